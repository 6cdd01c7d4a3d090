"""Next-token sampling on the device, with the randomness drawn on the host.

Pipeline over logits [V], in llama.cpp's default order:
  1. repeat penalty: each distinct token among the recent ones has a positive logit divided by the penalty and a
     non-positive one multiplied by it;
  2. temperature == 0: argmax, done;
  3. top-k: keep the logits >= the k-th largest;
  4. top-p: with probabilities at temperature 1 over the kept tokens, keep the most probable ones until their mass
     reaches top_p;
  5. softmax(logits / temperature) over the kept tokens and an inverse-CDF draw: the token, in vocabulary order, whose
     cumulative-probability interval contains u * total, for a uniform u in [0, 1).
top_k=0 (or >= V), top_p=1 and repeat_penalty=1 switch their step off. Ties at a top-k or top-p boundary are all kept.

`sample` is a deterministic function of (logits, u, recent); `Sampler` owns the seeded numpy Generator that draws u, the
window of recent tokens, and a TinyJit of `sample`. The same seed and the same logits give the same tokens.

The sampled token stays on the device: the JIT writes it to a ring of the last tokens there, which is also the repeat
penalty's window, and returns it as the next decode step's input. The host queues steps without waiting and reads the
ring once per batch of steps (`collect`): a read per token costs a whole host round trip, a large share of a small
model's step on a GPU. The u of the coming steps are drawn in step order and written before the batch (`prepare`).
The top-k and top-p thresholds come from a multi-way search over the logit range instead of a sort of the vocabulary:
each pass tests _WAYS thresholds at once and keeps the highest that still passes, so the threshold is exact unless two
logits lie within range / _WAYS**_PASSES of each other (then the lower one is kept too).
"""
import collections
import contextlib
import math
from dataclasses import dataclass
from typing import Callable
import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import UOp
from ops import patches
from ops.host_io import DeviceSlot

_WAYS, _PASSES = 32, 7
READBACK = 32   # the most steps queued between two reads of the sampled tokens

@dataclass(frozen=True)
class SamplerParams:
  temperature: float = 0.8
  top_k: int = 40
  top_p: float = 0.95
  repeat_penalty: float = 1.0
  repeat_last_n: int = 64

  def __post_init__(self):
    if not self.temperature >= 0: raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not self.top_k >= 0: raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0 < self.top_p <= 1: raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if not self.repeat_penalty > 0: raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
    if not self.repeat_last_n >= 0: raise ValueError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")

def penalize(logits: Tensor, recent: Tensor, penalty: float) -> Tensor:
  """recent [n] int32 token ids, -1 marks an empty slot."""
  seen = (recent.unsqueeze(-1) == Tensor.arange(logits.shape[-1])).any(axis=0)
  return seen.where((logits > 0).where(logits / penalty, logits * penalty), logits)

def first_argmax(x: Tensor) -> Tensor:
  """Index of the first maximum of x [V] (V < 2^21) as an int32 scalar, in two kernels where Tensor.argmax takes three:
  each value and its index become one float64 key, an integer below 2^53 so exact, whose maximum is the largest value
  at its lowest index (the float's bits made order-preserving, times 2^21, minus the index). The first kernel takes
  the maxima of groups of at least 16 values, up to 8192 groups: a GPU thread walks a group alone, one load after the
  other, so long groups are slow and few groups leave it idle. The groups are a multiple of 256 (padded), so that
  tinygrad splits the second kernel's max over 256 threads: GPT-OSS's 8044 groups of its 201088 values left it to one
  thread. Keys are float64,
  not int64: tinygrad writes int64's max identity as a literal C compilers warn about."""
  n, span = max(16, math.ceil(x.shape[-1] / 8192)), float(1 << 21)
  groups = math.ceil(x.shape[-1] / n / 256) * 256
  if groups * n > span: raise ValueError(f"first_argmax takes at most {1 << 21} values, got {x.shape[-1]}")
  bits = x.cast(dtypes.float32).pad((0, groups * n - x.shape[-1]), value=-float("inf")).bitcast(dtypes.int32)
  ordered = (bits < 0).where(bits ^ 0x7FFFFFFF, bits).cast(dtypes.float64)   # negative floats: larger magnitude, smaller key
  keys = ordered * span - Tensor.arange(groups * n, dtype=dtypes.float64)
  top = keys.reshape(groups, n).max(-1).contiguous().max()
  return ((top / span).ceil() * span - top).cast(dtypes.int32)

def _raise_floor(logits: Tensor, floor: Tensor, enough: Callable[[Tensor], Tensor]) -> Tensor:
  """The highest threshold t >= floor where enough(logits >= t) holds (floor itself if none); enough maps masks [M, V] to [M]."""
  width = logits.max() + 1 - floor
  for _ in range(_PASSES):
    cands = floor + width * Tensor.arange(_WAYS) / _WAYS
    floor = enough(logits >= cands.unsqueeze(-1)).where(cands, floor).max()
    width = width / _WAYS
  return floor

