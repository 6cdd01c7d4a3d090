// The floor under any matvec of one weight: the fastest read of that many bytes by one kernel, launched as one of a
// chain of dependent kernels in a CUDA graph (as a decode step's kernels are, and `tinyzoo matvec --shape` times them),
// over a grid of launch sizes; and a large copy in the same run (bytes read plus written) to set it against.
//   read_floor BYTES COPIES ITERS [ROWS COLS]  ->  one JSON line per launch size, then one for the copy
// Each kernel reads another buffer of BYTES (COPIES of them outgrow the L2), 16 bytes a load, UNROLL loads in flight a
// thread, and stores one value a warp. With ROWS and COLS (a Q4_0 weight of BYTES), also hand-written Q4_0 matvecs over
// tinyzoo's packed_words layout (quant/words.py: a block's 16 quant bytes as 4 words, its fp16 scales apart), each
// checked against the host in double precision, in five designs (JSON kinds): matvec (float x, R rows a warp, S words a
// lane), matvec_without_x (the same with x's loads left out: what they cost), matvec_staged (x in shared memory, a
// thread a block), matvec_rows (a warp a row at a time, x in registers, the next row's loads first) and matvec_dp4a
// (x quantized to 8 bits a block, as llama.cpp's matvecs read it): what a gemv written for this GPU reaches beside the
// read alone. The read and the matvecs over float or 8-bit x are also timed chained by programmatic dependent launch
// (Hopper's PDL, kinds suffixed _overlapped and _prefetched): what a gemv reaches once a kernel's launch and start
// overlap the tail of the one before it. CUDA C rather than tinygrad: it measures the machine and what any kernel
// reaches, not a kernel generator.
#include <cstdio>
#include <type_traits>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

// How a kernel follows the one before it in a chain. ALONE: it starts once that one has ended (a graph edge). OVERLAPPED:
// launched for programmatic dependent launch, it lets the next kernel launch as soon as all its own workgroups have
// started, and waits for the one before (to have ended, its writes visible) on entry, so that its launch and its
// workgroups' start overlap that one's tail. PREFETCHED: the same, and before waiting each workgroup asks the L2 for its
// even share of the kernel's weight bytes, which no kernel before it writes: the weight streams in during that tail too.
// A generic entry, as a kernel generator could add to any kernel; the waits come before every load of x.
enum Chain { ALONE, OVERLAPPED, PREFETCHED };
static const char *const CHAIN_SUFFIX[] = {"", "_overlapped", "_prefetched"};

__device__ __forceinline__ void prefetch_share(const void *buf, size_t bytes) {
  const size_t share = (bytes / gridDim.x + 15) / 16 * 16, start = share * blockIdx.x;
  if (start < bytes) {
    const unsigned n = (unsigned)((share < bytes - start ? share : bytes - start) / 16 * 16);
    if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)buf + start), "r"(n) : "memory");
  }
}

