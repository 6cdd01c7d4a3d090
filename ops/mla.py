"""DeepSeek-style multi-head latent attention, with one latent cache per layer: absorbed, or for a prompt chunk expanded.

Definitions, per head h: k_nope[h] = c @ Wk[h].T with Wk [H, d_nope, r]; v[h] = c @ Wv[h].T with Wv [H, d_v, r];
key = concat(k_nope[h], k_pe) where k_pe [.., d_rope] is shared by all heads; out = softmax(causal(q.key * scale)) @ v.

Absorbed: q_lat[h] = q_nope[h] @ Wk[h] (dim r) makes q.key = concat(q_lat, q_pe) . concat(c, k_pe), and
softmax @ v = (softmax @ c) @ Wv[h].T. So MLA is multi-query attention with one kv head whose key rows are the cache
rows concat(c, k_pe) and whose values are their first r columns, followed by a per-head up-projection.
The cache stores concat(c, k_pe) per position, [B, L, r + d_rope] (L: whole attention chunks); the values are its first r
columns, unless a separate value cache [B, L, r] is asked for (the seed's cache_v, which llama.cpp's MLA does without).
The caller absorbs q_nope through Wk before and expands the latent output through Wv after (both are per-head matmuls
over packed weights); q_pe and k_pe arrive with RoPE already applied.

Expanded (`expanded_attention`): the positions attention reads are expanded to every head's k_nope and v, then it is
plain multi-head attention with keys concat(k_nope[h], k_pe). Per position and head that costs r * (d_nope + d_v) once
for the expansion, where each query row costs 2r + d_rope in the absorbed form and d_nope + d_rope + d_v expanded: a
chunk of enough rows is cheaper expanded (`expanded_cheaper`). A decode step (one row) is always absorbed.
"""
from typing import Callable
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DTypeLike
from tinygrad.uop.ops import sint
from ops.attention import CHUNK, attend_chunks, cache_positions, chunks_read, fused_attention, write_positions

PREFILL_FORMS = ("auto", "absorbed", "expanded")   # a prompt chunk's form: the cheaper one, or this one

class LatentCache:
  """rows [B, L, r + d_rope] with L = cache_positions(max_ctx, per_part), zero-initialised on the device; with `values`,
  a value cache v [B, L, r] of its own beside them (else None)."""
  def __init__(self, batch: int, max_ctx: int, rank: int, rope_dim: int, dtype: DTypeLike = dtypes.float32, device: str|None = None,
               per_part: int = 1, values: bool = False):
    L = cache_positions(max_ctx, per_part)
    self.rows = Tensor.zeros(batch, L, rank + rope_dim, dtype=dtype, device=device).realize()
    self.v = Tensor.zeros(batch, L, rank, dtype=dtype, device=device).realize() if values else None

  def update(self, c: Tensor, k_pe: Tensor, start_pos: sint) -> tuple[Tensor, Tensor]:
    """Write c [B, T, r] and k_pe [B, T, d_rope] at start_pos; return the cache rows [B, L, r + d_rope] and the values
    [B, L, r]: the rows' first r columns, or the value cache, c written there too."""
    rows = write_positions(self.rows, c.cat(k_pe.cast(c.dtype), dim=-1), start_pos)
    return rows, rows[..., :c.shape[-1]] if self.v is None else write_positions(self.v, c, start_pos)

def mla_attention(q_lat: Tensor, q_pe: Tensor, rows: Tensor, values: Tensor, start_pos: sint, *, scale: float, variant: str = "chunked",
                  chunk_dtype: DTypeLike = dtypes.float32, split: int = 0, softmax: str = "max", weights_break: bool = False,
                  upcast: bool = True) -> Tensor:
  """q_lat [B, H, T, r] (q_nope @ Wk[h]), q_pe [B, H, T, d_rope], rows [B, L, r + d_rope] and values [B, L, r] from
  LatentCache -> the latent output [B, H, T, r] (softmax @ c), which Wv[h] expands to the heads' values. A decode step's
  softmax is stabilized as `softmax` says (ops/attention.py: under `self` by each head's logit of the newest row, so that
  neither a max kernel nor, split, the parts' maxima and their max are needed), its weights realized first with
  `weights_break`; fp16 operands are cast up to float32 unless not `upcast` (fused_attention)."""
  return fused_attention(q_lat.cat(q_pe.cast(q_lat.dtype), dim=-1), rows.unsqueeze(1), values.unsqueeze(1), start_pos, scale=scale,
                         variant=variant, softmax=softmax, chunk_dtype=chunk_dtype, split=split, weights_break=weights_break, upcast=upcast)

def expanded_cheaper(rows: int, rank: int, nope_dim: int, v_dim: int) -> bool:
  """Whether a chunk of `rows` query rows costs fewer multiplications expanded than absorbed, at any number of positions
  read: per position and head the difference is rank * (nope + v) + rows * (nope + v - 2 rank), and the absorbed form's
  own projections (rows * rank * (nope + v) a head) only add to its side."""
  return rows * (2 * rank - nope_dim - v_dim) > rank * (nope_dim + v_dim)

def expanded_attention(q: Tensor, rows: Tensor, values: Tensor, start_pos: sint, expand: Callable[[Tensor], tuple[Tensor, Tensor]], *,
                       scale: float, variant: str = "chunked", chunk_dtype: DTypeLike = dtypes.float32, upcast: bool = True) -> Tensor:
  """q [B, H, T, d_nope + d_rope] (q_pe rotated) against the cache rows [B, L, rank + d_rope] and the values [B, L, rank]
  (LatentCache's) that attention reads, each position's latent (its values) expanded by expand(c [B, n, CHUNK, rank]) ->
  (k_nope [B, n, CHUNK, H, d_nope], v [B, n, CHUNK, H, d_v]) to every head's key concat(k_nope, k_pe) and value -> the
  heads' outputs [B, H, T, d_v]."""
  (B, H, T, _), L, rank = q.shape, rows.shape[1], values.shape[-1]
  chunked = lambda t, n: t.reshape(B, L // CHUNK, CHUNK, t.shape[-1]).shrink_to((B, n, CHUNK, t.shape[-1]))
  read = chunked(rows, chunks_read(L, start_pos, T, variant)[1])
  n = read.shape[1]
  k_nope, v = expand(chunked(values, n))
  k_pe = read[..., rank:].cast(k_nope.dtype).unsqueeze(-2).expand(B, n, CHUNK, H, rows.shape[-1] - rank)
  as_chunks = lambda t: t.permute(0, 3, 1, 2, 4).reshape(B, H, 1, 1, n, CHUNK, t.shape[-1])
  return attend_chunks(q, as_chunks(k_nope.cat(k_pe, dim=-1)), as_chunks(v), L, start_pos, scale=scale, chunk_dtype=chunk_dtype, upcast=upcast)
