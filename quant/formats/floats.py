"""F32, F16 and BF16: one element per block, the value itself."""
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from quant.blockformat import BlockFormat, Part

def _f32(b: Tensor) -> list[Part]: return [Part(b.bitcast(dtypes.float32)[..., 0])]
def _f16(b: Tensor) -> list[Part]: return [Part(b.bitcast(dtypes.float16)[..., 0].cast(dtypes.float32))]
# bf16 is the high half of an fp32: widen the bits instead of relying on the backend's bf16 support
def _bf16(b: Tensor) -> list[Part]: return [Part((b.bitcast(dtypes.uint16)[..., 0].cast(dtypes.uint32) << 16).bitcast(dtypes.float32))]

F32 = BlockFormat(T.F32, 1, 4, (1,), 0, _f32)
F16 = BlockFormat(T.F16, 1, 2, (1,), 0, _f16)
BF16 = BlockFormat(T.BF16, 1, 2, (1,), 0, _bf16)
