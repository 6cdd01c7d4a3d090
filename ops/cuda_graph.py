"""Two changes to tinygrad 0.14's CUDA graphs, installed once per process over its classes (its files are not touched).

Valid build sizes. CUDAGraph builds every kernel node with the launch sizes evaluated at 0 for every variable. A size
such as the number of prompt tokens (a variable whose lower bound is 1), or the cache prefix before the current token,
then reads 0, and CUDA rejects a grid dimension of 0 with CUDA_ERROR_INVALID_VALUE ("invalid argument" at
cuGraphAddKernelNode). The sizes given at build time never run: tinygrad sets the real ones before every replay (its
launch_dims_replace). So the build only needs valid ones: while it runs, every launch dimension is at least 1.

Programmatic dependent launch (Hopper's PDL; kernel hint `pdl`). A graph's kernel waits for the kernels it depends on
to end before it launches, so each kernel's launch and its workgroups' start come after the one before has drained
(experiments/read_floor.cu measured that chain on the H100). Inside `programmatic_launch()`, kernels rendered for sm_90
or later begin by letting the kernels after them launch, once all of their own workgroups have started, and then wait
for the kernels before them to end, their writes visible, before anything else. The graph builder joins such a kernel
to the kernels it depends on by programmatic edges, which let it launch early: its launch and start overlap their
tail, and nothing it computes runs before they end. A kernel without the wait keeps full edges, as copies do.
With `prefetch`, each workgroup of a kernel first asks the L2 for its even share of every buffer the kernel reads at
fixed places (`prefetched_buffers`), then waits: a matvec's weight, which no kernel before it writes, streams in while
they end (experiments/read_floor.cu: the dp4a matvec 6.07 -> 5.32 us on the H100). A prefetch only warms the L2, which
every SM reads through, so it is safe even for a buffer the kernels before are still writing.
"""
import contextlib
import ctypes
from typing import Any, Callable, Iterator
from tinygrad.uop.ops import Ops, ProgramInfo, UOp
from tinygrad.dtype import AddrSpace

_launch_dims = ProgramInfo.launch_dims

def _launch_dims_at_least_one(self: ProgramInfo, var_vals: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
  global_size, local_size = _launch_dims(self, var_vals)
  return tuple(max(1, d) for d in global_size), None if local_size is None else tuple(max(1, d) for d in local_size)

@contextlib.contextmanager
def valid_build_dims() -> Iterator[None]:
  """Launch sizes evaluated inside are at least 1 in every dimension."""
  ProgramInfo.launch_dims = _launch_dims_at_least_one   # type: ignore[method-assign]
  try: yield
  finally: ProgramInfo.launch_dims = _launch_dims       # type: ignore[method-assign]

# a kernel's first two statements under programmatic launch, and what its PTX holds then
ENTRY = ('  asm volatile("griddepcontrol.launch_dependents;");', '  asm volatile("griddepcontrol.wait;" ::: "memory");')
WAITS = b"griddepcontrol.wait"
_programmatic = [False, False]   # kernels begin with ENTRY; and prefetch between its two statements
EDGES_BUILT = {"programmatic": 0}   # programmatic edges made by graph builds in this process

@contextlib.contextmanager
def programmatic_launch(on: bool = True, prefetch: bool = False) -> Iterator[None]:
  """CUDA kernels rendered inside (for sm_90 or later) begin with ENTRY, so graphs chain them by programmatic edges;
  with `prefetch` (and `on`), each workgroup asks the L2 for its share of the kernel's fixed reads before it waits."""
  before, _programmatic[:] = list(_programmatic), [on, on and prefetch]
  try: yield
  finally: _programmatic[:] = before

def prefetched_buffers(bufs: list[tuple[str, tuple[UOp, bool]]], uops: list[UOp]) -> list[tuple[str, int]]:
  """(name, bytes) of the global buffers a kernel reads only at places fixed by its launch: none written, none read
  where a loaded value picks the place (a gather: an embedding row, the experts a token uses), and none at all in a
  kernel with variables (attention over the valid part of a KV cache, which prefetching whole would read entirely)."""
  if any(u.addrspace == AddrSpace.ALU for _, (u, _) in bufs): return []
  # a load's address is its buffer indexed (INDEX, or SHRINK for a vector) by an expression that holds a load if gathered
  addresses = [u.src[0] for u in uops if u.op is Ops.LOAD and u.src[0].op in (Ops.INDEX, Ops.SHRINK)]
  gathered = {a.src[0] for a in addresses if any(v.op is Ops.LOAD for s in a.src[1:] for v in s.toposort())}
  return [(name, u.max_numel() * u.dtype.itemsize) for name, (u, written) in bufs
          if not written and u.addrspace == AddrSpace.GLOBAL and u not in gathered]

# one buffer's share: `{n}` bytes at `{name}`, cut into 16-byte aligned pieces as cp.async.bulk.prefetch.L2 wants them
PREFETCH_SHARE = ("    {{ const unsigned long long tz_share = (({n}ull + tz_groups - 1) / tz_groups + 15) & ~15ull,",
                  "        tz_base = (unsigned long long){name}, tz_end = tz_base + {n}ull,",
                  "        tz_from = (tz_base + tz_share * tz_group + 15) & ~15ull, tz_next = tz_base + tz_share * (tz_group + 1),",
                  "        tz_to = (tz_next < tz_end ? tz_next : tz_end) & ~15ull;",
                  '      if (tz_to > tz_from) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"',
                  '                                       :: "l"(tz_from), "r"((unsigned)(tz_to - tz_from)) : "memory"); }}')

def prefetch_lines(buffers: list[tuple[str, int]]) -> list[str]:
  """CUDA statements by which each workgroup's first thread asks the L2 for its even share of each buffer."""
  if not buffers: return []
  lines = ["  if (threadIdx.x + threadIdx.y + threadIdx.z == 0) {",
           "    const unsigned long long tz_groups = gridDim.x * gridDim.y * gridDim.z,",
           "        tz_group = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);"]
  for name, nbytes in buffers: lines += [line.format(n=nbytes, name=name) for line in PREFETCH_SHARE]
  return [*lines, "  }"]

def _sm(arch: str) -> int:
  digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
  return int(digits) if digits else 0

def _with_entry(render_kernel: Callable[..., str]) -> Callable[..., str]:
  def render(self, function_name, kernel, bufs, uops, prefix=None) -> str:
    if _programmatic[0] and _sm(self.target.arch) >= 90:
      kernel = [ENTRY[0], *(prefetch_lines(prefetched_buffers(bufs, uops)) if _programmatic[1] else []), ENTRY[1], *kernel]
    return render_kernel(self, function_name, kernel, bufs, uops, prefix)
  render.with_entry = True   # type: ignore[attr-defined]
  return render

class EdgeData(ctypes.Structure):   # CUgraphEdgeData (CUDA 12.3)
  _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 5)]

