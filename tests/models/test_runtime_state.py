"""State per runtime: each runtime compiles and captures under the kernel settings of its own hints (matvec opts, tuned
GPU matvec sizes, programmatic launch) and keeps its own records, so two runtimes with different hints in one process
do not leak into each other, whichever of them ran last."""
import numpy as np
from tinygrad import Tensor
from tinygrad.codegen.opt import OptOps
from gguf import GGMLQuantizationType as T
from models.runtime import Runtime
from models.synth import synthesize
from ops.cuda_graph import ENTRY
from ops.kernels import jit_programs
from profiles.hints import resolve
from quant.linear import QuantLinear
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from tests.quant.test_matvec_opts import cuda_launch, cuda_source

def upcast_rows(rt: Runtime) -> list[bool]:
  """Per kernel of the captured decode step: whether its rows are upcast by 8 (the CPU matvec opts of row_upcast 8)."""
  return [any(o.op is OptOps.UPCAST and o.arg == 8 for o in prg.src[0].arg.applied_opts) for prg in jit_programs(rt._decode)]

def test_two_runtimes_with_different_hints_do_not_share_kernels(tmp_path):
  path = synthesize("smollm2-135m-tiny", tmp_path / "tiny.gguf", quant="Q8_0")
  upcast, plain = Runtime(path, resolve({"row_upcast": 8}), 32), Runtime(path, resolve({"row_upcast": 0}), 32)
  prompt = [5, 6, 7]
  logits = [rt.prefill(prompt).numpy() for rt in (plain, upcast)]
  for pos in range(3, 6):   # used in turn: each captures, then replays
    for rt in (plain, upcast): rt.decode(8, pos)
  assert any(upcast_rows(upcast)) and not any(upcast_rows(plain))
  np.testing.assert_allclose(logits[0], logits[1], rtol=1e-5, atol=1e-5)

def test_each_runtime_compiles_with_its_own_gpu_sizes_and_launch(tmp_path, rng):
  """Tuned GPU matvec sizes and programmatic launch come from a runtime's hints and apply while it compiles: here a
  matvec compiled for the CUDA renderer under each runtime's settings, in turn, and each runtime's record of the
  shapes it compiled."""
  path = synthesize("smollm2-135m-tiny", tmp_path / "tiny.gguf", quant="Q8_0")
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (1024, 2048), rng), T.Q4_0, (1024, 2048)))
  x = Tensor(rng.standard_normal((1, 2048), dtype=np.float32)).realize()
  plain = Runtime(path, max_context=16, keep_programs=False)   # each compiles here: its heuristic records the shapes
  with plain.kernels: default_launch = cuda_launch(lin(x))
  shape = plain.kernels.heuristic.compiled_shapes[-1]
  tuned = Runtime(path, resolve({"pdl": True}, matvec_sizes={shape: (32, 2, 2)}), 16, keep_programs=False)
  for _ in range(2):
    with tuned.kernels: assert cuda_launch(lin(x))[1] == (32, 2, 1) and cuda_source(lin(x)).count(ENTRY[1]) == 1
    with plain.kernels: assert cuda_launch(lin(x)) == default_launch and "griddepcontrol" not in cuda_source(lin(x))
  assert tuned.kernels.heuristic.untuned_shapes() == [] and plain.kernels.heuristic.untuned_shapes() == [shape]
