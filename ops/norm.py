"""RMS normalisation over the last axis.

The statistics and the weight multiply run in float32 whatever x's dtype; the result is cast back to x's dtype.
Models whose weight is stored as an offset (Gemma's `1 + w`) pass the already-offset weight.
"""
from dataclasses import dataclass
from tinygrad import Tensor, dtypes

def rms_norm(x: Tensor, weight: Tensor|None, eps: float) -> Tensor:
  xf = x.cast(dtypes.float32)
  out = xf * (xf.square().mean(axis=-1, keepdim=True) + eps).rsqrt()
  if weight is not None: out = out * weight.cast(dtypes.float32)
  return out.cast(x.dtype)

NORMS = ("fused", "break", "fold")   # how a matmul reads an RMS norm (models/blocks.py normed_input)

@dataclass(frozen=True)
class NormedInput:
  """rms_norm(x, weight, eps) as a matmul's input, left for the matmul to compute: one that can folds the norm into
  itself (QuantLinear.normed), anything else reads `value()`."""
  x: Tensor
  weight: Tensor|None
  eps: float

  @property
  def shape(self) -> tuple: return self.x.shape

  def value(self) -> Tensor: return rms_norm(self.x, self.weight, self.eps)
