"""Every change tinyzoo makes to tinygrad's behaviour, in one place. Nothing here changes tinygrad on import: `install()`
does, once per process, and refuses a tinygrad it was not written for. The changes, each over tinygrad's own classes and
modules (its files are not touched):

- Kernel opts: tinygrad's hand-coded heuristic is asked through the kernel settings in force (`with settings:`), whose
  `heuristic` may choose the opts itself (quant/matvec_opts.py); without settings, or without a heuristic of theirs,
  tinygrad's decides. Compiled programs are cached by their graph and by the settings in force, so kernels compiled
  under other settings are never reused; settings with a `programs` store also keep each program there and take it
  from there in a later process, and so does `keep_programs(store)` for kernels compiled under no settings. Compiles
  stay in this process: tinygrad's compile workers are spawned fresh and would have none of these changes.
- dp4a (ops/dp4a.py): the devectorizers split a CUSTOMI over a vector into one a lane, and C-style renderers put the
  function's definition at the top of a kernel that calls it.
- CUDA graphs (ops/cuda_graph.py): built with every launch size at least 1; under settings with `pdl`, kernels rendered for
  sm_90 or later begin with the programmatic-launch entry and the graph joins them by programmatic edges.
- CPU threads (ops/cpu_threads.py): a kernel split over threads (a `core_id` parameter) is launched as one call of the
  thread pool's fork-join, which runs its ids on every core at once, where tinygrad launches it once an id in turn; and
  the CPU device has a graph, `CPUGraph`, which runs a batch of a captured JIT's kernels in one call from C where
  tinygrad launches each from Python.
- JIT inputs: a TinyJit call whose inputs are the realized tensors of an earlier call, unchanged (the same UOps), takes
  what tinygrad worked out from them then (their names, views and types, which a replay checks) instead of working it
  out again, a cost paid on every call of every replay.
- CPU replays: a JIT's replay whose every call is a batch of the CPU graph runs each batch directly and counts its
  kernels, where tinygrad's run_linear matches each call against every kind of call it runs and estimates its
  operations for its statistics, a cost paid on every replay that is large beside a small model's kernels. A replay
  that waits, prints (DEBUG >= 2) or profiles goes through run_linear.
- Programs into a captured JIT's calls: each distinct kernel's program is put into its source once and that source
  shared by every call of the kernel, where tinygrad substitutes it into each call anew, a walk of the kernel's graph
  for every one (a model's blocks share their kernels). Compiles run in this process
  one after another, as tinygrad's would with no compile workers.
- Schedules: tinygrad's cache of the schedules of the functions it realizes (a model's blocks) takes from, and keeps in,
  the store where compiled programs are kept, so that a later process schedules only what no run scheduled before.
- Graph estimates: a JIT graph's estimates of its operations and bytes (the sum over its kernels, simplified) are
  worked out when first read, for the statistics of a replay through run_linear, where tinygrad works them out as it
  builds the graph: at a real model's first replays, seconds of simplifying sums that a CPU replay never reads.
- `replays_through(run)`: while in force, JIT replays run through `run` (a per-kernel profile's timing).
- `capturing_jit(fxn)`: a TinyJit that captures its first call, where tinygrad's runs a first call plainly and captures
  the second.
"""
import contextlib
import ctypes
import functools
import importlib.metadata
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from ops import cpu_threads

TINYGRAD = "0.14.0"   # the version these changes are written for

class UnsupportedTinygrad(ValueError): pass

def check_tinygrad() -> None:
  """UnsupportedTinygrad (one line) unless the installed tinygrad is TINYGRAD."""
  if (version := importlib.metadata.version("tinygrad")) != TINYGRAD:
    raise UnsupportedTinygrad(f"tinyzoo's changes to tinygrad are written for tinygrad {TINYGRAD}, and {version} is installed: "
                              f"pip install tinygrad=={TINYGRAD}")

# tinygrad's own functions, taken by install() before it replaces them
_originals: dict[str, Any] = {}

def tinygrad_heuristic(k):
  """tinygrad's own hand-coded opts for a kernel, whether or not install() has put the hook in their place."""
  from tinygrad.codegen.opt import heuristic
  return _originals.get("heuristic", heuristic.hand_coded_optimizations)(k)

