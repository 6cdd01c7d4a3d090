"""Perplexity and KL divergence of a model's next-token distributions, computed as llama.cpp's `llama-perplexity` does.

The text's tokens (BOS first where the model adds one) are cut into windows of `ctx` tokens; there must be at least
two. Each window runs from position 0 with its first token replaced by BOS where the model adds one, and its second
half is scored: at each position j from ctx/2 to ctx - 2, the log-probability of token j + 1. Perplexity is exp of the
mean negative log-probability over every scored token.

Against a base (another file of the same model, or the log-probabilities a run saved with `save_base`), each scored
position also gives the KL divergence of this model's distribution from the base's, KL(base || model), and whether both
put the same token first; the perplexity ratio is this model's perplexity over the base's on the same tokens.
"""
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
import numpy as np
from tqdm import tqdm

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")   # Debian's base-files: every Debian or Ubuntu system has it
DEFAULT_CTX = 512
MAGIC = b"tinyzoo-logprobs 1\n"
ROWS_AT_ONCE = 64   # KL in float64 a few rows at a time: a window of a 262,144-token vocabulary is 0.5 GB

class QualityError(ValueError): pass

def read_text(path: str | os.PathLike) -> str:
  try: return Path(path).read_text(encoding="utf-8")
  except UnicodeDecodeError as e: raise QualityError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
  except OSError as e: raise QualityError(f"{path}: cannot read it ({e.strerror})") from None

@dataclass(frozen=True)
class Windows:
  """The text's tokens cut into `count` windows of `ctx` tokens, each as the model reads it."""
  tokens: tuple[int, ...]
  ctx: int
  count: int
  bos: int | None   # replaces each window's first token, where the model adds a BOS

  @property
  def first(self) -> int: return self.ctx // 2

  @property
  def scored(self) -> int: return self.count * (self.ctx - 1 - self.first)

  def window(self, i: int) -> list[int]:
    w = list(self.tokens[i * self.ctx:(i + 1) * self.ctx])
    if self.bos is not None: w[0] = self.bos
    return w

  def targets(self, i: int) -> np.ndarray:
    """The scored tokens of window i: positions first + 1 .. ctx - 1."""
    return np.array(self.window(i)[self.first + 1:], dtype=np.int64)

def windows(tokens: list[int], ctx: int, chunks: int | None, bos: int | None, name: str = "the text") -> Windows:
  if ctx < 4: raise QualityError(f"--ctx must be at least 4, got {ctx}")
  if chunks is not None and chunks < 1: raise QualityError(f"--chunks must be at least 1, got {chunks}")
  if len(tokens) < 2 * ctx:
    raise QualityError(f"{name} has {len(tokens)} tokens: perplexity with --ctx {ctx} needs at least {2 * ctx} (two windows)")
  n = len(tokens) // ctx
  return Windows(tuple(tokens), ctx, n if chunks is None else min(chunks, n), bos)

def model_windows(tokenizer, text: str, ctx: int, chunks: int | None, name: str = "the text") -> Windows:
  """The text's windows as a model with this tokenizer reads them (BOS first and in place of each window's first token
  where it adds one)."""
  return windows(tokenizer.encode(text), ctx, chunks, tokenizer.bos_id if tokenizer.vocab.add_bos else None, name)

def scored_rows(logprobs: Callable[[list[int], int], np.ndarray], w: Windows, i: int) -> np.ndarray:
  """Window i's log-probabilities at its scored positions, from `logprobs(ids, first)` (a model's rows from `first` on;
  the last position predicts past the window)."""
  return logprobs(w.window(i), w.first)[:-1]

