// C[M, N] (float32) = A[M, K] . W[N, K]^T: a prompt chunk's rows (fp16, row-major) against a weight's rows read as they
// are stored: fp16 (WEIGHTS 0), the word layout of a 32-element block format (quant/words.py: a block's quants as 32-bit
// words, its scale apart; WEIGHTS 1 Q4_0, 2 Q8_0, 3 MXFP4), or GGUF's super-blocks of 256 elements as they are (WEIGHTS 4:
// Q4_K's 144 bytes, 16-byte aligned: d, dmin and the 6-bit scales and mins in the first 16; WEIGHTS 5: Q6_K's 210 bytes,
// 2-byte aligned, read 16 bits at a time: the quants' low 4 bits, their high 2, 16 int8 scales, d), or Q5_0's blocks as
// they are (WEIGHTS 6: 22 bytes a 32 elements, 2-byte aligned: d, the quants' fifth bits, their low 4), dequantized to
// fp16 on their way into shared memory, so that no pass of its own writes the weights out in fp16 first. GROUPED 1: a
// MoE's expert weights [experts, N, ...] against a chunk's rows sorted into tiles of BM rows that share an expert
// (ops/routing.py ExpertGroups), E[tile] each tile's expert: a block reads its tile's expert alone (E -1: an empty tile, zeros).
// A block of 256 threads computes a BM x 128 tile of C (BM 128, or 64 where 128-row tiles leave SMs idle; grouped, the
// expert tile's 32, 64 or 128), eight warps of
// BM/2 x 32 each, over K in steps of 32 (one quant block): A's tiles (and fp16 W's) copied to shared memory by cp.async
// three steps deep; packed W's words loaded into registers two steps ahead and decoded into a shared tile one step
// ahead; read by ldmatrix and multiplied by mma.sync m16n8k16 with float32 sums. Rows of A or W past M or N are read as
// zeros (or a repeat of the last row) and their outputs not stored; K is a multiple of 32.
// The host defines NAME, M, N, K, WEIGHTS, GROUPED and the tiling this code is written for (BM, BN, BK, THREADS), which it checks.
#if (BM != 128 && BM != 64 && BM != 32) || BN != 128 || BK != 32 || THREADS != 256 || WEIGHTS < 0 || WEIGHTS > 6 || ((WEIGHTS == 4 || WEIGHTS == 5) && K % 256)
#error "gemm_mma.cu is written for tiles of 128, 64 or 32 x 128, K steps of 32, 256 threads and weights 0-6 (super-blocks: K a multiple of 256)"
#endif
#define MI (BM / 32)      // a warp's 16-row fragments of A
#define STAGES 3          // cp.async stages of A (and of fp16 W)
#define BLOCKS (K / 32)   // a packed row's blocks
#if WEIGHTS == 2
#define WORDS 8           // a Q8_0 block's 32 bytes
#else
#define WORDS 4           // a 4-bit block's 16 bytes
#endif

// a shared tile's rows are BK halfs, four 16-byte chunks; chunk c of row r lies at chunk c ^ ((r / 2) % 4), so that the
// eight rows ldmatrix reads at one chunk, and cp.async's stores, meet no bank twice
__device__ __forceinline__ int at(int r, int c) { return r * BK + ((c ^ ((r >> 1) & 3)) << 3); }

