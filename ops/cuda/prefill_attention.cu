// A prompt chunk's attention over an fp16 KV cache as one tiled kernel (flash attention): T query rows per head, q
// [HKV * G, T, D] (fp16, rotated and normalized), row i at position start_pos + i, against the cache's keys K [HKV, L, D]
// and values V [HKV, L, DV] (fp16: V at V_OFFSET halfs after K where both are one buffer, else the argument after K,
// SEPARATE_V), this chunk's already written. Row i sees the keys at positions start_pos + i and before (and after
// start_pos + i - WINDOW, with a window). No [T, positions] score tensor: a block of four warps takes 64 rows of one
// query head, each warp 16, its q fragments held in registers; for each tile of 64 key positions the rows see, the
// tile's keys and values are copied to shared memory by cp.async (the values' copy in flight while the logits are
// multiplied), the logits (16 x 64 a warp) by mma.sync m16n8k16 in float32, scaled, soft-capped and masked, the rows'
// running max and sum updated (online softmax), and the weights, rounded to fp16 in the registers that hold them, times
// the values by mma.sync again. At the end each row's sums over its denominator (a sink's logit added, SINKS): O
// [HKV * G, T, DV] float32.
// The host defines NAME, HKV, G, D, DV, L, T, WINDOW (0: none), SCALE, SOFTCAP (0: none), SINKS, V_OFFSET and
// SEPARATE_V, the launch this code is written for (THREADS, four warps of 16 rows: BR query rows a block), which it checks,
// and START_POS where the position is a number rather than the chunk's variable (the kernel's last argument).
#if D % 16 || DV % 16 || D > 128 || DV > 128
#error "prefill_attention.cu takes key and value heads of 16 to 128 in steps of 16"
#endif
#if THREADS != 128 || BR != 64
#error "prefill_attention.cu is written for blocks of 128 threads and 64 query rows"
#endif
#define BC 64            // key positions a tile
#define LDK (D + 8)      // a shared key row's halfs: rows 16 bytes apart in banks, so ldmatrix's eight rows meet no bank twice
#define LDV (DV + 8)

