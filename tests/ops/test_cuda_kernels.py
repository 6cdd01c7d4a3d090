"""Hand-written CUDA kernels (ops/cuda): on the CPU their host side (launch sizes, what the scheduler is told they read
and write, the shapes they take and refuse, the `gemm` hint refused off a CUDA GPU) and, where nvcc is installed, their
sources compile for sm_90; on a CUDA GPU each one against float64 numpy at sizes that are no multiples of its tile."""
import shutil
import subprocess
from pathlib import Path
import numpy as np
import pytest
from tinygrad import Device, Tensor, dtypes
from tinygrad.uop.ops import Ops, ProgramInfo, UOp
from ops.cuda import KernelRefused, gemm_mma, gemm_mma_applies, gemm_mma_source, mma_refusal, source
from quant.linear import gemm

def _program_of(out: Tensor) -> UOp:
  (prg,) = [u for u in out.uop.toposort() if u.op is Ops.PROGRAM]
  return prg

def test_a_programs_launch_sizes_reads_and_writes():
  m, n, k = 77, 300, 96
  a, b = Tensor.empty(m, k, dtype=dtypes.float16), Tensor.empty(n, k, dtype=dtypes.float16)
  prg = _program_of(gemm_mma(a, b))
  info = ProgramInfo.from_sink(prg.src[0])
  assert (info.name, info.global_size, info.local_size) == ("r_gemm_mma_77x300x96", (3, 1, 1), (256, 1, 1))   # ceil(300/128), ceil(77/128)
  assert (info.outs, info.ins) == ((0,), (1, 2)) and prg.src[0].arg.estimates.ops == 2 * m * n * k
  code = prg.src[2].arg
  assert code.startswith("#define NAME r_gemm_mma_77x300x96\n#define M 77\n#define N 300\n#define K 96\n#define BM 128\n") and "mma.sync" in code

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiles the CUDA sources with nvcc")
def test_the_gemm_source_refuses_a_tiling_it_is_not_written_for(tmp_path: Path):
  (cu := tmp_path / "k.cu").write_text(source("gemm_mma.cu", "r_gemm", M=64, N=64, K=64, BM=64, BN=128, BK=32, THREADS=256))
  r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"), str(cu)], capture_output=True, text=True, timeout=300)
  assert r.returncode != 0 and "written for 128 x 128 tiles" in r.stderr

@pytest.mark.parametrize("a, b, why", [
  ((64, 100), (32, 100), "K a multiple of 32"),                       # K = 100
  ((64, 96), (32, 64), "K a multiple of 32"),                         # K differs
])
def test_gemm_mma_refuses_what_it_does_not_take(a, b, why):
  x, w = Tensor.empty(*a, dtype=dtypes.float16), Tensor.empty(*b, dtype=dtypes.float16)
  assert not gemm_mma_applies(x, w)
  with pytest.raises(KernelRefused, match=why) as e: gemm_mma(x, w)
  assert "\n" not in str(e.value)
  assert not gemm_mma_applies(x.float(), w.float())

def test_gemm_takes_the_mma_kernel_where_it_applies_and_tinygrads_elsewhere():
  """One matrix's GEMM of half inputs summed in float32 takes gemm_mma; several matrices (latent attention's heads), a
  sum rounded to half, or tinygrad's choice do not."""
  w, x = Tensor.empty(256, 64, dtype=dtypes.float32), Tensor.empty(1, 40, 64, dtype=dtypes.float32)
  kernels = lambda y: [u for u in y.uop.toposort() if u.op is Ops.PROGRAM]
  y = gemm(w, x, dtypes.float16, kernel="mma")
  assert y.shape == (1, 40, 256) and y.dtype == dtypes.float32 and len(kernels(y)) == 1
  assert not kernels(gemm(w, x, dtypes.float16)) and not kernels(gemm(w, x, dtypes.float16, upcast=False, kernel="mma"))
  assert not kernels(gemm(Tensor.empty(2, 256, 64), Tensor.empty(40, 2, 64), dtypes.float16, kernel="mma"))

def test_the_gemm_hint_is_refused_off_a_cuda_gpu(capsys):
  from tinyzoo.cli import main
  assert mma_refusal("CPU") == "gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not CPU"
  if Device.DEFAULT == "CUDA": return
  assert main(["bench", "llama3.2-1b-tiny", "--gemm", "mma", "--no-journal", "--no-peer", "-r", "1"]) == 1
  assert capsys.readouterr().err.strip() == "tinyzoo: error: hint gemm: gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not CPU"

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiles the CUDA sources with nvcc")
@pytest.mark.parametrize("m, n, k", [(77, 300, 96), (512, 3072, 2048)])
def test_the_gemm_source_compiles_for_sm_90(tmp_path: Path, m: int, n: int, k: int):
  (cu := tmp_path / "k.cu").write_text(gemm_mma_source("r_gemm", m, n, k))
  r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"), str(cu)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr

@pytest.mark.skipif(Device.DEFAULT != "CUDA" or mma_refusal("CUDA") is not None, reason="runs gemm_mma on a CUDA GPU")
@pytest.mark.parametrize("m, n, k", [(77, 300, 96), (128, 128, 32), (512, 3072, 2048), (300, 1000, 4096)])
def test_gemm_mma_against_float64(rng: np.random.Generator, m: int, n: int, k: int):
  """Sizes no multiple of the tile included; fp16 inputs, so the reference multiplies the same fp16 values in float64."""
  a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, k), (n, k)))
  got = gemm_mma(Tensor(a), Tensor(b)).numpy()
  want = a.astype(np.float64) @ b.astype(np.float64).T
  assert got.shape == (m, n)
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.sqrt(k))