#if WEIGHTS == 4
// two quants of a word's bytes k and k+1, `shift` bits up in each byte and 4 bits wide, as a half2 of sc * q - mn (in
// float32, rounded once, as gguf's dequantization computes them)
__device__ __forceinline__ unsigned decode2_min(unsigned w, int k, int shift, float sc, float mn) {
  unsigned bits = (__byte_perm(w >> shift, 0, k == 0 ? 0x4140 : 0x4342) & 0x000F000Fu) | 0x64006400u;   // 1024 + q, exactly
  const float2 q = __half22float2(*reinterpret_cast<__half2*>(&bits));
  __half2 v = __floats2half2_rn((q.x - 1024.f) * sc - mn, (q.y - 1024.f) * sc - mn);
  return *reinterpret_cast<unsigned*>(&v);
}
#elif WEIGHTS >= 5
// two quants of bytes k and k+1 of a word of low bits l (4 bits, `low` up in each byte), their high bits `hi` in place
// (bits 4 and 5 of each 16-bit lane), as a half2 of sc * (q - zero) (in float32, rounded once, as gguf's dequantization
// computes them)
__device__ __forceinline__ unsigned decode2_high(unsigned l, int k, int low, unsigned hi, float sc, float zero) {
  unsigned bits = ((__byte_perm(l, 0, k == 0 ? 0x4140 : 0x4342) >> low) & 0x000F000Fu) | hi | 0x64006400u;
  const float2 q = __half22float2(*reinterpret_cast<__half2*>(&bits));   // 1024 + q, exactly
  __half2 v = __floats2half2_rn((q.x - 1024.f - zero) * sc, (q.y - 1024.f - zero) * sc);
  return *reinterpret_cast<unsigned*>(&v);
}
#if WEIGHTS == 5
// Q6_K: the high bits of bytes k and k+1 of a word h of them, 2 bits `high` up in each byte
__device__ __forceinline__ unsigned high2(unsigned h, int k, int high) {
  return ((__byte_perm(h, 0, k == 0 ? 0x4140 : 0x4342) >> high) & 0x00030003u) << 4;
}
#else
// Q5_0: the fifth bits of quants i and i + 1, bits i and i + 1 of h
__device__ __forceinline__ unsigned high1(unsigned h, int i) { return ((h >> i) & 1u) << 4 | ((h >> (i + 1)) & 1u) << 20; }
#endif
#elif WEIGHTS
// two quants of a word's bytes k and k+1 (k = 0 or 2), `shift` bits up in each byte and 4 or 8 bits wide, as a half2
// of their values before the block's scale; `scale`: the block's, as a half2
__device__ __forceinline__ unsigned decode2(unsigned w, int k, int shift, __half2 scale) {
  unsigned q = __byte_perm(w >> shift, 0, k == 0 ? 0x4140 : 0x4342);   // bytes k, k+1 in the low bytes of 16-bit lanes
#if WEIGHTS == 3
  // E2M1: its magnitude bits in an fp16's exponent and mantissa are its value times 2^-14, subnormals included; sign apart
  unsigned bits = ((q & 0x00070007u) << 9) | ((q & 0x00080008u) << 12);
  __half2 v = __hmul2(*reinterpret_cast<__half2*>(&bits), __float2half2_rn(16384.f));   // exact
#else
  // 1024 + u exactly as an fp16 (u in its low mantissa bits), less 1024 and the format's offset, both exact: u is a
  // Q4_0 quant (offset 8) or a Q8_0 int8 with its sign bit flipped (q + 128)
#if WEIGHTS == 2
  unsigned bits = ((q & 0x00FF00FFu) ^ 0x00800080u) | 0x64006400u;
#else
  unsigned bits = (q & 0x000F000Fu) | 0x64006400u;
#endif
  __half2 v = __hsub2(*reinterpret_cast<__half2*>(&bits), __float2half2_rn(WEIGHTS == 2 ? 1152.f : 1032.f));
#endif
  v = __hmul2(v, scale);
  return *reinterpret_cast<unsigned*>(&v);
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS) NAME(float* __restrict__ C, const half* __restrict__ A,
#if WEIGHTS == 0
                                                         const half* __restrict__ W
#elif WEIGHTS == 4
                                                         const uint4* __restrict__ Wb
#elif WEIGHTS >= 5
                                                         const unsigned short* __restrict__ Wh
#elif WEIGHTS == 3
                                                         const unsigned* __restrict__ Wq, const unsigned char* __restrict__ We
#else
                                                         const unsigned* __restrict__ Wq, const half* __restrict__ Wd
#endif
#if GROUPED
                                                         , const int* __restrict__ E
#endif
                                                         ) {
  __shared__ __align__(128) half As[STAGES][BM * BK];
#if WEIGHTS == 0
  __shared__ __align__(128) half Bs[STAGES][BN * BK];
#else
  __shared__ __align__(128) half Bs[2][BN * BK];
#endif
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

  // one step's copies by cp.async: BM rows of A (and 128 of fp16 W), four 16-byte chunks a row
  auto copy = [&](int stage, int step) {
    const int k0 = step * BK;
    #pragma unroll
    for (int i = 0; i < (BM * 4 + THREADS - 1) / THREADS; i++) {
      const int c = tid + i * THREADS, r = c >> 2, gm = m0 + r;
      if (BM * 4 % THREADS && c >= BM * 4) break;   // 32-row tiles: half the threads copy A
      copy16(&As[stage][at(r, c & 3)], A + (size_t)(gm < M ? gm : M - 1) * K + k0 + (c & 3) * 8, gm < M);
    }
#if WEIGHTS == 0
    #pragma unroll
    for (int i = 0; i < BN * 4 / THREADS; i++) {
      const int c = tid + i * THREADS, r = c >> 2, gn = n0 + r;
      copy16(&Bs[stage][at(r, c & 3)], W + (expert * N + (gn < N ? gn : N - 1)) * K + k0 + (c & 3) * 8, gn < N);
    }
#endif
    copies_commit();
  };

#if WEIGHTS
  // packed W: two threads a row, each half of the row's block in this step (rows past N repeat the last one)
  const int wr = tid >> 1, wh = tid & 1, gn = n0 + wr < N ? n0 + wr : N - 1;
  uint4 q;        // the words of the step being fetched
#if WEIGHTS == 4
  float sc, mn;   // and its sub-block's scale and min (d times its 6-bit scale, dmin times its 6-bit min)
  int shift;      // and the nibble its quants are in
  auto fetch = [&](int step) {
    // step's 32 elements: sub-block j = step % 8 of super-block step / 8; of 64-element group j / 2, whose quant bytes
    // hold sub-block j's in their low nibbles where j is even, else in their high ones, this thread's 16 bytes
    const uint4* super = Wb + ((expert * N + gn) * (K / 256) + step / 8) * 9;
    const int j = step & 7;
    q = super[1 + 2 * (j >> 1) + wh];
    shift = 4 * (j & 1);
    const uint4 head = super[0];
    const unsigned scales[3] = {head.y, head.z, head.w};
    auto byte = [&](int i) { return (scales[i >> 2] >> (8 * (i & 3))) & 0xFFu; };
    const unsigned s6 = j < 4 ? byte(j) & 63 : (byte(j + 4) & 15) | ((byte(j - 4) >> 6) << 4);
    const unsigned m6 = j < 4 ? byte(j + 4) & 63 : (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&head.x));   // d, dmin
    sc = dm.x * (float)s6; mn = dm.y * (float)m6;
  };
  // the fetched quants decoded into stage `stage` of W's shared tile: elements 16 wh .. 16 wh + 15, two chunks
  auto decode = [&](int stage) {
    const uint4 lo = make_uint4(decode2_min(q.x, 0, shift, sc, mn), decode2_min(q.x, 2, shift, sc, mn), decode2_min(q.y, 0, shift, sc, mn),
                                decode2_min(q.y, 2, shift, sc, mn));
    const uint4 hi = make_uint4(decode2_min(q.z, 0, shift, sc, mn), decode2_min(q.z, 2, shift, sc, mn), decode2_min(q.w, 0, shift, sc, mn),
                                decode2_min(q.w, 2, shift, sc, mn));
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh)]) = lo;
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh + 1)]) = hi;
  };