@dataclass(frozen=True)
class KernelSettings:
  """How kernels are compiled, and graphs built, while these settings are in force (`with settings:`, nestable).
  `heuristic` chooses each kernel's opts (an object with `optimize(scheduler) -> scheduler`, equal to another only
  where it chooses the same; None: tinygrad's heuristic). `pdl`: CUDA kernels chained by programmatic dependent launch,
  with `pdl_prefetch` each workgroup asking the L2 for its share of its fixed reads first. `beam` and `jit_batch_size`
  set tinygrad's BEAM and JIT_BATCH_SIZE (None leaves tinygrad's); `tensor_cores` off sets its TC to 0, so no kernel
  uses them; `graphs` off sets its JIT to 2, so a captured step launches its kernels one by one, no graph batching
  them. `edges` counts the programmatic edges graphs built, `compile_s` the seconds spent compiling kernels (or taking
  them from `programs`). `programs`: where compiled programs are kept across processes (an object with
  `program(key, compile) -> PROGRAM`, models/jit_cache.py's store), or None."""
  heuristic: Any = None
  pdl: bool = False
  pdl_prefetch: bool = False
  beam: int | None = None
  jit_batch_size: int | None = None
  tensor_cores: bool = True
  graphs: bool = True
  edges: list[int] = field(default_factory=lambda: [0], compare=False, hash=False, repr=False)
  compile_s: list[float] = field(default_factory=lambda: [0.0], compare=False, hash=False, repr=False)
  programs: Any = field(default=None, compare=False, hash=False, repr=False)

  @property
  def compile_key(self) -> tuple:
    """What compiled programs depend on besides their graph."""
    return (self.heuristic, self.pdl, self.pdl_prefetch, self.tensor_cores, self.beam)

  def __enter__(self) -> "KernelSettings":
    from tinygrad.helpers import Context
    tinygrad = Context(**{k.upper(): v for k, v in (("beam", self.beam), ("jit_batch_size", self.jit_batch_size),
                                                    ("tc", None if self.tensor_cores else 0), ("jit", None if self.graphs else 2))
                                   if v is not None})
    tinygrad.__enter__()
    _active.append((self, tinygrad))
    return self

  def __exit__(self, *exc) -> None:
    _, tinygrad = _active.pop()
    tinygrad.__exit__(*exc)

_active: list[tuple[KernelSettings, Any]] = []

def active() -> KernelSettings | None:
  """The kernel settings in force, or None."""
  return _active[-1][0] if _active else None

def _hand_coded(k):
  settings = active()
  return tinygrad_heuristic(k) if settings is None or settings.heuristic is None else settings.heuristic.optimize(k)

def _key(ast, renderer) -> tuple:
  settings = active()
  return (*_originals["program_key"](ast, renderer), None if settings is None else settings.compile_key)

_unset_programs: list[Any] = [None]   # where kernels compiled under no settings are kept (keep_programs)

def keep_programs(store: Any) -> None:
  """From now on in this process, kernels compiled under no kernel settings are kept in `store` (as a settings'
  `programs`) and taken from there where a process compiled them before."""
  _unset_programs[0] = store

def _store() -> Any:
  """Where compiled programs and schedules are kept now: the settings' store in force, else keep_programs's, or None."""
  return _unset_programs[0] if (settings := active()) is None else settings.programs

def _do_to_program(ast, renderer):
  settings, compile = active(), functools.partial(_originals["do_to_program"], ast, renderer)
  programs, start = _store(), time.perf_counter()
  try: return compile() if programs is None else programs.program(_key(ast, renderer), compile)
  finally:
    if settings is not None: settings.compile_s[0] += time.perf_counter() - start

class _Schedules(dict):
  """tinygrad's cache of schedules (by the key of the function scheduled) with the store in force behind it: a schedule
  this process has not made is taken from the store where a run kept it, and one it makes is kept there."""
  def get(self, key, default=None):
    if (linear := super().get(key)) is None and (store := _store()) is not None and (linear := store.schedule(key)) is not None:
      super().__setitem__(key, linear)
    return default if linear is None else linear

  def __setitem__(self, key, linear) -> None:
    super().__setitem__(key, linear)
    if (store := _store()) is not None: store.keep_schedule(key, linear)

def _render_with_dp4a(self, uops) -> str:
  from ops import dp4a
  source = _originals["render"](self, uops)
  return f"{dp4a.definition(self)}\n{source}" if dp4a.NAME + "(" in source else source

