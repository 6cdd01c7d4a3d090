import numpy as np
from tinygrad import GlobalCounters, Tensor, dtypes
from ops.norm import rms_norm

def ref_rms_norm(x: np.ndarray, w: np.ndarray|None, eps: float) -> np.ndarray:
  x = x.astype(np.float64)
  out = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
  return out if w is None else out * w

def test_rms_norm_weighted(seed, rng):
  x, w = rng.normal(size=(2, 3, 64)).astype(np.float32) * 3, rng.normal(size=64).astype(np.float32)
  out = rms_norm(Tensor(x), Tensor(w), 1e-6)
  np.testing.assert_allclose(out.numpy(), ref_rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")

def test_rms_norm_half_keeps_dtype(seed, rng):
  x = rng.normal(size=(2, 3, 64)).astype(np.float16)
  out = rms_norm(Tensor(x), None, 1e-5)
  assert out.dtype == dtypes.half
  np.testing.assert_allclose(out.numpy(), ref_rms_norm(x, None, 1e-5), rtol=2e-3, atol=2e-3, err_msg=f"seed={seed}")

def test_rms_norm_summed_per_output_is_one_kernel(seed, rng):
  """The squares broadcast before their sum: the same norm, made by one kernel where the sum would be one of its own."""
  x, w = rng.normal(size=(1, 1, 96)).astype(np.float32) * 3, rng.normal(size=96).astype(np.float32)
  xt, wt = Tensor(x).realize(), Tensor(w).realize()
  for per_output, kernels in ((False, 2), (True, 1)):
    GlobalCounters.reset()
    out = rms_norm(xt, wt, 1e-6, sum_per_output=per_output).realize()
    assert GlobalCounters.kernel_count == kernels, (per_output, GlobalCounters.kernel_count)
    np.testing.assert_allclose(out.numpy(), ref_rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")
