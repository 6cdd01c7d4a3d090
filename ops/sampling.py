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
The top-k and top-p thresholds come from a multi-way search over the logit range instead of a sort of the vocabulary:
each pass tests _WAYS thresholds at once and keeps the highest that still passes, so the threshold is exact unless two
logits lie within range / _WAYS**_PASSES of each other (then the lower one is kept too).
"""
import collections
import functools
import math
from dataclasses import dataclass
from typing import Callable
import numpy as np
from tinygrad import Tensor, TinyJit, dtypes
from ops.host_io import DeviceSlot, read_scalar

_WAYS, _PASSES = 32, 7

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
  other, so long groups are slow (512 groups of 251 values took 120 us of an H100's decode step) and few groups
  leave it idle. Keys are float64, not int64: tinygrad writes int64's max identity as a literal C compilers warn about."""
  n, span = max(16, math.ceil(x.shape[-1] / 8192)), float(1 << 21)
  groups = math.ceil(x.shape[-1] / n)
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
  """logits [V], u [1] uniform in [0, 1) (None at temperature 0), recent [n] int32 or None -> token id, an int32 scalar."""
  logits = logits.cast(dtypes.float32)
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
    self.jit = TinyJit(functools.partial(sample, params=params))
    self._u: DeviceSlot | None = None
    self._recent: DeviceSlot | None = None

  def accept(self, token: int):
    """Record a token (prompt or generated) for the repeat penalty."""
    self.recent.append(token)

  def queue(self, logits: Tensor) -> Tensor:
    """Samples on the device: the token as a device scalar, not waited for (and not recorded for the repeat penalty).
    Only the inputs the pipeline reads are written: each write is a host-to-device copy on every token."""
    p, n = self.params, self.params.repeat_last_n
    if self._u is None and p.temperature > 0: self._u = DeviceSlot((1,), dtypes.float32, logits.device)
    if self._recent is None and n and p.repeat_penalty != 1: self._recent = DeviceSlot((n,), dtypes.int32, logits.device)
    u = self._u.write(self.rng.random(1, dtype=np.float32)) if self._u is not None else None
    recent = self._recent.write(list(self.recent) + [-1] * (n - len(self.recent))) if self._recent is not None else None
    return self.jit(logits.contiguous(), u, recent)

  def __call__(self, logits: Tensor) -> int:
    token = int(read_scalar(self.queue(logits)))
    self.accept(token)
    return token
