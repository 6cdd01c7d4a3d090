"""The word layout of the 32-element legacy formats (Q4_0, Q4_1, Q8_0) for the `packed_words` matmul strategy.

The same packed bits, rearranged once at load: the fp16 fields apart and the quants as 32-bit words. A GGUF Q4_0 block
is 18 bytes, so blocks are only 2-byte aligned and a kernel reading them in place loads every quant byte on its own;
as words, a GPU thread reads a block's 16 quant bytes in one 16-byte load. Element 4j + k of a Q8_0 block is byte k
of word j; element 16h + 4j + k of a 4-bit block is nibble h of byte k of word j.
"""
from dataclasses import dataclass
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from quant.qtensor import QTensor

# GGML type -> (byte offset of the quants, of Q4_1's min or None, bits per element); the scale d is always bytes 0:2
WORD_TYPES = {T.Q4_0: (2, None, 4), T.Q4_1: (4, 2, 4), T.Q8_0: (2, None, 8)}

@dataclass(frozen=True)
class WordBlocks:
  words: Tensor          # uint32 [..., nb, words per block]
  d: Tensor              # float16 [..., nb]
  m: Tensor | None       # float16 [..., nb]: Q4_1's min
  bits: int

  @property
  def tensors(self) -> list[Tensor]: return [self.words, self.d] + ([self.m] if self.m is not None else [])

  @staticmethod
  def from_blocks(qt: QTensor) -> "WordBlocks | None":
    """The word layout of `qt`, realized on its device; None for a type without one."""
    if qt.ggml_type not in WORD_TYPES: return None
    start, m_at, bits = WORD_TYPES[qt.ggml_type]
    b = qt.blocks
    def half(at: int) -> Tensor: return b[..., at:at + 2].contiguous().bitcast(dtypes.float16).squeeze(-1).contiguous().realize()
    words = b[..., start:].contiguous().bitcast(dtypes.uint32).contiguous().realize()
    return WordBlocks(words, half(0), half(m_at) if m_at is not None else None, bits)

  def dot(self, x: Tensor, sel: Tensor | None = None) -> Tensor:
    """x [..., in] -> [..., O]: one reduce over every element of every block, as packed-dot does. With sel [..., k], the
    words are [experts, O, ...] and only the selected experts are read."""
    n_words, planes = self.words.shape[-1], 8 // self.bits   # 2 nibble planes in a 4-bit block's bytes, 1 in Q8_0's
    # axes inside a block: word j, byte k, plane h (innermost, so a word is loaded once for both planes); byte k of a
    # word is 8k bits up, plane h of a byte 4h more
    shifts = (Tensor.arange(4).reshape(1, 4, 1) * 8 + Tensor.arange(planes).reshape(1, 1, planes) * 4).cast(dtypes.uint32)
    q = (self.words.reshape(*self.words.shape, 1, 1) >> shifts).bitwise_and((1 << self.bits) - 1)
    # Q8_0 bytes are int8: flipping the sign bit and subtracting 128 sign-extends them
    v = (q.bitwise_xor(0x80).cast(dtypes.float32) - 128) if self.bits == 8 else q.cast(dtypes.float32) - (8 if self.m is None else 0)
    scale = self.d.cast(dtypes.float32).reshape(*self.d.shape, 1, 1, 1)
    w = v * scale if self.m is None else v * scale + self.m.cast(dtypes.float32).reshape(*self.m.shape, 1, 1, 1)
    if sel is not None: w = w[sel]   # the weights' expression is gathered, not the words: those would be copied out first
    xb = x.unsqueeze(-2).reshape(*x.shape[:-1], 1, x.shape[-1] // 32, planes, n_words, 4)
    xb = xb.permute(*range(xb.ndim - 4), -4, -2, -1, -3)   # element 16h + 4j + k of a block at [j, k, h]
    return (w * xb).sum(axis=(-4, -3, -2, -1))
