"""int8_dot's matmul on the CPU as a kernel of its own, in C over x86's integer dot product instructions.

tinygrad renders dp4a on the CPU as four byte products in plain C (ops/dp4a.py), one word at a time, which clang does
not turn into vector code: the int8_dot kernels read their weights far below the memory's speed. This kernel sums 32
products of a weight block's quants and x's with one instruction or two, as llama.cpp's CPU dot products do: AVX-512
VNNI's or AVX-VNNI's vpdpbusd (unsigned bytes times signed ones, four products summed into each of 8 int32), else
AVX2's vpmaddubsw and vpmaddwd. Which is chosen from the CPU's flags where the kernel is made (`simd_path`) and named in
its source.

It reads the GGUF blocks as the file stores them (unaligned loads cost nothing here), so it also takes the types
int8_dot has no word layout for: Q5_0 and the K-quants Q4_K and Q6_K (the real gemma3 file's). x is quantized as
ggml's Q8_0 (quant/int8_dot.py's Int8Rows): a K-quant's block of 256 meets 8 of x's blocks, each sub-block its own
scale (two, for Q6_K's runs of 16). Each 32 products' integer sums are converted to float once and scaled by both
blocks' scales, 8 at a time, in 8 float sums a row. The quants are unsigned bytes: an offset (Q4_0's 8, Q5_0's 16) or a
min (Q4_1's, Q4_K's) comes off with the sum of x's quants in the block, taken once for every row; Q8_0's and Q6_K's
signed quants multiply x's with their signs moved onto x's (|w| * sign(w) x), whose products stay within vpmaddubsw's
16 bits.

The kernel reaches tinygrad through `Tensor.custom_kernel` as a program whose source is given: a store to the output
and a load of each input, never rendered, tell the scheduler what it writes and reads. Its rows are split over the
CPU's threads by a `core_id` parameter, as tinygrad's THREAD opt splits a kernel, four rows at a time sharing x's loads,
each block prefetched while the rows two groups before it are summed; against a prompt chunk's rows each weight block
is unpacked once for eight rows of x (X_AT_ONCE), not once for each.
"""
import dataclasses
import functools
import platform
from pathlib import Path
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from tinygrad.helpers import NUM_CPU_THREADS, prod
from tinygrad.uop.ops import KernelInfo, Ops, UOp
from quant.int8_dot import Int8Rows
from quant.qtensor import QTensor

# each path's CPU flags beyond AVX2, FMA and F16C, fastest first
PATHS = {"avx512_vnni": {"avx512_vnni", "avx512vl"}, "avx_vnni": {"avx_vnni"}, "avx2": set()}
TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K)
ROWS_AT_ONCE = 4
# rows of x a weight block is unpacked for at once (a prompt chunk's; decode's one row takes one): of 2, 4, 8, 16 and
# 32, 8 was fastest here
X_AT_ONCE = 8
PREFETCH_GROUPS = 2   # how many groups of rows ahead a block is prefetched: of 1, 2 and 3, 2 was fastest here

@functools.cache
def cpu_flags() -> frozenset[str]:
  """The flags of this machine's CPU (Linux's /proc/cpuinfo); none where it cannot be read."""
  try: text = Path("/proc/cpuinfo").read_text()
  except OSError: return frozenset()
  return frozenset(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))

def runnable_paths(flags: frozenset[str] | None = None) -> list[str]:
  """The PATHS that an x86-64 CPU with `flags` (this one's by default) runs, fastest first."""
  flags = cpu_flags() if flags is None else flags
  if platform.machine().lower() not in ("x86_64", "amd64"): return []
  return [path for path, needs in PATHS.items() if {"avx2", "fma", "f16c", *needs} <= flags]

def simd_path(flags: frozenset[str] | None = None) -> str | None:
  """The fastest path that a CPU with `flags` (this one's by default) runs; None for one without AVX2."""
  return next(iter(runnable_paths(flags)), None)