PROGRAMMATIC = EdgeData(from_port=1, type=1)   # CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC

def _address(handle: Any) -> int | None: return ctypes.cast(handle, ctypes.c_void_p).value

def _nodes(like: Any, nodes: list) -> Any:
  return (like._type_ * len(nodes))(*nodes) if nodes else None

def programmatic_add_kernel_node(add_kernel_node: Callable[..., int], add_dependencies: Callable[..., int],
                                 waits: Callable[[int | None], bool]) -> Callable[..., int]:
  """cuGraphAddKernelNode for one graph's build: a kernel whose function `waits` (on entry) depends on the graph's
  kernels before it by programmatic edges (cuGraphAddDependencies_v2, `add_dependencies`), on anything else by full
  ones; other kernels as asked."""
  kernels: set[int | None] = set()

  def add(node_ref, graph, deps, count: int, params_ref) -> int:
    upstream = [deps[i] for i in range(count)] if deps else []
    early = {_address(d) for d in upstream if _address(d) in kernels} if waits(_address(params_ref._obj.func)) else set()
    plain = [d for d in upstream if _address(d) not in early]
    if (status := add_kernel_node(node_ref, graph, _nodes(deps, plain), len(plain), params_ref)) != 0: return status
    node = node_ref._obj
    kernels.add(_address(node))
    if not early: return 0
    sources = [d for d in upstream if _address(d) in early]
    n = len(sources)
    status = add_dependencies(graph, _nodes(deps, sources), _nodes(deps, [node] * n), (EdgeData * n)(*[PROGRAMMATIC] * n), n)
    if status == 0: EDGES_BUILT["programmatic"] += n
    return status
  return add

@contextlib.contextmanager
def programmatic_edges(graph: Any, cuda: Any) -> Iterator[None]:
  """While `graph` (a CUDAGraph being built) adds its kernel nodes through `cuda` (tinygrad's driver bindings): each
  kernel that waits on entry (its PTX holds ENTRY's wait) is joined to the kernels before it by programmatic edges.
  A driver without edge data (before CUDA 12.3) keeps full edges."""
  try: add_dependencies = cuda.dll.cuGraphAddDependencies_v2
  except AttributeError: add_dependencies = None
  if add_dependencies is None:
    yield
    return
  add_dependencies.argtypes, add_dependencies.restype = [ctypes.c_void_p] * 4 + [ctypes.c_size_t], ctypes.c_int
  waiting: dict[int | None, bool] = {}

  def waits(func: int | None) -> bool:
    if not waiting: waiting.update({_address(r.prg): WAITS in r.lib for r in graph.runtimes if hasattr(r, "prg")})
    return waiting.get(func, False)
  original = cuda.cuGraphAddKernelNode
  cuda.cuGraphAddKernelNode = programmatic_add_kernel_node(original, add_dependencies, waits)
  try: yield
  finally: cuda.cuGraphAddKernelNode = original

def install() -> None:
  """Wraps tinygrad's CUDAGraph constructor (valid build sizes, programmatic edges) and its CUDA renderer's kernel
  rendering (ENTRY inside programmatic_launch), once; a no-op where tinygrad has no CUDA graph runner."""
  from tinygrad.renderer.cstyle import CUDARenderer
  if not getattr(CUDARenderer.render_kernel, "with_entry", False): CUDARenderer.render_kernel = _with_entry(CUDARenderer.render_kernel)
  try:
    import tinygrad.runtime.autogen.cuda as cuda
    from tinygrad.runtime.graph.cuda import CUDAGraph
  except (ImportError, OSError): return
  if getattr(CUDAGraph.__init__, "valid_build_dims", False): return
  build = CUDAGraph.__init__

  def __init__(self, *args, **kwargs):
    with valid_build_dims(), programmatic_edges(self, cuda): build(self, *args, **kwargs)
  __init__.valid_build_dims = True   # type: ignore[attr-defined]
  CUDAGraph.__init__ = __init__      # type: ignore[method-assign]
