"""Every GGML block format tinyzoo reads, keyed by GGML type."""
from gguf import GGMLQuantizationType
from quant.blockformat import BlockFormat
from quant.formats.floats import F32, F16, BF16
from quant.formats.legacy import Q4_0, Q4_1, Q5_0, Q8_0
from quant.formats.kquants import Q4_K, Q5_K, Q6_K
from quant.formats.mxfp4 import MXFP4

FORMATS: dict[GGMLQuantizationType, BlockFormat] = {f.ggml_type: f for f in (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)}