__device__ __forceinline__ unsigned pack(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(float* __restrict__ O, const half* __restrict__ Q, CACHE_ARGS
#if SINKS
                                                          , const float* __restrict__ S
#endif
#ifdef START_POS
                                                          ) {
  const int start_pos = START_POS;
#else
                                                          , const int start_pos) {
#endif
  __shared__ __align__(128) half Ks[BC * LDK];   // also the chunk's q rows on their way into registers
  __shared__ __align__(128) half Vs[BC * LDV];
  const int h = blockIdx.y, kvh = h / G, q0 = blockIdx.x * BR, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const half *K = KEYS(kvh), *V = VALUES(kvh);

  // the block's q rows (zeros past T) through shared memory into each warp's A fragments, all of D at once
  for (int c = tid; c < BR * D / 8; c += THREADS) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    copy16(&Ks[r * LDK + col], Q + ((size_t)h * T + min(q0 + r, T - 1)) * D + col, q0 + r < T);
  }
  copies_commit();
  copies_wait<0>();
  __syncthreads();
  unsigned qa[D / 16][4];
  #pragma unroll
  for (int kk = 0; kk < D / 16; kk++) ldmatrix4(qa[kk], &Ks[(warp * 16 + (lane & 15)) * LDK + kk * 16 + (lane >> 4) * 8]);
  __syncthreads();

  // this thread's two rows of its warp's 16: lane / 4 and 8 below it, at absolute positions p[0], p[1]
  const int row0 = q0 + warp * 16 + (lane >> 2);
  const int p[2] = {start_pos + row0, start_pos + row0 + 8};
  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, o[DV / 8][4];
  #pragma unroll
  for (int j = 0; j < DV / 8; j++)
    #pragma unroll
    for (int e = 0; e < 4; e++) o[j][e] = 0.f;

  // the positions the block's rows see: from the first row's window (or 0) to its last row's own
  const int last_row = min(q0 + BR, T) - 1;
  const int lo = WINDOW ? max(0, start_pos + q0 - WINDOW + 1) : 0, hi = start_pos + last_row + 1;
  for (int t0 = lo / BC * BC; t0 < hi; t0 += BC) {
    for (int c = tid; c < BC * D / 8; c += THREADS) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      copy16(&Ks[r * LDK + col], K + (size_t)min(t0 + r, L - 1) * D + col, t0 + r < L);
    }
    copies_commit();
    for (int c = tid; c < BC * DV / 8; c += THREADS) {
      const int r = c / (DV / 8), col = (c % (DV / 8)) * 8;
      copy16(&Vs[r * LDV + col], V + (size_t)min(t0 + r, L - 1) * DV + col, t0 + r < L);
    }
    copies_commit();
    copies_wait<1>();   // the keys are in; the values may still be on their way
    __syncthreads();

    float s[BC / 8][4];   // the logits: 8 column fragments of 8 positions, rows lane/4 (0, 1) and +8 (2, 3)
    #pragma unroll
    for (int j = 0; j < BC / 8; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) s[j][e] = 0.f;
    #pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
      #pragma unroll
      for (int j = 0; j < BC / 8; j += 2) {   // keys j*8..j*8+15: lanes 0-7 rows 0-7 at the first 8 of K, 8-15 the next 8, 16-31 rows 8-15
        unsigned b[4];
        ldmatrix4(b, &Ks[(j * 8 + (lane & 7) + (lane >> 4) * 8) * LDK + kk * 16 + ((lane >> 3) & 1) * 8]);
        mma16816(s[j], qa[kk], b[0], b[1]);
        mma16816(s[j + 1], qa[kk], b[2], b[3]);
      }
    // scaled, soft-capped and masked, in base 2; the rows' running max and sum
    float top[2] = {m[0], m[1]};
    #pragma unroll
    for (int j = 0; j < BC / 8; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = t0 + j * 8 + (lane & 3) * 2 + (e & 1), r = e >> 1;
        float x = s[j][e] * SCALE;
        x = soft_cap(x, SOFTCAP);
        const bool seen = key <= p[r] && (!WINDOW || key > p[r] - WINDOW);
        s[j][e] = seen ? x * LOG2E : NEG_INF;
        top[r] = fmaxf(top[r], s[j][e]);
      }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 1));
      top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 2));
    }
    float sum[2] = {0.f, 0.f}, keep[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      const float ref = top[r] == NEG_INF ? 0.f : top[r];   // a row that has seen no position yet weighs every one 0
      keep[r] = exp2f(m[r] - ref);
      m[r] = top[r];
      top[r] = ref;
    }
    #pragma unroll
    for (int j = 0; j < BC / 8; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        s[j][e] = exp2f(s[j][e] - top[e >> 1]);
        sum[e >> 1] += s[j][e];
      }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l[r] = l[r] * keep[r] + sum[r];
    }
    #pragma unroll
    for (int j = 0; j < DV / 8; j++) {
      o[j][0] *= keep[0]; o[j][1] *= keep[0];
      o[j][2] *= keep[1]; o[j][3] *= keep[1];
    }
    copies_wait<0>();
    __syncthreads();
    // the weights times the values: the logits' fragments are the A fragments of the product, 16 positions a step
    #pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
      const unsigned a[4] = {pack(s[2 * kk][0], s[2 * kk][1]), pack(s[2 * kk][2], s[2 * kk][3]),
                             pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      #pragma unroll
      for (int j = 0; j < DV / 8; j += 2) {   // value columns j*8..j*8+15, the rows (positions) transposed into B's columns
        unsigned b[4];
        ldmatrix4_trans(b, &Vs[(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDV + j * 8 + (lane >> 4) * 8]);
        mma16816(o[j], a, b[0], b[1]);
        mma16816(o[j + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();   // every warp is done with this tile before the next one's copies overwrite it
  }
  // each row's sums over its denominator, a sink's logit joining it
  #pragma unroll
  for (int r = 0; r < 2; r++) {
    float denominator = l[r];
#if SINKS
    const float sink = S[h] * LOG2E, ref = m[r] == NEG_INF ? 0.f : m[r];
    denominator += exp2f(sink - ref);
#endif
    const int row = row0 + 8 * r;
    if (row >= T) continue;
    float* out = O + ((size_t)h * T + row) * DV + (lane & 3) * 2;
    #pragma unroll
    for (int j = 0; j < DV / 8; j++)
      *reinterpret_cast<float2*>(out + j * 8) = make_float2(o[j][2 * r] / denominator, o[j][2 * r + 1] / denominator);
  }
}