#elif WEIGHTS == 5
  uint4 qh;       // and the high bits of its quants
  float sc;       // and its 16 elements' scale (d times their int8 scale)
  int low, high;  // and where its quants' bits are in their bytes
  auto fetch = [&](int step) {
    // step's 32 elements: group g = j % 4 of half j / 4 (j = step % 8) of super-block step / 8, this thread's 16 of them;
    // a half's 64 bytes of low bits hold groups 0 and 1 in their low nibbles, 2 and 3 in their high ones, its 32 bytes
    // of high bits all four, two bits each
    const unsigned short* super = Wh + ((expert * N + gn) * (K / 256) + step / 8) * 105;
    const int j = step & 7, upper = j >> 2, g = j & 3;   // upper: the super-block's second 128 elements
    const unsigned short* l16 = super + (upper * 64 + (g & 1) * 32 + 16 * wh) / 2;
    const unsigned short* h16 = super + (128 + upper * 32 + 16 * wh) / 2;
    auto word = [](const unsigned short* p, int i) { return (unsigned)p[2 * i] | ((unsigned)p[2 * i + 1] << 16); };
    q = make_uint4(word(l16, 0), word(l16, 1), word(l16, 2), word(l16, 3));
    qh = make_uint4(word(h16, 0), word(h16, 1), word(h16, 2), word(h16, 3));
    low = 4 * (g >> 1); high = 2 * g;
    const int scale = (int)(signed char)(super[96 + (upper * 8 + wh + 2 * g) / 2] >> (8 * ((upper * 8 + wh + 2 * g) & 1)));
    sc = __half2float(*reinterpret_cast<const half*>(super + 104)) * (float)scale;
  };
  auto decode = [&](int stage) {
    const unsigned w[4] = {q.x, q.y, q.z, q.w}, h[4] = {qh.x, qh.y, qh.z, qh.w};
    unsigned v[8];
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = decode2_high(w[i / 2], 2 * (i & 1), low, high2(h[i / 2], 2 * (i & 1), high), sc, 32.f);
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh)]) = make_uint4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh + 1)]) = make_uint4(v[4], v[5], v[6], v[7]);
  };
#elif WEIGHTS == 6
  unsigned qh;    // and the fifth bits of its quants
  float sc;       // and its block's scale
  auto fetch = [&](int step) {
    // step's 32 elements: block `step` of the row (d, 4 bytes of fifth bits, 16 of low nibbles: elements 0-15 in the
    // low ones, 16-31 in the high), this thread's 16 of them
    const unsigned short* block = Wh + ((expert * N + gn) * BLOCKS + step) * 11;
    q = make_uint4((unsigned)block[3] | (unsigned)block[4] << 16, (unsigned)block[5] | (unsigned)block[6] << 16,
                   (unsigned)block[7] | (unsigned)block[8] << 16, (unsigned)block[9] | (unsigned)block[10] << 16);
    qh = block[1 + wh];
    sc = __half2float(*reinterpret_cast<const half*>(block));
  };
  auto decode = [&](int stage) {
    const unsigned w[4] = {q.x, q.y, q.z, q.w};
    unsigned v[8];
    #pragma unroll
    for (int i = 0; i < 8; i++) v[i] = decode2_high(w[i / 2], 2 * (i & 1), 4 * wh, high1(qh, 2 * i), sc, 16.f);
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh)]) = make_uint4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh + 1)]) = make_uint4(v[4], v[5], v[6], v[7]);
  };