def nll(logprobs: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """Each row's negative log-probability of its target, float64."""
  return -logprobs[np.arange(len(targets)), targets].astype(np.float64)

def divergence(base: np.ndarray, model: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Rows of log-probabilities [n, vocab] -> each row's KL(base || model) and whether both rank the same token first. Each
  row is normalized again in float64 first (float32 log-probabilities sum to 1 only to float32's accuracy, which left
  two near-equal distributions a KL below zero), and what float64 rounding leaves below zero is zero."""
  kl = np.empty(len(base))
  for s in range(0, len(base), ROWS_AT_ONCE):
    b, m = (normalized(rows[s:s + ROWS_AT_ONCE].astype(np.float64)) for rows in (base, model))
    kl[s:s + ROWS_AT_ONCE] = np.maximum((np.exp(b) * (b - m)).sum(-1), 0)
  return kl, base.argmax(-1) == model.argmax(-1)

def normalized(logprobs: np.ndarray) -> np.ndarray:
  """Log-probabilities [n, vocab] shifted so that each row's probabilities sum to 1."""
  top = logprobs.max(-1, keepdims=True)
  return logprobs - top - np.log(np.exp(logprobs - top).sum(-1, keepdims=True))

@dataclass
class Quality:
  """Running sums over the scored tokens, and what they come to."""
  ctx: int
  nll: list[np.ndarray] = field(default_factory=list)
  base_nll: list[np.ndarray] = field(default_factory=list)
  kl: list[np.ndarray] = field(default_factory=list)
  top1: list[np.ndarray] = field(default_factory=list)

  def add(self, logprobs: np.ndarray, targets: np.ndarray, base: np.ndarray | None = None) -> None:
    self.nll.append(nll(logprobs, targets))
    if base is None: return
    self.base_nll.append(nll(base, targets))
    kl, same = divergence(base, logprobs)
    self.kl.append(kl)
    self.top1.append(same)

  @property
  def tokens(self) -> int: return sum(map(len, self.nll))

  @property
  def perplexity(self) -> float: return math.exp(np.concatenate(self.nll).mean())

  def summary(self) -> dict:
    out = {"perplexity": self.perplexity, "tokens": self.tokens, "windows": len(self.nll), "ctx": self.ctx}
    if self.kl:
      kl, base_ppl = np.concatenate(self.kl), math.exp(np.concatenate(self.base_nll).mean())
      out.update(kl_mean=float(kl.mean()), kl_p99=float(np.percentile(kl, 99)), top1=float(np.concatenate(self.top1).mean()),
                 base_perplexity=base_ppl, ppl_ratio=self.perplexity / base_ppl)
    return out

  def line(self) -> str:
    s = self.summary()
    text = f"perplexity {s['perplexity']:.4f} over {s['tokens']} tokens ({s['windows']} windows of {s['ctx']})"
    if "kl_mean" in s:
      text += (f" | KL divergence from the base: mean {s['kl_mean']:.6f}, 99th percentile {s['kl_p99']:.6f} | top-1 agreement "
               f"{100 * s['top1']:.2f}% | perplexity ratio {s['ppl_ratio']:.5f} (base {s['base_perplexity']:.4f})")
    return text

class SavedBase:
  """Log-probabilities at the scored positions of every window, as one file: MAGIC, a JSON line (the windows' tokens,
  ctx, count, vocabulary size, the model's file name), then float32 [count, ctx - 1 - ctx/2, vocab], as BaseWriter
  writes it."""
  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)
    try:
      with open(self.path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC: raise QualityError(f"{path}: not a base log-probability file (tinyzoo perplexity --save-base)")
        self.header = json.loads(f.readline())
        self.offset = f.tell()
    except OSError as e: raise QualityError(f"{path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError): raise QualityError(f"{path}: damaged header") from None
    h = self.header
    self.shape = (h["count"], h["ctx"] - 1 - h["ctx"] // 2, h["vocab"])
    if self.path.stat().st_size != self.offset + 4 * math.prod(self.shape):
      raise QualityError(f"{path}: truncated or damaged ({self.path.stat().st_size} bytes where its header implies "
                         f"{self.offset + 4 * math.prod(self.shape)})")
    self.rows = np.memmap(self.path, dtype=np.float32, mode="r", offset=self.offset, shape=self.shape)

  def check(self, w: Windows, vocab: int) -> None:
    """That these windows and vocabulary are the ones the base was computed on."""
    h = self.header
    if h["ctx"] != w.ctx: raise QualityError(f"{self.path}: the base was computed with --ctx {h['ctx']}, this run uses {w.ctx}")
    if h["vocab"] != vocab: raise QualityError(f"{self.path}: the base's vocabulary has {h['vocab']} tokens, this model's {vocab}")
    if h["count"] < w.count: raise QualityError(f"{self.path}: the base holds {h['count']} windows, this run scores {w.count}")
    if h["tokens"][:w.count * w.ctx] != list(w.tokens[:w.count * w.ctx]):
      raise QualityError(f"{self.path}: the base was computed on other tokens (another text or tokenizer)")

class BaseWriter:
  """A SavedBase file written to a temporary file beside `path`: `add` appends each window's scored log-probabilities,
  `done` renames the complete file into place, `abandon` removes it."""
  def __init__(self, path: str | os.PathLike, w: Windows, vocab: int, model: str):
    path = Path(path)
    self.path, self.tmp = path, path.with_name(f".{path.name}.{os.getpid()}.tmp")
    header = {"tokens": list(w.tokens[:w.count * w.ctx]), "ctx": w.ctx, "count": w.count, "vocab": vocab, "model": model}
    try: self.f = open(self.tmp, "wb")
    except OSError as e: raise QualityError(f"{path}: cannot write beside it ({e.strerror})") from None
    self.f.write(MAGIC + json.dumps(header).encode() + b"\n")

  def add(self, rows: np.ndarray) -> None: self.f.write(np.ascontiguousarray(rows, dtype=np.float32).tobytes())

  def done(self) -> None:
    self.f.close()
    os.replace(self.tmp, self.path)

  def abandon(self) -> None:
    self.f.close()
    self.tmp.unlink(missing_ok=True)

def measure(logprobs: Callable[[list[int], int], np.ndarray], w: Windows, base: Callable[[int], np.ndarray] | None = None,
            save: BaseWriter | None = None, progress: bool = False) -> Quality:
  """Scores every window: `logprobs(ids, first)` gives a model's log-probabilities from row `first` on, `base(i)` the
  base's for window i's scored rows. With `save`, this model's scored rows are written there as a base (renamed into
  place only once every window is in)."""
  q = Quality(w.ctx)
  try:
    bar = tqdm(range(w.count), desc="perplexity", unit="window", disable=not progress)
    for i in bar:
      rows = scored_rows(logprobs, w, i)
      q.add(rows, w.targets(i), None if base is None else base(i))
      if save is not None: save.add(rows)
      bar.set_postfix_str(f"ppl {q.perplexity:.4f}" + (f", KL {np.concatenate(q.kl).mean():.5f}" if q.kl else ""))
  except BaseException:
    if save is not None: save.abandon()
    raise
  if save is not None: save.done()
  return q

class Probe:
  """Each runtime's quality on one text's windows: the first runtime given (an experiment's baseline) saves its
  log-probabilities under `workdir`, and every later one is compared with them."""
  def __init__(self, text: str | os.PathLike, ctx: int, chunks: int | None, workdir: str | os.PathLike, progress: bool = False):
    self.name, self.text, self.ctx, self.chunks = str(text), read_text(text), ctx, chunks
    self.path, self.progress, self.base = Path(workdir) / "base.logprobs", progress, None

  def __call__(self, rt) -> dict:
    w = model_windows(rt.tokenizer, self.text, self.ctx, self.chunks, self.name)
    vocab = rt.cfg.vocab_size
    if self.base is None:
      q = measure(rt.logprobs, w, save=BaseWriter(self.path, w, vocab, os.path.basename(rt.path)), progress=self.progress)
      self.base = SavedBase(self.path)
    else:
      self.base.check(w, vocab)
      q = measure(rt.logprobs, w, base=lambda i: self.base.rows[i], progress=self.progress)
    return {**q.summary(), "text": self.name}
