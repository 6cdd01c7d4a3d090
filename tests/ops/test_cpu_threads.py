"""ops/cpu_threads.py: a CPU kernel split over threads (tinygrad's THREAD opt) runs its ids on the thread pool, all of
them, with the same result as tinygrad's one-at-a-time launch; the pool is built once into the cache directory."""
import os
import numpy as np
import pytest
from tinygrad import Device, Tensor, TinyJit
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import Context
from ops import cpu_threads
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
