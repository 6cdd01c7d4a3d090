// The CUDA that ops/cuda's kernels use, emulated on the CPU, so their index and fragment arithmetic is checked against
// float64 where no GPU is (tests/ops/test_cuda_on_cpu.py). A block's threads run as threads of the process, one block
// after another (so __shared__ arrays are statics); a warp's lanes meet at a barrier of their own for each shuffle,
// ldmatrix and mma.sync, whose fragments follow the PTX ISA's layouts. cp.async copies at once: the emulation checks
// what the kernels compute, not how they overlap copies (a wait in the wrong place passes here). A barrier that waits
// more than a few seconds ends the process (a kernel whose threads do not all reach it would hang).
#define CUDA_ON_CPU 1
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 { unsigned x, y, z; };
static thread_local dim3 threadIdx, blockIdx;

struct half {
  _Float16 h;
  half() = default;
  half(float f) : h((_Float16)f) {}
};
typedef half __half;
struct __half2 { half x, y; };
typedef __half2 half2;
struct uint2 { unsigned x, y; };
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct float2 { float x, y; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float __half2float(half h) { return (float)h.h; }
static inline half __float2half(float f) { return half(f); }
static inline float2 __half22float2(half2 h) { return {(float)h.x.h, (float)h.y.h}; }
static inline half2 __floats2half2_rn(float a, float b) { return {half(a), half(b)}; }
static inline half2 __float2half2_rn(float a) { return {half(a), half(a)}; }
static inline half2 __half2half2(half a) { return {a, a}; }
static inline half2 __hmul2(half2 a, half2 b) { half2 r; r.x.h = a.x.h * b.x.h; r.y.h = a.y.h * b.y.h; return r; }
static inline half2 __hsub2(half2 a, half2 b) { half2 r; r.x.h = a.x.h - b.x.h; r.y.h = a.y.h - b.y.h; return r; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  uint8_t b[8]; memcpy(b, &x, 4); memcpy(b + 4, &y, 4);
  unsigned r = 0;
  for (int i = 0; i < 4; i++) r |= (unsigned)b[(s >> (4 * i)) & 7] << (8 * i);
  return r;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

// a barrier of n threads that gives up (and ends the process) after a few seconds
struct Barrier {
  std::mutex m; std::condition_variable cv; int n, waiting = 0; unsigned long generation = 0;
  explicit Barrier(int n) : n(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    unsigned long g = generation;
    if (++waiting == n) { waiting = 0; generation++; cv.notify_all(); return; }
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return generation != g; })) {
      fprintf(stderr, "cuda_on_cpu: a barrier of %d threads waited in vain (%d arrived)\n", n, waiting); _Exit(3);
    }
  }
};
static Barrier* block_barrier;
static Barrier* warp_barriers[32];
static inline int lane() { return threadIdx.x & 31; }
static inline int warp() { return threadIdx.x >> 5; }
static inline void warp_meet() { warp_barriers[warp()]->wait(); }
static inline void __syncthreads() { block_barrier->wait(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { warp_meet(); }

// what a warp's lanes hand each other: each lane's value, then every lane reads the ones it needs
static uint64_t handed[32][32][2];
template <class V> static inline V from_lane(V v, int src) {
  static_assert(sizeof(V) <= 16, "a lane hands on at most 16 bytes");
  memcpy(handed[warp()][lane()], &v, sizeof(V)); warp_meet();
  V r; memcpy(&r, handed[warp()][src], sizeof(V)); warp_meet();
  return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int mask) { return from_lane(v, lane() ^ mask); }
static inline float __shfl_sync(unsigned, float v, int src) { return from_lane(v, src); }

static inline void copy16(half* smem, const void* gmem, bool valid) { if (valid) memcpy(smem, gmem, 16); else memset(smem, 0, 16); }
static inline void copies_commit() {}
template <int IN_FLIGHT> static inline void copies_wait() {}

// ldmatrix .x4: lanes 8i..8i+7 give matrix i's row addresses; each lane gets, of each matrix, row lane/4 columns
// 2(lane%4) and the next (transposed: those rows of column lane/4)
static inline void ldmatrix(unsigned* r, const half* smem, bool transposed) {
  static const half* rows[32][32];
  rows[warp()][lane()] = smem; warp_meet();
  const int l = lane(), w = warp();
  for (int i = 0; i < 4; i++) {
    half e[2];
    for (int k = 0; k < 2; k++)
      e[k] = transposed ? rows[w][i * 8 + (l % 4) * 2 + k][l / 4] : rows[w][i * 8 + l / 4][(l % 4) * 2 + k];
    memcpy(&r[i], e, 4);
  }
  warp_meet();
}
static inline void ldmatrix4(unsigned* r, const half* smem) { ldmatrix(r, smem, false); }
static inline void ldmatrix4_trans(unsigned* r, const half* smem) { ldmatrix(r, smem, true); }

// mma.sync m16n8k16: a lane holds A's rows lane/4 and +8 at columns 2(lane%4)+{0,1} and +8, B's columns lane/4 at rows
// 2(lane%4)+{0,1} and +8, C's rows lane/4 and +8 at columns 2(lane%4)+{0,1}
static inline float half_of(unsigned u, int k) { half h[2]; memcpy(h, &u, 4); return (float)h[k].h; }
static inline void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  struct Fragments { unsigned a[4], b[2]; };
  static Fragments lanes[32][32];
  const int l = lane(), w = warp();
  memcpy(lanes[w][l].a, a, 16); lanes[w][l].b[0] = b0; lanes[w][l].b[1] = b1; warp_meet();
  float A[16][16], B[16][8];
  for (int t = 0; t < 32; t++) {
    const int g = t / 4, q = (t % 4) * 2;
    for (int k = 0; k < 2; k++) {
      A[g][q + k] = half_of(lanes[w][t].a[0], k); A[g + 8][q + k] = half_of(lanes[w][t].a[1], k);
      A[g][q + 8 + k] = half_of(lanes[w][t].a[2], k); A[g + 8][q + 8 + k] = half_of(lanes[w][t].a[3], k);
      B[q + k][g] = half_of(lanes[w][t].b[0], k); B[q + 8 + k][g] = half_of(lanes[w][t].b[1], k);
    }
  }
  warp_meet();
  for (int e = 0; e < 4; e++) {
    const int row = l / 4 + (e >> 1) * 8, col = (l % 4) * 2 + (e & 1);
    float s = 0.f;
    for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
    c[e] += s;
  }
}

// mma.sync m16n8k32 on int8: a lane holds A's rows lane/4 and +8 at columns 4(lane%4)+{0..3} and +16, B's columns
// lane/4 at rows 4(lane%4)+{0..3} and +16, C's as m16n8k16's
static inline int byte_of(unsigned u, int k) { return (int)(signed char)(u >> (8 * k)); }
static inline void mma16832_s8(int* c, const unsigned* a, unsigned b0, unsigned b1) {
  struct Fragments { unsigned a[4], b[2]; };
  static Fragments lanes[32][32];
  const int l = lane(), w = warp();
  memcpy(lanes[w][l].a, a, 16); lanes[w][l].b[0] = b0; lanes[w][l].b[1] = b1; warp_meet();
  int A[16][32], B[32][8];
  for (int t = 0; t < 32; t++) {
    const int g = t / 4, q = (t % 4) * 4;
    for (int k = 0; k < 4; k++) {
      A[g][q + k] = byte_of(lanes[w][t].a[0], k); A[g + 8][q + k] = byte_of(lanes[w][t].a[1], k);
      A[g][q + 16 + k] = byte_of(lanes[w][t].a[2], k); A[g + 8][q + 16 + k] = byte_of(lanes[w][t].a[3], k);
      B[q + k][g] = byte_of(lanes[w][t].b[0], k); B[q + 16 + k][g] = byte_of(lanes[w][t].b[1], k);
    }
  }
  warp_meet();
  for (int e = 0; e < 4; e++) {
    const int row = l / 4 + (e >> 1) * 8, col = (l % 4) * 2 + (e & 1);
    int s = 0;
    for (int k = 0; k < 32; k++) s += A[row][k] * B[k][col];
    c[e] += s;
  }
}

// a program's arguments from its buffers' addresses
struct Arg {
  void* p;
  template <class U> operator U*() const { return static_cast<U*>(p); }
};

// runs `kernel` on `grid` blocks of `threads` threads over the buffers in the files argv[1..buffers] (read whole, the
// first written back after) and the ints after them
static int emulate(int argc, char** argv, dim3 grid, int threads, int buffers, const std::function<void(void**, const int*)>& kernel) {
  if (argc < 1 + buffers) { fprintf(stderr, "cuda_on_cpu: %d buffer files expected\n", buffers); return 2; }
  std::vector<void*> data(buffers);
  std::vector<size_t> sizes(buffers);
  for (int i = 0; i < buffers; i++) {
    FILE* f = fopen(argv[1 + i], "rb");
    if (!f) { fprintf(stderr, "cuda_on_cpu: cannot read %s\n", argv[1 + i]); return 2; }
    fseek(f, 0, SEEK_END); sizes[i] = ftell(f); fseek(f, 0, SEEK_SET);
    data[i] = aligned_alloc(256, (sizes[i] + 255) / 256 * 256);
    if (fread(data[i], 1, sizes[i], f) != sizes[i]) return 2;
    fclose(f);
  }
  std::vector<int> ints;
  for (int i = 1 + buffers; i < argc; i++) ints.push_back(atoi(argv[i]));
  Barrier block(threads);
  block_barrier = &block;
  std::vector<Barrier*> warps;
  for (int w = 0; w * 32 < threads; w++) warps.push_back(warp_barriers[w] = new Barrier(std::min(32, threads - w * 32)));
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        std::vector<std::thread> block_threads;
        for (int t = 0; t < threads; t++)
          block_threads.emplace_back([&, t, x, y, z] { threadIdx = {(unsigned)t, 0, 0}; blockIdx = {x, y, z}; kernel(data.data(), ints.data()); });
        for (auto& t : block_threads) t.join();
      }
  for (Barrier* b : warps) delete b;
  FILE* f = fopen(argv[1], "wb");
  if (!f || fwrite(data[0], 1, sizes[0], f) != sizes[0]) return 2;
  fclose(f);
  return 0;
}
