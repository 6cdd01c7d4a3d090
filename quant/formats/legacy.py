"""The 32-element formats with one fp16 scale per block: Q4_0, Q4_1, Q5_0, Q8_0.

In the 4- and 5-bit ones element j < 16 sits in the low nibble of byte j and element j + 16 in its high nibble, so a
block splits into two parts of 16 that share the same bytes.
"""
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from quant.blockformat import BlockFormat, Part, f16, lo, hi

def _q4_0(b: Tensor) -> list[Part]:
  d, qs = f16(b[..., 0:2]), b[..., 2:18]
  return [Part(lo(qs).cast(dtypes.float32) - 8, d), Part(hi(qs).cast(dtypes.float32) - 8, d)]

def _q4_1(b: Tensor) -> list[Part]:
  d, m, qs = f16(b[..., 0:2]), f16(b[..., 2:4]), b[..., 4:20]
  return [Part(lo(qs).cast(dtypes.float32), d, m), Part(hi(qs).cast(dtypes.float32), d, m)]

def _q5_0(b: Tensor) -> list[Part]:
  d, qh, qs = f16(b[..., 0:2]), b[..., 2:6].bitcast(dtypes.uint32), b[..., 6:22]
  high = (qh >> Tensor.arange(32, dtype=dtypes.uint32)).bitwise_and(1) << 4   # bit j of qh is bit 4 of element j
  return [Part((lo(qs) | high[..., :16].cast(dtypes.uint8)).cast(dtypes.float32) - 16, d),
          Part((hi(qs) | high[..., 16:].cast(dtypes.uint8)).cast(dtypes.float32) - 16, d)]

def _q8_0(b: Tensor) -> list[Part]: return [Part(b[..., 2:34].bitcast(dtypes.int8).cast(dtypes.float32), f16(b[..., 0:2]))]

Q4_0 = BlockFormat(T.Q4_0, 32, 18, (2, 16), 0, _q4_0, (0,))
Q4_1 = BlockFormat(T.Q4_1, 32, 20, (2, 16), 0, _q4_1, (0, 2))
Q5_0 = BlockFormat(T.Q5_0, 32, 22, (2, 16), 0, _q5_0, (0,))
Q8_0 = BlockFormat(T.Q8_0, 32, 34, (1, 32), 0, _q8_0, (0,))
