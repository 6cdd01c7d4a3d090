"""Counting what a JIT replays: a toy whose kernels are known counts exactly those, launched one by one, inside graph
batches (JIT_BATCH_SIZE), and inside HCQ command batches."""
import os
import subprocess
import sys
import numpy as np
import pytest
from tinygrad import Device, GlobalCounters, Tensor, TinyJit
from tinygrad.engine.jit import GraphRunner
from tinygrad.engine.realize import run_linear
from tinygrad.helpers import Context
from tinygrad.uop.ops import Ops, UOp
from ops.kernels import count_kernels, jit_kernels

TOY_KERNELS = 5

def toy(x: Tensor) -> Tensor:
  """Five kernels: three forced elementwise steps, a row sum (a reduce) and a scaled copy of it."""
  h = ((x + 1).contiguous() * 2).contiguous().exp2().contiguous()
  return (h.sum(axis=1).contiguous() * 0.5).realize()

def toy_reference(x: np.ndarray) -> np.ndarray: return np.exp2((x + 1) * 2).sum(axis=1) * 0.5

class SequentialGraph(GraphRunner):
  """A graph that runs its batch's kernels in order through tinygrad's own launches, counting them in `launched`; the JIT
  batches kernels for it exactly as for any device's graph, so the counting sees real graph calls."""
  launched = 0

  def __call__(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int], wait: bool = False) -> float | None:
    SequentialGraph.launched += len(self.linear.src)
    run_linear(self.linear, var_vals, input_uops=input_uops, update_stats=False, jit=True, wait=wait)
    return None

def replayed(fn, x: Tensor) -> tuple[TinyJit, int, np.ndarray]:
  jit = TinyJit(fn)
  for _ in range(3): jit(x)
  GlobalCounters.reset()
  out = jit(x).numpy()
  return jit, GlobalCounters.kernel_count, out

def test_toy_counts_exactly_its_kernels(rng):
  x = Tensor(rng.standard_normal((16, 32)).astype(np.float32)).realize()
  with Context(JIT=2): jit, launched, out = replayed(toy, x)   # no graph: each kernel launched by itself
  assert count_kernels(jit) == launched == TOY_KERNELS
  assert all(k.batch is None for k in jit_kernels(jit))
  np.testing.assert_allclose(out, toy_reference(x.numpy()), rtol=1e-5)

@pytest.mark.parametrize("batch_size", [0, 2])
def test_toy_counts_the_same_inside_graph_batches(rng, monkeypatch, batch_size):
  monkeypatch.setattr(Device[Device.DEFAULT], "graph", SequentialGraph)
  x = Tensor(rng.standard_normal((16, 32)).astype(np.float32)).realize()
  with Context(JIT_BATCH_SIZE=batch_size):
    jit = TinyJit(toy)
    for _ in range(3): jit(x)
    SequentialGraph.launched, GlobalCounters.kernel_count = 0, 0
    out = jit(x).numpy()
  calls = jit.captured.linear.src
  graphs = [c for c in calls if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph"]
  assert graphs, "the JIT made no graph batch"
  # batch size 2 doubles after each batch: 2 then 3 kernels; 0 puts all five in one
  assert [len(g.src[0].src[0].src) for g in graphs] == ([2, 3] if batch_size else [5])
  assert count_kernels(jit) == SequentialGraph.launched == TOY_KERNELS
  assert GlobalCounters.kernel_count == len(graphs)   # tinygrad's own counter sees a batch as one kernel
  assert len({k.batch for k in jit_kernels(jit)}) == len(graphs)
  np.testing.assert_allclose(out, toy_reference(x.numpy()), rtol=1e-5)

@pytest.mark.parametrize("graphs", [True, False])
def test_kernel_settings_graphs_off_launches_each_kernel_alone(rng, monkeypatch, graphs):
  """The `graphs` hint: on, a captured step's kernels replay in graph batches; off, one by one (JIT=2), counted the same."""
  from quant.matvec_opts import kernel_settings
  monkeypatch.setattr(Device[Device.DEFAULT], "graph", SequentialGraph)
  x = Tensor(rng.standard_normal((16, 32)).astype(np.float32)).realize()
  with kernel_settings(0, graphs=graphs): jit, launched, out = replayed(toy, x)
  assert count_kernels(jit) == TOY_KERNELS and launched == (1 if graphs else TOY_KERNELS)   # a graph batch is one launch
  assert all((k.batch is not None) == graphs for k in jit_kernels(jit))
  np.testing.assert_allclose(out, toy_reference(x.numpy()), rtol=1e-5)

HCQ_PROBE = """
import sys; sys.path.insert(0, {root!r})
import numpy as np
from tinygrad import Tensor
from tests.ops.test_kernels import toy, toy_reference, replayed
from ops.kernels import count_kernels, jit_kernels
x = Tensor(np.random.default_rng({seed}).standard_normal((16, 32)).astype(np.float32)).realize()
jit, launched, out = replayed(toy, x)
np.testing.assert_allclose(out, toy_reference(x.numpy()), rtol=1e-5)
print(count_kernels(jit), launched, len({{k.batch for k in jit_kernels(jit)}}))
"""

@pytest.mark.skipif(Device.DEFAULT != "CPU", reason="HCQ2 batching is probed on the CPU backend")
def test_toy_counts_the_same_inside_hcq_batches(seed):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  r = subprocess.run([sys.executable, "-c", HCQ_PROBE.format(root=root, seed=seed)], capture_output=True, text=True, timeout=300,
                     env={**os.environ, "HCQ2": "1"})
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == [str(TOY_KERNELS), str(TOY_KERNELS), "1"]
