import math
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp
from ops.rope import Yarn, apply_rope, rope_tables

def ref_rope(x: np.ndarray, pos: np.ndarray, rot: int, base: float, interleaved: bool) -> np.ndarray:
  """Rotate each (a, b) channel pair of x [B, H, T, D] by pos [T] * base^(-2i/rot); channels from rot on are untouched."""
  x, out = x.astype(np.float64), x.astype(np.float64)
  for i in range(rot // 2):
    a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + rot // 2)
    c, s = np.cos(pos * base ** (-2 * i / rot)), np.sin(pos * base ** (-2 * i / rot))
    out[..., a], out[..., b] = x[..., a] * c - x[..., b] * s, x[..., b] * c + x[..., a] * s
  return out

def llama_cpp_yarn(n_dims, base, max_pos, freq_scale, n_ctx_orig, ext_factor, attn_factor, beta_fast, beta_slow):
  """A scalar transcription of ggml-cpu's rope cache: ggml_rope_yarn_corr_dims, rope_yarn_ramp and rope_yarn."""
  def corr_dim(n_rot): return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
  low, high = max(0.0, math.floor(corr_dim(beta_fast))), min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
  theta_scale = base ** (-2.0 / n_dims)
  cos, sin = np.zeros((max_pos, n_dims // 2)), np.zeros((max_pos, n_dims // 2))
  for p in range(max_pos):
    theta_extrap = float(p)
    for i0 in range(0, n_dims, 2):
      theta_interp = freq_scale * theta_extrap
      theta, mscale = theta_interp, attn_factor
      if ext_factor != 0:
        ramp = 1 - min(1.0, max(0.0, (i0 // 2 - low) / max(0.001, high - low)))
        theta = theta_interp * (1 - ramp * ext_factor) + theta_extrap * ramp * ext_factor
        mscale *= 1 + 0.1 * math.log(1 / freq_scale)
      cos[p, i0 // 2], sin[p, i0 // 2] = math.cos(theta) * mscale, math.sin(theta) * mscale
      theta_extrap *= theta_scale
  return cos, sin, (low, high)

@pytest.mark.parametrize("interleaved,rot", [(False, 16), (True, 16), (False, 8), (True, 10)])
def test_apply_rope(seed, rng, interleaved, rot):
  x, base, start = rng.normal(size=(2, 3, 5, 16)).astype(np.float32), 10000.0, 3
  cos, sin = rope_tables(rot, base, 16)
  out = apply_rope(Tensor(x), cos[start:start + 5], sin[start:start + 5], interleaved).numpy()
  ref = ref_rope(x, np.arange(start, start + 5), rot, base, interleaved)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")

def test_apply_rope_symbolic_position(seed, rng):
  cos, sin = rope_tables(10, 500.0, 32)
  @TinyJit
  def step(x: Tensor, pos: UOp) -> Tensor: return apply_rope(x, cos[pos:pos + 1], sin[pos:pos + 1], interleaved=True).realize()
  for p in range(3, 8):
    x = rng.normal(size=(1, 2, 1, 16)).astype(np.float32)
    out = step(Tensor(x), UOp.variable("start_pos", 0, 31).bind(p)).numpy()
    np.testing.assert_allclose(out, ref_rope(x, np.array([p]), 10, 500.0, True), rtol=1e-5, atol=1e-5, err_msg=f"pos={p} seed={seed}")

@pytest.mark.parametrize("ext_factor", [1.0, 0.0, "random"])
def test_yarn_tables_match_llama_cpp(seed, rng, ext_factor):
  rot, base, orig_ctx, max_pos = 32, 10000.0, 4096, 256
  yarn = Yarn(factor=float(rng.uniform(2, 16)), orig_ctx=orig_ctx, beta_fast=float(rng.uniform(24, 40)), beta_slow=float(rng.uniform(0.5, 2)),
              ext_factor=float(rng.uniform(0.2, 1)) if ext_factor == "random" else ext_factor, attn_factor=float(rng.uniform(0.5, 1.5)))
  cos, sin = rope_tables(rot, base, max_pos, yarn)
  ref_cos, ref_sin, (low, high) = llama_cpp_yarn(rot, base, max_pos, 1 / yarn.factor, orig_ctx, yarn.ext_factor, yarn.attn_factor,
                                                 yarn.beta_fast, yarn.beta_slow)
  assert 0 < low < high < rot // 2, f"the ramp should fall inside the pairs, got {low=} {high=} seed={seed}"
  np.testing.assert_allclose(cos.numpy(), ref_cos, atol=2e-6, err_msg=f"{yarn} seed={seed}")
  np.testing.assert_allclose(sin.numpy(), ref_sin, atol=2e-6, err_msg=f"{yarn} seed={seed}")
