"""The tokenizer metadata of a GGUF file (`tokenizer.ggml.*`), with the defaults and fix-ups llama.cpp applies when loading it."""
from dataclasses import dataclass
from enum import IntEnum
import numpy as np
from models.tokenizers.pretokenizers import pre_tokenizer
from quant.gguf_file import GGUFFile

class TokenType(IntEnum):
  NORMAL = 1; UNKNOWN = 2; CONTROL = 3; USER_DEFINED = 4; UNUSED = 5; BYTE = 6

# tokenizer.ggml.model -> (kind, default bos, default eos, default unk); gemma4 is BPE over raw UTF-8 with SentencePiece's U+2581 spaces
MODELS = {"llama": ("SentencePiece", 1, 2, 0), "gpt2": ("byte-level BPE", 11, 11, None), "gemma4": ("SentencePiece-style BPE", None, None, None)}

# llama.cpp recognizes end-of-generation and fill-in-the-middle tokens by their text and makes them control tokens whatever their stored type
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[", "<|return|>",
             "<|call|>", "<|flush|>", "<|calls|>")
# fill-in-the-middle markers by metadata key: the first one present becomes a control token when the file does not name the id itself
FIM_TEXTS = {
  "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
  "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
  "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"),
  "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
  "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
  "fim_sep": ("<|file_sep|>",),
}
_FIM_OLD_KEYS = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}
ALWAYS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss's message framing: user-defined in llama.cpp

@dataclass
class Vocab:
  model: str                      # tokenizer.ggml.model
  pre: str                        # tokenizer.ggml.pre ("default" when absent)
  tokens: list[str]
  token_to_id: dict[str, int]
  scores: np.ndarray              # float32 [n]
  types: np.ndarray               # int32 [n], TokenType values
  merges: list[str]               # "left right", rank = index (BPE only)
  bos_id: int | None
  eos_id: int | None
  unk_id: int | None
  stop_ids: frozenset[int]
  lstrip_ids: frozenset[int]      # special tokens that swallow the whitespace before them
  rstrip_ids: frozenset[int]      # ... and after them
  add_bos: bool
  add_eos: bool
  add_space_prefix: bool          # SentencePiece: a space before the text and after each special token
  chat_template: str | None

  @property
  def kind(self) -> str: return MODELS[self.model][0]

  def special_ids(self, parse_special: bool) -> list[int]:
    """Tokens cut out of the text before the model sees it, longest first: user-defined ones always, control and unknown ones on request."""
    kinds = (TokenType.USER_DEFINED, TokenType.CONTROL, TokenType.UNKNOWN) if parse_special else (TokenType.USER_DEFINED,)
    ids = np.flatnonzero(np.isin(self.types, kinds)).tolist()
    return sorted(ids, key=lambda i: -len(self.tokens[i].encode()))

  @classmethod
  def from_gguf(cls, g: GGUFFile) -> "Vocab":
    model, pre, merges = _model(g)
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(g.require("tokenizer.ggml.tokens"))]
    n, by_text = len(tokens), {t: i for i, t in enumerate(tokens)}
    types = np.asarray(g.get("tokenizer.ggml.token_type", np.full(n, TokenType.NORMAL)), np.int32)
    eog = _fix_types(types, by_text, [_fim_token(g, key, texts, by_text) for key, texts in FIM_TEXTS.items()])
    _, bos, eos, unk = MODELS[model]
    ids = {name: _special_id(g, name, default, n) for name, default in (("bos", bos), ("eos", eos), ("unknown", unk), ("eot", None), ("eom", None))}
    lstrip, rstrip = _strip_ids(g, types, by_text)
    return cls(model, pre, tokens, by_text, np.asarray(g.get("tokenizer.ggml.scores", np.zeros(n)), np.float32), types, merges,
               bos_id=ids["bos"], eos_id=ids["eos"], unk_id=ids["unknown"], lstrip_ids=lstrip, rstrip_ids=rstrip,
               stop_ids=frozenset(eog | {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}),
               add_bos=_add_bos(g, model, pre), add_eos=g.get("tokenizer.ggml.add_eos_token", False),
               add_space_prefix=model == "llama" and g.get("tokenizer.ggml.add_space_prefix", True), chat_template=g.get("tokenizer.chat_template"))

