"""A four-byte integer dot product as a tensor op: dp4a(a, b) = sum over k of byte k of a times byte k of b, each read
as a signed 8-bit integer, for int32 tensors a and b. NVIDIA GPUs do this in one instruction (`__dp4a`), four products
where a float matvec spends at least one instruction a weight; tinygrad renders no such op, so it is a custom inline UOp
(Ops.CUSTOMI) calling a function that each C-style renderer defines at the top of the kernels using it: `__dp4a` on
CUDA, four byte products in plain C elsewhere (the CPU tests run the same kernels).

tinygrad's devectorizers, which split an op over a vector (an UPCAST or UNROLL) into one op a lane, know only the built-in
elementwise ops, so a CUSTOMI over a vector would reach the renderer whole and fail: PER_LANE splits it the same way. It
and the definition (`definition`) at the top of a kernel that calls the function are installed into tinygrad by
ops/patches.py, which a kernel using dp4a needs.
"""
import itertools
import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.renderer.cstyle import CStyleLanguage, CUDARenderer
from tinygrad.uop.ops import Ops, PatternMatcher, UOp, UPat

NAME = "tz_dp4a"
_BYTES = " + ".join(f"(int)(signed char)(a >> {8 * k}) * (int)(signed char)(b >> {8 * k})" for k in range(4))
DEFINITIONS = {CUDARenderer: f"__device__ __forceinline__ int {NAME}(int a, int b) {{ return __dp4a(a, b, 0); }}",
               CStyleLanguage: f"static inline int {NAME}(int a, int b) {{ return {_BYTES}; }}"}

def dp4a(a: Tensor, b: Tensor) -> Tensor:
  """a, b int32 (broadcast against each other) -> int32: the dot product of their four signed bytes."""
  device = a.device if isinstance(a.device, str) else a.device[0]
  if not isinstance(renderer := Device[device].renderer, CStyleLanguage):
    raise ValueError(f"dp4a (the int8_dot strategy) needs a C-style renderer; {device} renders with {type(renderer).__name__}")
  shape = tuple(np.broadcast_shapes(a.shape, b.shape))
  # the CUSTOMI's sources are given their full shape here (tinygrad broadcasts only its built-in ops) and cast to int32,
  # which also makes their buffers loads (a CUSTOMI straight over an index would be handed the address)
  a, b = [t.cast(dtypes.int32).reshape((1,) * (len(shape) - t.ndim) + t.shape).expand(shape) for t in (a, b)]
  return Tensor(UOp(Ops.CUSTOMI, dtypes.int32, (a.uop, b.uop), arg=NAME + "({0}, {1})"))

def _per_lane(op: UOp) -> UOp | None:
  """A CUSTOMI over a vector as one CUSTOMI a lane, its sources broadcast along their axes of size 1, a scalar source to
  every lane (tinygrad's do_devectorize, which keeps no dtype that CUSTOMI cannot infer, and wants broadcasts unpacked
  first)."""
  if op.shape == () or any(len(s.shape) not in (0, len(op.shape)) for s in op.src): return None
  def lane(s: UOp, at: tuple[int, ...]) -> UOp:
    return s if s.shape == () else s.index(*[UOp.const(i if n > 1 else 0) for i, n in zip(at, s.shape)])
  lanes = [op.replace(src=tuple(lane(s, at) for s in op.src)) for at in itertools.product(*[range(n) for n in op.shape])]
  return UOp.stack(*lanes).reshape(op.shape)

PER_LANE = PatternMatcher([(UPat(Ops.CUSTOMI, name="op"), _per_lane)])

def definition(renderer: CStyleLanguage) -> str:
  """The function's definition for a kernel rendered by `renderer`."""
  return next(d for cls, d in DEFINITIONS.items() if isinstance(renderer, cls))
