"""BPE as llama.cpp runs it: the pre-tokenizer's pieces, then per piece the adjacent pair of lowest merge rank, leftmost first, is merged
until no pair is a merge. Byte-level vocabularies spell every byte as one printable character (GPT-2's table); gemma4 spells text as is."""
import heapq
from models.tokenizers.pretokenizers import PreTokenizer

def _byte_chars() -> list[str]:
  """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the others take 256, 257, ... in byte order."""
  printable = [*range(0x21, 0x7f), *range(0xa1, 0xad), *range(0xae, 0x100)]
  spare = iter(range(256, 512))
  return [chr(b) if b in printable else chr(next(spare)) for b in range(256)]

BYTE_CHARS = _byte_chars()
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}
_ENCODE_TABLE = dict(enumerate(BYTE_CHARS))   # for str.translate of bytes read as Latin-1

def _split_after_space(merge: str) -> tuple[str, ...]:
  """llama.cpp splits a merge at its first space after the first character, so the left token may be a space."""
  i = merge.find(" ", 1)
  return (merge[:i], merge[i + 1:]) if i > 0 else (merge,)

class BPE:
  def __init__(self, token_to_id: dict[str, int], merges: list[str], pre: PreTokenizer, byte_level: bool):
    self.token_to_id, self.pre, self.byte_level = token_to_id, pre, byte_level
    # "left right"; the first of repeated pairs counts (dict() keeps the last, hence reversed)
    pairs = [tuple(m.split(" ", 1)) if m[:1] != " " else _split_after_space(m) for m in merges]
    self.ranks: dict[tuple[str, ...], int] = dict(zip(reversed(pairs), range(len(pairs) - 1, -1, -1)))
    self._cache: dict[str, list[int]] = {}

  def encode(self, text: str) -> list[int]:
    if not self.byte_level: text = text.replace(" ", "\u2581")
    return [i for piece in self.pre.split(text) for i in self._piece(piece)]

  def _piece(self, piece: str) -> list[int]:
    if (ids := self._cache.get(piece)) is None:
      word = piece.encode().decode("latin-1").translate(_ENCODE_TABLE) if self.byte_level else piece
      whole = self.token_to_id.get(word) if self.pre.ignore_merges or (not self.byte_level and not word.strip("\n")) else None
      ids = [whole] if whole is not None else [i for symbol in self._merge(word) for i in self._symbol(symbol)]
      if len(self._cache) < 1 << 16: self._cache[piece] = ids
    return ids

  def _merge(self, word: str) -> list[str]:
    symbols = list(word)
    before, after = list(range(-1, len(symbols) - 1)), list(range(1, len(symbols))) + [-1]
    queue: list[tuple[int, int, int, str]] = []
    def push(left: int, right: int):
      if left >= 0 and right >= 0 and (rank := self.ranks.get((symbols[left], symbols[right]))) is not None:
        heapq.heappush(queue, (rank, left, right, symbols[left] + symbols[right]))
    for i in range(len(symbols) - 1): push(i, i + 1)
    while queue:
      _, left, right, merged = heapq.heappop(queue)
      if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != merged: continue   # outdated by an earlier merge
      symbols[left], symbols[right], after[left] = merged, "", after[right]
      if after[left] >= 0: before[after[left]] = left
      push(before[left], left)
      push(left, after[left])
    return [s for s in symbols if s]

  def _symbol(self, symbol: str) -> list[int]:
    """A merged symbol's token, or byte tokens when the vocabulary lacks it (bytes without a token are dropped, as llama.cpp does)."""
    if (i := self.token_to_id.get(symbol)) is not None: return [i]
    if self.byte_level: candidates = [chr(b) for b in symbol.encode() if b < 0x80]   # llama.cpp looks up each raw byte of the symbol's text
    else: candidates = [f"<0x{b:02X}>" for b in symbol.encode()]
    return [self.token_to_id[c] for c in candidates if c in self.token_to_id]
