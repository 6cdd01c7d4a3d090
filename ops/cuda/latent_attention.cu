// Latent attention (DeepSeek-style MLA, absorbed) over an fp16 latent cache, split over the positions (flash-decoding):
// T query rows of H heads, q [T * H, D] (fp16, row t * H + h: head h's q_nope through its k_b, then its rotated q_pe, at
// position start_pos + t) against the cache rows R [L, D] (each position's latent c and its rotated k_pe), one row read by
// every head; the values are the rows' first DV columns (c). Row t reads positions 0 .. start_pos + t: T is 1 for a decode
// step, a chunk's rows for a prompt chunk, which is attention of T * H query rows against one kv head.
//   NAME_parts: a block of four warps for each part of PARTS and each tile of 16 query rows (all heads of a position, or
//     of neighbouring positions). The rows are those of the mma.sync tiles, the positions their columns: for each tile of
//     16 positions copied to shared memory by cp.async, each warp multiplies every fourth 16 of D (its partial logits
//     summed through shared memory), one thread a row updates the running max and sum (online softmax) over the
//     positions it sees and writes the weights in fp16, and each warp multiplies them by its quarter of the value columns,
//     read from the same rows. The part's sums are written unnormalized beside their max and denominator:
//     P [T * H, PARTS, DV + 2].
//   NAME_combine (common.cuh): the parts combined, O [T * H, DV].
// The host defines NAME, H, T, D, DV, L, PARTS, SCALE, SINKS (0), the launch this code is written for (THREADS, and HT rows
// a block: an mma tile's), which it checks, and START_POS where the position is a number rather than the step's variable
// (the kernel's last argument).
#if D % 16 || DV % 64 || DV > D || DV > 512 || D > 640
#error "latent_attention.cu takes rows of 16 to 640 halfs in steps of 16 and up to 512 value columns in steps of 64"
#endif
#if THREADS != 128 || HT != 16
#error "latent_attention.cu is written for blocks of 128 threads and 16 query rows"
#endif
#define BC 16                 // positions a tile
#define LDR (D + 8)           // a shared row's halfs: rows 16 bytes apart in banks, so ldmatrix's eight rows meet no bank twice
#define LDP (BC + 8)
#define VQ (DV / 4)           // the value columns a warp sums
#define ROWS (T * H)          // the query rows, t-major

