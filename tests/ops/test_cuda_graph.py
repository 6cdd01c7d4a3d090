"""Programmatic dependent launch and valid graph build sizes (ops/cuda_graph.py, installed by ops/patches.py), on any
machine: launch sizes evaluated while a graph is built are at least 1 and the real sizes are untouched; kernels
rendered under settings with `pdl` begin with the entry, and the graph joins those that wait by programmatic edges. On a
GPU, experiments/device_check.py shows decode replaying as graphs (its results are in the journal and the README)."""
import ctypes
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
import pytest
from tinygrad import Tensor
from tinygrad.runtime.graph.cuda import CUDAGraph
from tinygrad.uop.ops import ProgramInfo, UOp
from ops import cuda_graph, patches
from ops.patches import KernelSettings

def program() -> ProgramInfo:
  toks = UOp.variable("toks", 1, 32)   # a prompt chunk's length: never 0, but tinygrad builds graph nodes with it at 0
  return ProgramInfo(name="k", global_size=(toks * 4, 2, 1), local_size=(toks, 1, 1), vars=(toks,))

def test_build_dims_are_at_least_one_and_real_dims_unchanged():
  p = program()
  assert p.launch_dims({"toks": 0}) == ((0, 2, 1), (0, 1, 1)), "what CUDA rejects with 'invalid argument'"
  with patches.valid_build_dims():
    assert p.launch_dims({"toks": 0}) == ((1, 2, 1), (1, 1, 1))
    assert p.launch_dims({"toks": 3}) == ((12, 2, 1), (3, 1, 1))
  assert p.launch_dims({"toks": 0}) == ((0, 2, 1), (0, 1, 1)), "restored on leaving"

def test_the_graph_constructor_builds_with_valid_dims():
  seen = []
  init = patches._cuda_graph_init(lambda self, *a, **k: seen.append(program().launch_dims({"toks": 0})), SimpleNamespace(dll=SimpleNamespace()))
  init(object.__new__(CUDAGraph), None)
  assert seen == [((1, 2, 1), (1, 1, 1))]
  assert program().launch_dims({"toks": 0})[0] == (0, 2, 1), "only while the graph is built"

def test_programmatic_launch_renders_the_entry_on_sm_90_and_later_only():
  """Under settings with pdl a kernel rendered for sm_90 or later begins with ENTRY (let the next launch, then wait);
  outside them, or for an older GPU, the kernel is as tinygrad renders it."""
  from tests.quant.test_matvec_opts import cuda_source
  x = Tensor.randn(64, 32).realize()
  with KernelSettings(pdl=True):
    src = cuda_source((x * 2).sum(axis=1))
    body = src[src.index(") {\n") + 4:].splitlines()
    assert body[:2] == list(cuda_graph.ENTRY)
    with KernelSettings(): assert "griddepcontrol" not in cuda_source((x * 3).sum(axis=1))
  assert "griddepcontrol" not in cuda_source((x * 4).sum(axis=1))
  for arch, entered in (("sm_80", False), ("sm_89", False), ("sm_90", True), ("sm_90a", True), ("sm_100", True)):
    renderer = SimpleNamespace(target=SimpleNamespace(arch=arch))
    with KernelSettings(pdl=True), pytest.MonkeyPatch.context() as mp:
      mp.setitem(patches._originals, "render_kernel", lambda self, name, kernel, bufs, uops, prefix=None: kernel)
      assert (patches._render_with_entry(renderer, "k", ["x;"], [], []) == [*cuda_graph.ENTRY, "x;"]) == entered, arch

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="CUDA's nvcc is not installed")
def test_the_entry_compiles_for_hopper(tmp_path: Path):
  """The kernel with ENTRY compiles for sm_90 (tinygrad compiles to PTX there) and its PTX holds the wait the graph
  builder looks for."""
  from tests.quant.test_matvec_opts import cuda_source
  with KernelSettings(pdl=True): (tmp_path / "k.cu").write_text(cuda_source((Tensor.randn(64, 32).realize() * 5).sum(axis=1)))
  built = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-o", str(tmp_path / "k.ptx"), str(tmp_path / "k.cu")], capture_output=True, text=True)
  assert built.returncode == 0, built.stderr
  assert cuda_graph.WAITS in (tmp_path / "k.ptx").read_bytes()

