"""ops/patches.py holds every change tinyzoo makes to tinygrad: importing any tinyzoo module changes nothing, install()
makes the changes once and refuses a tinygrad it was not written for, and the kernel settings in force are part of
every compiled program's cache key."""
import json
import subprocess
import sys
import textwrap
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit
from ops import patches
from ops.patches import KernelSettings

# imports the tinygrad modules tinyzoo could change, notes the identity of every module attribute and class attribute of
# tinygrad (and every tinygrad setting's value), imports every module of the packages named, then prints what changed;
# with "install" it calls install() at the end, to show that the comparison sees a change
SNAPSHOT = textwrap.dedent("""
  import importlib, json, pkgutil, sys
  import tinygrad.codegen, tinygrad.codegen.opt.heuristic, tinygrad.engine.jit, tinygrad.engine.realize, tinygrad.renderer.cstyle
  import tinygrad.runtime.graph.cuda, tinygrad.runtime.ops_cpu
  from tinygrad.helpers import ContextVar
  def state() -> dict:
    out = {}
    for name, mod in list(sys.modules.items()):
      if name.split(".")[0] != "tinygrad": continue
      for key, value in list(vars(mod).items()):
        out[f"{name}.{key}"] = id(value)
        if isinstance(value, type) and value.__module__ == name:
          out.update({f"{name}.{key}.{k}": id(v) for k, v in list(vars(value).items())})
    return out | {f"setting {k}": repr(v.value) for k, v in ContextVar._cache.items()}
  before = state()
  *packages, install = sys.argv[1:]
  for top in packages:
    package = importlib.import_module(top)
    for m in pkgutil.walk_packages(package.__path__, top + "."):
      if not m.name.endswith("__main__"): importlib.import_module(m.name)
  if install == "install": importlib.import_module("ops.patches").install()
  after = state()
  print(json.dumps(sorted(k for k in before if after.get(k) != before[k])))
""")

def changed_by_importing(*then: str) -> list[str]:
  r = subprocess.run([sys.executable, "-c", SNAPSHOT, "quant", "ops", "models", "profiles", "experiments", "tinyzoo", *then],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  return json.loads(r.stdout.strip().splitlines()[-1])

def test_importing_tinyzoo_leaves_tinygrad_untouched():
  assert changed_by_importing("no") == []
  changed = changed_by_importing("install")   # the same comparison sees what install() changes
  assert {"tinygrad.codegen.opt.heuristic.hand_coded_optimizations", "tinygrad.renderer.cstyle.CStyleLanguage.render",
          "tinygrad.runtime.graph.cuda.CUDAGraph.__init__", "tinygrad.runtime.ops_cpu.CPUProgram.__call__",
          "setting PARALLEL"} <= set(changed), changed

def test_install_once_and_only_for_its_tinygrad(monkeypatch):
  from tinygrad.codegen.opt import heuristic
  hook = heuristic.hand_coded_optimizations
  patches.install()
  assert heuristic.hand_coded_optimizations is hook is patches._hand_coded, "installed once, by the test session"
  monkeypatch.setattr(patches, "_installed", [])
  monkeypatch.setattr(patches.importlib.metadata, "version", lambda name: "0.15.0")
  with pytest.raises(patches.UnsupportedTinygrad, match=r"written for tinygrad 0.14.0, and 0.15.0 is installed: pip install tinygrad==0.14.0"):
    patches.install()

def test_cli_refuses_another_tinygrad_in_one_line(tmp_path):
  """The command checks the version before it loads anything that uses tinygrad (where names may have moved)."""
  code = ("import importlib.metadata as m; real = m.version; m.version = lambda n: '0.15.0' if n == 'tinygrad' else real(n); "
          "import sys; from tinyzoo import main; assert 'tinygrad' not in sys.modules; sys.exit(main(['run', 'smollm2-135m-tiny', '-p', 'hi']))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={"TINYZOO_CACHE": str(tmp_path),
                                                                                                    "PATH": "/usr/bin:/bin"})
  assert r.returncode == 1 and r.stderr.count("\n") == 1 and "tinyzoo: error: tinyzoo's changes to tinygrad are written for tinygrad 0.14.0" \
    in r.stderr, r.stderr

