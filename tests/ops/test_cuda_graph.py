"""The CUDA graph shim (ops/cuda_graph.py), on any machine: launch sizes evaluated while a graph is built are at least 1,
the real sizes are untouched, and install() wraps tinygrad's CUDAGraph constructor once. On a GPU,
experiments/device_check.py shows decode replaying as graphs (its results are in the journal's notes and the README)."""
from tinygrad.runtime.graph.cuda import CUDAGraph
from tinygrad.uop.ops import ProgramInfo, UOp
from ops import cuda_graph

def program() -> ProgramInfo:
  toks = UOp.variable("toks", 1, 32)   # a prompt chunk's length: never 0, but tinygrad builds graph nodes with it at 0
  return ProgramInfo(name="k", global_size=(toks * 4, 2, 1), local_size=(toks, 1, 1), vars=(toks,))

def test_build_dims_are_at_least_one_and_real_dims_unchanged():
  p = program()
  assert p.launch_dims({"toks": 0}) == ((0, 2, 1), (0, 1, 1)), "what CUDA rejects with 'invalid argument'"
  with cuda_graph.valid_build_dims():
    assert p.launch_dims({"toks": 0}) == ((1, 2, 1), (1, 1, 1))
    assert p.launch_dims({"toks": 3}) == ((12, 2, 1), (3, 1, 1))
  assert p.launch_dims({"toks": 0}) == ((0, 2, 1), (0, 1, 1)), "restored on leaving"

def test_install_wraps_the_graph_constructor_once(monkeypatch):
  seen = []
  monkeypatch.setattr(CUDAGraph, "__init__", lambda self, *a, **k: seen.append(program().launch_dims({"toks": 0})))
  cuda_graph.install()
  wrapped = CUDAGraph.__init__
  cuda_graph.install()
  assert CUDAGraph.__init__ is wrapped
  CUDAGraph.__init__(object.__new__(CUDAGraph), None)
  assert seen == [((1, 2, 1), (1, 1, 1))]
  assert program().launch_dims({"toks": 0})[0] == (0, 2, 1), "only while the graph is built"