def applies(w: QTensor) -> bool:
  """Whether int8_dot_cpu computes matmuls of w: one matrix of a type in TYPES on the CPU, a CPU with a SIMD path."""
  device = w.blocks.device
  return isinstance(device, str) and device.split(":")[0] == "CPU" and w.ggml_type in TYPES and len(w.shape) == 2 and \
    simd_path() is not None

SOURCE = r"""
#include <immintrin.h>
typedef unsigned char u8;
typedef unsigned int u32;
#define INL static inline __attribute__((always_inline))
INL int tz_hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}
INL float tz_hsumf(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
INL float tz_f16(const u8* p) { __fp16 h; __builtin_memcpy(&h, p, 2); return (float)h; }
INL __m256i tz_load(const u8* p) { return _mm256_loadu_si256((const __m256i*)p); }
/* unsigned bytes u (each at most 128) times signed bytes x: each int32 the sum of four products */
INL __m256i tz_dot(__m256i u, __m256i x) {
#if PATH_AVX512_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#elif PATH_AVX_VNNI
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}
INL __m256i tz_signed_dot(__m256i w, __m256i x) { return tz_dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }
/* 16 bytes' low nibbles then their high ones: 32 unsigned bytes */
INL __m256i tz_nibbles(const u8* p) {
  __m128i raw = _mm_loadu_si128((const __m128i*)p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}
/* byte i 0x10 where bit i of the 32 bits is set, else 0 */
INL __m256i tz_bit_bytes(u32 bits) {
  const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
  b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}
/* one weight block against the blocks of NX rows of x (a row XSTEP blocks after the last): x, xs, xsum at the first row's
   first (xs a block's scale, xsum that times the sum of its quants); the block's quants are unpacked once for all NX,
   each row's integer sums times scales added to its acc and the rest to its fixed */
#define XSTEP (NB * XBLOCKS)
INL void tz_block(const u8* wb, const u32* x, const float* xs, const float* xsum, __m256* acc, float* fixed, const int nx) {
#define X(j, at) tz_load((const u8*)(x + 12 * ((j) * XSTEP + (at))))
#if TYPE_Q4_0 || TYPE_Q4_1 || TYPE_Q5_0
#if TYPE_Q4_0
  const __m256i q = tz_nibbles(wb + 2);
  const float d = tz_f16(wb), off = -8.0f * d;
#elif TYPE_Q4_1
  const __m256i q = tz_nibbles(wb + 4);
  const float d = tz_f16(wb), off = tz_f16(wb + 2);
#else
  u32 high; __builtin_memcpy(&high, wb + 2, 4);
  const __m256i q = _mm256_or_si256(tz_nibbles(wb + 6), tz_bit_bytes(high));
  const float d = tz_f16(wb), off = -16.0f * d;
#endif
  for (int j = 0; j < nx; j++) {
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tz_dot(q, X(j, 0))), _mm256_set1_ps(d * xs[j * XSTEP]), acc[j]);
    fixed[j] += off * xsum[j * XSTEP];
  }
#elif TYPE_Q8_0
  const __m256i w = tz_load(wb + 2), magnitude = _mm256_sign_epi8(w, w);
  const float d = tz_f16(wb);
  for (int j = 0; j < nx; j++)
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tz_dot(magnitude, _mm256_sign_epi8(X(j, 0), w))), _mm256_set1_ps(d * xs[j * XSTEP]), acc[j]);
#elif TYPE_Q4_K
  /* d, dmin, 12 bytes of 6-bit scales and mins of 8 sub-blocks, then 4 runs of 32 bytes: low nibbles sub-block 2j, high 2j + 1 */
  const float d = tz_f16(wb), dmin = tz_f16(wb + 2);
  const u8* s = wb + 4;
  for (int k = 0; k < 8; k++) {
    const int sc = k < 4 ? s[k] & 63 : (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
    const int mn = k < 4 ? s[k + 4] & 63 : (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
    const __m256i raw = tz_load(wb + 16 + 32 * (k / 2));
    const __m256i q = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(15));
    for (int j = 0; j < nx; j++) {
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tz_dot(q, X(j, k))), _mm256_set1_ps(d * sc * xs[j * XSTEP + k]), acc[j]);
      fixed[j] -= dmin * mn * xsum[j * XSTEP + k];
    }
  }
#elif TYPE_Q6_K
  /* 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales (one a run of 16), d: sub-block 4h + k takes its
     low 4 bits from byte l of run k % 2 of half h's low bytes (the high nibble for k >= 2), bits 2k of byte l of half h's
     high bytes */
  const float d = tz_f16(wb + 208);
  const signed char* sc = (const signed char*)(wb + 192);
  for (int b = 0; b < 8; b++) {
    const int h = b / 4, k = b % 4;
    __m256i low = tz_load(wb + 64 * h + 32 * (k % 2)), high = tz_load(wb + 128 + 32 * h);
    low = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(low, 4) : low, _mm256_set1_epi8(15));
    high = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(high, 2 * k), 4), _mm256_set1_epi8(0x30));
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32)), magnitude = _mm256_sign_epi8(q, q);
    const __m256 scale = _mm256_set_m128(_mm_set1_ps((float)sc[8 * h + 2 * k + 1]), _mm_set1_ps((float)sc[8 * h + 2 * k]));
    for (int j = 0; j < nx; j++) {
      const __m256 sums = _mm256_cvtepi32_ps(tz_dot(magnitude, _mm256_sign_epi8(X(j, b), q)));
      acc[j] = _mm256_fmadd_ps(sums, _mm256_mul_ps(scale, _mm256_set1_ps(d * xs[j * XSTEP + b])), acc[j]);
    }
  }
#endif
#undef X
}
/* weight rows r to r + count against rows n to n + nx of x (count and nx constants where inlined) */
INL void tz_tile(float* restrict out, const u32* restrict xq, const float* xs, const float* xsum, const u8* restrict w, int r,
                 const int count, int n, const int nx) {
  __m256 acc[ROWS_AT_ONCE][X_AT_ONCE]; float fixed[ROWS_AT_ONCE][X_AT_ONCE];
  for (int i = 0; i < count; i++)
    for (int j = 0; j < nx; j++) { acc[i][j] = _mm256_setzero_ps(); fixed[i][j] = 0.0f; }
  for (int b = 0; b < NB; b++) {
    const int at = n * XSTEP + b * XBLOCKS;
    for (int i = 0; i < count; i++) {
      /* the same block of the rows PREFETCH_GROUPS groups on: the memory prefetchers alone left a large matrix at half speed */
      _mm_prefetch((const char*)(w + ((long)(r + i + PREFETCH_GROUPS * ROWS_AT_ONCE) * NB + b) * BLOCK_BYTES), _MM_HINT_T0);
      tz_block(w + ((long)(r + i) * NB + b) * BLOCK_BYTES, xq + 12 * at, xs + at, xsum + at, acc[i], fixed[i], nx);
    }
  }
  for (int i = 0; i < count; i++)
    for (int j = 0; j < nx; j++) out[(n + j) * ROWS + r + i] = tz_hsumf(acc[i][j]) + fixed[i][j];
}
/* weight rows r to r + count against every row of x, X_AT_ONCE rows of x at a time */
INL void tz_rows(float* restrict out, const u32* restrict xq, const float* xs, const float* xsum, const u8* restrict w, int r, const int count) {
  int n = 0;
  for (; n + X_AT_ONCE <= N; n += X_AT_ONCE) tz_tile(out, xq, xs, xsum, w, r, count, n, X_AT_ONCE);
  for (; n < N; n++) tz_tile(out, xq, xs, xsum, w, r, count, n, 1);
}
void NAME(float* restrict out, const u32* restrict xq, const u8* restrict w, const int core_id) {
  const int groups = ROWS / ROWS_AT_ONCE, lo = core_id * groups / THREADS * ROWS_AT_ONCE;
  const int hi = core_id == THREADS - 1 ? ROWS : (core_id + 1) * groups / THREADS * ROWS_AT_ONCE;
  float xs[N * NB * XBLOCKS], xsum[N * NB * XBLOCKS];
  for (int b = 0; b < N * NB * XBLOCKS; b++) {
    xs[b] = __builtin_bit_cast(float, xq[12 * b + 8]);
    xsum[b] = xs[b] * (float)tz_hsum(tz_dot(_mm256_set1_epi8(1), tz_load((const u8*)(xq + 12 * b))));
  }
  int r = lo;
  for (; r + ROWS_AT_ONCE <= hi; r += ROWS_AT_ONCE) tz_rows(out, xq, xs, xsum, w, r, ROWS_AT_ONCE);
  for (; r < hi; r++) tz_rows(out, xq, xs, xsum, w, r, 1);
}
"""