def sample(logits: Tensor, u: Tensor|None, recent: Tensor|None, params: SamplerParams) -> Tensor:
  """logits [V] (or [1, V]), u [1] uniform in [0, 1) (None at temperature 0), recent [n] int32 or None -> token id, an int32 scalar."""
  logits = logits.reshape(logits.shape[-1]).cast(dtypes.float32)   # one row, [1, V] from a decode step as well
  if recent is not None and params.repeat_penalty != 1: logits = penalize(logits, recent, params.repeat_penalty)
  if params.temperature == 0: return first_argmax(logits)
  floor = logits.isinf().where(float("inf"), logits).min()  # banned (-inf) tokens must not stretch the search range
  if 0 < params.top_k < logits.shape[-1]: floor = _raise_floor(logits, floor, lambda keep: keep.sum(axis=-1) >= params.top_k)
  if params.top_p < 1:
    probs = (logits >= floor).where(logits, -float("inf")).softmax(-1)
    floor = _raise_floor(logits, floor, lambda keep: keep.where(probs, 0).sum(axis=-1) >= params.top_p)
  cdf = (logits >= floor).where(logits / params.temperature, -float("inf")).softmax(-1).cumsum(-1)
  return (cdf <= u * cdf[-1]).sum().cast(dtypes.int32)

class Sampler:
  def __init__(self, params: SamplerParams, seed: int|None = None):
    self.params, self.rng = params, np.random.default_rng(seed)
    self.recent: collections.deque[int] = collections.deque(maxlen=params.repeat_last_n)
    self.jit = patches.capturing_jit(self._step)   # the slots it reads are realized before its first call
    self.ring_size = max(READBACK, params.repeat_last_n)
    self._step_var = UOp.variable("sample_step", 0, self.ring_size - 1)
    self._slots: dict[int, UOp] = {}       # the step variable bound to each slot used, once (binding is slow beside a small step)
    self._steps = 0                        # steps queued so far; step i writes ring slot i % ring_size
    self._ring: DeviceSlot | None = None   # int32 [ring_size]: the last tokens, -1 where none
    self._u: DeviceSlot | None = None      # float32 [ring_size]: each step's draw, in its slot
    self._ring_stale = True                # tokens were accepted on the host since the ring was written

  def accept(self, token: int):
    """Record a token (prompt or generated) for the repeat penalty."""
    self.recent.append(token)
    self._ring_stale = True

  def _step(self, logits: Tensor, slot: UOp) -> Tensor:
    assert self._ring is not None
    ring, p, n = self._ring.tensor, self.params, self.params.repeat_last_n
    # the slot stays a symbolic value inside expressions: a tensor made of it would be a kernel of its own
    u = self._u.tensor.shrink(((slot, slot + 1),)) if self._u is not None else None
    recent = ring[(Tensor.arange(n, dtype=dtypes.int32) * -1 + (slot - 1)) % self.ring_size] if n and p.repeat_penalty != 1 else None
    token = sample(logits, u, recent, p)
    ring.assign((Tensor.arange(self.ring_size, dtype=dtypes.int32) == slot).where(token, ring))
    out = token.reshape(1, 1)
    Tensor.realize(out, ring)
    return out

  def prepare(self, steps: int, device: str | None = None):
    """Before queueing `steps` steps: the ring holds the recent tokens the host accepted, the draws of those steps are written."""
    if steps > self.ring_size: raise ValueError(f"at most {self.ring_size} steps between reads, got {steps}")
    if self._ring is None: self._ring = DeviceSlot((self.ring_size,), dtypes.int32, device)
    if self._ring_stale:   # the last tokens end in the slot before the next step's
      slots = [(self._steps - 1 - i) % self.ring_size for i in range(len(self.recent))]
      ring = np.full(self.ring_size, -1, dtype=np.int32)
      ring[slots] = list(reversed(self.recent))
      self._ring.write(ring)
      self._ring_stale = False
    if self.params.temperature > 0:
      if self._u is None: self._u = DeviceSlot((self.ring_size,), dtypes.float32, device)
      draws = np.zeros(self.ring_size, dtype=np.float32)
      draws[[(self._steps + i) % self.ring_size for i in range(steps)]] = self.rng.random(steps, dtype=np.float32)
      self._u.write(draws)

  @contextlib.contextmanager
  def trial(self):
    """Steps queued inside (a warm-up's) leave no trace: the step count and the random draws are as before, and the
    next `prepare` writes the ring from the accepted tokens."""
    steps, state = self._steps, self.rng.bit_generator.state
    try: yield
    finally: self._steps, self._ring_stale, self.rng.bit_generator.state = steps, True, state

  def queue(self, logits: Tensor) -> Tensor:
    """Samples on the device after `prepare`: the token [1, 1] int32, not waited for, which the next decode step can read."""
    # a buffer as it is (a decode step's output: `contiguous` of one copies nothing but takes time on every step); anything
    # else as a copy of its own (`contiguous` of a row may be a view of its buffer, an input the JIT drops)
    x = logits if logits.uop.has_buffer_identity() else logits.clone()
    if (bound := self._slots.get(slot := self._steps % self.ring_size)) is None: bound = self._slots[slot] = self._step_var.bind(slot)
    token = self.jit(x, bound)
    self._steps += 1
    return token

  def collect(self, steps: int) -> list[int]:
    """The tokens of the last `steps` queued steps, waiting for the device, accepted for the repeat penalty."""
    assert self._ring is not None and steps <= self.ring_size
    ring = self._ring.read()
    tokens = [int(ring[(self._steps - steps + i) % self.ring_size]) for i in range(steps)]
    self.recent.extend(tokens)   # the ring holds them already
    return tokens

  def __call__(self, logits: Tensor) -> int:
    self.prepare(1, logits.device)
    self.queue(logits)
    return self.collect(1)[0]
