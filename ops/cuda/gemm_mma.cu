// C[M, N] (float32) = A[M, K] . B[N, K]^T, A and B fp16 row-major (K contiguous in both): a prompt chunk's rows against
// a weight's dequantized rows. A block of 256 threads computes a 128 x 128 tile of C, eight warps of 64 x 32 each, over
// K in steps of 32: both operands' tiles copied to shared memory by cp.async (two stages, the next step's copy in flight
// while this one's products are summed), read into registers by ldmatrix and multiplied by mma.sync m16n8k16 with
// float32 sums. Rows of A or B past M or N are read as zeros and their outputs not stored; K is a multiple of 32.
// The host defines NAME, M, N, K and the tiling this code is written for (BM, BN, BK, THREADS), which it checks.
#include <cuda_fp16.h>
#if BM != 128 || BN != 128 || BK != 32 || THREADS != 256
#error "gemm_mma.cu is written for 128 x 128 tiles, K steps of 32 and 256 threads"
#endif
#define LDS (BK + 8)   // a tile row's halfs in shared memory: 80 bytes, so ldmatrix's eight rows meet no bank twice

__device__ __forceinline__ void copy16(half* smem, const half* gmem, bool valid) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void ldmatrix4(unsigned* r0, unsigned* r1, unsigned* r2, unsigned* r3, const half* smem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(*r0), "=r"(*r1), "=r"(*r2), "=r"(*r3) : "r"(s));
}

extern "C" __global__ void __launch_bounds__(THREADS) NAME(float* __restrict__ C, const half* __restrict__ A, const half* __restrict__ B) {
  __shared__ __align__(128) half As[2][BM * LDS];
  __shared__ __align__(128) half Bs[2][BN * LDS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;   // this warp's corner in the tile: 2 x 4 warps
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc[4][4][4];
  #pragma unroll
  for (int i = 0; i < 4; i++)
    #pragma unroll
    for (int j = 0; j < 4; j++)
      #pragma unroll
      for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f;

  // one step's tiles: 128 rows of 32 halfs each for A and B, four 16-byte copies a row, two of each a thread
  auto load = [&](int stage, int k0) {
    #pragma unroll
    for (int i = 0; i < 2; i++) {
      const int c = tid + i * THREADS, r = c >> 2, kc = (c & 3) * 8, gm = m0 + r, gn = n0 + r;
      copy16(&As[stage][r * LDS + kc], A + (size_t)(gm < M ? gm : M - 1) * K + k0 + kc, gm < M);
      copy16(&Bs[stage][r * LDS + kc], B + (size_t)(gn < N ? gn : N - 1) * K + k0 + kc, gn < N);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  const int steps = K / BK;
  load(0, 0);
  for (int t = 0; t < steps; t++) {
    if (t + 1 < steps) {
      load((t + 1) & 1, (t + 1) * BK);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    const half* as = As[t & 1];
    const half* bs = Bs[t & 1];
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[4][4], b[4][2];
      // A's 16 x 16 fragments: lanes 0-15 give rows 0-15 at k 0, lanes 16-31 the same rows at k 8
      #pragma unroll
      for (int i = 0; i < 4; i++)
        ldmatrix4(&a[i][0], &a[i][1], &a[i][2], &a[i][3], as + (wm + i * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8);
      // B's 16 x 8 fragments two at a time: lanes 0-7 rows (n) 0-7 at k 0, 8-15 at k 8, 16-31 likewise for rows 8-15
      #pragma unroll
      for (int j = 0; j < 4; j += 2)
        ldmatrix4(&b[j][0], &b[j][1], &b[j + 1][0], &b[j + 1][1],
                  bs + (wn + j * 8 + (lane & 7) + (lane >> 4) * 8) * LDS + kk + ((lane >> 3) & 1) * 8);
      #pragma unroll
      for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++)
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                       : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                       : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
    }
    __syncthreads();   // this stage's tiles are overwritten by the copy two steps on
  }
  // each thread's sums: rows lane / 4 and 8 below it, columns two from (lane % 4) * 2, of every 16 x 8 fragment
  #pragma unroll
  for (int i = 0; i < 4; i++)
    #pragma unroll
    for (int j = 0; j < 4; j++) {
      const int row = m0 + wm + i * 16 + (lane >> 2), col = n0 + wn + j * 8 + (lane & 3) * 2;
      #pragma unroll
      for (int h = 0; h < 2; h++) {
        if (row + 8 * h >= M) continue;
        float* out = C + (size_t)(row + 8 * h) * N + col;
        if (col < N) out[0] = acc[i][j][2 * h];
        if (col + 1 < N) out[1] = acc[i][j][2 * h + 1];
      }
    }
}