def _render_with_entry(self, function_name, kernel, bufs, uops, prefix=None) -> str:
  from ops import cuda_graph
  settings = active()
  if settings is not None and settings.pdl and cuda_graph.sm(self.target.arch) >= 90:
    prefetch = cuda_graph.prefetch_lines(cuda_graph.prefetched_buffers(bufs, uops)) if settings.pdl_prefetch else []
    kernel = [cuda_graph.ENTRY[0], *prefetch, cuda_graph.ENTRY[1], *kernel]
  return _originals["render_kernel"](self, function_name, kernel, bufs, uops, prefix)

def _launch_dims_at_least_one(self, var_vals: dict[str, int]):
  global_size, local_size = _originals["launch_dims"](self, var_vals)
  return tuple(max(1, d) for d in global_size), None if local_size is None else tuple(max(1, d) for d in local_size)

@contextlib.contextmanager
def valid_build_dims() -> Iterator[None]:
  """Launch sizes evaluated inside are at least 1 in every dimension (CUDA rejects a grid of 0)."""
  from tinygrad.uop.ops import ProgramInfo
  _originals.setdefault("launch_dims", ProgramInfo.launch_dims)
  ProgramInfo.launch_dims = _launch_dims_at_least_one   # type: ignore[method-assign]
  try: yield
  finally: ProgramInfo.launch_dims = _originals["launch_dims"]   # type: ignore[method-assign]

@contextlib.contextmanager
def programmatic_edges(graph: Any, cuda: Any, counter: list[int]) -> Iterator[None]:
  """While `graph` (a CUDAGraph being built) adds its kernel nodes through `cuda` (tinygrad's driver bindings): each
  kernel that waits on entry (its PTX holds the entry's wait) is joined to the kernels before it by programmatic edges,
  counted in `counter[0]`. A driver without edge data (before CUDA 12.3) keeps full edges."""
  add_dependencies = getattr(cuda.dll, "cuGraphAddDependencies_v2", None)
  if add_dependencies is None:
    yield
    return
  add_dependencies.argtypes, add_dependencies.restype = [ctypes.c_void_p] * 4 + [ctypes.c_size_t], ctypes.c_int
  from ops import cuda_graph
  waiting: dict[int | None, bool] = {}

  def waits(func: int | None) -> bool:
    if not waiting: waiting.update({cuda_graph.address(r.prg): cuda_graph.WAITS in r.lib for r in graph.runtimes if hasattr(r, "prg")})
    return waiting.get(func, False)
  original = cuda.cuGraphAddKernelNode
  cuda.cuGraphAddKernelNode = cuda_graph.programmatic_add_kernel_node(original, add_dependencies, waits, counter)
  try: yield
  finally: cuda.cuGraphAddKernelNode = original

def _cuda_graph_init(build: Callable, cuda: Any) -> Callable:
  def __init__(self, *args, **kwargs):
    settings = active()
    with valid_build_dims(), programmatic_edges(self, cuda, settings.edges if settings is not None else [0]): build(self, *args, **kwargs)
  return __init__

def _threaded_call(self, *bufs, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False, timeout=None):
  """tinygrad's CPU launch of a kernel, or for one split over threads (a `core_id` parameter) one call of the thread
  pool's fork-join with the kernel, its number of ids and the position of its id among its arguments."""
  slot, args = self.runtimevars.get("core_id"), [b.va_addr for b in bufs] + [v or 0 for v in vals]
  if slot is None or self.lvp or global_size[0] < 2:
    return _originals["cpu_call"](self, *bufs, global_size=global_size, local_size=local_size, vals=vals, wait=wait, timeout=timeout)
  start = time.perf_counter()
  cpu_threads.fork_join(self.addr, global_size[0], slot, args)
  return time.perf_counter() - start if wait else None

class _GraphEstimates:
  """GraphRunner.estimates, worked out on first read: what GraphRunner's __init__ assigns (summed from jit.estimate_uop,
  which install() makes give none) is dropped."""
  def __get__(self, graph: Any, owner: type | None = None) -> Any:
    if graph is None: return self
    if (estimates := graph.__dict__.get("_estimates")) is None:
      from tinygrad.renderer import Estimates
      graph._estimates = estimates = sum((_originals["estimate_uop"](call) for call in graph.linear.src), Estimates()).simplify()
    return estimates

  def __set__(self, graph: Any, value: Any) -> None: pass