def _model(g: GGUFFile) -> tuple[str, str, list[str]]:
  """tokenizer.ggml.model, the pre-tokenizer and the merges, or a ValueError naming what is not supported."""
  model = g.require("tokenizer.ggml.model")
  if model not in MODELS: raise ValueError(f"unsupported tokenizer.ggml.model {model!r} (supported: {', '.join(MODELS)})")
  pre = "gemma4" if model == "gemma4" else g.get("tokenizer.ggml.pre") or "default"
  merges = g.get("tokenizer.ggml.merges") or []
  if model != "llama":
    pre_tokenizer(pre)
    if not merges: raise ValueError(f"BPE vocabulary ({model!r}) without tokenizer.ggml.merges")
  return model, pre, merges

def _add_bos(g: GGUFFile, model: str, pre: str) -> bool:
  if model == "gemma4": return True   # llama.cpp overrides the file for Gemma 4
  return g.get("tokenizer.ggml.add_bos_token", model == "llama" or pre_tokenizer(pre).add_bos)

def _special_id(g: GGUFFile, name: str, default: int | None, n: int) -> int | None:
  """A special token id from metadata, else the model's default; ids outside the vocabulary count as absent."""
  i = g.get(f"tokenizer.ggml.{name}_token_id")
  if i is not None and 0 <= i < n: return int(i)
  return default if default is not None and default < n else None

def _fim_token(g: GGUFFile, key: str, texts: tuple[str, ...], by_text: dict[str, int]) -> int | None:
  if f"tokenizer.ggml.{key}_token_id" in g or f"tokenizer.ggml.{_FIM_OLD_KEYS.get(key)}_token_id" in g: return None
  return next((by_text[t] for t in texts if t in by_text), None)

def _fix_types(types: np.ndarray, by_text: dict[str, int], fim: list[int | None]) -> set[int]:
  """llama.cpp's fix-ups of token types by text, in place; returns the end-of-generation tokens found by text."""
  eog = {by_text[t] for t in EOG_TEXTS if t in by_text}
  types[list(eog) + [i for i in fim if i is not None]] = TokenType.CONTROL
  types[[by_text[t] for t in ALWAYS_SHOWN if t in by_text]] = TokenType.USER_DEFINED
  # gpt-oss and solar-open end messages with <|end|> but generations with <|return|>/<|call|> or <|calls|>/<|flush|>
  if "<|end|>" in by_text and ({"<|return|>", "<|call|>"} <= by_text.keys() or {"<|calls|>", "<|flush|>"} <= by_text.keys()):
    eog.discard(end := by_text["<|end|>"]); types[end] = TokenType.USER_DEFINED
  if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):   # gemma4 and plamo2: an ordinary </s>
    eog.discard(s := by_text["</s>"]); types[s] = TokenType.NORMAL
  return eog

def _strip_ids(g: GGUFFile, types: np.ndarray, by_text: dict[str, int]) -> tuple[frozenset[int], frozenset[int]]:
  """The special tokens llama.cpp strips whitespace around, by model name: (left, right)."""
  ids = lambda *texts: frozenset(by_text[t] for t in texts if t in by_text)
  name, pre, arch = (g.get(key) or "" for key in ("general.name", "tokenizer.ggml.pre", "general.architecture"))
  if pre in ("jina-v2-de", "jina-v2-es", "jina-v2-code") or arch in ("nomic-bert-moe", "jina-bert-v3"): return ids("<mask>"), frozenset()
  if "phi-3" in name.lower() or "phi3" in name.lower():
    specials = frozenset(np.flatnonzero(np.isin(types, (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN))).tolist())
    return frozenset(), (specials | ids("</s>")) - ids("<unk>", "<s>", "<|endoftext|>")
  if "modern-bert" in name.lower(): return ids("[MASK]"), frozenset()
  return frozenset(), frozenset()
