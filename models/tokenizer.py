"""Text <-> token ids from a GGUF file's vocabulary alone, token for token as llama.cpp: SentencePiece (`llama`) and BPE (`gpt2`, `gemma4`)
vocabularies, special tokens, byte-exact decoding for streaming, and chat templates."""
import codecs
from typing import Iterable
from models.tokenizers import chat
from models.tokenizers.bpe import BPE, CHAR_BYTES
from models.tokenizers.pretokenizers import pre_tokenizer
from models.tokenizers.spm import SentencePiece
from models.tokenizers.vocab import TokenType, Vocab
from quant.gguf_file import GGUFFile

class Tokenizer:
  def __init__(self, vocab: Vocab):
    self.vocab = vocab
    if vocab.model == "llama": self.engine: SentencePiece | BPE = SentencePiece(vocab.tokens, vocab.scores, vocab.types, vocab.unk_id or 0)
    else: self.engine = BPE(vocab.token_to_id, vocab.merges, pre_tokenizer(vocab.pre), byte_level=vocab.model == "gpt2")
    self._specials = {parse: vocab.special_ids(parse) for parse in (False, True)}
    self._types = vocab.types.tolist()
    self._bytes: dict[int, bytes] = {}   # normal tokens' bytes, filled as they are met

  @classmethod
  def from_gguf(cls, g: GGUFFile) -> "Tokenizer": return cls(Vocab.from_gguf(g))

  @property
  def kind(self) -> str: return self.vocab.kind
  @property
  def vocab_size(self) -> int: return len(self.vocab.tokens)
  @property
  def bos_id(self) -> int | None: return self.vocab.bos_id
  @property
  def eos_id(self) -> int | None: return self.vocab.eos_id
  @property
  def stop_ids(self) -> frozenset[int]:
    """Ids that end generation: EOS, EOT/EOM, and end-of-turn markers such as <end_of_turn> and <|im_end|>."""
    return self.vocab.stop_ids

  def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
    """Token ids of text. add_special: BOS/EOS as the file asks; parse_special: control token texts (<|im_start|>, ...) become their ids."""
    v = self.vocab
    ids = [v.bos_id] if add_special and v.add_bos and v.bos_id is not None else []
    after_special = True   # SentencePiece puts its space prefix at the start and after every special token
    for part in self._split_specials(text, parse_special):
      if isinstance(part, int): ids.append(part)
      else: ids += self.engine.encode(" " + part if v.add_space_prefix and after_special else part)
      after_special = isinstance(part, int)
    if add_special and v.add_eos and v.eos_id is not None: ids.append(v.eos_id)
    return ids

  def _split_specials(self, text: str, parse_special: bool) -> list[str | int]:
    """text cut at special token texts, longest token first (as llama.cpp); the cuts become ids."""
    parts: list[str | int] = [text] if text else []
    for tid in self._specials[parse_special]:
      token = self.vocab.tokens[tid]
      if token not in text: continue
      lstrip, rstrip = tid in self.vocab.lstrip_ids, tid in self.vocab.rstrip_ids
      parts = [p for part in parts for p in (_cut(part, token, tid, lstrip, rstrip) if isinstance(part, str) else (part,))]
    return parts

  def piece_bytes(self, token: int, special: bool = False) -> bytes:
    """The bytes a token stands for; control and unknown tokens are empty unless special (byte tokens may be part of a character)."""
    text, kind = self.vocab.tokens[token], self._types[token]
    if kind in (TokenType.CONTROL, TokenType.UNKNOWN): return text.encode() if special else b""
    if kind == TokenType.USER_DEFINED: return text.encode()
    if kind == TokenType.BYTE: return bytes([int(text[3:5], 16)])
    if kind != TokenType.NORMAL: return b""
    if (data := self._bytes.get(token)) is None: data = self._bytes[token] = self._normal_bytes(text)
    return data

  def _normal_bytes(self, text: str) -> bytes:
    if self.vocab.model != "gpt2": return text.replace("\u2581", " ").encode()
    return bytes(CHAR_BYTES[c] for c in text) if all(c in CHAR_BYTES for c in text) else text.encode()   # else: not a byte-level spelling

  def decode(self, ids: Iterable[int], special: bool = False) -> str:
    """The text of ids; the space a SentencePiece space prefix put before the first word is dropped again."""
    ids = list(ids)
    pieces = [self.piece_bytes(i, special) for i in ids]
    if self.vocab.add_space_prefix and (first := next((k for k, p in enumerate(pieces) if p), None)) is not None:
      if self._types[ids[first]] == TokenType.NORMAL and pieces[first][:1] == b" ": pieces[first] = pieces[first][1:]
    return b"".join(pieces).decode("utf-8", errors="replace")

  @property
  def chat_template(self) -> str | None:
    """The file's template, else Gemma's turn format for vocabularies with <start_of_turn>/<end_of_turn>."""
    if self.vocab.chat_template: return self.vocab.chat_template
    return chat.GEMMA_TEMPLATE if {"<start_of_turn>", "<end_of_turn>"} <= self.vocab.token_to_id.keys() else None

  def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    if (template := self.chat_template) is None: raise ValueError("this GGUF file has no tokenizer.chat_template, so it cannot render a chat")
    text = lambda i: self.vocab.tokens[i] if i is not None else ""
    return chat.render(template, messages, add_generation_prompt, text(self.bos_id), text(self.eos_id))

  def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """The rendered chat's ids, special token texts parsed; BOS is added only when the template did not write it."""
    text = self.render_chat(messages, add_generation_prompt)
    ids = self.encode(text, add_special=False, parse_special=True)
    v = self.vocab
    return [v.bos_id] + ids if v.add_bos and v.bos_id is not None and ids[:1] != [v.bos_id] else ids

  def stream(self, special: bool = False) -> "StreamDecoder": return StreamDecoder(self, special)

_SPACES = " \t\n\v\f\r"   # C's isspace(), which llama.cpp strips with

def _cut(text: str, token: str, tid: int, lstrip: bool, rstrip: bool) -> list[str | int]:
  """text split at token, the token's id between the pieces, empty pieces dropped."""
  pieces = text.split(token)
  if lstrip: pieces[:-1] = [p.rstrip(_SPACES) for p in pieces[:-1]]
  if rstrip: pieces[1:] = [p.lstrip(_SPACES) for p in pieces[1:]]
  return [p for i, piece in enumerate(pieces) for p in ((tid, piece) if i else (piece,)) if p != ""]

class StreamDecoder:
  """Incremental decoding of generated ids: add() returns the text completed so far, holding back a partial UTF-8 character."""
  def __init__(self, tokenizer: Tokenizer, special: bool = False):
    self.tokenizer, self.special = tokenizer, special
    self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

  def add(self, token: int) -> str: return self._utf8.decode(self.tokenizer.piece_bytes(token, self.special))

  def flush(self) -> str:
    """What is left at the end; an incomplete character becomes U+FFFD."""
    return self._utf8.decode(b"", final=True)
