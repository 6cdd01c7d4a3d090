"""A loaded model ready to run: weights packed on the device, KV caches, and prefill/decode each captured once by
TinyJit with a symbolic start position, so steady-state decode never recompiles. A prompt runs in chunks of the
`prefill_chunk` hint's tokens, its last partial chunk padded to a whole one (the logits read at a symbolic row), so one
capture serves every prompt length; the padding's cache rows lie past the prompt, where the next step overwrites them
before any query sees them. A prompt of a few tokens (the `prefill_steps` hint's) runs as decode steps instead. Everything a runtime compiles and
captures is made under its own kernel settings (from its hints): two runtimes in one process do not share them. Given a
JitStore, a runtime takes the JITs a run with the same key captured before (models/jit_cache.py) and keeps those it
captures (`keep_jits`). Unless told not to keep programs, every kernel it compiles is taken from that store (else the
cache directory's) where a process compiled it before, whatever it was running (another model file of the same shapes,
another context or hints), and kept there."""
import functools
import os
import time
from dataclasses import dataclass, field
from typing import Iterator
import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.uop.ops import UOp
from ops.cuda import CACHE_READERS, HAND_WRITTEN, hint_refusal
from ops.kernels import count_kernels
from models.config import ModelConfig
from models.jit_cache import JitStore, cache_key, capture_sources, state_of
from models.registry import architecture_of
from models.spec import by_name
from models.tokenizer import Tokenizer
from models.weights import Weights
from ops import patches
from ops.host_io import DeviceSlot
from ops.sampling import READBACK, Sampler
from profiles.hints import Hints, flash_cache, resolve
from quant.files import file_sha256
from quant.gguf_file import GGUFFile
from quant.matvec_opts import runtime_settings

JIT_NAMES = ("prefill", "head", "decode")
ALL_JITS = (*JIT_NAMES, "sampler")   # what a generation captures: the runtime's and its sampler's

DEFAULT_CONTEXT = 2048

class ContextOverflow(ValueError): pass

@dataclass
class Timing:
  prompt_tokens: int = 0
  prompt_s: float = 0.0
  kernels_per_token: int = 0
  steps: list[float] = field(default_factory=list)   # seconds of each decode step after the first token

  @property
  def decoded(self) -> int: return len(self.steps)

  @property
  def decode_s(self) -> float: return sum(self.steps)

