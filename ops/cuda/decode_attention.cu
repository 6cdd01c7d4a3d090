// A decode step's attention over an fp16 KV cache, split over the positions (flash-decoding): one query row per head,
// q [HKV * G, D] (float32, rotated and normalized already, rounded to fp16 as a half cache's logits take it), the cache's
// keys K [HKV, L, D] and values V [HKV, L, DV] (fp16: V at V_OFFSET halfs after K where both are one buffer, else the
// argument after K, SEPARATE_V). Positions
// lo .. start_pos are read (lo = start_pos + 1 - WINDOW with a sliding window, else 0).
//   NAME_parts: a block of 128 threads for each kv head and each of PARTS parts of the positions read; the G query heads
//     of the kv head share each key and value it loads. A warp takes tiles of 32 positions: each lane one position's
//     logits for the G heads (its key row loaded 16 bytes at a time, all of a batch's loads issued before their sums);
//     the warp's running max and sum per head (online softmax), the weights left in shared memory; then the tile's
//     values, VL lanes a row (each 16 bytes of it), VR rows at once, all of a batch's loads again issued before their
//     sums, so that many rows are in flight rather than one. The row groups' sums are added across lanes at the end,
//     the block's four warps combined in shared memory and the part's sums written unnormalized beside their max and
//     denominator: P [HKV * G, PARTS, DV + 2].
//   NAME_combine (common.cuh): the parts combined, O [HKV * G, DV].
// The host defines NAME, HKV, G, D, DV, L, PARTS, WINDOW (0: none), SCALE, SOFTCAP (0: none), SINKS, V_OFFSET, SEPARATE_V and
// THREADS (a multiple of 32), and START_POS where the position is a number rather than the decode step's variable (the
// kernel's last argument).
#if D % 8 || DV % 32 || DV > 256 || G > 16
#error "decode_attention.cu takes head sizes of whole 16-byte rows, value heads of 32 to 256 in steps of 32 and up to 16 query heads a kv head"
#endif
#if THREADS % 32
#error "decode_attention.cu takes whole warps"
#endif
#define WARPS (THREADS / 32)
#define BATCH 8          // 16-byte loads a lane issues before it sums them
#define CHUNKS (DV / 8)  // 16-byte pieces of a value row
#define VL (CHUNKS <= 4 ? 4 : CHUNKS <= 8 ? 8 : CHUNKS <= 16 ? 16 : 32)   // lanes a value row
#define VR (32 / VL)     // value rows a warp reads at once
#define VSTEPS (32 / VR) // reads of VR rows a tile
#if (G * D + WARPS * G * (DV + 2)) * 4 > 48 * 1024
#error "decode_attention.cu keeps a block's query rows and its warps' sums in 48 KB of shared memory"
#endif

