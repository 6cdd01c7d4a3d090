import math
import numpy as np
from tinygrad import Tensor
import pytest
from gguf import GGMLQuantizationType as T
from ops.kernels import count_kernels
from ops.activations import geglu, geglu_fp16_table, swiglu, swiglu_clamped
from quant.linear import QuantLinear
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from tinygrad import TinyJit

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

@pytest.mark.parametrize("act", [swiglu, geglu, geglu_fp16_table, swiglu_clamped], ids=lambda a: a.name)
def test_of_pairs_is_the_activation_of_the_two_halves(act, seed, rng):
  g, u = ((rng.normal(size=(3, 40)) * 6).astype(np.float32) for _ in range(2))
  np.testing.assert_allclose(act.of_pairs(Tensor(np.stack([g, u], axis=-2))).numpy(), act(Tensor(g), Tensor(u)).numpy(), rtol=1e-6, atol=1e-6,
                             err_msg=f"{act.name} seed={seed}")

@pytest.mark.parametrize("strategy", ["packed_dot", "packed_words"])
def test_of_pairs_stays_in_the_joined_matmuls_kernel(strategy, rng):
  """Over the sums of joined gate and up rows the activation is computed by the matmul's kernel: one kernel where the
  halves of the same sum take two (the sum realized, then the activation)."""
  F, D = 48, 64
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q8_0, (2 * F, D), rng), T.Q8_0, (2 * F, D)), strategy=strategy)
  x = Tensor(rng.normal(size=(1, D)).astype(np.float32)).realize()
  kernels, outs = [], []
  for fn in (lambda x: swiglu.of_pairs(lin(x).unflatten(-1, (2, F))), lambda x: swiglu(*lin(x).split(F, dim=-1))):
    jit = TinyJit(lambda x: fn(x).realize())
    for _ in range(3): outs.append(jit(x).numpy())
    kernels.append(count_kernels(jit))
  assert kernels == [1, 2]
  # the two kernels sum in different orders: float32 rounding apart
  assert np.linalg.norm(outs[0] - outs[-1]) < 1e-5 * np.linalg.norm(outs[-1])