template <int C> __device__ __forceinline__ void enter(const void *weight, size_t weight_bytes, const void *scales = nullptr, size_t scale_bytes = 0) {
  if (C == ALONE) return;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (C == PREFETCHED && threadIdx.x == 0) {
    prefetch_share(weight, weight_bytes);
    if (scales) prefetch_share(scales, scale_bytes);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// `kernel` on `stream`, for programmatic dependent launch unless `chain` is ALONE
template <class... P, class... A> static void launch(int chain, void (*kernel)(P...), int blocks, int threads, cudaStream_t stream, A... args) {
  cudaLaunchAttribute pdl = {};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = chain != ALONE;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  config.attrs = &pdl;
  config.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

template <int UNROLL, int C>
__global__ void read_words(const uint4 *__restrict__ src, size_t n, unsigned *__restrict__ out) {
  enter<C>(src, n * 16);
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) { uint4 v = src[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  for (int lane = 16; lane; lane >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, lane);
  if ((threadIdx.x & 31) == 0) out[((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5] = acc;
}

// R rows a warp; each lane takes S neighbouring words of a block (S = 4: a whole block, one 16-byte load), the warp's
// lanes the next 32 * S words of the rows, and so on along them. A block's element 16h + 4j + k is nibble h of byte k
// of word j. A nibble q moved into a 1.0's top mantissa bits is f = 1 + q/16, so sum((q - 8) x) = 16 sum(f x) - 24
// sum(x), with no integer-to-float conversion. Without USE_X the activations are ones (not loaded): what x's loads cost.
template <int S> struct Words;

// word w's eight products with x added to dot: its elements 4j + k (byte k's low nibble) times lo's k-th, 16 + 4j + k
// (the high nibble) times hi's, each nibble as 1 + q/16
__device__ __forceinline__ void add_word(float &dot, unsigned w, float4 lo, float4 hi) {
  const float l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    dot += __uint_as_float((((w >> (8 * k)) & 0xFu) << 19) | 0x3F800000u) * l[k];
    dot += __uint_as_float((((w >> (8 * k + 4)) & 0xFu) << 19) | 0x3F800000u) * h[k];
  }
}
template <> struct Words<1> { using T = unsigned; static __device__ unsigned at(T v, int) { return v; } };
template <> struct Words<2> { using T = uint2; static __device__ unsigned at(T v, int i) { return i ? v.y : v.x; } };
template <> struct Words<4> { using T = uint4; static __device__ unsigned at(T v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; } };

template <int R, int S, bool USE_X, int C>
__global__ void q4_0_matvec(const unsigned *__restrict__ words, const __half *__restrict__ d, const float *__restrict__ x,
                            float *__restrict__ y, int rows, int blocks_per_row) {
  enter<C>(words, (size_t)rows * blocks_per_row * 16, d, (size_t)rows * blocks_per_row * 2);
  using W = Words<S>;
  const int lane = threadIdx.x & 31, row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R, row_words = blocks_per_row * 4;
  if (row0 >= rows) return;
  float acc[R] = {};
#pragma unroll 2
  for (int w0 = lane * S; w0 < row_words; w0 += 32 * S) {
    const int b = w0 >> 2, j0 = w0 & 3;
    typename W::T q[R];
    float scale[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      q[r] = *(const typename W::T *)(words + (size_t)(row0 + r) * row_words + w0);
      scale[r] = __half2float(d[(size_t)(row0 + r) * blocks_per_row + b]);
    }
    float4 lo[S], hi[S];   // word j's elements 4j + k and 16 + 4j + k
    float xsum = 0;
#pragma unroll
    for (int i = 0; i < S; i++) {
      lo[i] = USE_X ? *(const float4 *)(x + b * 32 + 4 * (j0 + i)) : make_float4(1, 1, 1, 1);
      hi[i] = USE_X ? *(const float4 *)(x + b * 32 + 16 + 4 * (j0 + i)) : make_float4(1, 1, 1, 1);
      xsum += lo[i].x + lo[i].y + lo[i].z + lo[i].w + hi[i].x + hi[i].y + hi[i].z + hi[i].w;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      float dot = 0;
#pragma unroll
      for (int i = 0; i < S; i++) add_word(dot, W::at(q[r], i), lo[i], hi[i]);
      acc[r] += (16.0f * dot - 24.0f * xsum) * scale[r];
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    for (int l = 16; l; l >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], l);
    if (lane == 0) y[row0 + r] = acc[r];
  }
}

// 256 threads a workgroup, a thread per block of a 2048-column row (64 threads a row, 4 rows at once) for P rows
// 4 apart: its P blocks' loads issued first, then the workgroup stages x in shared memory as [float4 e][block b], so
// that a warp reads a block's activations without bank conflicts, and each thread keeps its block's 32 in registers
// for all its rows.
template <int P, int C>
__global__ void __launch_bounds__(256) q4_0_matvec_staged(const uint4 *__restrict__ words, const __half *__restrict__ d,
                                                          const float4 *__restrict__ x, float *__restrict__ y, int rows) {
  enter<C>(words, (size_t)rows * 64 * 16, d, (size_t)rows * 64 * 2);
  __shared__ float4 xs[8 * 64];
  __shared__ float partial[8][P];
  const int t = threadIdx.x, b = t & 63, row0 = blockIdx.x * 4 * P + (t >> 6);
  uint4 q[P];
  float scale[P];
#pragma unroll
  for (int p = 0; p < P; p++) {
    q[p] = words[(size_t)(row0 + 4 * p) * 64 + b];
    scale[p] = __half2float(d[(size_t)(row0 + 4 * p) * 64 + b]);
  }
  for (int i = t; i < 8 * 64; i += 256) xs[(i & 7) * 64 + (i >> 3)] = x[i];
  __syncthreads();
  float4 xv[8];
  float xsum = 0;
#pragma unroll
  for (int e = 0; e < 8; e++) {
    xv[e] = xs[e * 64 + b];
    xsum += xv[e].x + xv[e].y + xv[e].z + xv[e].w;
  }
  float acc[P];
#pragma unroll
  for (int p = 0; p < P; p++) {
    const unsigned w[4] = {q[p].x, q[p].y, q[p].z, q[p].w};
    float dot = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) add_word(dot, w[j], xv[j], xv[4 + j]);
    acc[p] = (16.0f * dot - 24.0f * xsum) * scale[p];
    for (int l = 16; l; l >>= 1) acc[p] += __shfl_xor_sync(0xffffffffu, acc[p], l);
    if ((t & 31) == 0) partial[t >> 5][p] = acc[p];
  }
  __syncthreads();
  // row row0 + 4p of warp pair (2 * (r % 4), + 1)
  if (t < 4 * P) y[blockIdx.x * 4 * P + t] = partial[2 * (t & 3)][t >> 2] + partial[2 * (t & 3) + 1][t >> 2];
}

// As llama.cpp's: x quantized to 8 bits a 32-element block (x8, its scales xd), so that 4 products are one dp4a: R rows
// a warp, a word a lane. Word j's low nibbles are elements 4j + k, its high ones 16 + 4j + k: x8's words j and 4 + j.
template <int R, int C>
__global__ void q4_0_matvec_dp4a(const unsigned *__restrict__ words, const __half *__restrict__ d, const int *__restrict__ x8,
                                 const float *__restrict__ xd, float *__restrict__ y, int rows, int blocks_per_row) {
  enter<C>(words, (size_t)rows * blocks_per_row * 16, d, (size_t)rows * blocks_per_row * 2);
  const int lane = threadIdx.x & 31, row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R, row_words = blocks_per_row * 4;
  if (row0 >= rows) return;
  float acc[R] = {};
#pragma unroll 2
  for (int w0 = lane; w0 < row_words; w0 += 32) {
    const int b = w0 >> 2, j = w0 & 3;
    unsigned q[R];
    float scale[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      q[r] = words[(size_t)(row0 + r) * row_words + w0];
      scale[r] = __half2float(d[(size_t)(row0 + r) * blocks_per_row + b]);
    }
    const int lo = x8[b * 8 + j], hi = x8[b * 8 + 4 + j];
    const int offset = 8 * __dp4a(0x01010101, lo, __dp4a(0x01010101, hi, 0));
    const float xs = xd[b];
#pragma unroll
    for (int r = 0; r < R; r++)
      acc[r] += (__dp4a((int)(q[r] & 0x0F0F0F0Fu), lo, __dp4a((int)((q[r] >> 4) & 0x0F0F0F0Fu), hi, 0)) - offset) * xs * scale[r];
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    for (int l = 16; l; l >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], l);
    if (lane == 0) y[row0 + r] = acc[r];
  }
}

// A warp a row at a time, rows `warps` apart, for 2048-column rows: lane l always takes blocks 2l and 2l + 1, so it loads
// their 64 activations once for all its rows, and it loads the next row's blocks before summing this one's.
__global__ void q4_0_matvec_rows(const uint4 *__restrict__ words, const __half2 *__restrict__ d, const float4 *__restrict__ x,
                                 float *__restrict__ y, int rows) {
  const int lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x >> 5);
  float4 xv[16];
#pragma unroll
  for (int e = 0; e < 16; e++) xv[e] = x[lane * 16 + e];
  float xsum[2] = {};
#pragma unroll
  for (int e = 0; e < 16; e++) xsum[e / 8] += xv[e].x + xv[e].y + xv[e].z + xv[e].w;
  int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  uint4 next[2];
  __half2 next_d;
  if (r < rows) { next[0] = words[(size_t)r * 64 + 2 * lane]; next[1] = words[(size_t)r * 64 + 2 * lane + 1]; next_d = d[(size_t)r * 32 + lane]; }
  for (; r < rows; r += warps) {
    const uint4 q[2] = {next[0], next[1]};
    const float2 scale = __half22float2(next_d);
    if (r + warps < rows) {
      next[0] = words[(size_t)(r + warps) * 64 + 2 * lane];
      next[1] = words[(size_t)(r + warps) * 64 + 2 * lane + 1];
      next_d = d[(size_t)(r + warps) * 32 + lane];
    }
    float acc = 0;
#pragma unroll
    for (int blk = 0; blk < 2; blk++) {
      const unsigned w[4] = {q[blk].x, q[blk].y, q[blk].z, q[blk].w};
      float dot = 0;
#pragma unroll
      for (int j = 0; j < 4; j++) add_word(dot, w[j], xv[8 * blk + j], xv[8 * blk + 4 + j]);
      acc += (16.0f * dot - 24.0f * xsum[blk]) * (blk ? scale.y : scale.x);
    }
    for (int l = 16; l; l >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, l);
    if (lane == 0) y[r] = acc;
  }
}

__global__ void copy_words(const uint4 *__restrict__ src, uint4 *__restrict__ dst, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}

// ms per replay of a graph that runs `launch` once per buffer, back to back on one stream (each waits for the one before)
template <class F> static float graph_ms(int copies, int iters, F launch) {
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t exec;
  cudaEvent_t t0, t1;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < copies; c++) launch(c, s);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  for (int w = 0; w < 3; w++) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaEventRecord(t0, s));
  for (int it = 0; it < iters; it++) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaEventRecord(t1, s));
  CHECK(cudaEventSynchronize(t1));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(s));
  return ms / iters;
}

