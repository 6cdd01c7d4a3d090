"""A GGUF tensor kept as its raw blocks on the device, with its GGML type and logical shape."""
from dataclasses import dataclass
import numpy as np
from gguf import GGMLQuantizationType
from tinygrad import Tensor
from quant.blockformat import BlockFormat
from quant.formats import FORMATS

class UnsupportedType(ValueError): pass

def block_format(ggml_type: GGMLQuantizationType) -> BlockFormat:
  if (fmt := FORMATS.get(ggml_type)) is None:
    raise UnsupportedType(f"GGML type {ggml_type.name} is not supported (supported: {', '.join(f.name for f in FORMATS.values())})")
  return fmt

@dataclass(frozen=True)
class QTensor:
  # uint8 [*shape[:-1], shape[-1] // block_elems, block_bytes]; a one-element block (F32, F16, BF16) as one unsigned
  # integer of its width, [*shape[:-1], shape[-1], 1], so that a kernel loads it whole rather than byte by byte
  blocks: Tensor
  ggml_type: GGMLQuantizationType
  shape: tuple[int, ...]          # logical, row-major: the GGUF dims reversed

  @property
  def format(self) -> BlockFormat: return block_format(self.ggml_type)

  @property
  def nbytes(self) -> int: return self.blocks.nbytes()

  @staticmethod
  def from_bytes(raw: np.ndarray, ggml_type: GGMLQuantizationType, shape: tuple[int, ...], device: str | None = None) -> "QTensor":
    """raw: the tensor's bytes exactly as GGUF stores them (any numpy dtype, viewed as uint8)."""
    fmt = block_format(ggml_type)
    if shape[-1] % fmt.block_elems: raise ValueError(f"rows of {shape[-1]} elements are not whole {fmt.name} blocks of {fmt.block_elems}")
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(*shape[:-1], shape[-1] // fmt.block_elems, fmt.block_bytes)
    if fmt.block_elems == 1: blocks = blocks.view(f"<u{fmt.block_bytes}")
    return QTensor(Tensor(blocks, device=device), ggml_type, tuple(shape))

  def dequantize(self) -> Tensor:
    """The float32 weights, as a lazy expression over the blocks (realize it to keep a copy)."""
    return self.format.dequantize(self.blocks).reshape(self.shape)

def concat_rows(tensors: list[QTensor]) -> QTensor:
  """One tensor whose rows (the second-to-last logical axis) are those of `tensors` in order, for each index of any
  leading axes (experts); one GGML type, the same row length and leading axes; packed bytes copied once."""
  first = tensors[0]
  if any(t.ggml_type != first.ggml_type or t.shape[:-2] != first.shape[:-2] or t.shape[-1] != first.shape[-1] for t in tensors):
    raise ValueError("concat_rows needs tensors of one GGML type, row length and leading axes")
  blocks = first.blocks.cat(*[t.blocks for t in tensors[1:]], dim=-3).contiguous().realize()
  return QTensor(blocks, first.ggml_type, (*first.shape[:-2], sum(t.shape[-2] for t in tensors), first.shape[-1]))
