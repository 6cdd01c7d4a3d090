// What the kernels of this folder share, put before each one's source (ops/cuda source()): their PTX building blocks and
// how the attention kernels find a kv head's keys and values in the cache. Under CUDA_ON_CPU (tests/ops/cuda_on_cpu.h,
// which emulates the building blocks on the CPU) only the definitions that are not PTX stay.
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#ifndef CUDA_ON_CPU
#include <cuda_fp16.h>

// 16 bytes from global to shared memory by cp.async, zeros where not `valid`
__device__ __forceinline__ void copy16(half* smem, const void* gmem, bool valid) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// until at most IN_FLIGHT of this thread's committed groups of copies are still in flight
template <int IN_FLIGHT> __device__ __forceinline__ void copies_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(IN_FLIGHT)); }

// four 8 x 8 matrices of halfs from shared memory, each lane giving one row's address (lanes 8i..8i+7 matrix i's rows),
// as they are or transposed
__device__ __forceinline__ void ldmatrix4(unsigned* r, const half* smem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void ldmatrix4_trans(unsigned* r, const half* smem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

// c (16 x 8, float32) += a (16 x 16, fp16, row-major fragments) . b (16 x 8, fp16, column-major fragments)
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c (16 x 8, int32) += a (16 x 32, int8, row-major fragments) . b (32 x 8, int8, column-major fragments)
__device__ __forceinline__ void mma16832_s8(int* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

#ifdef BN
// a GEMM warp's sums into C [M, N] (float32, row-major): of each of its FRAGS x 4 fragments of 16 x 8 from row `row0`
// and column `col0`, rows lane / 4 and 8 below it, columns two from (lane % 4) * 2; none past M or N
template <int FRAGS> __device__ __forceinline__ void store_sums(float* C, const float (&acc)[FRAGS][4][4], int row0, int col0, int lane) {
  #pragma unroll
  for (int i = 0; i < FRAGS; i++)
    #pragma unroll
    for (int j = 0; j < 4; j++) {
      const int row = row0 + i * 16 + (lane >> 2), col = col0 + j * 8 + (lane & 3) * 2;
      #pragma unroll
      for (int h = 0; h < 2; h++) {
        if (row + 8 * h >= M || col >= N) continue;
        float* out = C + (size_t)(row + 8 * h) * N + col;
        if (N % 2 == 0) *reinterpret_cast<float2*>(out) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        else {
          out[0] = acc[i][j][2 * h];
          if (col + 1 < N) out[1] = acc[i][j][2 * h + 1];
        }
      }
    }
}
#endif

// the attention kernels' softmax in base 2, its -infinity (NVRTC has no math.h for INFINITY), and the soft cap (0: none)
#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000u)
__device__ __forceinline__ float soft_cap(float x, float cap) { return cap > 0.f ? cap * tanhf(x / cap) : x; }

// the attention kernels' fp16 cache, K [HKV, L, D] and V [HKV, L, DV]: V in a buffer of its own after K's (SEPARATE_V), or
// V_OFFSET halfs into K's
#if SEPARATE_V
#define CACHE_ARGS const half* __restrict__ KV, const half* __restrict__ VS
#define VALUES(kvh) (VS + (size_t)(kvh) * L * DV)
#else
#define CACHE_ARGS const half* __restrict__ KV
#define VALUES(kvh) (KV + V_OFFSET + (size_t)(kvh) * L * DV)
#endif
#define KEYS(kvh) (KV + (size_t)(kvh) * L * D)

// flash-decoding's second kernel, for the kernels whose parts (PARTS of them, their sums unnormalized beside their max in
// base 2 and their denominator, P [heads, PARTS, DV + 2]) it combines: a block for each query head, a thread for each
// value column, the parts rescaled to their largest max (and a sink's logit, SINKS), summed and divided by the
// denominator: O [heads, DV].
#ifdef PARTS
extern "C" __global__ void __launch_bounds__(DV) CAT(NAME, _combine)(float* __restrict__ O, const float* __restrict__ P
#if SINKS
                                                             , const float* __restrict__ S
#endif
                                                             ) {
  const int h = blockIdx.x, col = threadIdx.x;
  const float* parts = P + (size_t)h * PARTS * (DV + 2);
  float top = NEG_INF;
  for (int p = 0; p < PARTS; p++) top = fmaxf(top, parts[p * (DV + 2) + DV + 1]);
#if SINKS
  const float sink = S[h] * LOG2E;
  top = fmaxf(top, sink);
  float denominator = exp2f(sink - top);
#else
  float denominator = 0.f;
#endif
  float sum = 0.f;
  for (int p = 0; p < PARTS; p++) {
    const float* part = parts + p * (DV + 2);
    if (part[DV + 1] == NEG_INF) continue;
    const float r = exp2f(part[DV + 1] - top);
    sum += part[col] * r;
    denominator += part[DV] * r;
  }
  O[(size_t)h * DV + col] = sum / denominator;
}
#endif
