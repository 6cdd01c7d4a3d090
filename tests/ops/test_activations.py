import math
import numpy as np
from tinygrad import Tensor
from ops.activations import geglu, swiglu, swiglu_clamped

def sigmoid(x: np.ndarray) -> np.ndarray: return 1 / (1 + np.exp(-x))

def ref_swiglu(g, u): return g * sigmoid(g) * u
def ref_geglu(g, u): return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * u
def ref_swiglu_clamped(g, u, limit=7.0, alpha=1.702):
  g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
  return (u + 1) * g * sigmoid(alpha * g)

def test_activations(seed, rng):
  # wide inputs so both sides of the GPT-OSS clamp are exercised
  g, u = ((rng.normal(size=(4, 96)) * 6).astype(np.float32) for _ in range(2))
  for fn, ref in ((swiglu, ref_swiglu), (geglu, ref_geglu), (swiglu_clamped, ref_swiglu_clamped)):
    out = fn(Tensor(g), Tensor(u)).numpy()
    np.testing.assert_allclose(out, ref(g.astype(np.float64), u.astype(np.float64)), rtol=1e-4, atol=1e-4, err_msg=f"{fn.name} seed={seed}")
