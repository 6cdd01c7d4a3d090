"""Activations rounded the way llama.cpp's CPU matmuls round them before a quantized dot product.

ggml multiplies a quantized weight with activations quantized to a "vec_dot" type: Q8_0 (32-blocks, fp16 scale) for
Q4_0, Q5_0, Q8_0 and MXFP4; Q8_1 (the same values, plus a block sum) for Q4_1; Q8_K (256-blocks, fp32 scale from the
signed extreme value) for the K-quants; the weight's own float type for F16 and BF16. Matching llama.cpp to the last
logit needs the same rounding: without it, near-ties can flip. Here x is replaced by its
rounded value (q * d), which gives the same dot products as ggml's integer ones up to float summation order.
Rounding is to nearest-even, as ggml's x86 paths do.
"""
from typing import Callable
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes

ROUNDINGS = ("ggml", "exact")

def fp16_rounded(x: Tensor) -> Tensor:
  """float32 x >= 0 (up to fp16's largest) rounded to the nearest fp16, ties to even, subnormals included, as float32.
  Done on the bits: tinygrad 0.14 drops a cast to float16 and back as a no-op (on its CPU backend at least)."""
  bits = x.bitcast(dtypes.uint32)
  exponent = (bits >> 23).cast(dtypes.int32)
  # the low bits an fp16 lacks: 13 of a normal float32's 23 mantissa bits, more below fp16's smallest normal (2^-14),
  # all 23 at its smallest subnormal (2^-24); a carry out of the mantissa moves the exponent up, as it should
  dropped = (13 + (113 - exponent).maximum(0)).minimum(23).cast(dtypes.uint32)
  up = ((bits >> dropped) & 1) + (dropped.const_like(1) << (dropped - 1)) - 1   # half an fp16 step, less one unless odd: ties to even
  rounded = (((bits + up) >> dropped) << dropped).bitcast(dtypes.float32)
  # below 2^-24 an fp16 is 0 or 2^-24, whichever is nearer (a tie at 2^-25 goes to 0)
  return (exponent < 103).where((x > 2.0 ** -25).where(2.0 ** -24, 0.0), rounded)

def q8_0_blocks(x: Tensor, max_per_quant: bool = False) -> tuple[Tensor, Tensor]:
  """x [..., in] float32 as Q8_0 blocks: the quants q [..., in / 32, 32] (float, integral) and their scales d
  [..., in / 32, 1] (float32 of an fp16, as Q8_0 stores them). With `max_per_quant` each quant takes its block's largest
  magnitude again: tinygrad then computes it inside the kernel that reads the quants, where it would realize a block's
  maximum, broadcast over the block afterwards, by a kernel of its own (32 comparisons a quant instead of one)."""
  xb = x.reshape(*x.shape[:-1], -1, 32)
  magnitudes = xb.abs()
  amax = (magnitudes.unsqueeze(-2).expand(*xb.shape, 32) if max_per_quant else magnitudes).max(axis=-1, keepdim=not max_per_quant)
  q = (xb * (amax > 0).where(127 / amax, 0)).round()
  if not max_per_quant: return q, fp16_rounded(amax / 127)
  # rounding is monotone, so the largest rounded magnitude / 127 is the rounded largest one; rounded before the max, the
  # rounding's bitcasts read no reduce (tinygrad realizes one that they read by a kernel of its own)
  return q, fp16_rounded(magnitudes / 127).max(axis=-1, keepdim=True)

def _q8_0(x: Tensor) -> Tensor:
  q, d = q8_0_blocks(x)
  return (q * d).reshape(x.shape)

def q8_k_blocks(x: Tensor) -> tuple[Tensor, Tensor]:
  """x [..., in] float32 as Q8_K blocks: the quants q [..., in / 256, 256] (float, integral) and their float32 scales d
  [..., in / 256, 1], from the block's extreme value with its sign (its quant is -127)."""
  xb = x.reshape(*x.shape[:-1], -1, 256)
  amax = xb.abs().max(axis=-1, keepdim=True)
  peak = (xb == amax).any(axis=-1, keepdim=True).where(amax, -amax)   # the extreme value with its sign
  iscale = (amax > 0).where(-127 / peak, 0)
  return (xb * iscale).round().minimum(127), (amax > 0).where(1 / iscale, 0)

def _q8_k(x: Tensor) -> Tensor:
  q, d = q8_k_blocks(x)
  return (q * d).reshape(x.shape)

def _via(dtype) -> Callable[[Tensor], Tensor]:
  return lambda x: x.cast(dtype).cast(dtypes.float32)

K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)   # those whose activations ggml rounds as Q8_K
_ROUND = {T.Q4_0: _q8_0, T.Q5_0: _q8_0, T.Q8_0: _q8_0, T.MXFP4: _q8_0, T.Q4_1: _q8_0, **{t: _q8_k for t in K_QUANTS},
          T.F16: _via(dtypes.float16), T.BF16: _via(dtypes.bfloat16)}

def round_activations(x: Tensor, weight_type: T, rounding: str) -> Tensor:
  """x [..., in] float32 as the matmul against a weight of `weight_type` sees it (rounding is one of ROUNDINGS)."""
  fn = _ROUND.get(weight_type) if rounding == "ggml" else None
  return x if fn is None else fn(x.cast(dtypes.float32))

def realized_rounding(x: Tensor, weight_type: T, rounding: str) -> Tensor:
  """round_activations, realized by a kernel of its own where it rounds, for a matmul that reads x as it is given (a
  matvec, a prompt chunk's packed matmul): reading the expression, it would round x again for each group of its rows. A
  GEMM realizes its input anyway, the rounding in that kernel."""
  rounded = round_activations(x, weight_type, rounding)
  return x if rounded is x else rounded.contiguous()
