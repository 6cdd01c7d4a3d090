"""The word layout of the 32-element formats with one scale per block (Q4_0, Q4_1, Q8_0, MXFP4) for the `packed_words`
matmul strategy.

The same packed bits, rearranged once at load: the scale fields apart and the quants as 32-bit words. A GGUF Q4_0 block
is 18 bytes, so blocks are only 2-byte aligned and a kernel reading them in place loads every quant byte on its own;
as words, a GPU thread reads a block's 16 quant bytes in one 16-byte load. Element 4j + k of a Q8_0 block is byte k
of word j; element 16h + 4j + k of a 4-bit block is nibble h of byte k of word j.

Decoding avoids integer-to-float conversions, which NVIDIA GPUs run at an eighth of the FMA rate (they bounded the
first GPU matvecs), and spends two integer operations an element: a shift that moves the quant to the top of a 1.0's
mantissa, and one mask-and-or (a b-bit quant q becomes the float 1 + q/2^b, exactly). The 1.0 and the format's offset
come off each word's sum at once, 2^b*sum(f*x) - (2^b + offset)*sum(x), where subtracting them per element took a
third operation; sum(x) is the same for every row a thread reads. An E2M1 code's magnitude bits shifted into an fp16's
exponent and mantissa are its value times 2^-14, subnormals included, half-to-float runs at full rate, and its sign
bit is shifted to the float's. Each word's elements are summed before its block's scale multiplies them (one multiply
per 8 or 4 elements).
"""
from dataclasses import dataclass
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from quant.formats.mxfp4 import e8m0_half
from quant.qtensor import QTensor

# GGML type -> (byte offset of the quants, of Q4_1's min or None, bits per element); the scale is bytes 0:2 (fp16), or
# byte 0 (E8M0) for MXFP4
WORD_TYPES = {T.Q4_0: (2, None, 4), T.Q4_1: (4, 2, 4), T.Q8_0: (2, None, 8), T.MXFP4: (1, None, 4)}
ONE = 0x3F800000   # the bits of 1.0

