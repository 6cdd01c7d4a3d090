"""JIT steady state: capture a step once, replay it, count its kernels and time the replays."""
import statistics
import time
from dataclasses import dataclass
from typing import Callable
from tinygrad import Device, Tensor, TinyJit
from experiments.kernels import count_kernels
from ops import cuda_graph

cuda_graph.install()

@dataclass(frozen=True)
class Steady:
  kernels: int            # kernels one replay runs, counted from what the JIT replays
  times_ms: list[float]   # wall time of each timed replay, device synchronized

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
  return Steady(count_kernels(jit), times)