def source(name: str, w: QTensor, n: int, threads: int, path: str) -> str:
  """The kernel's C for w's rows against `n` rows of x, split over `threads`, by `path`."""
  fmt = w.format
  defines = {"N": n, "ROWS": w.shape[0], "NB": w.shape[1] // fmt.block_elems, "BLOCK_BYTES": fmt.block_bytes,
             "XBLOCKS": fmt.block_elems // 32, "THREADS": threads, "ROWS_AT_ONCE": ROWS_AT_ONCE, "X_AT_ONCE": X_AT_ONCE,
             "PREFETCH_GROUPS": PREFETCH_GROUPS,
             **{f"TYPE_{t.name}": int(t is w.ggml_type) for t in TYPES}, **{f"PATH_{p.upper()}": int(p == path) for p in PATHS}}
  return "\n".join(f"#define {k} {v}" for k, v in defines.items()) + SOURCE.replace("NAME", name)

def int8_dot_cpu(w: QTensor, x: Int8Rows, path: str | None = None) -> Tensor:
  """x @ w.T for one matrix w [O, in] on the CPU (where `applies`), x [..., in] quantized -> [..., O] float32, by
  `path` (simd_path()'s by default)."""
  if path is None and (path := simd_path()) is None: raise ValueError("int8_dot_cpu needs an x86-64 CPU with AVX2, FMA and F16C")
  if not all(isinstance(s, int) for s in x.blocks.shape): raise ValueError(f"int8_dot_cpu needs x of a fixed shape, not {x.blocks.shape}")
  rows, lead = w.shape[0], x.blocks.shape[:-2]
  n, threads = prod(lead), max(1, min(NUM_CPU_THREADS.value, rows // ROWS_AT_ONCE))
  name = f"r_int8_dot_{w.ggml_type.name}_{n}x{w.shape[1]}x{rows}_{path}"   # r_: a reduce, as tinygrad names them
  code = source(name, w, n, threads, path)

  def program(*params: UOp) -> UOp:
    out, *ins = [p.flatten() for p in params]
    # the kernel's last argument, after the buffers (a variable's slot is its place among the arguments)
    core_id = UOp.variable("core_id", 0, threads - 1, dtypes.int32, param=True)
    core_id = core_id.replace(arg=dataclasses.replace(core_id.arg, slot=len(params)))
    # what the kernel writes and reads, for the scheduler: never rendered (the source is given)
    first = UOp.const(0, dtypes.int)
    read = sum((b.index(first).load().cast(dtypes.float32) for b in ins), core_id.cast(dtypes.float32))
    sink = UOp.sink(out.index(first).store(read), arg=KernelInfo(name=name))
    return UOp(Ops.PROGRAM, src=(sink, UOp(Ops.LINEAR, src=params), UOp(Ops.SOURCE, arg=code)))
  out = Tensor.empty(n, rows, dtype=dtypes.float32, device=w.blocks.device)
  return Tensor.custom_kernel(out, x.blocks, w.blocks, fxn=program)[0].reshape(*lead, rows)