#else
  __half2 scale;  // and its block's scale
  auto fetch = [&](int step) {
    const size_t block = (expert * N + gn) * BLOCKS + step;
    const unsigned* words = Wq + block * WORDS;
#if WEIGHTS == 2
    q = *reinterpret_cast<const uint4*>(words + 4 * wh);   // bytes 16h..16h+15: elements 16h..16h+15
    scale = __half2half2(Wd[block]);
#else
    const uint2 w2 = *reinterpret_cast<const uint2*>(words + 2 * wh);   // bytes 8h..8h+7: elements 8h.. (low), 16+8h.. (high)
    q.x = w2.x; q.y = w2.y;
#if WEIGHTS == 3
    scale = __float2half2_rn(ldexpf(1.f, (int)We[block] - 127));   // E8M0: 2^(e-127)
#else
    scale = __half2half2(Wd[block]);
#endif
#endif
  };
  // the fetched words decoded into stage `stage` of W's shared tile: two 16-byte chunks a thread
  auto decode = [&](int stage) {
    uint4 lo, hi;
#if WEIGHTS == 2
    lo = make_uint4(decode2(q.x, 0, 0, scale), decode2(q.x, 2, 0, scale), decode2(q.y, 0, 0, scale), decode2(q.y, 2, 0, scale));
    hi = make_uint4(decode2(q.z, 0, 0, scale), decode2(q.z, 2, 0, scale), decode2(q.w, 0, 0, scale), decode2(q.w, 2, 0, scale));
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh)]) = lo;
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 * wh + 1)]) = hi;
#else
    lo = make_uint4(decode2(q.x, 0, 0, scale), decode2(q.x, 2, 0, scale), decode2(q.y, 0, 0, scale), decode2(q.y, 2, 0, scale));
    hi = make_uint4(decode2(q.x, 0, 4, scale), decode2(q.x, 2, 4, scale), decode2(q.y, 0, 4, scale), decode2(q.y, 2, 4, scale));
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, wh)]) = lo;
    *reinterpret_cast<uint4*>(&Bs[stage][at(wr, 2 + wh)]) = hi;
#endif
  };
#endif
#endif

  const int steps = K / BK;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < steps) copy(s, s);
    else copies_commit();
  }
#if WEIGHTS
  fetch(0);
  decode(0);
  if (steps > 1) fetch(1);
#endif
  for (int t = 0; t < steps; t++) {
    copies_wait<STAGES - 2>();
    __syncthreads();   // step t's tiles are in; every warp is past step t-1, whose stage the next copy takes
    if (t + STAGES - 1 < steps) copy((t + STAGES - 1) % STAGES, t + STAGES - 1);
    else copies_commit();
    const half* as = As[t % STAGES];
#if WEIGHTS == 0
    const half* bs = Bs[t % STAGES];
#else
    const half* bs = Bs[t & 1];
#endif
    #pragma unroll
    for (int kk = 0; kk < BK / 8; kk += 2) {   // two chunks (16 of K) a product
      unsigned a[MI][4], b[4][2], r[4];
      // A's 16 x 16 fragments: lanes 0-15 give rows 0-15 at the first chunk, lanes 16-31 the same rows at the second
      #pragma unroll
      for (int i = 0; i < MI; i++) ldmatrix4(a[i], as + at(wm + i * 16 + (lane & 15), kk + (lane >> 4)));
      // W's 16 x 8 fragments two at a time: lanes 0-7 rows (n) 0-7 at the first chunk, 8-15 at the second, 16-31 rows 8-15
      #pragma unroll
      for (int j = 0; j < 4; j += 2) {
        ldmatrix4(r, bs + at(wn + j * 8 + (lane & 7) + (lane >> 4) * 8, kk + ((lane >> 3) & 1)));
        b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
      }
      #pragma unroll
      for (int i = 0; i < MI; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++) mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
    }
#if WEIGHTS
    // step t+1's words into the stage step t-1 read (every warp is past it), then step t+2's fetched
    if (t + 1 < steps) {
      decode((t + 1) & 1);
      if (t + 2 < steps) fetch(t + 2);
    }
#endif
  }
  store_sums(C, acc, m0 + wm, n0 + wn, lane);
}
