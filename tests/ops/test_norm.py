import numpy as np
from tinygrad import Tensor, dtypes
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