__device__ __forceinline__ float warp_max(float x) {
  #pragma unroll
  for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  #pragma unroll
  for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

extern "C" __global__ void __launch_bounds__(THREADS) CAT(NAME, _parts)(float* __restrict__ P, const float* __restrict__ Q,
                                                                       CACHE_ARGS
#ifdef START_POS
                                                                       ) {
  const int start_pos = START_POS;   // a position known where the kernel is made (not a decode step's variable)
#else
                                                                       , const int start_pos) {
#endif
  __shared__ float qs[G][D];
  __shared__ float wm[WARPS][G], wl[WARPS][G], wacc[WARPS][G][DV];
  const int kvh = blockIdx.y, part = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const half *K = KEYS(kvh), *V = VALUES(kvh);
  const int n = start_pos + 1, lo = WINDOW && n > WINDOW ? n - WINDOW : 0;
  const int span = ((n - lo + PARTS - 1) / PARTS + 31) / 32 * 32;   // whole tiles of 32 positions a part
  const int first = lo + part * span, last = min(n, first + span);
  if (first >= last) {   // a part past the position: only its max is written, the combine skips the rest
    for (int g = tid; g < G; g += THREADS) P[((size_t)(kvh * G + g) * PARTS + part) * (DV + 2) + DV + 1] = NEG_INF;
    return;
  }
  for (int i = tid; i < G * D; i += THREADS) qs[i / D][i % D] = __half2float(__float2half(Q[(size_t)kvh * G * D + i]));
  __syncthreads();

  // this lane's piece of the value rows (VL lanes a row, the lanes of one row group VR rows apart) and its sums of it
  const int chunk = lane % VL, group = lane / VL;
  float (*weights)[G] = reinterpret_cast<float (*)[G]>(&wacc[warp][0][0]);   // a tile's weights, in this warp's sums' room
  float m[G], l[G], acc[G][8];
  #pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = NEG_INF; l[g] = 0.f;
    #pragma unroll
    for (int c = 0; c < 8; c++) acc[g][c] = 0.f;
  }
  for (int t0 = first + warp * 32; t0 < last; t0 += THREADS) {
    const int j = t0 + lane;
    float s[G];
    #pragma unroll
    for (int g = 0; g < G; g++) s[g] = 0.f;
    if (j < last) {
      const uint4* krow = reinterpret_cast<const uint4*>(K + (size_t)j * D);
      #pragma unroll
      for (int c0 = 0; c0 < D / 8; c0 += BATCH) {
        uint4 w[BATCH];
        #pragma unroll
        for (int c = 0; c < BATCH; c++) if (c0 + c < D / 8) w[c] = krow[c0 + c];
        #pragma unroll
        for (int c = 0; c < BATCH; c++) {
          if (c0 + c >= D / 8) continue;
          const half2* h = reinterpret_cast<const half2*>(&w[c]);
          #pragma unroll
          for (int e = 0; e < 4; e++) {
            const float2 k2 = __half22float2(h[e]);
            #pragma unroll
            for (int g = 0; g < G; g++) s[g] += qs[g][(c0 + c) * 8 + 2 * e] * k2.x + qs[g][(c0 + c) * 8 + 2 * e + 1] * k2.y;
          }
        }
      }
    }
    #pragma unroll
    for (int g = 0; g < G; g++) {
      float x = s[g] * SCALE;
      x = soft_cap(x, SOFTCAP);
      x = j < last ? x * LOG2E : NEG_INF;   // logits in base 2 from here on
      const float top = fmaxf(m[g], warp_max(x));
      const float keep = exp2f(m[g] - top);   // top is finite: the tile's first position is read
      weights[lane][g] = exp2f(x - top);      // 0 past `last`
      m[g] = top;
      l[g] = l[g] * keep + warp_sum(weights[lane][g]);
      #pragma unroll
      for (int c = 0; c < 8; c++) acc[g][c] *= keep;
    }
    __syncwarp();
    // the tile's values: rows past `last` are not read (the cache there is unwritten)
    const int count = min(32, last - t0);
    #pragma unroll
    for (int s0 = 0; s0 < VSTEPS; s0 += BATCH) {
      uint4 w[BATCH];
      #pragma unroll
      for (int b = 0; b < BATCH; b++) {
        const int r = (s0 + b) * VR + group;
        if (s0 + b < VSTEPS && r < count && chunk < CHUNKS) w[b] = reinterpret_cast<const uint4*>(V + (size_t)(t0 + r) * DV)[chunk];
      }
      #pragma unroll
      for (int b = 0; b < BATCH; b++) {
        const int r = (s0 + b) * VR + group;
        if (s0 + b >= VSTEPS || r >= count || chunk >= CHUNKS) continue;
        const half2* h = reinterpret_cast<const half2*>(&w[b]);
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const float2 v2 = __half22float2(h[e]);
          #pragma unroll
          for (int g = 0; g < G; g++) {
            acc[g][2 * e] += weights[r][g] * v2.x;
            acc[g][2 * e + 1] += weights[r][g] * v2.y;
          }
        }
      }
    }
    __syncwarp();
  }
  // the row groups' sums added: lanes `chunk` of group 0 hold the warp's
  #pragma unroll
  for (int o = VL; o < 32; o <<= 1) {
    #pragma unroll
    for (int g = 0; g < G; g++) {
      #pragma unroll
      for (int c = 0; c < 8; c++) acc[g][c] += __shfl_xor_sync(0xffffffffu, acc[g][c], o);
    }
  }
  // the block's warps combined: rescaled to their largest max, summed
  #pragma unroll
  for (int g = 0; g < G; g++) {
    if (lane == 0) { wm[warp][g] = m[g]; wl[warp][g] = l[g]; }
    if (group == 0 && chunk < CHUNKS) {
      #pragma unroll
      for (int c = 0; c < 8; c++) wacc[warp][g][chunk * 8 + c] = acc[g][c];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * (DV + 2); i += THREADS) {
    const int g = i / (DV + 2), col = i % (DV + 2);
    float top = NEG_INF;
    #pragma unroll
    for (int w = 0; w < WARPS; w++) top = fmaxf(top, wm[w][g]);
    float out = top;   // column DV + 1: the part's max (-inf for a part with no positions)
    if (col <= DV) {
      out = 0.f;
      #pragma unroll
      for (int w = 0; w < WARPS; w++) {
        if (wm[w][g] == NEG_INF) continue;
        out += (col < DV ? wacc[w][g][col] : wl[w][g]) * exp2f(wm[w][g] - top);
      }
    }
    P[((size_t)(kvh * G + g) * PARTS + part) * (DV + 2) + col] = out;
  }
}
