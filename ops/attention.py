"""Scaled dot-product attention over a KV cache: `attention` is the plain path, `fused_attention` the same computed from
cheaper reads, each a named function beside the plain path's pieces and tested against it (tests/ops/test_attention.py).

Layouts: q [B, Hq, T, D], caches k [B, Hkv, L, D] and v [B, Hkv, L, Dv] (L positions allocated, a multiple of CHUNK);
Hq is a multiple of Hkv and query head h reads kv head h // (Hq // Hkv) (grouped-query attention). Query row i sits at
absolute position start_pos + i and key column j at position j; the cache holds start_pos + T valid positions. Key j is
visible to query i when j <= start_pos + i, and with a sliding window also when j > start_pos + i - window. start_pos
may be a bound symbolic variable (TinyJit decode).

The plain path: logits q.k * scale in float32 (a half cache meets q rounded to half, as llama.cpp's half KV cache does),
soft-capped (`soft_capped`), masked (`visible`), softmax stabilized by their max, times the values (`softmax_values`).
Without `upcast` fp16 operands (a half cache's keys and values, a half chunk's GEMM inputs) are multiplied as they are,
each sum rounded to fp16, where they are cast up to float32 first (the casts tinygrad would otherwise be left without).
A sink (gpt-oss) is one learned logit per query head that joins the softmax denominator and contributes no value.
Attention reads the cache in chunks of CHUNK positions, as many as hold the valid ones, and masks the rest: the sums
over positions then have a static inner axis that a GPU spreads over threads, where over the valid prefix alone (a
symbolic length) each thread walked every position in turn. A sliding window's layer reads only the newest chunks its
window reaches (`chunks_read`). The variant `whole` reads every chunk the cache allocated:
static shapes and loop bounds at every position, at the cost of reading (and masking) the whole cache every step.

Split into parts (`split`, flash-decoding): a decode step's value sum is one sum over every position read, few outputs
(heads times Dv) for a long reduce, which a GPU spreads over only a few workgroups at long context. Split, each part's
sums (a part: `split` chunks) are realized ([heads, parts, Dv + 1]: a workgroup per head and part) and a second kernel
adds them up. The cache is then allocated and read in whole parts.

The fused reads (`fused_attention`), each saving a kernel:
- q rotated where the logits read it (`Reads.rotated`, from `q_rope`: the cos and sin rows of the query positions and the
  pairing), on q broadcast against the keys, once per key: tinygrad realizes an elementwise result that is broadcast
  afterwards, so a rotated q would be a kernel of its own. With `key_rope` (a row cache, `KVCache.write_rows`) the
  cached keys arrive unrotated and are rotated by their positions' rows as read.
- q and keys normalized where read (`q_norm`, `k_norm`: an RMS norm's weight and eps): the weight multiplies them as read
  and their 1/rms the logits (linear in q and in each key), each summed once per logit for the same reason (a norm
  before the rotation would be realized: the rotation reads it at two indices). With k_norm the dot and the squares are
  one sum whose terms a product combines (`normed_logits`), and under softmax self the query's own key sits beside each
  key on a pair axis.
- softmax self (`relative_to_own_key`, `own_sink_peak`): the stabilizer is each query's logit of its own key (the newest,
  always visible) plus SELF_MARGIN, summed with the logit itself as q.(k - k_self), so the logits kernel computes it and
  no max kernel is added (a max read inside the value sum, which sums over positions, would be recomputed for every
  position). The same softmax in exact arithmetic, and in float32 as long as no logit exceeds the query's own by more
  than about 130 (exp overflows past 88 + SELF_MARGIN - ln(positions)), where the max's is exact at any spread. For one
  query row (a decode step) and not with a soft cap (not linear in q). A sink's term is exp(sink - q.k_self - margin),
  its own logit computed again by the value kernel (a sink with normalized q or keys keeps the max).
"""
from typing import Callable
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DTypeLike
from tinygrad.uop.ops import sint, smax
from ops.norm import rms_scale
from ops.rope import pair_swapped, rope_per_element

CHUNK = 64
VARIANTS = ("chunked", "whole")   # the chunks that hold valid positions, or every chunk allocated
LAYOUTS = ("heads", "rows")   # KVCache: k and v per head, or each position's q, k and v projections as one row
SOFTMAXES = ("max", "self")   # the softmax's stabilizer: the logits' max, or each query's logit of its own key
# the "self" stabilizer's margin over each query's own logit: that logit's weight is e^-60, a normal float32 (they go
# down to e^-87), and logits up to about 148 - ln(positions) above it stay finite
SELF_MARGIN = 60.0

