"""Programmatic dependent launch (Hopper's PDL; kernel hints `pdl` and `pdl_prefetch`) for tinygrad's CUDA graphs: what a
kernel begins with and how the graph joins it. ops/patches.py installs both into tinygrad.

A graph's kernel waits for the kernels it depends on to end before it launches, so each kernel's launch and its
workgroups' start come after the one before has drained. Under `pdl`, kernels rendered for sm_90 or later begin with
ENTRY: they let the kernels after them launch once all of their own workgroups have started, then wait for the kernels
before them to end, their writes visible, before anything else. The graph builder joins such a kernel to the kernels it
depends on by programmatic edges (`programmatic_add_kernel_node`), which let it launch early: its launch and start
overlap their tail, and nothing it computes runs before they end. A kernel without the wait keeps full edges, as copies
do. With `pdl_prefetch`, each workgroup first asks the L2 for its even share of every buffer the kernel reads at fixed
places (`prefetched_buffers`), then waits: a matvec's weight, which no kernel before it writes, streams in while they
end. A prefetch only warms the L2, which every SM reads through, so it is safe even for a buffer the kernels before are
still writing.
"""
import ctypes
from typing import Any, Callable
from tinygrad.uop.ops import Ops, UOp
from tinygrad.dtype import AddrSpace

# a kernel's first two statements under programmatic launch, and what its PTX holds then
ENTRY = ('  asm volatile("griddepcontrol.launch_dependents;");', '  asm volatile("griddepcontrol.wait;" ::: "memory");')
WAITS = b"griddepcontrol.wait"

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

def sm(arch: str) -> int:
  """The compute capability of a CUDA arch: 'sm_90a' -> 90."""
  digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
  return int(digits) if digits else 0

class EdgeData(ctypes.Structure):   # CUgraphEdgeData (CUDA 12.3)
  _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 5)]

PROGRAMMATIC = EdgeData(from_port=1, type=1)   # CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC

def address(handle: Any) -> int | None: return ctypes.cast(handle, ctypes.c_void_p).value

def _nodes(like: Any, nodes: list) -> Any:
  return (like._type_ * len(nodes))(*nodes) if nodes else None

def programmatic_add_kernel_node(add_kernel_node: Callable[..., int], add_dependencies: Callable[..., int],
                                 waits: Callable[[int | None], bool], counter: list[int]) -> Callable[..., int]:
  """cuGraphAddKernelNode for one graph's build: a kernel whose function `waits` (on entry) depends on the graph's
  kernels before it by programmatic edges (cuGraphAddDependencies_v2, `add_dependencies`), on anything else by full
  ones; other kernels as asked. Counts the programmatic edges made in counter[0]."""
  kernels: set[int | None] = set()

  def add(node_ref, graph, deps, count: int, params_ref) -> int:
    upstream = [deps[i] for i in range(count)] if deps else []
    early = {address(d) for d in upstream if address(d) in kernels} if waits(address(params_ref._obj.func)) else set()
    plain = [d for d in upstream if address(d) not in early]
    if (status := add_kernel_node(node_ref, graph, _nodes(deps, plain), len(plain), params_ref)) != 0: return status
    node = node_ref._obj
    kernels.add(address(node))
    if not early: return 0
    sources = [d for d in upstream if address(d) in early]
    n = len(sources)
    status = add_dependencies(graph, _nodes(deps, sources), _nodes(deps, [node] * n), (EdgeData * n)(*[PROGRAMMATIC] * n), n)
    if status == 0: counter[0] += n
    return status
  return add
