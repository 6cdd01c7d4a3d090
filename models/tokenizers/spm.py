"""SentencePiece as llama.cpp runs it, by the sentencepiece package: a BPE model built from the GGUF's tokens and scores, where the pair
whose concatenation is the highest-scoring token merges first (leftmost on ties), and characters left without a token fall back to bytes.

llama.cpp lets any token text take part in merges, so every token but the unknown one and the byte tokens is declared NORMAL here;
user-defined and control tokens are cut out of the text beforehand (models.tokenizer), and the text arrives with U+2581 for spaces."""
from functools import cached_property
import numpy as np
import sentencepiece
from models.tokenizers.vocab import TokenType

_NORMAL, _UNKNOWN, _BYTE = 1, 2, 6   # sentencepiece.ModelProto.SentencePiece.Type
_BPE = 2                              # sentencepiece.TrainerSpec.ModelType

def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1   # negative int32 fields are sign-extended to 64 bits
  out = bytearray()
  while n >= 0x80: out.append(n & 0x7f | 0x80); n >>= 7
  return bytes(out + bytes([n]))

def _field(number: int, value: int | bytes) -> bytes:
  """One protobuf field: an int as a varint, bytes length-delimited."""
  if isinstance(value, int): return _varint(number << 3) + _varint(value)
  return _varint(number << 3 | 2) + _varint(len(value)) + value

def _pieces(tokens: list[str], scores: np.ndarray, kinds: list[int]) -> bytes:
  """The repeated `pieces` field {piece = 1, score = 2, type = 3}, written inline: this loop runs once per token."""
  texts = [t.encode() for t in tokens]
  lengths = [_varint(n) for n in range(max(map(len, texts)) + 16)]
  packed, tails = scores.astype("<f4").tobytes(), {k: _field(3, k) for k in set(kinds)}
  out = []
  for i, (text, kind) in enumerate(zip(texts, kinds)):
    piece = b"\x0a" + lengths[len(text)] + text + b"\x15" + packed[4 * i:4 * i + 4] + tails[kind]
    out.append(b"\x0a" + lengths[len(piece)] + piece)
  return b"".join(out)

def model_proto(tokens: list[str], scores: np.ndarray, types: np.ndarray, unk_id: int) -> bytes:
  """A serialized sentencepiece ModelProto (the protobuf module is not needed for this one message)."""
  kinds = np.where(types == TokenType.BYTE, _BYTE, _NORMAL)
  kinds[unk_id] = _UNKNOWN
  byte_fallback = int(bool((kinds == _BYTE).any()))
  trainer = _field(3, _BPE) + _field(35, byte_fallback) + _field(40, unk_id) + _field(41, -1) + _field(42, -1) + _field(43, -1)
  normalizer = _field(1, b"identity") + _field(3, 0) + _field(4, 0) + _field(5, 0)   # no dummy prefix, keep whitespace, no escaping
  return _pieces(tokens, scores, kinds.tolist()) + _field(2, trainer) + _field(3, normalizer)

class SentencePiece:
  def __init__(self, tokens: list[str], scores: np.ndarray, types: np.ndarray, unk_id: int):
    self.tokens, self.scores, self.types, self.unk_id = tokens, scores, types, unk_id

  @cached_property
  def processor(self) -> sentencepiece.SentencePieceProcessor:
    """Built on first use: serializing a large vocabulary takes a noticeable fraction of a second."""
    return sentencepiece.SentencePieceProcessor(model_proto=model_proto(self.tokens, self.scores, self.types, self.unk_id))

  def encode(self, text: str) -> list[int]: return self.processor.encode(text.replace(" ", "\u2581"))
