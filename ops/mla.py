"""DeepSeek-style multi-head latent attention in the absorbed form, with one latent cache per layer.

Definitions, per head h: k_nope[h] = c @ Wk[h].T with Wk [H, d_nope, r]; v[h] = c @ Wv[h].T with Wv [H, d_v, r];
key = concat(k_nope[h], k_pe) where k_pe [.., d_rope] is shared by all heads; out = softmax(causal(q.key * scale)) @ v.

Absorbed: q_lat[h] = q_nope[h] @ Wk[h] (dim r) makes q.key = concat(q_lat, q_pe) . concat(c, k_pe), and
softmax @ v = (softmax @ c) @ Wv[h].T. So MLA is multi-query attention with one kv head whose key rows are the cache
rows concat(c, k_pe) and whose values are their first r columns, followed by a per-head up-projection.
The cache stores concat(c, k_pe) per position, [B, L, r + d_rope] (L: whole attention chunks); there is no separate V cache.
The caller absorbs q_nope through Wk before and expands the latent output through Wv after (both are per-head matmuls
over packed weights); q_pe and k_pe arrive with RoPE already applied.
"""
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DTypeLike
from tinygrad.uop.ops import sint
from ops.attention import attention, cache_positions, write_positions

class LatentCache:
  """rows [B, L, r + d_rope] with L = cache_positions(max_ctx), zero-initialised on the device."""
  def __init__(self, batch: int, max_ctx: int, rank: int, rope_dim: int, dtype: DTypeLike = dtypes.float32, device: str|None = None):
    self.rows = Tensor.zeros(batch, cache_positions(max_ctx), rank + rope_dim, dtype=dtype, device=device).realize()

  def update(self, c: Tensor, k_pe: Tensor, start_pos: sint) -> Tensor:
    """Write c [B, T, r] and k_pe [B, T, d_rope] at start_pos; return the cache rows [B, L, r + d_rope]."""
    return write_positions(self.rows, c.cat(k_pe.cast(c.dtype), dim=-1), start_pos)

def mla_attention(q_lat: Tensor, q_pe: Tensor, rows: Tensor, start_pos: sint, *, scale: float, variant: str = "chunked",
                  chunk_dtype: DTypeLike = dtypes.float32) -> Tensor:
  """q_lat [B, H, T, r] (q_nope @ Wk[h]), q_pe [B, H, T, d_rope], rows [B, L, r + d_rope] from LatentCache
  -> the latent output [B, H, T, r] (softmax @ c), which Wv[h] expands to the heads' values."""
  kv = rows.unsqueeze(1)
  return attention(q_lat.cat(q_pe.cast(q_lat.dtype), dim=-1), kv, kv[..., :q_lat.shape[-1]], start_pos, scale=scale, variant=variant,
                   chunk_dtype=chunk_dtype)
