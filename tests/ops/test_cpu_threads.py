"""ops/cpu_threads.py: a CPU kernel split over threads (tinygrad's THREAD opt) runs its ids on the thread pool, all of
them, with the same result as tinygrad's one-at-a-time launch; a captured JIT's replay runs its kernels from C in one
call; the pool is built once into the cache directory."""
import os
import numpy as np
import pytest
from tinygrad import Device, Tensor, TinyJit
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import Context
from tinygrad.uop.ops import UOp
from ops import cpu_threads
from ops.kernels import count_kernels, jit_kernels
from ops.patches import KernelSettings, tinygrad_heuristic

pytestmark = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the pool runs CPU kernels")

class Threaded:
  """Kernel opts: each reduce's first output axis split over `ids` threads, the rest tinygrad's."""
  def __init__(self, ids: int): self.ids = ids
  def optimize(self, k):
    tuned = k.copy()
    tuned.apply_opt(Opt(OptOps.THREAD, 0, self.ids))
    return tinygrad_heuristic(tuned)

@pytest.mark.parametrize("ids", [2, 3, 6])
def test_a_kernel_split_over_threads_runs_every_id_on_the_pool(ids: int, rng: np.random.Generator, monkeypatch):
  """Ids beyond the pool's threads are taken in turn; the launch goes through the pool, not tinygrad's loop."""
  launched, original = [], cpu_threads.fork_join
  def counted(*args):
    launched.append(args[1])
    original(*args)
  monkeypatch.setattr(cpu_threads, "fork_join", counted)
  x = rng.standard_normal((6 * 8, 40)).astype(np.float32)
  with Context(NUM_CPU_THREADS=max(ids, 2)), KernelSettings(Threaded(ids)):
    jit = TinyJit(lambda t: (t * t).sum(axis=1).realize())
    for _ in range(3): got = jit(Tensor(x)).numpy()
  np.testing.assert_allclose(got, (x.astype(np.float64) ** 2).sum(axis=1), rtol=1e-5)
  assert launched and set(launched) == {ids}

def test_the_pool_is_built_once_into_the_cache_whole(tmp_path, monkeypatch):
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path))
  lib = cpu_threads.build()
  assert os.path.exists(lib) and cpu_threads.build() == lib
  assert sorted(p.name for p in (tmp_path / "cpu_threads").iterdir()) == [os.path.basename(lib)], "no temporary file left"

def test_no_compiler_is_one_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path))
  monkeypatch.setenv("PATH", str(tmp_path))
  monkeypatch.delenv("CC", raising=False)
  with pytest.raises(cpu_threads.ThreadsUnavailable, match="no C compiler"): cpu_threads.build()

def test_a_captured_jit_runs_its_kernels_from_c_as_one_call_a_replay(rng: np.random.Generator, monkeypatch):
  """The CPU graph: after capture each replay is one call of the library running every kernel, threaded ones on the
  pool; the buffers passed in and the variables' values reach the kernels fresh on every replay."""
  runs, original = [], cpu_threads.run
  def counted(launches, count: int):
    runs.append(count)
    original(launches, count)
  monkeypatch.setattr(cpu_threads, "run", counted)
  w = Tensor(rng.standard_normal((40, 24)).astype(np.float32)).realize()
  def step(x: Tensor, n: UOp) -> Tensor:
    h = (x @ w).relu().contiguous()
    return ((h * h).sum(axis=1).contiguous() + h[:, :n].sum(axis=1) * 0.5).realize()
  n = UOp.variable("n", 1, 24)
  with Context(NUM_CPU_THREADS=2, JIT_BATCH_SIZE=0), KernelSettings(Threaded(2)):
    jit = TinyJit(step)
    for i in range(5):
      x, cols = rng.standard_normal((6 * 8, 40)).astype(np.float32), 1 + i * 5
      got = jit(Tensor(x), n.bind(cols)).numpy()
      h = np.maximum(x.astype(np.float64) @ w.numpy(), 0)
      np.testing.assert_allclose(got, (h * h).sum(axis=1) + h[:, :cols].sum(axis=1) * 0.5, rtol=1e-5)
  assert count_kernels(jit) > 1 and all(k.batch is not None for k in jit_kernels(jit))
  assert runs[-3:] == [count_kernels(jit)] * 3, "each replay after the capture runs its kernels in one call"