def cache_positions(max_ctx: int, per_part: int = 1) -> int:
  """Positions a cache allocates for max_ctx: whole chunks, a multiple of `per_part` of them (split attention's parts)."""
  return -(-max_ctx // (CHUNK * per_part)) * CHUNK * per_part

def write_positions(buf: Tensor, x: Tensor, start_pos: sint) -> Tensor:
  """Write x [..., T, D] into the cache buffer [..., L, D] at positions start_pos..start_pos+T, in place; returns buf."""
  buf[..., start_pos:start_pos + x.shape[-2], :].assign(x.cast(buf.dtype))
  return buf

class KVCache:
  """Per-layer key and value caches, k [B, Hkv, L, D] and v [B, Hkv, L, Dv] with L = cache_positions(max_ctx, per_part),
  zero-initialised on the device. Where D == Dv they are the two halves of one buffer [2, B, Hkv, L, D], so a step
  writes both in one kernel.
  With `q_width` (layout `rows`) the cache is one buffer [B, L, q_width + Hkv*(D + Dv)] holding each position's q, k and
  v projections side by side, as one matmul over their joined weights computes them: that matmul's kernel stores its
  output there (`write_rows`), where the k and v write was a kernel of its own. k stays as projected (unrotated);
  attention rotates it where the logits read it (`key_rope`). The q columns of past positions are dead weight."""
  def __init__(self, batch: int, kv_heads: int, max_ctx: int, head_dim: int, v_head_dim: int|None = None,
               dtype: DTypeLike = dtypes.float32, device: str|None = None, q_width: int|None = None, per_part: int = 1):
    v_head_dim, L = v_head_dim or head_dim, cache_positions(max_ctx, per_part)
    self.kv_heads, self.head_dim, self.v_head_dim, self.q_width = kv_heads, head_dim, v_head_dim, q_width
    self.rows = None if q_width is None else \
      Tensor.zeros(batch, L, q_width + kv_heads * (head_dim + v_head_dim), dtype=dtype, device=device).realize()
    self.kv = Tensor.zeros(2, batch, kv_heads, L, head_dim, dtype=dtype, device=device).realize() \
      if v_head_dim == head_dim and self.rows is None else None
    if self.rows is not None: self.k, self.v = self._kv_views(self.rows)
    elif self.kv is not None: self.k, self.v = self.kv[0], self.kv[1]
    else: self.k, self.v = (Tensor.zeros(batch, kv_heads, L, d, dtype=dtype, device=device).realize() for d in (head_dim, v_head_dim))

  def _kv_views(self, rows: Tensor) -> tuple[Tensor, Tensor]:
    B, L, _ = rows.shape
    k0, v0 = self.q_width, self.q_width + self.kv_heads * self.head_dim
    k = rows[..., k0:v0].reshape(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
    return k, rows[..., v0:].reshape(B, L, self.kv_heads, self.v_head_dim).transpose(1, 2)

  def write_rows(self, qkv: Tensor, start_pos: sint) -> tuple[Tensor, Tensor, Tensor]:
    """Layout rows: the joined projections [B, T, width] written at start_pos; returns q [B, T, q_width] and the caches
    k [B, Hkv, L, D] (unrotated) and v [B, Hkv, L, Dv], read after the write."""
    rows = write_positions(self.rows, qkv, start_pos)
    return rows[:, start_pos:start_pos + qkv.shape[1], :self.q_width], *self._kv_views(rows)

  def update(self, k: Tensor, v: Tensor, start_pos: sint) -> tuple[Tensor, Tensor]:
    """k [B, Hkv, T, D] and v written at start_pos; returns the caches, read after the write. Several rows (a prompt
    chunk) are realized first: the write would take a GEMM computing them into its kernel, the joined k and v write's
    stack of both around it, where the GEMM gets no register tile (CPU) and no tensor cores (GPU)."""
    if k.shape[-2] > 1: k, v = k.contiguous(), v.contiguous()
    if self.kv is None: return write_positions(self.k, k, start_pos), write_positions(self.v, v, start_pos)
    # k and v side by side on a new leading axis as one expression (padded and added: a cat would write each in a kernel)
    both = k.unsqueeze(0).pad(((0, 1),) + ((0, 0),) * k.ndim) + v.unsqueeze(0).pad(((1, 0),) + ((0, 0),) * v.ndim)
    kv = write_positions(self.kv, both, start_pos)
    return kv[0], kv[1]

def chunked(L: int, per_part: int = 0) -> tuple[int, ...]:
  """The axes L positions are read in: chunks of CHUNK positions, or with `per_part` parts of that many chunks."""
  return (L // CHUNK // per_part, per_part, CHUNK) if per_part else (L // CHUNK, CHUNK)

def _spanned(t: Tensor, axis: int, span: tuple[sint, sint], per_part: int) -> Tensor:
  """t with its chunk axis (or part axis) `axis` cut to the chunks span (first, count) names (whole parts with per_part)."""
  first, count = span
  step = per_part or 1
  return t.shrink(tuple((first // step, (first + count) // step) if i == axis else None for i in range(t.ndim)))

def _chunks(cache: Tensor, span: tuple[sint, sint], per_part: int = 0) -> Tensor:
  """[B, H, L, D] -> the chunks span (first, count) names, [B, H, 1, 1, count, CHUNK, D] (beside the query group and query
  axes), or with `per_part` in parts [B, H, 1, 1, count // per_part, per_part, CHUNK, D]: every axis cut from the
  cache's static shape (a symbolic count split into parts by a reshape left a division by it in every index, which
  tinygrad does not simplify: a key of the same kv head read once for each query head)."""
  B, H, L, D = cache.shape
  return _spanned(cache.reshape(B, H, 1, 1, *chunked(L, per_part), D), 4, span, per_part)

def _checked(q: Tensor, k: Tensor, variant: str) -> tuple[int, ...]:
  """(B, Hq, T, D, Hkv, L) of a query against a cache, both checked."""
  (B, Hq, T, D), Hkv, L = q.shape, k.shape[1], k.shape[2]
  if Hq % Hkv: raise ValueError(f"query heads {Hq} are not a multiple of kv heads {Hkv}")
  if L % CHUNK: raise ValueError(f"a cache of {L} positions is not whole chunks of {CHUNK}")
  if variant not in VARIANTS: raise ValueError(f"unknown attention variant {variant!r} (choose from {', '.join(VARIANTS)})")
  return B, Hq, T, D, Hkv, L

def chunks_read(L: int, start_pos: sint, T: int, variant: str, window: int | None = None, per_part: int = 1) -> tuple[sint, sint]:
  """The chunks of a cache of L positions attention reads, as (first, count): those that hold valid positions (chunked),
  or all (whole). With a window, chunked reads at most as many as the window reaches, up to the newest: rows
  start_pos.. see keys from start_pos - window + 1 on, in at most (window + T - 2) // CHUNK + 2 chunks; the first moves
  with the position once the newest chunk is past that count. Chunked without a window reads a multiple of `per_part`
  chunks (split attention's parts), rounded up past the newest."""
  n = (start_pos + T + CHUNK - 1) // CHUNK
  if variant == "whole" or (window is not None and (window + T - 2) // CHUNK + 2 >= L // CHUNK): return 0, L // CHUNK
  if window is None:
    per_part = max(per_part, 1)
    if (L // CHUNK) % per_part: raise ValueError(f"a cache of {L // CHUNK} chunks is not parts of {per_part} (allocate it by cache_positions)")
    return 0, (n + per_part - 1) // per_part * per_part
  reach = (window + T - 2) // CHUNK + 2
  return smax(0, n - reach), reach - smax(0, reach - n)

def soft_capped(logits: Tensor, cap: float) -> Tensor: return (logits / cap).tanh() * cap

def visible(logits: Tensor, L: int, span: tuple[sint, sint], start_pos: sint, window: int | None, per_part: int = 0) -> Tensor:
  """The logits [..., T, count, CHUNK] of the chunks span (first, count) names (with `per_part`, [..., T, count // per_part,
  per_part, CHUNK]), of the keys each query sees (at or before its position, inside the window), -inf elsewhere."""
  kpos = _spanned(Tensor.arange(L).reshape(chunked(L, per_part)), 0, span, per_part)
  qpos = (Tensor.arange(logits.shape[-1 - kpos.ndim]) + start_pos).reshape(-1, *[1] * kpos.ndim)
  seen = kpos <= qpos
  if window is not None: seen = seen & (kpos > qpos - window)
  return seen.where(logits, float("-inf"))

def _sinks(sinks: Tensor | None, Hkv: int, G: int) -> Tensor | None:
  return None if sinks is None else sinks.cast(dtypes.float32).reshape(1, Hkv, G, 1, 1, 1)

def max_peak(logits: Tensor, sink: Tensor | None) -> Tensor:
  """The plain stabilizer: the logits' max over positions (and the sink's logit, where larger), a kernel of its own."""
  peak = logits.max(axis=(-2, -1), keepdim=True)
  return peak if sink is None else peak.maximum(sink)

def with_ones(values: Tensor, ones: int = 1) -> Tensor:
  """The values [..., Dv] with columns of ones after them: summed with the softmax weights, each gives their denominator."""
  return values.pad(((0, 0),) * (values.ndim - 1) + ((0, ones),), value=1.0)

def over_denominator(ev: Tensor, sink_term: Tensor | None) -> Tensor:
  """Value sums [..., Dv] with the denominator as their last column [..., Dv + 1] -> their quotient, a sink's term added
  to the denominator first."""
  if sink_term is not None: ev = ev + sink_term.pad(((0, 0),) * (ev.ndim - 1) + ((ev.shape[-1] - 1, 0),))
  return ev[..., :-1] / ev[..., -1:]

def weighted_values(e: Tensor, values: Tensor, ones: int = 1, upcast: bool = True) -> Tensor:
  """The terms of sum(e * v) over positions beside `ones` columns of the terms of sum(e) [..., Dv + ones], to be summed
  by one reduce (the denominator one more output column of the value sum, not a kernel of its own). A half cache's
  values are multiplied in float32 unless not `upcast`: under softmax self each e carries the factor e^-SELF_MARGIN,
  below half's range (rounded to half, every weight was 0 and the attention's output with it)."""
  return e.unsqueeze(-1) * with_ones(values.cast(dtypes.float32) if upcast else values, ones)

def values_with_denominator(e: Tensor, values: Tensor, sink_term: Tensor | None, upcast: bool = True) -> Tensor:
  """sum(e * v) / sum(e) over positions in one kernel (weighted_values); a sink's term is added to the denominator in
  the same kernel."""
  return over_denominator(weighted_values(e, values, upcast=upcast).sum(axis=(-3, -2)), sink_term)

def gemm_logits(q: Tensor, keys: Tensor, dtype: DTypeLike, upcast: bool = True) -> Tensor:
  """q.k for several query rows (a prompt chunk): q [B, Hkv, G, T, 1, 1, D] and the keys [B, Hkv, 1, 1, n, CHUNK, D]
  each realized in `dtype` and multiplied by one GEMM per kv head (tensor cores on a GPU in half), summed in float32
  (without `upcast`, their sums rounded to `dtype`) -> [B, Hkv, G, T, n, CHUNK]. The logits are realized in the GEMM's
  shape: the mask reading them by chunk and position would otherwise split the GEMM's axes, and it took no tensor cores."""
  B, H, G, T, _, _, D = q.shape
  n, C = keys.shape[-3], keys.shape[-2]
  qr = q.cast(dtype).reshape(B, H, G * T, D).contiguous()
  kr = keys.cast(dtype).reshape(B, H, n * C, D).contiguous()
  return qr.matmul(kr.transpose(-1, -2), dtype=dtypes.float32 if upcast else None).contiguous().reshape(B, H, G, T, n, C)

def gemm_values(e: Tensor, values: Tensor, sink_term: Tensor | None, dtype: DTypeLike, upcast: bool = True) -> Tensor:
  """sum(e * v) / sum(e) over positions for several query rows (a prompt chunk): e [B, Hkv, G, T, n, CHUNK] and the
  values each realized in `dtype` and multiplied by one GEMM per kv head, its query heads' rows together (tensor cores
  on a GPU in half), summed in float32 (without `upcast`, rounded to `dtype`); the denominator summed apart in e's type.
  Read inside a value sum over the positions, each exp would be computed again for every output column."""
  B, H, G, T, n, C = e.shape
  den = e.sum(axis=(-2, -1)).unsqueeze(-1)
  w = e.cast(dtype).reshape(B, H, G * T, n * C).contiguous()
  v = values.cast(dtype).reshape(B, H, n * C, values.shape[-1]).contiguous()
  out = w.matmul(v, dtype=dtypes.float32 if upcast else None).reshape(B, H, G, T, values.shape[-1])
  return out / (den if sink_term is None else den + sink_term)

def softmax_values(logits: Tensor, peak: Tensor | float, values: Tensor, sink: Tensor | None = None, sink_peak: Tensor | None = None,
                   chunk_dtype: DTypeLike = dtypes.float32, weights_break: bool = False, upcast: bool = True) -> Tensor:
  """softmax(logits) times the values [..., n, CHUNK, Dv], the logits less `peak` before exp and the division after the
  value sum (one kernel fewer than normalizing the weights first); a sink's exp(sink - sink_peak) joins the denominator.
  Several query rows (a prompt chunk) take gemm_values in `chunk_dtype`. With `weights_break` one row's weights are
  realized first (`weights_realized`)."""
  e = (logits - peak).exp()
  sink_term = None if sink is None else (sink - sink_peak).squeeze(-1).exp()
  if logits.shape[-3] > 1: return gemm_values(e, values, sink_term, chunk_dtype, upcast)
  return values_with_denominator(weights_realized(e, weights_break), values, sink_term, upcast)

def weights_realized(e: Tensor, weights_break: bool) -> Tensor:
  """A decode step's softmax weights as the value sum reads them: computed inside it, each exp again for every value
  column (no kernel of their own), or with `weights_break` realized by a kernel of their own, each exp computed once."""
  return e.contiguous() if weights_break else e

# the columns of ones beside a part's values: 16 keep the columns a multiple of 16, so that a GPU spreads them over the
# threads of a workgroup (with one, Dv + 1 columns took a workgroup of 8 threads, each reading another head's values)
SUM_ONES = 16
# the parts' sums padded to a multiple of this many: their sum's axes are then multiples of 16 (the columns too, with
# all of SUM_ONES kept), which a GPU spreads over the threads of a workgroup (65 parts of 65 columns had a thread each
# output, walking every part in turn)
PARTS_SPREAD = 16

def part_sums(e: Tensor, values: Tensor, upcast: bool = True) -> Tensor:
  """Each part's sum(e * v) beside its sum(e): e [..., parts, m, CHUNK] and the values [..., parts, m, CHUNK, Dv] ->
  [..., parts, Dv + SUM_ONES], the denominator in each of the last columns (weighted_values)."""
  return weighted_values(e, values, SUM_ONES, upcast).sum((-3, -2))

def split_parts(split: int, T: int, window: int | None) -> int:
  """Chunks a part of split attention holds: `split` for a decode step (one query row) without a window (a window's read
  is short and bounded: one sum), else 0 (not split)."""
  return split if T == 1 and window is None else 0

def split_softmax_values(logits: Tensor, peak: float | None, values: Tensor, sink: Tensor | None = None, sink_peak: Tensor | None = None,
                         most: int | None = None, weights_break: bool = False, upcast: bool = True) -> Tensor:
  """softmax_values for one query row over logits [..., parts, per_part, CHUNK] and values [..., parts, per_part, CHUNK,
  Dv] (as _chunks gives them in parts; flash-decoding): each part's value sum and denominator (part_sums) by one kernel
  whose workgroups cover every head and part, then their sum over the parts by a second, so that a long context's
  positions are spread over the whole device where one sum over them ran in few workgroups. With a fixed `peak`
  (softmax self) the parts' sums add as they are; with None each part is stabilized by its own max and rescaled to the
  largest when they are added (no kernel for a max over every position). The second kernel reads a symbolic count of
  parts' sums padded to `most` as a view (no memory read), so that it sums a static axis, which a GPU spreads over
  threads (over a symbolic one each thread walked every part). With `weights_break` the weights are realized first
  (`weights_realized`)."""
  Dv, count = values.shape[-1], logits.shape[-3]
  def grown(t: Tensor, value: float) -> Tensor:
    if most is None or isinstance(count, int): return t
    return t.pad(((0, 0),) * (t.ndim - 2) + ((0, -(-most // PARTS_SPREAD) * PARTS_SPREAD - count), (0, 0)), value=value)
  if peak is None:
    local = logits.max((-2, -1))
    local = (local == float("-inf")).where(0.0, local).unsqueeze(-1)   # a part every position of which is masked (under `whole`)
  e = weights_realized((logits - (local.unsqueeze(-1) if peak is None else peak)).exp(), weights_break)
  parts = grown(part_sums(e, values, upcast).contiguous(), 0.0)
  if peak is None:
    top = (local := grown(local, float("-inf"))).max(-2, keepdim=True)
    if sink is not None: top = top.maximum(sink)
    parts, sink_peak = parts * (local - top).exp(), top
  return over_denominator(parts.sum(-2)[..., :Dv + 1], None if sink is None else (sink - sink_peak).squeeze(-1).exp())

def attention(q: Tensor, k: Tensor, v: Tensor, start_pos: sint, *, scale: float, window: int|None = None, sinks: Tensor|None = None,
              softcap: float|None = None, variant: str = "chunked", chunk_dtype: DTypeLike = dtypes.float32, split: int = 0) -> Tensor:
  """softmax(q.k * scale) v over the keys each query sees: q rotated (and normalized) already, the cache's keys too;
  several query rows take their logits and value sums by GEMMs in `chunk_dtype` (gemm_logits, gemm_values), one row
  (a decode step) without a window, with `split`, its value sums split into parts of that many chunks (split_parts)."""
  B, Hq, T, D, Hkv, L = _checked(q, k, variant)
  span = chunks_read(L, start_pos, T, variant, window, per_part := split_parts(split, T, window))
  return attend_chunks(q, _chunks(k, span, per_part), _chunks(v, span, per_part), L, start_pos, scale=scale, window=window, sinks=sinks,
                       softcap=softcap, chunk_dtype=chunk_dtype, per_part=per_part, first=span[0])

def attend_chunks(q: Tensor, keys: Tensor, values: Tensor, L: int, start_pos: sint, *, scale: float, window: int|None = None,
                  sinks: Tensor|None = None, softcap: float|None = None, chunk_dtype: DTypeLike = dtypes.float32, per_part: int = 0,
                  first: sint = 0, upcast: bool = True) -> Tensor:
  """`attention` over the chunks it reads of a cache of L positions, from chunk `first` on: keys [B, Hkv, 1, 1, n, CHUNK, D]
  and values [B, Hkv, 1, 1, n, CHUNK, Dv] (as _chunks gives them) -> [B, Hq, T, Dv]; with `per_part` (split_parts) the
  value sums split into parts of that many chunks, the keys and values in parts (_chunks with per_part)."""
  (B, Hq, T, D), Hkv = q.shape, keys.shape[1]
  G = Hq // Hkv
  shape = (B, Hkv, G, T, *keys.shape[4:])   # the query heads of each kv head on their own axis: k and v broadcast
  qg = q.reshape(B, Hkv, G, T, *[1] * (keys.ndim - 5), D)
  if keys.dtype == dtypes.float16: qg = qg.cast(dtypes.float16)
  if T > 1: logits = gemm_logits(qg, keys, chunk_dtype, upcast) * scale
  else: logits = dot(qg.expand(shape), keys.expand(shape), upcast) * scale   # [B, Hkv, G, T, n, CHUNK]
  if softcap is not None: logits = soft_capped(logits, softcap)
  logits, sink = visible(logits, L, (first, keys.shape[4] * (per_part or 1)), start_pos, window, per_part), _sinks(sinks, Hkv, G)
  if per_part: out = split_softmax_values(logits, None, values, sink, None, L // CHUNK // per_part, upcast=upcast)
  else: out = softmax_values(logits, peak := max_peak(logits, sink), values, sink, peak, chunk_dtype, upcast=upcast)
  return out.reshape(B, Hq, T, values.shape[-1]).cast(q.dtype)

def dot(a: Tensor, b: Tensor, upcast: bool) -> Tensor:
  """sum(a * b) over the last axis, a and b cast to float32 first, or without `upcast` multiplied as they are (fp16 ones
  in fp16, the sum rounded to fp16)."""
  return (a.cast(dtypes.float32) * b.cast(dtypes.float32)).sum(-1) if upcast else (a * b).sum(-1)

class Reads:
  """How the fused logits read q, the query's own key and the cached keys: as views broadcast to a shape (q before any
  arithmetic on it), each rotation pair's elements swapped first where asked (pair_swapped, before any broadcast),
  times a norm's weight and rotated by per-element tables (`rotated`)."""
  def __init__(self, q: Tensor, k: Tensor, start_pos: sint, span: tuple[sint, sint], q_rope: tuple[Tensor, Tensor, bool] | None,
               per_part: int = 0):
    (self.B, Hq, self.T, self.D), self.Hkv = q.shape, k.shape[1]
    self.q, self.k, self.start_pos, self.span, self.G, self.per_part = q, k, start_pos, span, Hq // self.Hkv, per_part
    self.ones = [1] * len(chunked(k.shape[2], per_part))   # a query's size on the axes the positions are read in
    self.half, self.interleaved = (0, False) if q_rope is None else (q_rope[0].shape[-1], q_rope[2])
    # the rotation of the query positions, per element: on q, and on the query's own key where keys are rotated as read
    self.at_queries = None if q_rope is None else \
      tuple(t.reshape(self.T, *self.ones, self.D) for t in rope_per_element(*q_rope[:2], self.interleaved, self.D))

  def _swapped(self, t: Tensor, swap: bool) -> Tensor: return pair_swapped(t, self.half, self.interleaved) if swap else t

  def queries(self, shape: tuple, swap: bool = False) -> Tensor:
    return self._swapped(self.q.reshape(self.B, self.Hkv, self.G, self.T, *self.ones, self.D), swap).expand(shape)

  def own_keys(self, shape: tuple, swap: bool = False) -> Tensor:
    own = self.k[:, :, self.start_pos:self.start_pos + self.T].reshape(self.B, self.Hkv, 1, self.T, *self.ones, self.D)
    return self._swapped(own, swap).expand(shape)

  def cached_keys(self, shape: tuple, swap: bool = False) -> Tensor:
    return _chunks(self._swapped(self.k, swap), self.span, self.per_part).expand(shape)

  def at_keys(self, key_rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The rotation of each cached key's position, per element, chunked as the keys are (tables padded to the cache)."""
    L = self.k.shape[2]
    cos, sin = (t[:L].pad(((0, L - min(L, t.shape[0])), (0, 0))) for t in key_rope)
    return tuple(_chunks(t.reshape(1, 1, L, self.D), self.span, self.per_part) for t in rope_per_element(cos, sin, self.interleaved, self.D))

  def rotated(self, view: Callable[..., Tensor], shape: tuple, tables: tuple[Tensor, Tensor] | None, weight: Tensor | None) -> Tensor:
    """view(shape) times weight (a norm's), rotated by per-element cos and sin tables."""
    x = view(shape) if weight is None else view(shape) * weight
    if tables is None: return x
    x_swapped = view(shape, True) if weight is None else view(shape, True) * pair_swapped(weight, self.half, self.interleaved)
    return x * tables[0] + x_swapped * tables[1]

def relative_to_own_key(keys: Tensor, own: Tensor) -> Tensor:
  """Each key less the query's own (softmax self): its logit is then the logit less the stabilizer's."""
  return keys.cast(dtypes.float32) - own.cast(dtypes.float32)

def normed_logits(q: Tensor, keys: Tensor, raw_keys: Tensor, raw_q: Tensor | None, q_eps: float, k_eps: float) -> Tensor:
  """q.k times each key's 1/rms (and q's, given q before its norm) over the last axis: the dot and the squares as one sum
  over the head's elements, its terms combined by a product, so that a GPU splits that one sum over threads (read as
  sums of their own, each is a loop every thread walks)."""
  f32 = lambda t: t.cast(dtypes.float32)
  terms = [f32(q) * f32(keys), f32(raw_keys).square()] + ([f32(raw_q.expand(keys.shape)).square()] if raw_q is not None else [])
  sums, which = Tensor.stack(*terms, dim=-2).sum(-1), Tensor.arange(len(terms))
  return (which == 0).where(sums, (sums / q.shape[-1] + (which == 1).where(k_eps, q_eps)).rsqrt()).prod(-1)

def normed_logits_relative_to_own_key(q: Tensor, keys: Tensor, raw_keys: Tensor, own: Tensor, raw_own: Tensor, raw_q: Tensor | None,
                                      q_eps: float, k_eps: float) -> Tensor:
  """normed_logits less the query's logit of its own key (softmax self): the own key beside each key on the leading pair
  axis of q's broadcast, its logit taken off in a sum over that axis."""
  first = Tensor.arange(2).reshape(2, *[1] * (q.ndim - 1)) == 0
  logits = normed_logits(q, first.where(keys, own), first.where(raw_keys, raw_own), raw_q, q_eps, k_eps)
  return (logits * first.squeeze(-1).where(1.0, -1.0)).sum(0)

def own_sink_peak(reads: Reads, key_tables: bool, half: bool, scale: float) -> Tensor:
  """A sink's stabilizer under softmax self: the query's logit of its own key (computed again where the sink is read)
  plus the margin."""
  one = (reads.B, reads.Hkv, reads.G, reads.T, *reads.ones, reads.D)
  qs = reads.rotated(reads.queries, one, reads.at_queries, None)
  ks = reads.rotated(reads.own_keys, one, reads.at_queries if key_tables else None, None)
  if half: qs = qs.cast(dtypes.float16)
  return ((qs.cast(dtypes.float32) * ks.cast(dtypes.float32)).sum(-1) * scale + SELF_MARGIN).reshape(one[:4] + (1, 1))

def fused_attention(q: Tensor, k: Tensor, v: Tensor, start_pos: sint, *, scale: float, q_rope: tuple[Tensor, Tensor, bool]|None = None,
                    window: int|None = None, sinks: Tensor|None = None, softcap: float|None = None, q_norm: tuple[Tensor, float]|None = None,
                    key_rope: tuple[Tensor, Tensor]|None = None, k_norm: tuple[Tensor, float]|None = None, variant: str = "chunked",
                    softmax: str = "max", chunk_dtype: DTypeLike = dtypes.float32, split: int = 0, weights_break: bool = False,
                    upcast: bool = True) -> Tensor:
  """attention() of q rotated by q_rope (and, with q_norm, normalized first) over the cache's keys normalized by k_norm
  and, with key_rope, rotated by their positions: each read where the logits read it; the softmax stabilized as
  `softmax` says, a decode step's value sums split into parts of `split` chunks (split_parts), its weights realized
  first with `weights_break` (`weights_realized`). Several query rows (a prompt chunk) take `_chunk_attention`. Without
  `upcast` the logits and the value sums multiply fp16 operands as they are (`dot`); keys taken relative to the
  query's own (softmax self), normed logits and a sink's stay float32."""
  B, Hq, T, D, Hkv, L = _checked(q, k, variant)
  if softmax not in SOFTMAXES: raise ValueError(f"unknown softmax stabilizer {softmax!r} (choose from {', '.join(SOFTMAXES)})")
  if key_rope is not None and q_rope is None: raise ValueError("key_rope needs q_rope's pairing")
  # a sink's logit is met at the query's own logit (not linear in q with a norm on q or the keys)
  by_self = softmax == "self" and softcap is None and B * T == 1 and (sinks is None or (q_norm is None and k_norm is None))
  per_part = split_parts(split, T, window)
  reads = Reads(q, k, start_pos, span := chunks_read(L, start_pos, T, variant, window, per_part), q_rope, per_part)
  key_tables = None if key_rope is None else reads.at_keys(key_rope)
  if T > 1: return _chunk_attention(reads, v, L, key_tables, scale=scale, window=window, sinks=sinks, softcap=softcap, q_norm=q_norm,
                                    k_norm=k_norm, chunk_dtype=chunk_dtype, upcast=upcast)
  shape = (B, Hkv, reads.G, T, *_chunks(k, span, per_part).shape[4:])   # the count as the shrink simplified it
  raw_q = reads.queries(shape)
  if k_norm is not None and by_self: shape = (2, *shape)   # the pair axis of normed_logits_relative_to_own_key
  qg = reads.rotated(reads.queries, shape, reads.at_queries, None if q_norm is None else q_norm[0])
  if k.dtype == dtypes.float16: qg = qg.cast(dtypes.float16)
  k_weight = None if k_norm is None else k_norm[0]
  keys = reads.rotated(reads.cached_keys, shape, key_tables, k_weight)
  own = reads.rotated(reads.own_keys, shape, reads.at_queries if key_rope is not None else None, k_weight) if by_self else None
  if k_norm is None:
    logits = dot(qg, keys if own is None else relative_to_own_key(keys, own), upcast)
    if q_norm is not None: logits = logits * rms_scale(raw_q, q_norm[1]).squeeze(-1)
  else:
    q_normed = (raw_q, q_norm[1]) if q_norm is not None else (None, 0.0)
    if own is None: logits = normed_logits(qg, keys, reads.cached_keys(shape), *q_normed, k_norm[1])
    else: logits = normed_logits_relative_to_own_key(qg, keys, reads.cached_keys(shape), own, reads.own_keys(shape), *q_normed, k_norm[1])
  logits = logits * scale
  if softcap is not None: logits = soft_capped(logits, softcap)
  logits, sink = visible(logits, L, span, start_pos, window, per_part), _sinks(sinks, Hkv, reads.G)
  sink_peak = None if sink is None or not by_self else own_sink_peak(reads, key_rope is not None, k.dtype == dtypes.float16, scale)
  if per_part:
    out = split_softmax_values(logits, SELF_MARGIN if by_self else None, _chunks(v, span, per_part), sink, sink_peak, L // CHUNK // per_part,
                               weights_break, upcast)
  elif by_self: out = softmax_values(logits, SELF_MARGIN, _chunks(v, span), sink, sink_peak, chunk_dtype, weights_break, upcast)
  else: out = softmax_values(logits, peak := max_peak(logits, sink), _chunks(v, span), sink, peak, chunk_dtype, weights_break, upcast)
  return out.reshape(B, Hq, T, v.shape[-1]).cast(q.dtype)

def _chunk_attention(reads: Reads, v: Tensor, L: int, key_tables: tuple[Tensor, Tensor] | None, *, scale: float, window: int | None,
                     sinks: Tensor | None, softcap: float | None, q_norm: tuple[Tensor, float] | None, k_norm: tuple[Tensor, float] | None,
                     chunk_dtype: DTypeLike, upcast: bool) -> Tensor:
  """fused_attention for several query rows (a prompt chunk): the queries and the keys read rotated and normalized once
  each, not once for each logit, so that the logits are a GEMM per kv head (attend_chunks, gemm_logits) where the fused
  reads made them a reduce over a broadcast that takes no tensor cores."""
  def normed(view: Callable[..., Tensor], shape: tuple, tables: tuple[Tensor, Tensor] | None, norm: tuple[Tensor, float] | None) -> Tensor:
    x = reads.rotated(view, shape, tables, None if norm is None else norm[0])
    return x if norm is None else x * rms_scale(view(shape), norm[1])
  B, G, T, D = reads.B, reads.G, reads.T, reads.D
  keys = normed(reads.cached_keys, (B, reads.Hkv, 1, 1, *_chunks(reads.k, reads.span).shape[-3:]), key_tables, k_norm)
  q = normed(reads.queries, (B, reads.Hkv, G, T, 1, 1, D), reads.at_queries, q_norm).reshape(B, reads.Hkv * G, T, D)
  return attend_chunks(q, keys, _chunks(v, reads.span), L, reads.start_pos, scale=scale, window=window, sinks=sinks, softcap=softcap,
                       chunk_dtype=chunk_dtype, first=reads.span[0], upcast=upcast).cast(reads.q.dtype)