def test_compiled_programs_are_kept_apart_by_the_settings_in_force(rng):
  """The same graph compiled under two settings is two programs; under equal settings, one."""
  from tinygrad.codegen import to_program_cache
  from quant.matvec_opts import MatvecOpts
  x = Tensor(rng.standard_normal((64, 48)).astype("float32")).realize()
  def compiled(settings: KernelSettings | None) -> int:
    before = len(to_program_cache)
    jit = TinyJit(lambda t: (t * 3).sum(axis=1).realize())
    if settings is None:
      for _ in range(2): jit(x)
    else:
      with settings:
        for _ in range(2): jit(x)
    return len(to_program_cache) - before
  first = compiled(KernelSettings(MatvecOpts(8)))
  assert first >= 1 and compiled(KernelSettings(MatvecOpts(8))) == 0 and compiled(KernelSettings(MatvecOpts(4))) == first
  assert compiled(KernelSettings(MatvecOpts(8), pdl=True)) == first and compiled(None) == first

def test_a_capturing_jit_captures_its_first_call_and_replays_it_on_new_inputs(rng):
  """Its first call runs the function once, capturing what it realizes, and answers; later calls replay the kernels
  on the inputs of the call without running the function. Compile seconds are counted under settings in force."""
  calls, settings = [], KernelSettings()
  def scaled_sums(t: Tensor) -> Tensor:
    calls.append(t.shape)
    return (t * 3).sum(axis=1).realize()
  jit = patches.capturing_jit(scaled_sums)
  xs = [rng.standard_normal((32, 40)).astype("float32") for _ in range(3)]
  with settings:
    outs = [jit(Tensor(x).realize()).numpy() for x in xs]
  assert jit.captured is not None and len(calls) == 1 and settings.compile_s[0] > 0
  for x, out in zip(xs, outs): np.testing.assert_allclose(out, (x.astype(np.float64) * 3).sum(axis=1), rtol=1e-5, atol=1e-4)

def test_a_jit_call_on_the_tensors_of_an_earlier_one_takes_what_was_worked_out_from_them(rng, monkeypatch):
  """The same realized tensors again: tinygrad's input preparation is not run, the bound variables' values still reach
  the kernels; a new tensor, a view holding a variable (whose value the view carries) and a container are prepared."""
  import tinygrad.engine.jit as jit
  from tinygrad import UOp
  prepared, original = [], patches._originals["jit_inputs"]
  monkeypatch.setitem(patches._originals, "jit_inputs", lambda args, kwargs: prepared.append(len(args)) or original(args, kwargs))
  assert jit._prepare_jit_inputs is patches._remembered_jit_inputs
  x, n = Tensor(rng.standard_normal((4, 8)).astype(np.float32)).realize(), UOp.variable("n", 1, 8)
  step = TinyJit(lambda t, k: (t * 2)[:, :k].sum(axis=1).realize())
  for i in range(4): np.testing.assert_allclose(step(x, n.bind(i + 1)).numpy(), (x.numpy() * 2)[:, :i + 1].sum(axis=1), rtol=1e-5)
  assert len(prepared) == 1, "only the first call prepared its inputs"
  y = Tensor(rng.standard_normal((4, 8)).astype(np.float32)).realize()
  np.testing.assert_allclose(step(y, n.bind(3)).numpy(), (y.numpy() * 2)[:, :3].sum(axis=1), rtol=1e-5)
  assert len(prepared) == 2
  rows = TinyJit(lambda t: (t + 1).sum(axis=0).realize())
  views = {i: x[:n.bind(i)] for i in (1, 2)}   # each view held, so that a second call meets the same UOp
  for i in (1, 1, 2, 2): np.testing.assert_allclose(rows(views[i]).numpy(), (x.numpy()[:i] + 1).sum(axis=0), rtol=1e-5)
  assert len(prepared) == 6, "a view with a variable is prepared on every call, the same view again too"
  both = TinyJit(lambda ts: (ts[0] - ts[1]).realize())
  for _ in range(3): np.testing.assert_allclose(both([x, y]).numpy(), x.numpy() - y.numpy(), rtol=1e-6)
  assert len(prepared) == 9, "a container is prepared on every call"

