"""Scaled dot-product attention over a KV cache.

Layouts: q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv]; Hq is a multiple of Hkv and query head h reads kv head
h // (Hq // Hkv) (grouped-query attention). Query row i sits at absolute position start_pos + i and key column j at
position j, so with a cache S = start_pos + T. Key j is visible to query i when j <= start_pos + i, and with a sliding
window also when j > start_pos + i - window. start_pos may be a bound symbolic variable (TinyJit decode).

Logits are q.k * scale in float32, soft-capped as cap*tanh(logits/cap) before masking. A sink (gpt-oss) is one learned
logit per query head that joins the softmax denominator and contributes no value.
"""
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DTypeLike
from tinygrad.uop.ops import sint

def write_positions(buf: Tensor, x: Tensor, start_pos: sint) -> Tensor:
  """Write x [..., T, D] into the cache buffer [..., max_ctx, D] at positions start_pos..start_pos+T, in place.
  Returns the valid prefix [..., :start_pos+T, D]."""
  end = start_pos + x.shape[-2]
  buf[..., start_pos:end, :].assign(x.cast(buf.dtype))
  return buf[..., :end, :]

class KVCache:
  """Per-layer key and value caches, k [B, Hkv, max_ctx, D] and v [B, Hkv, max_ctx, Dv], zero-initialised on the device."""
  def __init__(self, batch: int, kv_heads: int, max_ctx: int, head_dim: int, v_head_dim: int|None = None,
               dtype: DTypeLike = dtypes.float32, device: str|None = None):
    self.k = Tensor.zeros(batch, kv_heads, max_ctx, head_dim, dtype=dtype, device=device).realize()
    self.v = Tensor.zeros(batch, kv_heads, max_ctx, v_head_dim or head_dim, dtype=dtype, device=device).realize()

  def update(self, k: Tensor, v: Tensor, start_pos: sint) -> tuple[Tensor, Tensor]:
    return write_positions(self.k, k, start_pos), write_positions(self.v, v, start_pos)

def attention(q: Tensor, k: Tensor, v: Tensor, start_pos: sint, *, scale: float, window: int|None = None,
              sinks: Tensor|None = None, softcap: float|None = None) -> Tensor:
  (B, Hq, T, D), Hkv, S = q.shape, k.shape[1], k.shape[2]
  if Hq % Hkv: raise ValueError(f"query heads {Hq} are not a multiple of kv heads {Hkv}")
  # group the query heads of each kv head on their own axis so k and v broadcast instead of being repeated
  qg = q.reshape(B, Hkv, Hq // Hkv, T, D)
  logits = qg.matmul(k.unsqueeze(2).transpose(-1, -2), dtype=dtypes.float32) * scale
  if softcap is not None: logits = (logits / softcap).tanh() * softcap
  # arange over a symbolic length lowers to a quadratic cumsum kernel, so take the static arange of the longest S and shrink it
  qpos, kpos = Tensor.arange(T).unsqueeze(-1) + start_pos, Tensor.arange(k.max_shape[2]).shrink_to((S,))
  visible = kpos <= qpos
  if window is not None: visible = visible & (kpos > qpos - window)
  logits = visible.where(logits, float("-inf"))
  # softmax with the division after the value matmul: one kernel fewer than normalizing the weights first.
  # A sink adds exp(sink) to the denominator only.
  peak = logits.max(axis=-1, keepdim=True)
  sink = None if sinks is None else sinks.cast(dtypes.float32).reshape(1, Hkv, Hq // Hkv, 1, 1)
  if sink is not None: peak = peak.maximum(sink)
  e = (logits - peak).exp()
  denom = e.sum(axis=-1, keepdim=True) + (0 if sink is None else (sink - peak).exp())
  out = (e.cast(v.dtype) @ v.unsqueeze(2)) / denom
  return out.reshape(B, Hq, T, v.shape[-1]).cast(q.dtype)