def _with_graph(init: Callable) -> Callable:
  def __init__(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.graph = cpu_threads.CPUGraph
  return __init__

# what _prepare_jit_inputs worked out for the inputs of recent calls: (names, views and types) by the calls' tensors
_inputs_seen: dict[tuple, tuple[tuple, list, list]] = {}
INPUTS_SEEN = 256

def _remembered_jit_inputs(args: tuple, kwargs: dict):
  """tinygrad's _prepare_jit_inputs, taken from an earlier call with the same realized tensors (the same UOps, each
  checked alive by a weak reference: nothing is kept alive), where those held no variables in their views and the call
  passes no containers; the variables' values from the call's bound UOps."""
  from tinygrad import Tensor
  from tinygrad.uop.ops import Ops, UOp, buffers
  def allocated(u: UOp) -> bool:   # UOp.is_realized, for a buffer by its allocation alone (most of a call's cost otherwise)
    return (b := buffers.get(base)) is not None and b.is_allocated() if (base := u.base).op is Ops.BUFFER else u.is_realized
  named = [*enumerate(args), *sorted(kwargs.items())]
  if any(isinstance(a, (tuple, list, dict)) for _, a in named): return _originals["jit_inputs"](args, kwargs)
  tensors = [(name, t) for name, t in named if t.__class__ is Tensor]
  uops = [t.uop.src[0] if t.uop.op is Ops.UNSHARD else t.uop for _, t in tensors]
  key = tuple((name, id(u)) for (name, _), u in zip(tensors, uops))
  seen = _inputs_seen.get(key)
  if seen is None or any(ref() is not u for ref, u in zip(seen[0], uops)) or not all(allocated(u) for u in uops):
    prepared = _originals["jit_inputs"](args, kwargs)
    if all(not variables for _, variables, _, _ in prepared[3]):
      if len(_inputs_seen) >= INPUTS_SEEN: _inputs_seen.pop(next(iter(_inputs_seen)))
      _inputs_seen[key] = (tuple(weakref.ref(u) for u in uops), prepared[2], prepared[3])
    return prepared
  var_vals = {v.expr: val for v, val in (a.unbind() for _, a in named if isinstance(a, UOp))}
  return [u.base for u in uops], var_vals, seen[1], seen[2]

# for each captured JIT's calls: the asts of its CPU graph batches, or None where a call is something else
_cpu_batches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

def _batches(linear: Any) -> tuple | None:
  from tinygrad import Device
  from tinygrad.uop.ops import Ops
  if (asts := _cpu_batches.get(linear, False)) is False:
    asts = tuple(c.src[0] for c in linear.src)
    if not all(a.op is Ops.CUSTOM_FUNCTION and a.arg == "graph" and isinstance(a.device, str) and Device[a.device].graph is cpu_threads.CPUGraph
               for a in asts): asts = None
    _cpu_batches[linear] = asts
  return asts

def _replay(linear: Any, var_vals: dict[str, int] | None = None, input_uops: tuple = (), update_stats: bool = True, jit: bool = False,
            wait: bool = False) -> None:
  """tinygrad's run_linear as a TinyJit's replay calls it, each CPU graph batch run directly (see the module's docstring)."""
  from tinygrad.engine.realize import get_graph_runtime
  from tinygrad.helpers import DEBUG, PROFILE, GlobalCounters
  if not jit or wait or DEBUG >= 2 or PROFILE or (asts := _batches(linear)) is None:
    return _originals["run_linear"](linear, var_vals, input_uops=input_uops, update_stats=update_stats, jit=jit, wait=wait)
  inputs, values = tuple(input_uops), var_vals or {}
  for ast in asts:
    graph = get_graph_runtime(ast, inputs)
    graph(inputs, values)
    if update_stats: GlobalCounters.kernel_count += len(graph.calls)

def _lower_and_compile(linear: Any) -> Any:
  """tinygrad's lower_and_compile (see the module's docstring): every call of a kernel compiled, its program swapped in."""
  from tinygrad.codegen import to_program, to_program_key
  from tinygrad.engine.realize import _get_call_to_compile
  from tinygrad.uop.ops import Ops
  sources: dict[tuple, Any] = {}
  calls = {}
  for c in linear.toposort():
    if c.op is not Ops.CALL or (a := _get_call_to_compile(c)) is None: continue
    if (src := sources.get(k := (c.src[0], to_program_key(*a)))) is None: sources[k] = src = c.src[0].substitute({a[0]: to_program(*a)})
    calls[c] = c.replace(src=(src, *c.src[1:]))
  return linear.substitute(calls, name="precompile kernels") if calls else linear

_installed: list[bool] = []

def install() -> None:
  """Makes every change above, once per process; UnsupportedTinygrad (one line) for a tinygrad other than TINYGRAD."""
  if _installed: return
  check_tinygrad()
  import tinygrad.codegen as codegen
  import tinygrad.engine.realize as realize
  from tinygrad.codegen.opt import heuristic
  from tinygrad import Device
  from tinygrad.helpers import PARALLEL
  from tinygrad.renderer.cstyle import CStyleLanguage, CUDARenderer
  from tinygrad.uop.ops import ProgramInfo
  from ops import dp4a
  _originals.update(heuristic=heuristic.hand_coded_optimizations, program_key=codegen.to_program_key, render=CStyleLanguage.render,
                    render_kernel=CUDARenderer.render_kernel, launch_dims=ProgramInfo.launch_dims, do_to_program=codegen.do_to_program)
  heuristic.hand_coded_optimizations = _hand_coded
  codegen.to_program_key = realize.to_program_key = _key
  codegen.do_to_program = _do_to_program
  PARALLEL.value = 0
  codegen.devectorizer2 = codegen.devectorizer2 + dp4a.PER_LANE
  codegen.ew_devectorizer = codegen.ew_devectorizer + dp4a.PER_LANE
  import tinygrad.engine.jit as jit
  from tinygrad.renderer import Estimates
  _originals.update(jit_inputs=jit._prepare_jit_inputs, run_linear=jit.run_linear, estimate_uop=jit.estimate_uop)
  jit._prepare_jit_inputs = _remembered_jit_inputs
  jit.run_linear = _replay
  jit.estimate_uop = lambda call: Estimates()   # read by GraphRunner's __init__ alone
  jit.GraphRunner.estimates = _GraphEstimates()   # type: ignore[attr-defined]
  realize.lower_and_compile = _lower_and_compile
  import tinygrad.schedule as schedule
  schedule.schedule_cache = _Schedules(schedule.schedule_cache)
  CStyleLanguage.render = _render_with_dp4a            # type: ignore[method-assign]
  CUDARenderer.render_kernel = _render_with_entry      # type: ignore[method-assign]
  from tinygrad.runtime.ops_cpu import CPUDevice, CPUProgram
  _originals.update(cpu_call=CPUProgram.__call__)
  CPUProgram.__call__ = _threaded_call   # type: ignore[method-assign]
  CPUDevice.__init__ = _with_graph(CPUDevice.__init__)   # type: ignore[method-assign]
  if "CPU" in Device._opened_devices: Device["CPU"].graph = cpu_threads.CPUGraph
  try:
    import tinygrad.runtime.autogen.cuda as cuda
    from tinygrad.runtime.graph.cuda import CUDAGraph
    CUDAGraph.__init__ = _cuda_graph_init(CUDAGraph.__init__, cuda)   # type: ignore[method-assign]
  except (ImportError, OSError): pass
  _installed.append(True)

@contextlib.contextmanager
def replays_through(run: Callable[..., None]) -> Iterator[None]:
  """While in force, every TinyJit replay calls `run` (with run_linear's arguments) instead of tinygrad's run_linear."""
  import tinygrad.engine.jit as jit
  original = jit.run_linear
  jit.run_linear = run
  try: yield
  finally: jit.run_linear = original

def capturing_jit(fxn: Callable) -> Any:
  """A TinyJit of `fxn` that captures its first call (and runs what it captured), where tinygrad's runs the first call
  plainly and captures the second: the function is built and scheduled once instead of twice. Everything it reads must
  be realized before that call: a lazy tensor's kernels would be captured too, and run again on every replay."""
  from tinygrad import TinyJit
  jit = TinyJit(fxn)
  jit.cnt = 1   # tinygrad's count of the calls made: at 1 it captures
  return jit

def forget_compiled() -> None:
  """Drops this process's compiled programs, so that the next kernels compile afresh (a measured compile time) or come
  from a store of kept programs, where one is in use."""
  import tinygrad.codegen as codegen
  codegen.to_program_cache.clear()
