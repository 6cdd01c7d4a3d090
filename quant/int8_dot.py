"""The `int8_dot` matmul strategy: packed words against activations quantized to 8 bits, summed in integers by dp4a.

llama.cpp's CUDA matvecs quantize x to 8 bits a 32-element block (its q8_1, the rounding of its CPU paths'
Q8_0) in a kernel of their own, then multiply a weight's integer quants with x's four at a time (`__dp4a`). Against a
float matvec that reads 32 bytes of x for every 4 bytes of Q4_0 weight and spends about three instructions a weight
decoding and multiplying, it reads 8 and spends about one for four weights: the two costs that kept float Q4_0 gemvs
well below a copy's rate on a GPU (results/gpu_notes.md). Each word's integer dot is converted to float once and scaled
by both blocks' scales.

Word j of a 4-bit block holds elements 4j + k in its low nibbles and 16 + 4j + k in its high ones (quant/words.py): the
low nibbles masked out are four unsigned bytes against x's word j, the high ones against word 4 + j. The sum of the
eight quants of x that a word meets is two more dp4a, against bytes of one: Q4_0's offset of 8 takes 8 times it off the
word's integer dot, Q4_1's min adds m * d_x times it. Q8_0's bytes are signed already. Other types have no integer form
here.
"""
from dataclasses import dataclass
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from ops.dp4a import dp4a
from quant.activations import K_QUANTS, q8_0_blocks, q8_k_blocks
from quant.words import WordBlocks

INT8_TYPES = (T.Q4_0, T.Q4_1, T.Q8_0)
LOW_NIBBLES = 0x0F0F0F0F
ONE_BYTES = 0x01010101   # dp4a against it sums a word's four signed bytes

@dataclass(frozen=True)
class Int8Rows:
  """x [..., in] quantized to 8 bits a 32-element block, as ggml's Q8_0 rounds it: one buffer, [..., in / 32, 12] uint32
  a block, its quants as 8 words (element 4w + k is byte k of word w), then the bits of the float32 d (the quants times
  d are the block's values) and three zeros (a block is 48 bytes: three 16-byte loads), written by one kernel."""
  blocks: Tensor

  @staticmethod
  def quantize(x: Tensor, weight_type: T = T.Q8_0) -> "Int8Rows":
    """x [..., in] (in a multiple of 32) as a buffer of its own (`contiguous`), which every matmul reading x can share,
    rounded as ggml rounds the activations of a weight_type: for a K-quant as Q8_K (in a multiple of 256; each of its
    32-element blocks holds its 256-block's quants and float32 scale)."""
    if weight_type in K_QUANTS:
      q, d = q8_k_blocks(x.cast(dtypes.float32))
      q, d = q.reshape(*q.shape[:-2], -1, 32), d.expand(*d.shape[:-1], 8).reshape(*d.shape[:-2], -1, 1)
    else: q, d = q8_0_blocks(x.cast(dtypes.float32), max_per_quant=True)
    # four quants a word, each as its two's-complement byte shifted into place: the bytes do not overlap, so their sum
    # is their bitwise or
    shifts = (Tensor.arange(4) * 8).cast(dtypes.uint32)
    words = ((q.cast(dtypes.int32).cast(dtypes.uint32) & 0xFF).reshape(*q.shape[:-1], 8, 4) << shifts).sum(-1, dtype=dtypes.uint32)
    return Int8Rows(words.cat(d.pad(((0, 0),) * (d.ndim - 1) + ((0, 3),)).bitcast(dtypes.uint32), dim=-1).contiguous())

  @property
  def words(self) -> Tensor: return self.blocks[..., :8]

  @property
  def scale(self) -> Tensor: return self.blocks[..., 8].bitcast(dtypes.float32)

def int8_dot(w: WordBlocks, x: Int8Rows, sel: Tensor | None = None, mix: Tensor | None = None) -> Tensor:
  """w of a type in INT8_TYPES [..., O, nb, words], x [..., in] quantized -> [..., O] float32. With sel [..., k] the words
  are [experts, O, nb, words] and only the selected experts are read: x [..., k or 1, in] -> [..., k, O]; with mix
  [..., k] as well, their outputs summed with those weights -> [..., O], one sum over experts and blocks."""
  if w.ggml_type not in INT8_TYPES:
    raise ValueError(f"int8_dot has no integer form for {w.ggml_type.name} (only {', '.join(t.name for t in INT8_TYPES)})")
  # a word's expression is gathered, not the words: those would be copied out by a kernel of their own first
  def chosen(t: Tensor) -> Tensor: return t if sel is None else t[sel]
  xw = x.words.unsqueeze(-3)   # [..., 1, nb, 8]: one x for every row
  if w.bits == 8: dots = dp4a(chosen(w.words), xw)
  else:
    dots = dp4a(chosen(w.words & LOW_NIBBLES), xw[..., :4]) + dp4a(chosen((w.words >> 4) & LOW_NIBBLES), xw[..., 4:])
    ones = xw[..., :4].const_like(ONE_BYTES)
    sums = dp4a(xw[..., :4], ones) + dp4a(xw[..., 4:], ones)   # [..., 1, nb, 4]: the quants each word meets
    if w.ggml_type is T.Q4_0: dots = dots - 8 * sums
  scale = x.scale.unsqueeze(-2).unsqueeze(-1)   # [..., 1, nb, 1]
  y = dots.cast(dtypes.float32) * scale * w.per_word(w.d, sel).cast(dtypes.float32)
  if w.m is not None: y = y + w.per_word(w.m, sel).cast(dtypes.float32) * scale * sums.cast(dtypes.float32)
  if mix is None: return y.sum(axis=(-2, -1))
  return (y * mix.reshape(*mix.shape, 1, 1, 1)).sum(axis=(-4, -2, -1))
