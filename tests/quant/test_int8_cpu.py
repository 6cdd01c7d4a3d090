"""int8_dot's CPU kernel (quant/int8_cpu.py) against gguf's dequantized weights times x rounded as ggml rounds it (gguf's
Q8_0, or Q8_K for the K-quants), in float64, by every SIMD path this CPU runs."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, quants
from tinygrad import Device, Tensor
from quant import int8_cpu
from quant.activations import K_QUANTS
from quant.int8_dot import Int8Rows
from quant.linear import QuantExperts, QuantLinear
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from tests.quant.test_int8_dot import gguf_q8_0, off_ties

RUNS = int8_cpu.runnable_paths()
pytestmark = pytest.mark.skipif(not RUNS or Device.DEFAULT != "CPU", reason="an x86-64 CPU with AVX2 as the default device")

def q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """x [..., in] as ggml's quantize_row_q8_K rounds it, in float32: the quants [..., in / 256, 256] and scales
  [..., in / 256] from each block's extreme value with its sign (its quant is -127), ties to even."""
  xb = x.astype(np.float32).reshape(*x.shape[:-1], -1, 256)
  peak = np.take_along_axis(xb, np.abs(xb).argmax(-1)[..., None], -1)
  with np.errstate(divide="ignore"): iscale = np.where(peak == 0, np.float32(0), np.float32(-127) / peak)
  q = np.minimum(np.rint(xb * iscale), 127)
  with np.errstate(divide="ignore"): return q, np.where(iscale == 0, np.float32(0), np.float32(1) / iscale)[..., 0]

@pytest.mark.parametrize("t", int8_cpu.TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("path, rows, lead", [*((p, 46, (2, 3)) for p in RUNS), *((p, 3, (1,)) for p in RUNS[:1])])
def test_cpu_kernel_is_the_matmul_of_x_rounded_as_ggml(path: str, t: T, rows: int, lead: tuple, rng: np.random.Generator):
  """46 rows against 6 of x, split over the threads four rows at a time, leave rows one at a time; 3 rows (one of x)
  are fewer than four, on one thread."""
  cols = 512   # two K-quant blocks
  raw = random_blocks(t, (rows, cols), rng, scale=0.1)
  w = quants.dequantize(raw, t).reshape(rows, cols).astype(np.float64)
  k_quant = t in K_QUANTS
  x = off_ties(rng, (*lead, cols), 256 if k_quant else 32)
  x[..., :256 if k_quant else 32] = 0   # a block of zeros: scale 0
  q, d = q8_k(x) if k_quant else gguf_q8_0(x)
  want = (q.astype(np.float64) * d[..., None]).reshape(x.shape) @ w.T
  got = int8_cpu.int8_dot_cpu(QTensor.from_bytes(raw, t, (rows, cols)), Int8Rows.quantize(Tensor(x), t), path).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * (np.abs(want).max() + 1))

def _kernel_names(t: Tensor) -> list[str]:
  from tinygrad.uop.ops import Ops
  asts = [c.src[0] for c in t.schedule_linear().src]
  return [(a.src[0] if a.op is Ops.PROGRAM else a).arg.name for a in asts if a.op in (Ops.SINK, Ops.PROGRAM)]

def test_int8_dot_matmuls_of_one_matrix_take_the_cpu_kernel(rng: np.random.Generator):
  """A QuantLinear under int8_dot is x's quantizing kernels (one for Q8_0's rounding, three for Q8_K's) and the CPU
  kernel, which reads the GGUF blocks (no word layout is made); expert matmuls keep tinygrad's kernels."""
  for t, kernels in ((T.Q4_1, 2), (T.Q4_K, 4)):
    lin = QuantLinear(QTensor.from_bytes(random_blocks(t, (16, 256), rng), t, (16, 256)), strategy="int8_dot")
    names = _kernel_names(lin(Tensor(rng.standard_normal((1, 256)).astype(np.float32)).realize()))
    assert len(names) == kernels and names[-1] == f"r_int8_dot_{t.name}_1x256x16_{int8_cpu.simd_path()}", names
    assert lin.words is None and lin.device_tensors == [lin.weight.blocks]
  experts = QuantExperts(QTensor.from_bytes(random_blocks(T.Q4_0, (4, 16, 64), rng), T.Q4_0, (4, 16, 64)), strategy="int8_dot")
  y = experts(Tensor(rng.standard_normal((1, 1, 64)).astype(np.float32)).realize(), Tensor([[1, 3]]))
  assert not any(n.startswith("r_int8_dot_") for n in _kernel_names(y))

@pytest.mark.parametrize("flags, path", [
  ({"avx2", "fma", "f16c", "avx512vl", "avx512_vnni", "avx_vnni"}, "avx512_vnni"),
  ({"avx2", "fma", "f16c", "avx512_vnni", "avx_vnni"}, "avx_vnni"),   # VNNI's 256-bit form needs AVX-512VL
  ({"avx2", "fma", "f16c"}, "avx2"),
  ({"avx", "fma", "f16c"}, None)])
def test_simd_path_is_the_fastest_the_flags_allow(flags: set, path: str | None):
  assert int8_cpu.simd_path(frozenset(flags)) == path
