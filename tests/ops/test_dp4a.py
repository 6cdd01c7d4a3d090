"""dp4a (ops/dp4a.py) against numpy's byte products, on the CPU and as CUDA source (compiled with nvcc where it exists)."""
import shutil
import subprocess
from pathlib import Path
import numpy as np
import pytest
from tinygrad import Tensor
from tinygrad.helpers import PARALLEL
from ops.dp4a import dp4a

def byte_dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """The four signed byte products of a and b summed, in int64."""
  return (a.view(np.int8).reshape(*a.shape, 4).astype(np.int64) * b.view(np.int8).reshape(*b.shape, 4).astype(np.int64)).sum(-1)

def test_dp4a_sums_four_signed_byte_products_with_broadcasting(rng: np.random.Generator):
  a = rng.integers(0, 2**32, (6, 20), dtype=np.uint32)
  b = rng.integers(0, 2**32, (20,), dtype=np.uint32)
  np.testing.assert_array_equal(dp4a(Tensor(a), Tensor(b)).numpy(), byte_dots(a, np.broadcast_to(b, a.shape)))
  # inside a reduce, where the CPU opts compute several rows a thread (a CUSTOMI over vectors, split per lane)
  np.testing.assert_array_equal(dp4a(Tensor(a), Tensor(b)).sum(-1).numpy(), byte_dots(a, np.broadcast_to(b, a.shape)).sum(-1))
  assert PARALLEL.value == 0, "kernels using dp4a compile in this process, where the renderer knows it"

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="CUDA's nvcc is not installed")
def test_dp4a_renders_as_the_cuda_instruction(tmp_path: Path, rng: np.random.Generator):
  from tests.quant.test_matvec_opts import cuda_source
  a, b = Tensor(rng.integers(0, 2**32, (64, 32), dtype=np.uint32)), Tensor(rng.integers(0, 2**32, (32,), dtype=np.uint32))
  source = cuda_source(dp4a(a, b).sum(-1))
  assert "__dp4a" in source
  (tmp_path / "k.cu").write_text(source)
  built = subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-o", str(tmp_path / "k.ptx"), str(tmp_path / "k.cu")], capture_output=True, text=True)
  assert built.returncode == 0, built.stderr
  assert b"dp4a" in (tmp_path / "k.ptx").read_bytes()

def test_dp4a_needs_a_c_style_renderer(monkeypatch):
  from types import SimpleNamespace
  import ops.dp4a
  monkeypatch.setattr(ops.dp4a, "Device", {"CPU": SimpleNamespace(renderer=object())})
  with pytest.raises(ValueError, match="needs a C-style renderer; CPU renders with object"): dp4a(Tensor([1]), Tensor([2]))
