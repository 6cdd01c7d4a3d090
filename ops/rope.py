"""Rotary position embeddings.

`rope_tables` returns cos and sin, each [max_pos, rot_dims//2] float32 on the device; column i is the pair rotated at
frequency base^(-2i/rot_dims). Slice the rows of the current positions (`cos[start_pos:start_pos+T]`, a symbolic
start_pos works) and pass them to `apply_rope` with x laid out [B, H, T, D]. Only the first rot_dims = 2*cos.shape[-1]
channels rotate (partial rotary); the remaining D - rot_dims pass through.

Pairing: `interleaved=False` rotates (x[i], x[i + rot_dims/2]) (NEOX, half-split); `interleaved=True` rotates
(x[2i], x[2i+1]) (llama.cpp's normal mode).

YaRN as llama.cpp's ggml rope computes it, with freq_scale = 1/factor: the correction dims [low, high] are the pair
indices that make beta_fast and beta_slow turns over orig_ctx positions; pair i takes the angle
theta_extrap * (freq_scale*(1 - mix) + mix) where mix = ext_factor * ramp(i) and ramp falls linearly from 1 (i <= low)
to 0 (i >= high). cos and sin are multiplied by attn_factor, and by (1 + 0.1*ln(factor)) when ext_factor != 0.
ext_factor=0 is plain linear (position interpolation) scaling. `freq_factors` (llama.cpp's `rope_freqs.weight`, how Llama 3
GGUFs carry their rope scaling) divide each pair's frequency before all of that, as ggml's rope does; with factor 1 and
ext_factor 0 they are the only change.
The tables are built host-side in float64 once, so long contexts keep exact angles.
"""
import math
from dataclasses import dataclass
import numpy as np
from tinygrad import Tensor

@dataclass(frozen=True)
class Yarn:
  factor: float
  orig_ctx: int
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  ext_factor: float = 1.0
  attn_factor: float = 1.0
  freq_factors: tuple[float, ...] | None = None   # per pair: the frequency is divided by it

  def corr_dims(self, rot_dims: int, base: float) -> tuple[float, float]:
    # the pair index whose wavelength fits n_rot times into orig_ctx
    def dim(n_rot: float) -> float: return rot_dims * math.log(self.orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(dim(self.beta_fast))), min(rot_dims - 1.0, math.ceil(dim(self.beta_slow)))

  @property
  def mscale(self) -> float: return self.attn_factor * (1 + 0.1 * math.log(self.factor) if self.ext_factor != 0 else 1.0)

def _frequencies(rot_dims: int, base: float, yarn: Yarn|None) -> np.ndarray:
  freqs = base ** (-np.arange(0, rot_dims, 2, dtype=np.float64) / rot_dims)
  if yarn is None: return freqs
  if yarn.freq_factors is not None:
    if len(yarn.freq_factors) != rot_dims // 2: raise ValueError(f"{len(yarn.freq_factors)} rope frequency factors for {rot_dims // 2} pairs")
    freqs = freqs / np.asarray(yarn.freq_factors, np.float64)
  low, high = yarn.corr_dims(rot_dims, base)
  mix = yarn.ext_factor * (1 - np.clip((np.arange(rot_dims // 2) - low) / max(0.001, high - low), 0, 1))
  return freqs * ((1 - mix) / yarn.factor + mix)

def rope_tables(rot_dims: int, base: float, max_pos: int, yarn: Yarn|None = None, device: str|None = None) -> tuple[Tensor, Tensor]:
  if rot_dims % 2: raise ValueError(f"rot_dims must be even, got {rot_dims}")
  theta = np.outer(np.arange(max_pos, dtype=np.float64), _frequencies(rot_dims, base, yarn))
  mscale = 1.0 if yarn is None else yarn.mscale
  cos, sin = (Tensor((f(theta) * mscale).astype(np.float32), device=device) for f in (np.cos, np.sin))
  return cos.realize(), sin.realize()

def rope_per_element(cos: Tensor, sin: Tensor, interleaved: bool, dims: int) -> tuple[Tensor, Tensor]:
  """The rows' cos and sin [..., rot_dims/2] as factors for each of a head's `dims` elements [..., dims]: a rotated
  x is x * cos + pair_swapped(x) * sin (sin signed for the first element of each pair; 1 and 0 past the rotated part)."""
  half = cos.shape[-1]
  sign = (Tensor.arange(2) * 2 - 1).reshape((1, 2) if interleaved else (2, 1))
  def each(t: Tensor, signed: bool) -> Tensor: return (t.unsqueeze(-1 if interleaved else -2) * (sign if signed else sign.abs())).flatten(-2)
  c, s = each(cos, False), each(sin, True)
  if dims == 2 * half: return c, s
  rest = ((0, 0),) * (c.ndim - 1) + ((0, dims - 2 * half),)
  return c.pad(rest, value=1.0), s.pad(rest)

def pair_swapped(x: Tensor, half: int, interleaved: bool) -> Tensor:
  """x [..., D] with the two elements of each rotation pair of its first 2*half swapped (a view). Attention takes it
  before x is broadcast over the cache's symbolic number of chunks: a flip of such a tensor indexes it through
  divisions by that number, which tinygrad does not simplify away, and a GPU computes them for every element."""
  pairs = x[..., :2 * half].unflatten(-1, (half, 2) if interleaved else (2, half))
  swapped = pairs.flip(-1 if interleaved else -2).flatten(-2)
  return swapped.cat(x[..., 2 * half:], dim=-1) if 2 * half < x.shape[-1] else swapped

def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
  # (a, b) -> (a cos - b sin, b cos + a sin) as one expression over x and its swapped pairs: written as two halves
  # joined by a cat, a rotated q that attention reads once per key is made in two kernels, one per half
  c, s = rope_per_element(cos, sin, interleaved, x.shape[-1])
  return (x * c + pair_swapped(x, cos.shape[-1], interleaved) * s).cast(x.dtype)