@dataclass(frozen=True)
class WordBlocks:
  ggml_type: T
  words: Tensor          # uint32 [..., nb, words per block]
  d: Tensor              # float16 [..., nb], or MXFP4's uint8 exponents
  m: Tensor | None       # float16 [..., nb]: Q4_1's min

  @property
  def bits(self) -> int: return WORD_TYPES[self.ggml_type][2]

  @property
  def tensors(self) -> list[Tensor]: return [self.words, self.d] + ([self.m] if self.m is not None else [])

  @staticmethod
  def from_blocks(qt: QTensor) -> "WordBlocks | None":
    """The word layout of `qt`, realized on its device; None for a type without one."""
    if qt.ggml_type not in WORD_TYPES: return None
    start, m_at, _ = WORD_TYPES[qt.ggml_type]
    b = qt.blocks
    def field(at: int, size: int, dtype) -> Tensor: return b[..., at:at + size].contiguous().bitcast(dtype).squeeze(-1).contiguous().realize()
    words = b[..., start:].contiguous().bitcast(dtypes.uint32).contiguous().realize()
    d = field(0, 1, dtypes.uint8) if qt.ggml_type is T.MXFP4 else field(0, 2, dtypes.float16)
    return WordBlocks(qt.ggml_type, words, d, field(m_at, 2, dtypes.float16) if m_at is not None else None)

  def _mantissas(self) -> tuple[Tensor, int, int]:
    """Every element as a float32 f before its block's scale, [..., nb, word j, byte k, plane h], and (a, b): its value
    is a*f - b (MXFP4's times 2^-15)."""
    planes = 8 // self.bits   # 2 nibble planes in a 4-bit block's bytes, 1 in Q8_0's
    # byte k of a word is 8k bits up, plane h of a byte 4h more; the plane is innermost, so a word is loaded once for both
    at = (Tensor.arange(4).reshape(1, 4, 1) * 8 + Tensor.arange(planes).reshape(1, 1, planes) * 4).cast(dtypes.int32)
    words = self.words.reshape(*self.words.shape, 1, 1)
    def moved(to: int, mask: int) -> Tensor:   # each element's bits shifted from `at` to bit `to`, masked: one shift each
      return ((words << (to - at).maximum(0).cast(dtypes.uint32)) >> (at - to).maximum(0).cast(dtypes.uint32)).bitwise_and(mask << to)
    if self.ggml_type is T.MXFP4:
      magnitude = moved(9, 7).cast(dtypes.uint16).bitcast(dtypes.float16).cast(dtypes.float32)
      return (magnitude.bitcast(dtypes.uint32) | moved(28, 8)).bitcast(dtypes.float32), 1, 0
    # Q8_0's bytes are int8: with the sign bits flipped (once a word) they are q + 128
    if self.bits == 8: words = words.bitwise_xor(0x80808080)
    top = 23 - self.bits
    f = (moved(top, (1 << self.bits) - 1) | ONE).bitcast(dtypes.float32)
    return f, 1 << self.bits, (1 << self.bits) + {T.Q4_0: 8, T.Q8_0: 128}.get(self.ggml_type, 0)

  def per_word(self, field: Tensor, sel: Tensor | None) -> Tensor:
    """A per-block field [..., nb] as [..., nb, words], gathered by sel: broadcast before the gather, or the gathered
    field is realized by a kernel of its own."""
    field = field.unsqueeze(-1).expand(*field.shape, self.words.shape[-1])
    return field if sel is None else field[sel]

  def _scale(self, sel: Tensor | None) -> Tensor:
    d = self.per_word(self.d, sel)
    return e8m0_half(d) * 2.0 ** 15 if self.ggml_type is T.MXFP4 else d.cast(dtypes.float32)

  def _blocked(self, x: Tensor) -> Tensor:
    """x [..., in] -> [..., 1, nb, word j, byte k, plane h], element 16h + 4j + k of a block at [j, k, h]."""
    n_words, planes = self.words.shape[-1], 8 // self.bits
    xb = x.unsqueeze(-2).reshape(*x.shape[:-1], 1, x.shape[-1] // 32, planes, n_words, 4)
    return xb.permute(*range(xb.ndim - 4), -4, -2, -1, -3)

  def _word_dots(self, xb: Tensor, sel: Tensor | None) -> Tensor:
    """Each word's dot with its slice of x, scaled by its block's scale: [..., O, nb * words] (with sel, [..., k, O, ...]).
    The words of a row are one reduce axis, so a GPU matvec can give neighbouring threads neighbouring words: their
    activation loads then cover one contiguous span, where a thread per block reads 128 bytes a row's block apart
    (quant/matvec_opts.py)."""
    f, a, b = self._mantissas()
    # the decoded expression is gathered, not the words: those would be copied out by a kernel of their own first
    if sel is not None: f = f[sel]
    products = f * xb
    y = products.sum(axis=(-2, -1))
    if b or self.m is not None:
      # x broadcast over the rows before its sum, which then stays in this kernel (a thread computes it once for its rows)
      xs = xb.expand(products.shape).sum(axis=(-2, -1))
      y = y * a - xs * b
    y = y * self._scale(sel)
    if self.m is not None: y = y + self.per_word(self.m, sel).cast(dtypes.float32) * xs
    return y.flatten(-2)

  def dot_and_squares(self, x: Tensor, scale: Tensor | None, sel: Tensor | None = None) -> Tensor:
    """x [..., in] -> [..., O, 2]: each row's dot with x * scale, and beside it the sum of x's squares (the same for
    every row), in one reduce. An RMS norm of x is thereby folded into the matmul that reads it: no kernel of its own
    sums the squares. On a GPU the axis of the two sums is upcast (quant/matvec_opts.py), so a thread computes both
    from the x it loads. With sel, as `dot`: x [..., 1, in] -> [..., k, O, 2]."""
    dots, xb = self._word_dots(self._blocked(x if scale is None else x * scale), sel), self._blocked(x)
    squares = xb.expand(*dots.shape[:-1], *xb.shape[-4:])   # broadcast first: squared where it is read
    squares = (squares * squares).sum(axis=(-2, -1)).flatten(-2)
    return dots.unsqueeze(-2).cat(squares.unsqueeze(-2), dim=-2).sum(axis=-1)   # [..., O, 2, nb * words] -> [..., O, 2]

  def dot(self, x: Tensor, sel: Tensor | None = None, mix: Tensor | None = None) -> Tensor:
    """x [..., in] -> [..., O]. With sel [..., k], the words are [experts, O, ...] and only the selected experts are
    read: x [..., k or 1, in] -> [..., k, O]; with mix [..., k] as well, their sum weighted by it -> [..., O]."""
    y = self._word_dots(self._blocked(x), sel)
    if mix is None: return y.sum(axis=-1)
    # the experts' words as one axis of one sum: a sum over experts around the sum over blocks would be a reduce
    # around a reduce, whose inner one a GPU cannot split over threads
    y = (y * mix.unsqueeze(-1).unsqueeze(-1)).transpose(-3, -2)
    return y.reshape(*y.shape[:-2], -1).sum(axis=-1)