def test_a_cpu_replay_runs_its_batches_itself_and_counts_their_kernels(rng, monkeypatch):
  """A replay whose calls are all CPU graph batches runs each batch without tinygrad's run_linear, on each call's fresh
  input, and adds its kernels to tinygrad's count; under DEBUG=2 (tinygrad prints each kernel) it goes through
  run_linear."""
  import tinygrad.engine.jit as jit
  from tinygrad.helpers import Context, GlobalCounters
  from ops.kernels import count_kernels
  through, original = [], patches._originals["run_linear"]
  monkeypatch.setitem(patches._originals, "run_linear", lambda *a, **k: through.append(k.get("jit")) or original(*a, **k))
  assert jit.run_linear is patches._replay
  w = Tensor(rng.standard_normal((16, 8)).astype(np.float32)).realize()
  step = TinyJit(lambda x: ((x @ w).relu().contiguous() * 2).sum(axis=1).realize())
  def call() -> int:
    """The kernels tinygrad counted in the step."""
    x = rng.standard_normal((4, 16)).astype(np.float32)
    xt, before = Tensor(x).realize(), GlobalCounters.kernel_count
    out = step(xt)
    counted = GlobalCounters.kernel_count - before
    np.testing.assert_allclose(out.numpy(), 2 * np.maximum(x.astype(np.float64) @ w.numpy(), 0).sum(axis=1), rtol=1e-5)
    return counted
  with Context(JIT_BATCH_SIZE=0):
    for _ in range(3): call()
    assert call() == count_kernels(step) > 1 and True not in through, through
    with Context(DEBUG=2): call()
    assert through[-1] is True

def test_a_graphs_estimates_are_worked_out_when_first_read(rng):
  """A CPU graph batch is built without its kernels' estimates; read (as a replay through run_linear reads them for its
  statistics), they are tinygrad's: the sum over its calls, which tinygrad's GraphRunner works out as it is built."""
  from tinygrad.engine.realize import get_graph_runtime
  from tinygrad.helpers import Context, GlobalCounters
  from tinygrad.renderer import Estimates
  from tinygrad.uop.ops import Ops
  from ops.cpu_threads import CPUGraph
  w = Tensor(rng.standard_normal((16, 8)).astype(np.float32)).realize()
  step = TinyJit(lambda x: ((x @ w).relu().contiguous() * 2).sum(axis=1).realize())
  with Context(JIT_BATCH_SIZE=0):
    for _ in range(3): step(Tensor(rng.standard_normal((4, 16)).astype(np.float32)).realize())
  (batch,) = [c.src[0] for c in step.captured.linear.src if c.src[0].op is Ops.CUSTOM_FUNCTION]
  graph = get_graph_runtime(batch)
  assert isinstance(graph, CPUGraph) and "_estimates" not in vars(graph)
  want = sum((patches._originals["estimate_uop"](c) for c in graph.linear.src), Estimates()).simplify()
  assert graph.estimates == want and want.ops > 0 and want.mem > 0 and vars(graph)["_estimates"] is graph.estimates
  before = GlobalCounters.global_ops
  with Context(DEBUG=2): step(Tensor(rng.standard_normal((4, 16)).astype(np.float32)).realize())   # through run_linear
  assert GlobalCounters.global_ops - before == want.ops

def test_a_captured_kernel_shared_by_calls_gets_its_program_put_in_once(rng, monkeypatch):
  """A capture whose calls repeat one kernel on other buffers (as a model's blocks do): each call runs its program on
  its own buffers, and the program goes into the kernel's source once, not once a call."""
  import tinygrad.engine.realize as realize
  from tinygrad.uop.ops import Ops, UOp
  from ops.kernels import count_kernels
  assert realize.lower_and_compile is patches._lower_and_compile
  into_kernels, substitute = [], UOp.substitute
  def watched(self: UOp, dvars: dict, *a, **k) -> UOp:
    if any(v.op is Ops.PROGRAM for v in dvars.values()): into_kernels.append(self)
    return substitute(self, dvars, *a, **k)
  monkeypatch.setattr(UOp, "substitute", watched)
  ws = [Tensor(rng.standard_normal((8, 8)).astype(np.float32)).realize() for _ in range(6)]
  def blocks(x: Tensor) -> Tensor:
    for w in ws: x = (x @ w).tanh().realize()
    return x
  step = patches.capturing_jit(blocks)
  for _ in range(2):
    x = rng.standard_normal((1, 8)).astype(np.float32)
    want = x.astype(np.float64)
    for w in ws: want = np.tanh(want @ w.numpy().astype(np.float64))
    np.testing.assert_allclose(step(Tensor(x).realize()).numpy(), want, rtol=1e-4, atol=1e-5)
  assert count_kernels(step) == len(ws) and len(into_kernels) == 1, into_kernels
