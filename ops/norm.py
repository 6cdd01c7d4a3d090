"""RMS normalisation over the last axis.

The statistics and the weight multiply run in float32 whatever x's dtype; the result is cast back to x's dtype.
Models whose weight is stored as an offset (Gemma's `1 + w`) pass the already-offset weight.
"""
from dataclasses import dataclass
from tinygrad import Tensor, dtypes

def rms_scale(x: Tensor, eps: float, sum_per_output: bool = False) -> Tensor:
  """1/rms(x) over the last axis in float32: [..., 1], or with `sum_per_output` [..., n], x's squares broadcast over the
  outputs before they are summed. tinygrad then computes the sum inside the kernel that reads it (every workgroup sums
  them again, from cache) where it would realize a sum that is broadcast afterwards as a kernel of its own; n^2
  additions instead of n, for one row of x."""
  squares = x.cast(dtypes.float32).square()
  if sum_per_output: squares = squares.unsqueeze(-2).expand(*squares.shape, squares.shape[-1])
  return (squares.mean(axis=-1, keepdim=not sum_per_output) + eps).rsqrt()

def rms_norm(x: Tensor, weight: Tensor|None, eps: float, sum_per_output: bool = False) -> Tensor:
  out = x.cast(dtypes.float32) * rms_scale(x, eps, sum_per_output)
  if weight is not None: out = out * weight.cast(dtypes.float32)
  return out.cast(x.dtype)

NORMS = ("fused", "break", "single", "fold")   # how a matmul reads an RMS norm (models/blocks.py normed_input)

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