// f(std::integral_constant<int, C>()) for each Chain C
template <class F> static void for_each_chain(F f) {
  f(std::integral_constant<int, ALONE>());
  f(std::integral_constant<int, OVERLAPPED>());
  f(std::integral_constant<int, PREFETCHED>());
}

template <int UNROLL, int C> static void time_reads(const std::vector<uint4 *> &bufs, size_t words, unsigned *out, size_t bytes, int iters) {
  const int copies = (int)bufs.size();
  for (int threads : {128, 256, 512, 1024})
    for (int blocks : {132, 264, 528, 1056, 2112, 4224, 8448}) {
      if ((size_t)blocks * threads > words) continue;
      float ms = graph_ms(copies, iters, [&](int c, cudaStream_t s) { launch(C, read_words<UNROLL, C>, blocks, threads, s, bufs[c], words, out); });
      CHECK(cudaGetLastError());
      printf("{\"kind\": \"read%s\", \"blocks\": %d, \"threads\": %d, \"unroll\": %d, \"us\": %.3f, \"gb_s\": %.1f}\n", CHAIN_SUFFIX[C], blocks,
             threads, UNROLL, ms * 1e3 / copies, (double)bytes * copies / ms / 1e6);
    }
}

// A Q4_0 weight in the packed_words layout (words and fp16 scales), random (seeded), and x
struct Q4_0Weight {
  int rows, cols, nb;
  std::vector<unsigned> words;
  std::vector<__half> d;
  std::vector<float> x;
  Q4_0Weight(int rows, int cols) : rows(rows), cols(cols), nb(cols / 32), words((size_t)rows * nb * 4), d((size_t)rows * nb), x(cols) {
    srand(1);
    for (auto &w : words) w = ((unsigned)rand() << 16) ^ (unsigned)rand();
    for (auto &v : d) v = __float2half((rand() % 2001 - 1000) * 1e-5f);
    for (auto &v : x) v = (rand() % 2001 - 1000) * 1e-3f;
  }
  // the weight times xs in double precision: element 16h + 4j + k of block b is nibble h of byte k of its word j
  std::vector<double> times(const std::vector<float> &xs) const {
    std::vector<double> y(rows, 0.0);
    for (int r = 0; r < rows; r++)
      for (int i = 0; i < cols; i++) {
        const int b = i / 32, e = i % 32, h = e / 16, j = e % 16 / 4, k = e % 4;
        const int q = (words[((size_t)r * nb + b) * 4 + j] >> (8 * k + 4 * h)) & 15;
        y[r] += (double)__half2float(d[(size_t)r * nb + b]) * (q - 8) * xs[i];
      }
    return y;
  }
};

