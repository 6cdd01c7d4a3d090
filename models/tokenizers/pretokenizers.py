"""Pre-tokenizers of BPE vocabularies: the regex splits llama.cpp applies for each `tokenizer.ggml.pre` value, before the merges."""
import functools
from dataclasses import dataclass
import regex

# contractions, case-insensitive only for ASCII letters as in llama.cpp (a full (?i:) would also take e.g. the Kelvin sign)
_ANY_CASE = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# deepseek-llm's explicit list of cased letters
_DEEPSEEK_LETTERS = (
  r"A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386"
  r"\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
  r"\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
  r"\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
  r"\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183"
  r"\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
  r"\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
  r"\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")

def _cl100k(word: str = r"\p{L}+", number: str = r"\p{N}{1,3}", other: str = r"[^\s\p{L}\p{N}]") -> str:
  """The GPT-4 family: contractions, words with one leading non-letter, numbers, punctuation runs, then whitespace."""
  return _ANY_CASE + r"|[^\r\n\p{L}\p{N}]?" + word + "|" + number + "| ?" + other + r"+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

def _cased(contractions: str, number: str) -> str:
  """The GPT-4o family: words split at lower-to-upper case changes (`[^a-z]` letters lead, `[^A-Z]` letters follow)."""
  lead, follow, prefix = r"(?:(?=\p{L})[^a-z])", r"(?:(?=\p{L})[^A-Z])", r"[^\r\n\p{L}\p{N}]?"
  return (prefix + lead + "*" + follow + "+" + contractions + "|" + prefix + lead + "+" + follow + "*" + contractions + "|" + number +
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

@dataclass(frozen=True)
class PreTokenizer:
  patterns: tuple[str, ...]   # applied in turn, each to every piece the previous ones left
  ignore_merges: bool = False  # a piece that is a whole token is taken as it is
  add_bos: bool = False        # the default when the file has no tokenizer.ggml.add_bos_token

  def split(self, text: str) -> list[str]:
    """The pieces of text: as llama.cpp's unicode_regex_split, the matches and the text between them both become pieces."""
    masked, spans = text.translate(_WIDE_SPACES), [(0, len(text))]
    for pattern in _compiled(self.patterns):
      spans = [span for start, end in spans for span in _cut(pattern, masked, start, end)]
    return [text[a:b] for a, b in spans]

def _cut(pattern: regex.Pattern, text: str, start: int, end: int) -> list[tuple[int, int]]:
  """text[start:end] cut at both ends of every match of pattern."""
  cuts = sorted({start, end, *(start + i for m in pattern.finditer(text[start:end]) for i in m.span())})
  return list(zip(cuts, cuts[1:]))

# llama.cpp's regexes see non-ASCII whitespace as "\v" (std::regex knows only ASCII spaces), so e.g. U+3000 never matches a literal U+3000
_WIDE_SPACES = dict.fromkeys([0x85, 0xa0, 0x1680, *range(0x2000, 0x200b), 0x2028, 0x2029, 0x202f, 0x205f, 0x3000], "\v")

@functools.cache
def _compiled(patterns: tuple[str, ...]) -> list[regex.Pattern]: return [regex.compile(p) for p in patterns]

_FAMILIES: dict[tuple[str, ...], PreTokenizer] = {
  ("default",): PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
  ("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
   "jina-v1-en", "jina-v2-code", "roberta-bpe", "gigachat", "a.x-4.0", "mellum", "modern-bert"): PreTokenizer((_GPT2,)),
  ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"): PreTokenizer((r"\p{N}", _GPT2)),
  ("falcon",): PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
  ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"):
    PreTokenizer((_cl100k(),), ignore_merges=True, add_bos=True),
  ("dbrx", "smaug-bpe"): PreTokenizer((_cl100k(),)),
  ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"):
    PreTokenizer((_cl100k(number=r"\p{N}"),)),
  ("qwen35",): PreTokenizer((_cl100k(r"[\p{L}\p{M}]+", r"\p{N}", r"[^\s\p{L}\p{M}\p{N}]"),)),
  ("minicpm5",): PreTokenizer((r"\p{N}{1,3}", _cl100k(number=r"\p{N}+")), ignore_merges=True),
  ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"): PreTokenizer((_cased(_ANY_CASE + "?", r"\p{N}{1,3}"),)),
  ("tekken",): PreTokenizer((_cased("", r"\p{N}"),), ignore_merges=True, add_bos=True),
  ("deepseek-llm",): PreTokenizer((r"[\r\n]", r"\s?[" + _DEEPSEEK_LETTERS + "]+", r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                                   r"\s+\Z", _CJK, r"\p{N}+")),
  ("deepseek-coder",): PreTokenizer((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
  ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"): PreTokenizer((r"\p{N}{1,3}", r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
  ("poro-chat", "bloom", "gpt3-finnish"): PreTokenizer((r" ?[^(\s|.,!?…。，、।۔،)]+",)),
  ("viking",): PreTokenizer((r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}")),
  ("gemma4",): PreTokenizer((r"[^\n]+|\n+",)),
}
PRE_TOKENIZERS: dict[str, PreTokenizer] = {name: p for names, p in _FAMILIES.items() for name in names}

def pre_tokenizer(pre: str) -> PreTokenizer:
  if pre not in PRE_TOKENIZERS: raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r} (supported: {', '.join(sorted(PRE_TOKENIZERS))})")
  return PRE_TOKENIZERS[pre]
