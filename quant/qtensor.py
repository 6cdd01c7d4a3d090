"""A GGUF tensor kept as its raw blocks on the device, with its GGML type and logical shape."""
from dataclasses import dataclass
import numpy as np
from gguf import GGMLQuantizationType
from tinygrad import Tensor
from ops.host_io import upload
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
    """raw: the tensor's bytes exactly as GGUF stores them (any numpy dtype, viewed as uint8), copied to the device."""
    return QTensor(upload(host_blocks(raw, ggml_type, shape), device), ggml_type, tuple(shape))

  def dequantize(self) -> Tensor:
    """The float32 weights, as a lazy expression over the blocks (realize it to keep a copy)."""
    return self.format.dequantize(self.blocks).reshape(self.shape)

  def rows(self, index: Tensor) -> Tensor:
    """The float32 rows at `index` (int [...]) of a 2-D tensor: [..., shape[-1]], the rows' blocks gathered before they are
    dequantized (a row's bytes read, where a gather from the dequantized table reads the table in groups of rows)."""
    return self.format.dequantize(self.blocks[index]).reshape(*index.shape, self.shape[-1])

def host_blocks(raw: np.ndarray, ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
  """A tensor's bytes as `QTensor.blocks` lays them out, on the host."""
  fmt = block_format(ggml_type)
  if shape[-1] % fmt.block_elems: raise ValueError(f"rows of {shape[-1]} elements are not whole {fmt.name} blocks of {fmt.block_elems}")
  blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(*shape[:-1], shape[-1] // fmt.block_elems, fmt.block_bytes)
  return blocks.view(f"<u{fmt.block_bytes}") if fmt.block_elems == 1 else blocks

def concat_rows(parts: list[tuple[np.ndarray, tuple[int, ...]]], ggml_type: GGMLQuantizationType, device: str | None = None) -> QTensor:
  """One tensor whose rows (the second-to-last logical axis) are those of the parts (raw bytes as from_bytes takes them,
  logical shape) in order, for each index of any leading axes (experts): the same row length and leading axes; joined
  on the host and copied to the device once."""
  shapes = [shape for _, shape in parts]
  if any(s[:-2] != shapes[0][:-2] or s[-1] != shapes[0][-1] for s in shapes):
    raise ValueError("concat_rows needs tensors of one row length and leading axes")
  blocks = np.concatenate([host_blocks(raw, ggml_type, shape) for raw, shape in parts], axis=len(shapes[0]) - 2)
  return QTensor(upload(blocks, device), ggml_type, (*shapes[0][:-2], sum(s[-2] for s in shapes), shapes[0][-1]))
