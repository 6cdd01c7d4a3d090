// C[M, N] (float32) = A[M, K] . W[N, K]^T in integers, as llama.cpp's MMQ: A's rows quantized to int8 in blocks of 32
// (Aq [M, K] int8, Ad [M, K / 32] float32: A ~ Ad * Aq, as the caller quantizes them) against the words of a 32-element block
// format (quant/words.py: WEIGHTS 1 Q4_0, its quants less 8; 2 Q8_0) and their fp16 scales. A block's products are one
// mma.sync m16n8k32 (int8 in, int32 sums), then scaled by the two blocks' scales into float32 sums. GROUPED 1: a MoE's
// expert words [experts, N, ...] against a chunk's rows sorted into tiles of BM rows that share an expert, E[tile] each
// tile's expert (as gemm_mma.cu).
// A block of 256 threads computes a BM x 128 tile of C (BM 128, 64 or 32), eight warps of BM/2 x 32, over K in steps of
// one block: A's int8 tiles copied by cp.async three steps deep; W's words and both steps' scales loaded into registers
// two steps ahead and stored into a shared tile (Q4_0's nibbles widened to int8) one step ahead; read by ldmatrix. Rows
// of A or W past M or N are read as zeros (or a repeat of the last row) and their outputs not stored; K is a multiple of 32.
// The host defines NAME, M, N, K, WEIGHTS, GROUPED and the tiling (BM, BN, BK, THREADS), which it checks.
#if (BM != 128 && BM != 64 && BM != 32) || BN != 128 || BK != 32 || THREADS != 256 || (WEIGHTS != 1 && WEIGHTS != 2)
#error "gemm_int8.cu is written for tiles of 128, 64 or 32 x 128, K steps of 32, 256 threads and Q4_0 or Q8_0 words"
#endif
#define MI (BM / 32)      // a warp's 16-row fragments of A
#define STAGES 3          // cp.async stages of A
#define BLOCKS (K / 32)   // a row's blocks

// a shared tile's rows are one block's 32 bytes, two 16-byte chunks; chunk c of row r lies at chunk c ^ ((r / 4) % 2), so
// that the eight rows ldmatrix reads at one chunk meet no bank twice (in bytes)
__device__ __forceinline__ int at(int r, int c) { return r * BK + ((c ^ ((r >> 2) & 1)) << 4); }

// two blocks an SM: so bounded, ptxas keeps every sum of a 128-row tile in registers; left to itself it spills some
extern "C" __global__ void __launch_bounds__(THREADS, 2) NAME(float* __restrict__ C, const signed char* __restrict__ Aq,
                                                         const float* __restrict__ Ad, const unsigned* __restrict__ Wq,
                                                         const half* __restrict__ Wd
#if GROUPED
                                                         , const int* __restrict__ E
#endif
                                                         ) {
  __shared__ __align__(128) signed char As[STAGES][BM * BK];
  __shared__ __align__(128) signed char Bs[2][BN * BK];
  __shared__ float as_d[2][BM], bs_d[2][BN];   // the steps' scales of A's rows and W's
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = (warp >> 2) * (BM / 2), wn = (warp & 3) * 32;   // this warp's corner in the tile: 2 x 4 warps
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
#if GROUPED
  const size_t expert = (size_t)E[blockIdx.y];
#else
  const size_t expert = 0;
#endif
  float acc[MI][4][4] = {};
#if GROUPED
  if (E[blockIdx.y] < 0) { store_sums(C, acc, m0 + wm, n0 + wn, lane); return; }   // a tile past every run: zeros
#endif

  // one step's copies of A by cp.async: BM rows, two 16-byte chunks a row
  auto copy = [&](int stage, int step) {
    const int c = tid, r = c >> 1, gm = m0 + r;
    if (c < BM * 2)
      copy16(reinterpret_cast<half*>(&As[stage][at(r, c & 1)]), Aq + (size_t)(gm < M ? gm : M - 1) * K + step * BK + (c & 1) * 16, gm < M);
    copies_commit();
  };

  // W: two threads a row, each half of the row's block (rows past N repeat the last one); the first BM threads fetch A's
  // scales and the first BN W's
  const int wr = tid >> 1, wh = tid & 1, gn = n0 + wr < N ? n0 + wr : N - 1;
  uint4 q;           // this thread's words of the step being fetched
  float sa = 0.f, sw = 0.f;   // and the scales it fetches
  auto fetch = [&](int step) {
    const size_t block = (expert * N + gn) * BLOCKS + step;
#if WEIGHTS == 2
    q = *reinterpret_cast<const uint4*>(Wq + block * 8 + 4 * wh);   // bytes 16h..16h+15: elements 16h..16h+15
#else
    const uint2 w2 = *reinterpret_cast<const uint2*>(Wq + block * 4 + 2 * wh);   // elements 8h.. (low nibbles), 16+8h.. (high)
    q.x = w2.x; q.y = w2.y;
#endif
    if (tid < BM) sa = m0 + tid < M ? Ad[(size_t)(m0 + tid) * BLOCKS + step] : 0.f;
    if (tid < BN) sw = __half2float(Wd[(expert * N + (n0 + tid < N ? n0 + tid : N - 1)) * BLOCKS + step]);
  };
  // the fetched step into stage `stage` of the shared tiles
  auto store = [&](int stage) {
#if WEIGHTS == 2
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, wh)]) = q;
#else
    // Q4_0 quants less 8 as int8 (elements 8h.. from the low nibbles, 16+8h.. from the high): each nibble's top bit
    // flipped (q - 8 in 4-bit two's complement), then sign-extended
    auto widen = [](unsigned w, int shift) {
      const unsigned n = ((w >> shift) & 0x0F0F0F0Fu) ^ 0x08080808u;
      return n | ((n & 0x08080808u) * 0x1Eu);   // bits 4-7 of a byte copy its bit 3
    };
    *reinterpret_cast<uint2*>(&Bs[stage][at(wr, 0) + 8 * wh]) = make_uint2(widen(q.x, 0), widen(q.y, 0));
    *reinterpret_cast<uint2*>(&Bs[stage][at(wr, 1) + 8 * wh]) = make_uint2(widen(q.x, 4), widen(q.y, 4));
