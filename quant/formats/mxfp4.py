"""MXFP4 (OCP microscaling): 32 E2M1 values sharing one E8M0 exponent byte, nibbles laid out as in Q4_0."""
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from quant.blockformat import BlockFormat, Part, lo, hi

def e2m1(c: Tensor) -> Tensor:
  """4-bit code -> twice its E2M1 value (0, 1, 2, 3, 4, 6, 8, 12 and negatives), as ggml keeps them."""
  m = c.bitwise_and(7).cast(dtypes.int32)
  mag = (m < 2).where(m, (2 + m.bitwise_and(1)) << ((m >> 1) - 1).maximum(0))
  return (c >= 8).where(-mag, mag).cast(dtypes.float32)

def e8m0_half(e: Tensor) -> Tensor:
  """2^(e-128): the exponent halved to match the doubled E2M1 values; e < 2 gives fp32 subnormals."""
  e = e.cast(dtypes.uint32)
  return (e < 2).where(Tensor(0x00200000, dtype=dtypes.uint32) << e, (e - 1) << 23).bitcast(dtypes.float32)

def _mxfp4(b: Tensor) -> list[Part]:
  d, qs = e8m0_half(b[..., 0:1]), b[..., 1:17]
  return [Part(e2m1(lo(qs)), d), Part(e2m1(hi(qs)), d)]

MXFP4 = BlockFormat(T.MXFP4, 32, 17, (2, 16), 0, _mxfp4)
