"""Scaled dot-product attention over a KV cache.

Layouts: q [B, Hq, T, D], caches k [B, Hkv, L, D] and v [B, Hkv, L, Dv] (L positions allocated, a multiple of CHUNK);
Hq is a multiple of Hkv and query head h reads kv head h // (Hq // Hkv) (grouped-query attention). Query row i sits at
absolute position start_pos + i and key column j at position j; the cache holds start_pos + T valid positions. Key j is
visible to query i when j <= start_pos + i, and with a sliding window also when j > start_pos + i - window. start_pos
may be a bound symbolic variable (TinyJit decode).

Attention reads the cache in chunks of CHUNK positions, as many as hold the valid ones, and masks the rest. The sums over
positions then have a static inner axis that a GPU spreads over threads; over the valid prefix alone (a symbolic
length) each thread walked every position in turn, one load after the other (15 us a layer on an H100). The variant
`whole` reads every chunk the cache allocated instead: static shapes and loop bounds at every position, at the cost
of reading (and masking) the whole cache every step.

Logits are q.k * scale in float32, soft-capped as cap*tanh(logits/cap) before masking. `q_rope` (the cos and sin rows of
the query positions, [T, rot_dims/2], and the pairing) rotates q where the logits read it, and a half cache meets q
rounded to half (as llama.cpp's half KV cache does). That arithmetic runs on q broadcast against the keys, once per key:
tinygrad realizes an elementwise result that is broadcast afterwards, and a rotated q would cost a kernel of its own.
`q_norm` and `k_norm` (an RMS norm's weight and eps) say q, and the cached keys, arrive before their norm: the weight
multiplies them as read and their 1/rms the logits (they are linear in q and in each key), each summed once per logit
for the same reason (a norm before the rotation would be realized: the rotation reads it at two indices). With k_norm
the dot and the squares are one sum whose terms a product combines (`_normed_logits`), and under softmax self the
query's own key sits beside each key on a pair axis. A sink (gpt-oss) is one learned logit per query head that joins
the softmax denominator and contributes no value.

The softmax subtracts a stabilizer from the logits before exp. `softmax="max"` takes their max over positions, a
kernel of its own: a max read inside the value sum, which sums over positions, would be recomputed for every position.
`softmax="self"` takes each query's logit of its own key (the newest, always visible) plus SELF_MARGIN, summed with the
logit itself as q.(k - k_self), so the logits kernel computes it and no kernel is added: the same softmax in exact
arithmetic, and in float32 as long as no logit exceeds the query's own by more than about 130 (exp overflows past
88 + SELF_MARGIN - ln(positions)), where the max's softmax is exact at any spread. For one query row (a decode step;
a prefill keeps the max, as the norm `single` does) and not with a soft cap (not linear in q). A sink's term is
exp(sink - q.k_self - margin), its own logit of 64 products computed again for each output by the value kernel (a
sink with normalized q or keys keeps the max).
"""
from typing import Callable
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DTypeLike
from tinygrad.uop.ops import sint
from ops.norm import rms_scale
from ops.rope import pair_swapped, rope_per_element

CHUNK = 64
VARIANTS = ("chunked", "whole")   # the chunks that hold valid positions, or every chunk allocated
LAYOUTS = ("heads", "rows")   # KVCache: k and v per head, or each position's q, k and v projections as one row
SOFTMAXES = ("max", "self")   # the softmax's stabilizer: the logits' max, or each query's logit of its own key
# the "self" stabilizer's margin over each query's own logit: that logit's weight is e^-60, a normal float32 (they go
# down to e^-87), and logits up to about 148 - ln(positions) above it stay finite
SELF_MARGIN = 60.0