def test_prefetch_asks_for_the_buffers_a_kernel_reads_at_fixed_places_only(rng):
  """With prefetch each workgroup first asks the L2 for its share of a matvec's weight and x (read at places its launch
  fixes), between ENTRY's two statements; not for its output, an embedding table read at a loaded token's row, or
  anything in a kernel with a variable."""
  import numpy as np
  from tinygrad import UOp as TUOp, dtypes
  from tests.quant.test_matvec_opts import cuda_source
  w, x = Tensor(rng.standard_normal((64, 32), dtype=np.float32)), Tensor(rng.standard_normal(32, dtype=np.float32))
  with KernelSettings(pdl=True, pdl_prefetch=True):
    matvec = cuda_source((w * x).sum(axis=1))
    gather = cuda_source(w[Tensor([3], dtype=dtypes.int32)] * 2)
    n = TUOp.variable("n", 1, 32)
    ranged = cuda_source(w[:, :n].sum(axis=1))
  with KernelSettings(pdl=True): plain = cuda_source((w * x).sum(axis=1))
  lines = matvec.splitlines()
  body = lines[next(i for i, line in enumerate(lines) if "__global__" in line) + 1:]
  assert body[0] == cuda_graph.ENTRY[0] and cuda_graph.ENTRY[1] in body and body.index(cuda_graph.ENTRY[1]) > 2
  def shares(source: str) -> list[str]: return [line for line in source.splitlines() if "const unsigned long long tz_share" in line]
  def buffers(source: str) -> list[str]: return [line for line in source.splitlines() if "tz_base = " in line]
  assert sorted(line.split("((")[1].split("ull")[0] for line in shares(matvec)) == ["128", "8192"], "w's 8192 bytes and x's 128"
  assert len(buffers(matvec)) == 2 and "data0" not in "".join(buffers(matvec)), "the output is written, not prefetched"
  assert all("8192ull" not in line for line in shares(gather)), "the table is read where a loaded index says"
  assert "prefetch" not in ranged and "prefetch" not in plain

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="CUDA's nvcc is not installed")
def test_the_prefetch_compiles_for_hopper(tmp_path: Path):
  from tests.quant.test_matvec_opts import cuda_source
  with KernelSettings(pdl=True, pdl_prefetch=True):
    (tmp_path / "k.cu").write_text(cuda_source((Tensor.randn(64, 32).realize() * Tensor.randn(32).realize()).sum(axis=1)))
  built = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-o", str(tmp_path / "k.ptx"), str(tmp_path / "k.cu")], capture_output=True, text=True)
  assert built.returncode == 0, built.stderr
  assert b"cp.async.bulk.prefetch.L2" in (tmp_path / "k.ptx").read_bytes()

class Params(ctypes.Structure): _fields_ = [("func", ctypes.c_void_p)]

def test_kernels_that_wait_on_entry_get_programmatic_edges_from_kernels_only():
  """A kernel whose function waits on entry is joined to the graph's kernels before it by programmatic edges (from the
  programmatic port), to a copy by a full edge; a kernel that does not wait keeps full edges from everything."""
  added, linked, counter = {}, [], [0]
  def add_kernel_node(node_ref, graph, deps, count, params_ref):
    node_ref._obj.value = 100 + len(added)
    added[node_ref._obj.value] = (params_ref._obj.func, [deps[i] for i in range(count)])
    return 0
  def add_dependencies(graph, sources, targets, edges, count):
    linked.extend((sources[i], targets[i], (edges[i].from_port, edges[i].to_port, edges[i].type)) for i in range(count))
    return 0
  add = cuda_graph.programmatic_add_kernel_node(add_kernel_node, add_dependencies, lambda func: func == 7, counter)
  def node(func: int, *deps: int) -> int:
    ref = ctypes.byref(handle := ctypes.c_void_p())
    assert add(ref, "graph", (ctypes.c_void_p * len(deps))(*deps) if deps else None, len(deps), ctypes.byref(Params(func))) == 0
    return handle.value
  first = node(1)
  copy = 55   # a node the builder did not add as a kernel: a copy
  waiting = node(7, first, copy)
  plain = node(1, waiting, copy)
  assert added == {first: (1, []), waiting: (7, [copy]), plain: (1, [waiting, copy])}
  assert linked == [(first, waiting, (1, 0, 1))] and counter == [1]

def test_without_edge_data_in_the_driver_graphs_are_built_as_before():
  cuda = SimpleNamespace(dll=SimpleNamespace(), cuGraphAddKernelNode=(original := lambda *a: 0))
  with patches.programmatic_edges(SimpleNamespace(runtimes=[]), cuda, [0]): assert cuda.cuGraphAddKernelNode is original
  cuda.dll.cuGraphAddDependencies_v2 = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
  with patches.programmatic_edges(SimpleNamespace(runtimes=[]), cuda, [0]): assert cuda.cuGraphAddKernelNode is not original
  assert cuda.cuGraphAddKernelNode is original

def test_programmatic_launch_prefetches_only_with_it():
  from quant.matvec_opts import kernel_settings
  assert [(s.pdl, s.pdl_prefetch) for s in (kernel_settings(8, pdl=True), kernel_settings(8, pdl=True, prefetch=True),
                                            kernel_settings(8, prefetch=True), kernel_settings(8))] == \
         [(True, False), (True, True), (False, False), (False, False)]
