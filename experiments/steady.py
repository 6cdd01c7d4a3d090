"""JIT steady state: capture a step once, replay it, count its kernels and time the replays, each alone (what one call
costs its caller, host dispatch and synchronization included) and back to back (what the device spends on one: the host
queues the next replay while the device runs this one)."""
import statistics
import time
from dataclasses import dataclass
from typing import Callable
from tinygrad import Device, Tensor, TinyJit
from ops.kernels import count_kernels

@dataclass(frozen=True)
class Steady:
  kernels: int            # kernels one replay runs, counted from what the JIT replays
  times_ms: list[float]   # wall time of each timed replay, device synchronized
  pipelined_ms: float     # wall time of the timed replays run back to back, synchronized once, per replay

  @property
  def median_ms(self) -> float: return statistics.median(self.times_ms)

def steady_state(step: Callable[..., Tensor], *inputs: Tensor, warmup: int = 3, iters: int = 20) -> Steady:
  """Runs `step(*inputs)` under TinyJit: `warmup` calls (the first ones capture), then `iters` timed replays."""
  if warmup < 2: raise ValueError("warmup must be at least 2: TinyJit captures on its second call")
  jit = TinyJit(lambda *xs: step(*xs).realize())
  dev = Device[inputs[0].device if inputs else Device.DEFAULT]
  for _ in range(warmup): jit(*inputs)
  dev.synchronize()
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jit(*inputs)
    dev.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)
  return Steady(count_kernels(jit), times, back_to_back_ms(lambda: jit(*inputs), dev.device, iters))

def back_to_back_ms(call: Callable[[], object], device: str, n: int) -> float:
  """ms per call of n calls queued on the device without waiting, the device synchronized before and after."""
  return queued(call, device, n)[1]

def queued(call: Callable[[], object], device: str, n: int) -> tuple[float, float]:
  """n calls queued on the device without waiting: (ms per call the host spent issuing them, ms per call until the device
  finished them). The second is the device's time per call where the host keeps ahead of it, the host's where not."""
  dev = Device[device]
  dev.synchronize()
  t0 = time.perf_counter()
  for _ in range(n): call()
  t1 = time.perf_counter()
  dev.synchronize()
  return (t1 - t0) * 1e3 / n, (time.perf_counter() - t0) * 1e3 / n

def queued_steps(rt, sampler, token, pos: int, n: int) -> tuple[float, float]:
  """`queued` for n decode steps of runtime `rt` at position `pos`, each sampled by `sampler` (token: the last sampled one,
  on the device) as the generation loop runs them but never read back: (ms per step issued, ms per step finished)."""
  with rt.kernels:
    chain = [token]
    def step(): chain[0] = sampler.queue(rt.decode(chain[0], pos))
    return queued(step, rt.device or Device.DEFAULT, n)
