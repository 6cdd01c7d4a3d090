"""Seeded random tensors in real GGML block layouts: random quant bits, finite scales of a chosen size."""
import numpy as np
from gguf import GGMLQuantizationType as T
from quant.qtensor import block_format

FLOAT_DTYPES = {T.F32: np.float32, T.F16: np.float16}

def random_blocks(ggml_type: T, shape: tuple[int, ...], rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
  """Raw bytes [*shape[:-1], row_bytes] of a tensor of logical `shape`: float types hold N(0, scale) values, block
  types hold uniform random bits with their fp16 scales drawn from N(0, scale) and MXFP4 exponents near 2^0."""
  fmt = block_format(ggml_type)
  if fmt.block_elems == 1:
    values = (rng.standard_normal(shape) * scale).astype(np.float32)
    raw = (values.view(np.uint32) >> 16).astype(np.uint16) if ggml_type == T.BF16 else values.astype(FLOAT_DTYPES[ggml_type])
    return raw.view(np.uint8).reshape(*shape[:-1], -1)
  blocks = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // fmt.block_elems, fmt.block_bytes), dtype=np.uint8)
  for off in fmt.f16_fields: blocks[..., off:off + 2] = (rng.standard_normal(blocks.shape[:-1] + (1,)) * scale).astype(np.float16).view(np.uint8)
  if ggml_type == T.MXFP4: blocks[..., 0] = rng.integers(124, 131, size=blocks.shape[:-1])
  return blocks.reshape(*shape[:-1], -1)
