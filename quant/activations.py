"""Activations rounded the way llama.cpp's CPU matmuls round them before a quantized dot product.

ggml multiplies a quantized weight with activations quantized to a "vec_dot" type: Q8_0 (32-blocks, fp16 scale) for
Q4_0, Q5_0, Q8_0 and MXFP4; Q8_1 (the same values, plus a block sum) for Q4_1; Q8_K (256-blocks, fp32 scale from the
signed extreme value) for the K-quants; the weight's own float type for F16 and BF16. Matching llama.cpp to the last
logit needs the same rounding: without it, near-ties at ~1% of the logit scale can flip. Here x is replaced by its
rounded value (q * d), which gives the same dot products as ggml's integer ones up to float summation order.
Rounding is to nearest-even, as ggml's x86 paths do.
"""
from typing import Callable
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes

ROUNDINGS = ("ggml", "exact")

def q8_0_blocks(x: Tensor) -> tuple[Tensor, Tensor]:
  """x [..., in] float32 as Q8_0 blocks: the quants q [..., in / 32, 32] (float, integral) and their scales d
  [..., in / 32, 1] (float32 of an fp16, as Q8_0 stores them)."""
  xb = x.reshape(*x.shape[:-1], -1, 32)
  amax = xb.abs().max(axis=-1, keepdim=True)
  q = (xb * (amax > 0).where(127 / amax, 0)).round()
  return q, (amax / 127).cast(dtypes.float16).cast(dtypes.float32)

def _q8_0(x: Tensor) -> Tensor:
  q, d = q8_0_blocks(x)
  return (q * d).reshape(x.shape)

def _q8_k(x: Tensor) -> Tensor:
  xb = x.reshape(*x.shape[:-1], -1, 256)
  amax = xb.abs().max(axis=-1, keepdim=True)
  peak = (xb == amax).any(axis=-1, keepdim=True).where(amax, -amax)   # the extreme value with its sign
  iscale = (amax > 0).where(-127 / peak, 0)
  q = (xb * iscale).round().minimum(127)
  return (q * (amax > 0).where(1 / iscale, 0)).reshape(x.shape)

def _via(dtype) -> Callable[[Tensor], Tensor]:
  return lambda x: x.cast(dtype).cast(dtypes.float32)

_ROUND = {T.Q4_0: _q8_0, T.Q5_0: _q8_0, T.Q8_0: _q8_0, T.MXFP4: _q8_0, T.Q4_1: _q8_0, T.Q4_K: _q8_k, T.Q5_K: _q8_k, T.Q6_K: _q8_k,
          T.F16: _via(dtypes.float16), T.BF16: _via(dtypes.bfloat16)}

def round_activations(x: Tensor, weight_type: T, rounding: str) -> Tensor:
  """x [..., in] float32 as the matmul against a weight of `weight_type` sees it (rounding is one of ROUNDINGS)."""
  fn = _ROUND.get(weight_type) if rounding == "ggml" else None
  return x if fn is None else fn(x.cast(dtypes.float32))