def cache_positions(max_ctx: int) -> int:
  """Positions a cache allocates for max_ctx: whole chunks."""
  return -(-max_ctx // CHUNK) * CHUNK

def write_positions(buf: Tensor, x: Tensor, start_pos: sint) -> Tensor:
  """Write x [..., T, D] into the cache buffer [..., L, D] at positions start_pos..start_pos+T, in place; returns buf."""
  buf[..., start_pos:start_pos + x.shape[-2], :].assign(x.cast(buf.dtype))
  return buf

class KVCache:
  """Per-layer key and value caches, k [B, Hkv, L, D] and v [B, Hkv, L, Dv] with L = cache_positions(max_ctx),
  zero-initialised on the device. Where D == Dv they are the two halves of one buffer [2, B, Hkv, L, D], so a step
  writes both in one kernel.
  With `q_width` (layout `rows`) the cache is one buffer [B, L, q_width + Hkv*(D + Dv)] holding each position's q, k and
  v projections side by side, as one matmul over their joined weights computes them: that matmul's kernel stores its
  output there (`write_rows`), where the k and v write was a kernel of its own. k stays as projected (unrotated);
  attention rotates it where the logits read it (`key_rope`). The q columns of past positions are dead weight."""
  def __init__(self, batch: int, kv_heads: int, max_ctx: int, head_dim: int, v_head_dim: int|None = None,
               dtype: DTypeLike = dtypes.float32, device: str|None = None, q_width: int|None = None):
    v_head_dim, L = v_head_dim or head_dim, cache_positions(max_ctx)
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
    if self.kv is None: return write_positions(self.k, k, start_pos), write_positions(self.v, v, start_pos)
    # k and v side by side on a new leading axis as one expression (padded and added: a cat would write each in a kernel)
    both = k.unsqueeze(0).pad(((0, 1),) + ((0, 0),) * k.ndim) + v.unsqueeze(0).pad(((1, 0),) + ((0, 0),) * v.ndim)
    kv = write_positions(self.kv, both, start_pos)
    return kv[0], kv[1]

def _chunks(cache: Tensor, n: sint) -> Tensor:
  """[B, H, L, D] -> its first n chunks, [B, H, 1, 1, n, CHUNK, D] (beside the query group and query axes)."""
  B, H, L, D = cache.shape
  return cache.reshape(B, H, 1, 1, L // CHUNK, CHUNK, D).shrink_to((B, H, 1, 1, n, CHUNK, D))

def _normed_logits(q: Tensor, keys: Tensor, raw_keys: Tensor, raw_q: Tensor | None, q_eps: float, k_eps: float) -> Tensor:
  """q.k times each key's 1/rms (and q's, given q before its norm) over the last axis: the dot and the squares as one sum
  over the head's elements, its terms combined by a product, so that a GPU splits that one sum over threads (read as
  sums of their own, each is a loop every thread walks)."""
  f32 = lambda t: t.cast(dtypes.float32)
  terms = [f32(q) * f32(keys), f32(raw_keys).square()] + ([f32(raw_q.expand(keys.shape)).square()] if raw_q is not None else [])
  sums, which = Tensor.stack(*terms, dim=-2).sum(-1), Tensor.arange(len(terms))
  return (which == 0).where(sums, (sums / q.shape[-1] + (which == 1).where(k_eps, q_eps)).rsqrt()).prod(-1)

def attention(q: Tensor, k: Tensor, v: Tensor, start_pos: sint, *, scale: float, window: int|None = None,
              sinks: Tensor|None = None, softcap: float|None = None, q_rope: tuple[Tensor, Tensor, bool]|None = None,
              q_norm: tuple[Tensor, float]|None = None, key_rope: tuple[Tensor, Tensor]|None = None,
              k_norm: tuple[Tensor, float]|None = None, variant: str = "chunked", softmax: str = "max") -> Tensor:
  (B, Hq, T, D), Hkv, L = q.shape, k.shape[1], k.shape[2]
  if Hq % Hkv: raise ValueError(f"query heads {Hq} are not a multiple of kv heads {Hkv}")
  if L % CHUNK: raise ValueError(f"a cache of {L} positions is not whole chunks of {CHUNK}")
  if variant not in VARIANTS: raise ValueError(f"unknown attention variant {variant!r} (choose from {', '.join(VARIANTS)})")
  if softmax not in SOFTMAXES: raise ValueError(f"unknown softmax stabilizer {softmax!r} (choose from {', '.join(SOFTMAXES)})")
  # a sink's logit is met at the query's own logit (not linear in q with a norm on q or the keys)
  by_self = softmax == "self" and softcap is None and B * T == 1 and (sinks is None or (q_norm is None and k_norm is None))
  n = L // CHUNK if variant == "whole" else (start_pos + T + CHUNK - 1) // CHUNK
  G, interleaved = Hq // Hkv, q_rope is not None and q_rope[2]
  half = 0 if q_rope is None else q_rope[0].shape[-1]
  if key_rope is not None and q_rope is None: raise ValueError("key_rope needs q_rope's pairing")
  # q, the query's own key and the keys as views broadcast to a shape, each rotation pair's elements swapped first
  # where asked (pair_swapped, before any broadcast); the query heads of each kv head on their own axis, so k and v
  # broadcast instead of being repeated, and q broadcast against the keys before any arithmetic on it
  def swapped(t: Tensor, swap: bool) -> Tensor: return pair_swapped(t, half, interleaved) if swap else t
  def queries(shape: tuple, swap: bool = False) -> Tensor: return swapped(q.reshape(B, Hkv, G, T, 1, 1, D), swap).expand(shape)
  def own_keys(shape: tuple, swap: bool = False) -> Tensor:
    return swapped(k[:, :, start_pos:start_pos + T].reshape(B, Hkv, 1, T, 1, 1, D), swap).expand(shape)
  def cached_keys(shape: tuple, swap: bool = False) -> Tensor: return _chunks(swapped(k, swap), n).expand(shape)
  def rotated(view: Callable[..., Tensor], shape: tuple, tables: tuple[Tensor, Tensor] | None, weight: Tensor | None) -> Tensor:
    """view(shape) times weight (a norm's), rotated by per-element cos and sin tables (rope_per_element)."""
    x = view(shape) if weight is None else view(shape) * weight
    if tables is None: return x
    x_swapped = view(shape, True) if weight is None else view(shape, True) * pair_swapped(weight, half, interleaved)
    return x * tables[0] + x_swapped * tables[1]
  at_queries = None if q_rope is None else tuple(t.reshape(T, 1, 1, D) for t in rope_per_element(*q_rope[:2], interleaved, D))
  # with a key norm, each query's own key (softmax self) is read beside every key on a leading pair axis of q's broadcast
  pairs = 2 if k_norm is not None and by_self else 1
  shape = (B, Hkv, G, T, *_chunks(k, n).shape[-3:])   # n as the shrink simplified it
  raw_q = queries(shape)
  if pairs == 2: shape = (2, *shape)
  qg = rotated(queries, shape, at_queries, None if q_norm is None else q_norm[0])
  k_weight = None if k_norm is None else k_norm[0]
  own = rotated(own_keys, shape, at_queries if key_rope is not None else None, k_weight) if by_self else None
  if key_rope is None: keys = rotated(cached_keys, shape, None, k_weight)
  else:   # unrotated keys (layout rows), rotated by their positions' rows of the tables as read
    cos, sin = (t[:L].pad(((0, L - min(L, t.shape[0])), (0, 0))) for t in key_rope)
    keys = rotated(cached_keys, shape, tuple(_chunks(t.reshape(1, 1, L, D), n) for t in rope_per_element(cos, sin, interleaved, D)), k_weight)
  if k_norm is not None: raw_keys, raw_own = cached_keys(shape), own_keys(shape) if by_self else None   # before the norm's weight
  if k.dtype == dtypes.float16: qg = qg.cast(dtypes.float16)
  if k_norm is None:   # with `by_self` each query's own key (position start_pos + i) is taken off every key
    if own is not None: keys = keys.cast(dtypes.float32) - own.cast(dtypes.float32)
    logits = (qg.cast(dtypes.float32) * keys.cast(dtypes.float32)).sum(-1)   # [B, Hkv, G, T, n, CHUNK]
    if q_norm is not None: logits = logits * rms_scale(raw_q, q_norm[1]).squeeze(-1)
  else:   # the query's own key (by_self) beside each key on the leading pair axis, its logit taken off in a sum over it
    first = Tensor.arange(pairs).reshape(pairs, *[1] * (qg.ndim - 1)) == 0
    if own is not None: keys, raw_keys = first.where(keys, own), first.where(raw_keys, raw_own)
    logits = _normed_logits(qg, keys, raw_keys, raw_q if q_norm is not None else None, q_norm[1] if q_norm else 0.0, k_norm[1])
    if own is not None: logits = (logits * first.squeeze(-1).where(1.0, -1.0)).sum(0)
  logits = logits * scale
  if softcap is not None: logits = (logits / softcap).tanh() * softcap
  kpos = (Tensor.arange(L // CHUNK).reshape(-1, 1) * CHUNK + Tensor.arange(CHUNK)).shrink_to((n, CHUNK))
  qpos = (Tensor.arange(T) + start_pos).reshape(T, 1, 1)
  visible = kpos <= qpos
  if window is not None: visible = visible & (kpos > qpos - window)
  logits = visible.where(logits, float("-inf"))
  # softmax with the division after the value matmul: one kernel fewer than normalizing the weights first.
  # A sink adds exp(sink) to the denominator only.
  sink = None if sinks is None else sinks.cast(dtypes.float32).reshape(1, Hkv, G, 1, 1, 1)
  if by_self:   # a sink meets the logits' stabilizer: the query's logit of its own key (computed again here) plus the margin
    peak, sink_peak = SELF_MARGIN, None
    if sink is not None:
      one = (B, Hkv, G, T, 1, 1, D)
      qs, ks = rotated(queries, one, at_queries, None), rotated(own_keys, one, at_queries if key_rope is not None else None, None)
      if k.dtype == dtypes.float16: qs = qs.cast(dtypes.float16)
      sink_peak = (qs.cast(dtypes.float32) * ks.cast(dtypes.float32)).sum(-1) * scale + SELF_MARGIN
  else:
    peak = logits.max(axis=(-2, -1), keepdim=True)
    if sink is not None: peak = peak.maximum(sink)
    sink_peak = peak
  e = (logits - peak).exp()
  sink_term = None if sink is None else (sink - sink_peak).squeeze(-1).exp()
  vc = _chunks(v, n)
  if v.dtype == dtypes.float32:
    # the denominator as one more output column of the value matmul (v with a column of ones): one kernel, not two;
    # a sink's term is added to that column in the same kernel
    ev = (e.unsqueeze(-1) * vc.pad(((0, 0),) * (vc.ndim - 1) + ((0, 1),), value=1.0)).sum(axis=(-3, -2))
    if sink_term is not None: ev = ev + sink_term.pad(((0, 0),) * (ev.ndim - 1) + ((v.shape[-1], 0),))
    out = ev[..., :-1] / ev[..., -1:]
  else:   # a half cache (ggml rounding) meets e rounded to half, as llama.cpp does, while the denominator stays float32
    den = e.sum(axis=(-2, -1)).unsqueeze(-1)
    out = (e.cast(v.dtype).unsqueeze(-1) * vc).sum(axis=(-3, -2), dtype=dtypes.float32) / (den if sink_term is None else den + sink_term)
  return out.reshape(B, Hq, T, v.shape[-1]).cast(q.dtype)