#endif
    if (tid < BM) as_d[stage][tid] = sa;
    if (tid < BN) bs_d[stage][tid] = sw;
  };

  const int steps = K / BK;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < steps) copy(s, s);
    else copies_commit();
  }
  fetch(0);
  store(0);
  if (steps > 1) fetch(1);
  for (int t = 0; t < steps; t++) {
    copies_wait<STAGES - 2>();
    __syncthreads();   // step t's tiles are in; every warp is past step t-1, whose stage the next copy takes
    if (t + STAGES - 1 < steps) copy((t + STAGES - 1) % STAGES, t + STAGES - 1);
    else copies_commit();
    const signed char *as = As[t % STAGES], *bs = Bs[t & 1];
    unsigned a[MI][4], b[4][2], r[4];
    // A's 16 x 32 fragments: lanes 0-15 give rows 0-15 at the first chunk, lanes 16-31 the same rows at the second
    #pragma unroll
    for (int i = 0; i < MI; i++) ldmatrix4(a[i], reinterpret_cast<const half*>(as + at(wm + i * 16 + (lane & 15), lane >> 4)));
    // W's 32 x 8 fragments two at a time: lanes 0-7 rows (n) 0-7 at the first chunk, 8-15 at the second, 16-31 rows 8-15
    #pragma unroll
    for (int j = 0; j < 4; j += 2) {
      ldmatrix4(r, reinterpret_cast<const half*>(bs + at(wn + j * 8 + (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1)));
      b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
    }
    // each fragment's integer sums scaled by its rows' and columns' scales: rows lane / 4 and 8 below, columns two from (lane % 4) * 2
    float ra[MI][2], cw[4][2];
    #pragma unroll
    for (int i = 0; i < MI; i++) { ra[i][0] = as_d[t & 1][wm + i * 16 + (lane >> 2)]; ra[i][1] = as_d[t & 1][wm + i * 16 + (lane >> 2) + 8]; }
    #pragma unroll
    for (int j = 0; j < 4; j++) { cw[j][0] = bs_d[t & 1][wn + j * 8 + (lane & 3) * 2]; cw[j][1] = bs_d[t & 1][wn + j * 8 + (lane & 3) * 2 + 1]; }
    #pragma unroll
    for (int i = 0; i < MI; i++)
      #pragma unroll
      for (int j = 0; j < 4; j++) {
        int c[4] = {0, 0, 0, 0};
        mma16832_s8(c, a[i], b[j][0], b[j][1]);
        #pragma unroll
        for (int e = 0; e < 4; e++) acc[i][j][e] += (float)c[e] * (ra[i][e >> 1] * cw[j][e & 1]);
      }
    // step t+1 into the stage step t-1 read (every warp is past it), then step t+2's fetched
    if (t + 1 < steps) {
      store((t + 1) & 1);
      if (t + 2 < steps) fetch(t + 2);
    }
  }
  store_sums(C, acc, m0 + wm, n0 + wn, lane);
}
