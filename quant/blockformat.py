"""How one GGML block format is described: its sizes, the logical layout of a block, and its parts.

A block of `block_elems` weights is viewed in its logical order as `layout` (for Q4_0: (2, 16), the low nibbles then the
high ones). Indexing `axis` of that layout enumerates the block's parts: each part is computed from the packed bytes
alone, without interleaving nibbles, as `q * scale + offset`, where `scale` and `offset` are constant along the
part's last axis. Matmul strategies combine parts with the matching slices of the activations (packed-dot) or stack
them back into the logical order (dequantize).
"""
from dataclasses import dataclass
from typing import Callable
from gguf import GGMLQuantizationType
from tinygrad import Tensor, dtypes

@dataclass(frozen=True)
class Part:
  q: Tensor
  scale: Tensor | None = None
  offset: Tensor | None = None

  def value(self) -> Tensor:
    v = self.q if self.scale is None else self.q * self.scale
    return v if self.offset is None else v + self.offset

@dataclass(frozen=True)
class BlockFormat:
  ggml_type: GGMLQuantizationType
  block_elems: int
  block_bytes: int
  layout: tuple[int, ...]
  axis: int
  parts: Callable[[Tensor], list[Part]]   # blocks [..., nb, block_bytes] uint8 -> parts [..., nb, *layout without axis]
  f16_fields: tuple[int, ...] = ()        # byte offsets of the fp16 scales/mins in a block

  @property
  def name(self) -> str: return self.ggml_type.name

  def split(self, x: Tensor) -> list[Tensor]:
    """Activations [..., nb * block_elems] as the parts' matching slices, each [..., nb, *layout without axis]."""
    xv = x.reshape(*x.shape[:-1], x.shape[-1] // self.block_elems, *self.layout)
    return [xv[(..., i) + (slice(None),) * (len(self.layout) - self.axis - 1)] for i in range(self.layout[self.axis])]

  def dequantize(self, blocks: Tensor) -> Tensor:
    """blocks [..., nb, block_bytes] uint8 -> float32 weights [..., nb * block_elems] in logical order."""
    parts = [p.value().cast(dtypes.float32) for p in self.parts(blocks)]
    return Tensor.stack(*parts, dim=blocks.ndim - 1 + self.axis).reshape(*blocks.shape[:-2], -1)

# shared byte readers
def f16(b: Tensor) -> Tensor: return b.bitcast(dtypes.float16).cast(dtypes.float32)
def lo(b: Tensor) -> Tensor: return b.bitwise_and(0xF)
def hi(b: Tensor) -> Tensor: return b.rshift(4)
def bit(b: Tensor, shift: int, width: int = 1) -> Tensor: return b.rshift(shift).bitwise_and((1 << width) - 1)