struct DeviceWeights {
  std::vector<unsigned *> words;
  std::vector<__half *> d;
  float *x, *y;
  DeviceWeights(const Q4_0Weight &w, int copies) : words(copies), d(copies) {
    for (int c = 0; c < copies; c++) {
      CHECK(cudaMalloc(&words[c], w.words.size() * 4));
      CHECK(cudaMalloc(&d[c], w.d.size() * 2));
      CHECK(cudaMemcpy(words[c], w.words.data(), w.words.size() * 4, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(d[c], w.d.data(), w.d.size() * 2, cudaMemcpyHostToDevice));
    }
    CHECK(cudaMalloc(&x, w.cols * 4));
    CHECK(cudaMalloc(&y, w.rows * 4));
    CHECK(cudaMemcpy(x, w.x.data(), w.cols * 4, cudaMemcpyHostToDevice));
  }
  ~DeviceWeights() {
    for (size_t c = 0; c < words.size(); c++) { CHECK(cudaFree(words[c])); CHECK(cudaFree(d[c])); }
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
  }
};

// The largest difference of the device's y from `want`, relative to want's largest magnitude
static double relative_error(const std::vector<double> &want, const DeviceWeights &dev) {
  std::vector<float> y(want.size());
  CHECK(cudaMemcpy(y.data(), dev.y, y.size() * 4, cudaMemcpyDeviceToHost));
  double err = 0, top = 0;
  for (size_t r = 0; r < y.size(); r++) { err = fmax(err, fabs(y[r] - want[r])); top = fmax(top, fabs(want[r])); }
  return top ? err / top : 0.0;
}

// One launch size of a matvec: run on the first copy and checked against `want` (none: not checked), then timed on every
// copy in turn (one kernel each, chained as the reads are) and the last one's y checked again; one JSON line of `kind`
// with `suffix`, `fields`, the larger error and us a kernel.
template <class F>
static void check_and_time(const char *kind, const char *suffix, const char *fields, F launch, const std::vector<double> *want,
                           DeviceWeights &dev, int iters) {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  launch(0, s);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  const double err = want ? relative_error(*want, dev) : 0.0;
  const float ms = graph_ms((int)dev.words.size(), iters, launch);
  CHECK(cudaGetLastError());
  printf("{\"kind\": \"%s%s\", %s, \"rel_err\": %.2e, \"us\": %.3f}\n", kind, suffix, fields, want ? fmax(err, relative_error(*want, dev)) : 0.0,
         ms * 1e3 / dev.words.size());
}

template <int R, int S, bool USE_X> static void time_matvec(const Q4_0Weight &w, DeviceWeights &dev, const std::vector<double> &want, int iters) {
  for_each_chain([&](auto chain) {
    constexpr int C = decltype(chain)::value;
    if constexpr (USE_X || C == ALONE) {   // without x only alone
      for (int threads : {64, 128, 256}) {
        char fields[128];
        snprintf(fields, sizeof fields, "\"rows_per_warp\": %d, \"words_per_thread\": %d, \"threads\": %d", R, S, threads);
        const int blocks = w.rows / R / (threads / 32);
        check_and_time(USE_X ? "matvec" : "matvec_without_x", CHAIN_SUFFIX[C], fields, [&](int c, cudaStream_t s) {
          launch(C, q4_0_matvec<R, S, USE_X, C>, blocks, threads, s, (const unsigned *)dev.words[c], (const __half *)dev.d[c],
                 (const float *)dev.x, dev.y, w.rows, w.nb);
        }, USE_X ? &want : nullptr, dev, iters);
      }
    }
  });
}

template <int P> static void time_staged(const Q4_0Weight &w, DeviceWeights &dev, const std::vector<double> &want, int iters) {
  for_each_chain([&](auto chain) {
    constexpr int C = decltype(chain)::value;
    char fields[64];
    snprintf(fields, sizeof fields, "\"rows_per_thread\": %d, \"threads\": 256", P);
    check_and_time("matvec_staged", CHAIN_SUFFIX[C], fields, [&](int c, cudaStream_t s) {
      launch(C, q4_0_matvec_staged<P, C>, w.rows / (4 * P), 256, s, (const uint4 *)dev.words[c], (const __half *)dev.d[c],
             (const float4 *)dev.x, dev.y, w.rows);
    }, &want, dev, iters);
  });
}

static void time_rows(const Q4_0Weight &w, DeviceWeights &dev, const std::vector<double> &want, int iters) {
  for (int threads : {256, 512})
    for (int blocks : {132, 264, 528, 1056}) {
      char fields[64];
      snprintf(fields, sizeof fields, "\"blocks\": %d, \"threads\": %d", blocks, threads);
      check_and_time("matvec_rows", "", fields, [&](int c, cudaStream_t s) {
        q4_0_matvec_rows<<<blocks, threads, 0, s>>>((const uint4 *)dev.words[c], (const __half2 *)dev.d[c], (const float4 *)dev.x, dev.y, w.rows);
      }, &want, dev, iters);
    }
}

// x quantized to 8 bits a block as llama.cpp's q8_1 (scaled to the block's largest magnitude), checked against the
// host's product with that quantized x
template <int R> static void time_dp4a(const Q4_0Weight &w, DeviceWeights &dev, int iters) {
  std::vector<signed char> x8(w.cols);
  std::vector<float> xd(w.nb), xq(w.cols);
  for (int b = 0; b < w.nb; b++) {
    float largest = 0;
    for (int i = 0; i < 32; i++) largest = fmaxf(largest, fabsf(w.x[b * 32 + i]));
    xd[b] = largest / 127;
    for (int i = 0; i < 32; i++) {
      x8[b * 32 + i] = (signed char)lrintf(xd[b] ? w.x[b * 32 + i] / xd[b] : 0);
      xq[b * 32 + i] = x8[b * 32 + i] * xd[b];
    }
  }
  const std::vector<double> want = w.times(xq);
  int *dx8;
  float *dxd;
  CHECK(cudaMalloc(&dx8, w.cols));
  CHECK(cudaMalloc(&dxd, w.nb * 4));
  CHECK(cudaMemcpy(dx8, x8.data(), w.cols, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dxd, xd.data(), w.nb * 4, cudaMemcpyHostToDevice));
  for_each_chain([&](auto chain) {
    constexpr int C = decltype(chain)::value;
    for (int threads : {64, 128, 256}) {
      char fields[64];
      snprintf(fields, sizeof fields, "\"rows_per_warp\": %d, \"threads\": %d", R, threads);
      check_and_time("matvec_dp4a", CHAIN_SUFFIX[C], fields, [&](int c, cudaStream_t s) {
        launch(C, q4_0_matvec_dp4a<R, C>, w.rows / R / (threads / 32), threads, s, (const unsigned *)dev.words[c], (const __half *)dev.d[c],
               (const int *)dx8, (const float *)dxd, dev.y, w.rows, w.nb);
      }, &want, dev, iters);
    }
  });
  CHECK(cudaFree(dx8));
  CHECK(cudaFree(dxd));
}

// the float x design at R rows a warp: 1, 2 and 4 words a lane, and 2 without x's loads
template <int R> static void time_float_matvecs(const Q4_0Weight &w, DeviceWeights &dev, const std::vector<double> &want, int iters) {
  time_matvec<R, 1, true>(w, dev, want, iters);
  time_matvec<R, 2, true>(w, dev, want, iters);
  time_matvec<R, 4, true>(w, dev, want, iters);
  time_matvec<R, 2, false>(w, dev, want, iters);
}

// every design over its launch sizes; the staged and row-at-a-time ones are written for 2048 columns
static void time_matvecs(const Q4_0Weight &w, DeviceWeights &dev, int iters) {
  const std::vector<double> want = w.times(w.x);
  if (w.cols == 2048) {
    time_rows(w, dev, want, iters);
    time_staged<1>(w, dev, want, iters);
    time_staged<2>(w, dev, want, iters);
    time_staged<4>(w, dev, want, iters);
    time_staged<8>(w, dev, want, iters);
  }
  time_dp4a<1>(w, dev, iters);
  time_dp4a<2>(w, dev, iters);
  time_dp4a<4>(w, dev, iters);
  time_dp4a<8>(w, dev, iters);
  time_float_matvecs<2>(w, dev, want, iters);
  time_float_matvecs<4>(w, dev, want, iters);
  time_float_matvecs<8>(w, dev, want, iters);
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 6) { fprintf(stderr, "usage: read_floor BYTES COPIES ITERS [ROWS COLS]\n"); return 2; }
  const size_t bytes = strtoull(argv[1], nullptr, 10) / 16 * 16, words = bytes / 16;
  const int copies = atoi(argv[2]), iters = atoi(argv[3]);
  if (!words || copies < 1 || iters < 1) { fprintf(stderr, "read_floor: BYTES >= 16, COPIES >= 1 and ITERS >= 1\n"); return 2; }
  std::vector<uint4 *> bufs(copies);
  for (auto &b : bufs) { CHECK(cudaMalloc(&b, bytes)); CHECK(cudaMemset(b, 1, bytes)); }
  unsigned *out;
  CHECK(cudaMalloc(&out, 8448 * 1024 / 32 * sizeof(unsigned)));
  for_each_chain([&](auto chain) {
    constexpr int C = decltype(chain)::value;
    time_reads<1, C>(bufs, words, out, bytes, iters);
    time_reads<2, C>(bufs, words, out, bytes, iters);
    time_reads<4, C>(bufs, words, out, bytes, iters);
    time_reads<8, C>(bufs, words, out, bytes, iters);
  });
  const size_t big = (size_t)1 << 30;   // 1 GiB, as experiments/bench.py's copy_bandwidth
  uint4 *src, *dst;
  CHECK(cudaMalloc(&src, big));
  CHECK(cudaMalloc(&dst, big));
  CHECK(cudaMemset(src, 1, big));
  float ms = graph_ms(1, 10, [&](int, cudaStream_t s) { copy_words<<<132 * 16, 256, 0, s>>>(src, dst, big / 16); });
  if (argc == 6) {
    for (auto &b : bufs) CHECK(cudaFree(b));
    const Q4_0Weight w(atoi(argv[4]), atoi(argv[5]));
    DeviceWeights dev(w, copies);
    time_matvecs(w, dev, iters);
  }
  printf("{\"kind\": \"copy\", \"bytes\": %zu, \"gb_s\": %.1f}\n", big, 2.0 * big / ms / 1e6);
  return 0;
}