extern "C" __global__ void __launch_bounds__(THREADS, 1) CAT(NAME, _parts)(float* __restrict__ P, const half* __restrict__ Q,
                                                                          const half* __restrict__ R
#ifdef START_POS
                                                                          ) {
  const int start_pos = START_POS;
#else
                                                                          , const int start_pos) {
#endif
  __shared__ __align__(128) half Qs[HT * LDR];
  __shared__ __align__(128) half Rs[BC * LDR];
  __shared__ __align__(16) half Ps[HT * LDP];
  __shared__ float partial[4][HT][BC], keep[HT];
  const int part = blockIdx.x, r0 = blockIdx.y * HT, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = start_pos + (min(r0 + HT, ROWS) - 1) / H + 1;   // the positions the tile's last row sees
  const int span = ((n + PARTS - 1) / PARTS + BC - 1) / BC * BC;   // whole tiles a part
  const int first = part * span, last = min(n, first + span);
  if (first >= last) {   // a part past the positions: only its max is written, the combine skips the rest
    if (tid < HT && r0 + tid < ROWS) P[((size_t)(r0 + tid) * PARTS + part) * (DV + 2) + DV + 1] = NEG_INF;
    return;
  }
  const int seen = start_pos + min(r0 + tid, ROWS - 1) / H;   // row tid's last position (threads 0 .. 15)

  // the tile's q rows (zeros past ROWS)
  for (int c = tid; c < HT * D / 8; c += THREADS) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    copy16(&Qs[r * LDR + col], Q + (size_t)min(r0 + r, ROWS - 1) * D + col, r0 + r < ROWS);
  }
  copies_commit();
  copies_wait<0>();

  float o[VQ / 8][4];
  #pragma unroll
  for (int j = 0; j < VQ / 8; j++)
    #pragma unroll
    for (int e = 0; e < 4; e++) o[j][e] = 0.f;
  float m = NEG_INF, l = 0.f;   // row `tid`'s running max (base 2) and sum, in threads 0 .. 15

  for (int t0 = first; t0 < last; t0 += BC) {
    for (int c = tid; c < BC * D / 8; c += THREADS) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      copy16(&Rs[r * LDR + col], R + (size_t)min(t0 + r, L - 1) * D + col, t0 + r < L);
    }
    copies_commit();
    copies_wait<0>();
    __syncthreads();
    // this warp's part of the logits: heads x positions over every fourth 16 dimensions from warp * 16
    float s[2][4] = {};
    #pragma unroll
    for (int kk = warp; kk < D / 16; kk += 4) {
      const int k0 = kk * 16;
      unsigned a[4], b[4];
      ldmatrix4(a, &Qs[(lane & 15) * LDR + k0 + (lane >> 4) * 8]);
      ldmatrix4(b, &Rs[((lane & 7) + (lane >> 4) * 8) * LDR + k0 + ((lane >> 3) & 1) * 8]);
      mma16816(s[0], a, b[0], b[1]);
      mma16816(s[1], a, b[2], b[3]);
    }
    #pragma unroll
    for (int j = 0; j < 2; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) partial[warp][lane / 4 + (e >> 1) * 8][j * 8 + (lane & 3) * 2 + (e & 1)] = s[j][e];
    __syncthreads();
    if (tid < HT) {   // row tid: the tile's logits summed, scaled and masked, in base 2; the running max and sum
      float x[BC], top = m;
      #pragma unroll
      for (int j = 0; j < BC; j++) {
        x[j] = t0 + j < last && t0 + j <= seen ? (partial[0][tid][j] + partial[1][tid][j] + partial[2][tid][j] + partial[3][tid][j]) * (SCALE * LOG2E) : NEG_INF;
        top = fmaxf(top, x[j]);
      }
      const float ref = top == NEG_INF ? 0.f : top;   // a row that has seen no position yet weighs every one 0
      float sum = 0.f;
      #pragma unroll
      for (int j = 0; j < BC; j++) {
        const float e = exp2f(x[j] - ref);
        sum += e;
        Ps[tid * LDP + j] = __float2half(e);
      }
      keep[tid] = exp2f(m - ref);
      l = l * keep[tid] + sum;
      m = top;
    }
    __syncthreads();
    // the weights times this warp's value columns of the same rows
    const float k_lo = keep[lane / 4], k_hi = keep[lane / 4 + 8];
    #pragma unroll
    for (int j = 0; j < VQ / 8; j++) { o[j][0] *= k_lo; o[j][1] *= k_lo; o[j][2] *= k_hi; o[j][3] *= k_hi; }
    unsigned a[4];
    ldmatrix4(a, &Ps[(lane & 15) * LDP + (lane >> 4) * 8]);
    #pragma unroll
    for (int j = 0; j < VQ / 8; j += 2) {
      unsigned b[4];
      ldmatrix4_trans(b, &Rs[((lane & 7) + ((lane >> 3) & 1) * 8) * LDR + warp * VQ + j * 8 + (lane >> 4) * 8]);
      mma16816(o[j], a, b[0], b[1]);
      mma16816(o[j + 1], a, b[2], b[3]);
    }
    __syncthreads();   // every warp is done with this tile before the next one's copies overwrite it
  }
  // the part's sums, unnormalized, beside each row's denominator and max
  #pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = r0 + lane / 4 + 8 * r;
    if (row >= ROWS) continue;
    float* out = P + ((size_t)row * PARTS + part) * (DV + 2) + warp * VQ + (lane & 3) * 2;
    #pragma unroll
    for (int j = 0; j < VQ / 8; j++) *reinterpret_cast<float2*>(out + j * 8) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
  }
  if (tid < HT && r0 + tid < ROWS) {
    P[((size_t)(r0 + tid) * PARTS + part) * (DV + 2) + DV] = l;
    P[((size_t)(r0 + tid) * PARTS + part) * (DV + 2) + DV + 1] = m;
  }
}