class Runtime:
  """A model file built with `hints` (by default the built-in ones: the command line resolves a model's from its flags,
  the device profile and the file's manifest, profiles/device.py resolve_hints), a KV cache of `max_context` positions."""
  def __init__(self, path: str | os.PathLike, hints: Hints | None = None, max_context: int | None = None, device: str | None = None,
               progress: bool = False, jits: JitStore | None = None, keep_programs: bool = True):
    patches.install()
    self.path, self.jits = path, jits
    self.hints = hints or resolve()
    h = self.hints
    self.kernels = runtime_settings(h, (JitStore() if jits is None else jits) if keep_programs else None)
    self.gguf = GGUFFile(path)
    self.arch = arch = architecture_of(self.gguf)
    self.cfg: ModelConfig = ModelConfig.from_gguf(self.gguf)
    self.tokenizer = Tokenizer.from_gguf(self.gguf)
    if max_context is not None and max_context < 1: raise ValueError(f"--ctx must be positive, got {max_context}")
    self.max_context = min(max_context or DEFAULT_CONTEXT, self.cfg.context_length)
    self.chunk = min(h.prefill_chunk, self.max_context)
    for hint in HAND_WRITTEN:
      if (why := hint_refusal(hint, getattr(h, hint), device or Device.DEFAULT)) is not None: raise ValueError(f"hint {hint}: {why}")
    for hint in CACHE_READERS:
      if getattr(h, hint) == "flash" and (why := flash_cache(h.values, h.sources)) is not None: raise ValueError(f"hint {hint}: {why}")
    try: spec = by_name(arch.tensors(self.cfg, self.gguf))
    except ValueError as e: raise self.gguf.fail(str(e)) from None   # what the metadata lacks for the file's tensors
    with self.kernels:
      self.weights = Weights(self.gguf, self.hints, spec, device, progress)
      # positions for a padded last chunk past the context's end: cache rows and rope tables
      self.model = arch.build(self.weights, self.cfg, self.max_context + self.chunk)
    self.device = device
    # each captured at its first call: the weights, caches and input slots they read are realized already
    self._decode = patches.capturing_jit(self._forward)
    self._prefill, self._head = patches.capturing_jit(self._chunk), patches.capturing_jit(self._logits)
    self._rows = patches.capturing_jit(self._logprobs)   # every row's next-token log-probabilities (perplexity); not kept across runs
    self._decode_pos = UOp.variable("decode_pos", 0, self.max_context - 1)
    self._prefill_pos = UOp.variable("prefill_pos", 0, self.max_context - 1)
    self._prefill_last = UOp.variable("prefill_last", 0, self.chunk - 1)   # the row of the chunk's last prompt token
    self._decode_token, self._prefill_tokens = DeviceSlot((1, 1), dtypes.int32, device), DeviceSlot((1, self.chunk), dtypes.int32, device)
    self.cached: set[str] = set()   # the JITs the store gave
    self.restore_jits()

  def restore_jits(self) -> None:
    """Takes from the store each of prefill, head and decode that it holds for this runtime's key."""
    if self.jits is None: return
    state = self._state()
    for name in JIT_NAMES:
      if (jit := self.jits.load(self._jit_key(name), state)) is not None: setattr(self, f"_{name}", jit); self.cached.add(name)

  def _state(self) -> dict:
    return state_of({"model": self.model, "decode_token": self._decode_token, "prefill_tokens": self._prefill_tokens})

  @functools.cached_property
  def _key_parts(self) -> dict:
    """What every JIT of this runtime depends on besides its own name and shapes."""
    return {"model": file_sha256(self.path), "hints": {n: h["value"] for n, h in self.hints.as_dict().items()}, "device": self.jits.device,
            "sizes": sorted(self.hints.matvec_sizes.items()), "on": self.device, "max_context": self.max_context, "chunk": self.chunk}

  def _jit_key(self, name: str, **extra) -> str: return cache_key(capture_sources(self.arch.__name__), jit=name, **self._key_parts, **extra)

  def _sampler_key(self, sampler: Sampler) -> str: return self._jit_key("sampler", sampler=repr(sampler.params), ring=sampler.ring_size)

  def restore_sampler(self, sampler: Sampler) -> bool:
    """Gives `sampler` the JIT the store holds for its parameters; whether it had one."""
    if self.jits is None: return False
    sampler.prepare(0, self.device)   # its slots, which the JIT reads
    if (jit := self.jits.load(self._sampler_key(sampler), state_of({"sampler": sampler}))) is None: return False
    sampler.jit = jit
    self.cached.add("sampler")
    return True

  def warm_up(self, sampler: Sampler, progress: bool = False) -> float:
    """Captures each JIT a generation runs (prefill, head, decode, the sampler's) that is not captured yet, on a token
    at position 0, so that the prompt's timing holds none of it; returns the seconds taken. The cache rows written lie
    where the prompt and the steps after it write before they read."""
    from tqdm import tqdm
    todo = [n for n in ALL_JITS if (sampler.jit if n == "sampler" else getattr(self, f"_{n}")).captured is None]
    if not todo: return 0.0
    t0 = time.perf_counter()
    with tqdm(total=len(todo), desc="compiling", unit="JIT", leave=False, disable=not progress, mininterval=0, miniters=1) as bar, sampler.trial():
      logits, chunk_jits = None, {"prefill", "head"} & set(todo)
      if chunk_jits:
        logits = self.prefill_chunks([0])
        bar.update(len(chunk_jits))
      if "decode" in todo:
        logits = self.decode(0, 0)
        bar.update(1)
      if "sampler" in todo:
        sampler.prepare(1, self.device)
        sampler.queue(logits if logits is not None else Tensor.zeros(1, self.cfg.vocab_size, device=self.device).contiguous().realize())
        bar.update(1)
    return time.perf_counter() - t0

  def keep_jits(self, sampler: Sampler | None = None) -> None:
    """Stores each captured JIT the store did not give (with the sampler's, if given)."""
    if self.jits is None: return
    state = self._state()
    for name in JIT_NAMES:
      if name not in self.cached and (jit := getattr(self, f"_{name}")).captured is not None and self.jits.save(self._jit_key(name), jit, state):
        self.cached.add(name)
    if sampler is not None and "sampler" not in self.cached and sampler.jit.captured is not None:
      if self.jits.save(self._sampler_key(sampler), sampler.jit, state_of({"sampler": sampler})): self.cached.add("sampler")

  def _forward(self, tokens: Tensor, start_pos: UOp) -> Tensor: return self.model(tokens, start_pos).realize()
  def _chunk(self, tokens: Tensor, start_pos: UOp) -> Tensor: return self.model.hidden(tokens, start_pos).realize()
  def _logits(self, x: Tensor, last: UOp) -> Tensor: return self.model.head(x, last).realize()
  def _logprobs(self, x: Tensor) -> Tensor: return self.model.logits(x[0]).float().log_softmax(-1).realize()

  def check_fits(self, n_prompt: int, n_new: int = 0):
    if n_prompt + n_new > self.max_context:
      raise ContextOverflow(f"prompt of {n_prompt} tokens{f' plus {n_new} to generate' if n_new else ''} exceeds the context of "
                            f"{self.max_context} tokens (--ctx, at most {self.cfg.context_length} for this model)")

  def prefill(self, ids: list[int]) -> Tensor:
    """Runs the prompt from position 0 and returns the logits of its last token: through decode steps if it has at most
    `prefill_steps` tokens, else in chunks (`prefill_chunks`). Under ggml rounding, which mirrors llama.cpp's batch, the
    prompt runs in chunks as llama.cpp's does."""
    if not ids: raise ValueError("empty prompt")
    if len(ids) > self.hints.prefill_steps or self.hints.rounding == "ggml": return self.prefill_chunks(ids)
    self.check_fits(len(ids))
    for pos, token in enumerate(ids): logits = self.decode(token, pos)
    return logits

  def prefill_chunks(self, ids: list[int]) -> Tensor:
    """Runs the prompt from position 0 through the prefill JIT, a chunk at a time (the last one padded), then the head
    JIT on the last chunk's output alone. Returns the logits of the prompt's last token."""
    if not ids: raise ValueError("empty prompt")
    with self.kernels:
      for pos, part, x in self._chunks(ids): pass   # every chunk run, the last one kept
      return self._head(x, self._prefill_last.bind(len(part) - 1))

  def _chunks(self, ids: list[int]) -> Iterator[tuple[int, list[int], Tensor]]:
    """Runs `ids` from position 0 through the prefill JIT a chunk at a time (the last one padded), yielding each chunk's
    position, tokens and output (the JIT's buffer: read it before the next)."""
    self.check_fits(len(ids))
    for pos in range(0, len(ids), self.chunk):
      part = ids[pos:pos + self.chunk]
      yield pos, part, self._prefill(self._prefill_tokens.write(part + [0] * (self.chunk - len(part))), self._prefill_pos.bind(pos))

  def logprobs(self, ids: list[int], first: int = 0) -> np.ndarray:
    """Runs `ids` from position 0 through the prefill JIT and returns the next token's log-probabilities at each
    position from `first` on: [len(ids) - first, vocab] float32, each row a log-softmax over the vocabulary."""
    if not 0 <= first < len(ids): raise ValueError(f"first row {first} outside a sequence of {len(ids)} tokens")
    with self.kernels:
      return np.concatenate([self._rows(x).numpy()[max(first - pos, 0):len(part)] for pos, part, x in self._chunks(ids) if pos + len(part) > first])

  def decode(self, token: int | Tensor, pos: int) -> Tensor:
    """Logits [1, vocab] after feeding `token` (an id, or a [1, 1] int32 device tensor such as a sampled one) at `pos`."""
    with self.kernels: return self._decode(token if isinstance(token, Tensor) else self._decode_token.write(token), self._decode_pos.bind(pos))

  def kernels_per_token(self, sampler: Sampler | None = None) -> int:
    """Kernels one decoded token replays: the decode JIT plus the sampler's, once both have captured."""
    n = count_kernels(self._decode) if self._decode.captured is not None else 0
    return n + (count_kernels(sampler.jit) if sampler is not None and sampler.jit.captured is not None else 0)

  def generate(self, ids: list[int], n: int, sampler: Sampler, timing: Timing | None = None) -> Iterator[int]:
    """Yields up to n new tokens after the prompt, stopping after an end-of-generation token."""
    self.check_fits(len(ids), n)
    timing = timing or Timing()
    for t in ids: sampler.accept(t)
    t0 = time.perf_counter()
    logits = self.prefill(ids)
    timing.prompt_tokens, timing.prompt_s = len(ids), time.perf_counter() - t0
    yield from self.continue_from(logits, len(ids), n, sampler, timing)

  def continue_from(self, logits: Tensor, pos: int, n: int, sampler: Sampler, timing: Timing | None = None,
                    stop_ids: frozenset[int] | None = None) -> Iterator[int]:
    """Samples from `logits` (those of position pos-1), then decodes on: up to n tokens, ending after a stop token (the
    tokenizer's end-of-generation ids unless `stop_ids` says otherwise). Each sampled token stays on the device as the
    next step's input; the host queues steps without waiting and reads the tokens back in batches (one step at a time
    while the JITs compile and capture): a stop token ends the work at the end of its batch."""
    timing = timing or Timing()
    stop_ids = self.tokenizer.stop_ids if stop_ids is None else stop_ids
    done, token = 0, None   # the last sampled token, on the device
    try:
      while done < n:
        batch = min(n - done, 1 if done < 3 else READBACK)
        sampler.prepare(batch, logits.device)
        t0 = time.perf_counter()
        with self.kernels:
          for i in range(done, done + batch):
            token = sampler.queue(logits if token is None else self.decode(token, pos + i - 1))
          tokens = sampler.collect(batch)
        step_s = (time.perf_counter() - t0) / max(batch - (done == 0), 1)   # the first token needs no decode step
        for i, t in enumerate(tokens, start=done):
          if i: timing.steps.append(step_s)
          yield t
          if t in stop_ids: return
        done += batch
    finally: timing.kernels_per_token = self.kernels_per_token(sampler)   # once, whether the loop ends, stops or is left
