"""The int8_dot strategy (quant/int8_dot.py): x quantized as gguf's Q8_0 quantizes it, and matmuls against gguf's
dequantized weights times that x, in float64 (tests/quant/test_linear.py runs it beside every other strategy)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, quants
from tinygrad import Tensor
from quant.int8_dot import Int8Rows, int8_dot
from quant.linear import QuantExperts, QuantLinear
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from quant.words import WordBlocks

def gguf_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """x [..., in] as gguf's Q8_0 blocks: the quants int8 [..., in / 32, 32] and the fp16 scales as float32 [..., in / 32]."""
  raw = quants.quantize(x.reshape(-1, x.shape[-1]), T.Q8_0).reshape(*x.shape[:-1], -1, 34)
  return raw[..., 2:].view(np.int8), raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)

def off_ties(rng: np.random.Generator, shape: tuple[int, ...], block: int = 32) -> np.ndarray:
  """Fresh standard normal x [..., in] with no element near a rounding tie of its quant in blocks of `block` (Q8_0's
  32, Q8_K's 256): gguf rounds x * (1 / d), the kernel x * (127 / amax), whose float32 products differ in their last
  bit (a CI run drew a quant that rounded each way, and a whole row moved by a quant step of one block)."""
  while True:
    x = rng.standard_normal(shape).astype(np.float32)
    xb = x.astype(np.float64).reshape(*shape[:-1], -1, block)
    r = np.abs(xb * 127 / np.abs(xb).max(axis=-1, keepdims=True))
    if (np.abs(r - np.floor(r) - 0.5) > 1e-4).all(): return x

def test_quantized_rows_hold_ggmls_q8_0_quants_and_scales(rng: np.random.Generator):
  x = rng.standard_normal((3, 256)).astype(np.float32) * 4
  x[1, 32:64] = 0   # a block of zeros: scale 0, quants 0
  blocks = Int8Rows.quantize(Tensor(x)).blocks.numpy()
  assert blocks.shape == (3, 8, 12) and (blocks[..., 9:] == 0).all()
  q, d = gguf_q8_0(x)
  np.testing.assert_array_equal(blocks[..., :8].copy().view(np.int8).reshape(q.shape), q)
  np.testing.assert_array_equal(blocks[..., 8].copy().view(np.float32), d)

@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_int8_dot_is_the_matmul_of_x_rounded_to_q8_0(t: T, rng: np.random.Generator):
  rows, cols = 40, 320
  raw = random_blocks(t, (rows, cols), rng, scale=0.1)
  w = quants.dequantize(raw, t).reshape(rows, cols).astype(np.float64)
  x = off_ties(rng, (2, 3, cols))
  q, d = gguf_q8_0(x)
  want = (q.astype(np.float64) * d[..., None]).reshape(x.shape) @ w.T
  got = int8_dot(WordBlocks.from_blocks(QTensor.from_bytes(raw, t, (rows, cols))), Int8Rows.quantize(Tensor(x))).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * (np.abs(want).max() + 1))

def test_a_quantized_x_is_shared_by_the_matmuls_that_read_it(rng: np.random.Generator):
  lins = [QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (16, 64), rng), T.Q4_0, (16, 64)), strategy="int8_dot") for _ in range(2)]
  x = Tensor(rng.standard_normal((1, 64)).astype(np.float32))
  xq = Int8Rows.quantize(x)
  for lin in lins: np.testing.assert_allclose(lin(xq).numpy(), lin(x).numpy(), rtol=1e-6)

def test_types_and_matmuls_without_an_integer_form(rng: np.random.Generator):
  mx = QTensor.from_bytes(random_blocks(T.MXFP4, (16, 64), rng), T.MXFP4, (16, 64))
  with pytest.raises(ValueError, match="no integer form for MXFP4"): int8_dot(WordBlocks.from_blocks(mx), Int8Rows.quantize(Tensor.randn(1, 64)))
  lin = QuantLinear(mx, strategy="int8_dot")   # reads as packed_words
  assert not lin.int8 and lin(Tensor.randn(1, 64)).shape == (1, 16)
  with pytest.raises(ValueError, match="activations in 8 bits need an int8_dot matmul"): lin(Int8Rows.quantize(Tensor.randn(1, 64)))
  experts = QuantExperts(QTensor.from_bytes(random_blocks(T.MXFP4, (4, 16, 64), rng), T.MXFP4, (4, 16, 64)), strategy="int8_dot")
  assert not experts.int8 and experts(Tensor.randn(1, 1, 64), Tensor([[1, 3]])).shape == (1, 2, 16)   # read as packed_words

def test_fp16_rounding_on_the_bits_matches_numpys(rng: np.random.Generator):
  """Q8_0's scales are fp16: rounded on the bits, since tinygrad drops a cast to float16 and back."""
  from quant.activations import fp16_rounded
  ties = [1 + 2**-11, 1 + 3 * 2**-11, 2**-25, 3 * 2**-25, 1.5 * 2**-24, 2.5 * 2**-24]   # halfway, to even either way
  v = np.concatenate([rng.random(4096) * 10.0 ** rng.integers(-9, 5, 4096), [0, 2**-24, 2**-14, 65504], ties]).astype(np.float32)
  np.testing.assert_array_equal(fp16_rounded(Tensor(v)).numpy(), v.astype(np.float16).astype(np.float32))

def test_quantizing_x_is_one_kernel_and_rounding_it_as_ggml_two(rng: np.random.Generator):
  """Int8Rows.quantize writes its buffer in one kernel (each block's largest magnitude taken where the quants are
  written); x rounded as ggml rounds it for a Q8_0 dot (q * d, the plain path) stays two kernels, the blocks' largest
  magnitudes and then the rounded values. Both hold gguf's Q8_0."""
  from tinygrad import GlobalCounters
  from quant.activations import round_activations
  x = rng.standard_normal((4, 256)).astype(np.float32)
  q, d = gguf_q8_0(x)
  def realized(t: Tensor, kernels: int) -> np.ndarray:
    GlobalCounters.reset()
    out = t.realize()
    assert GlobalCounters.kernel_count == kernels
    return out.numpy()
  np.testing.assert_array_equal(realized(Int8Rows.quantize(Tensor(x).realize()).blocks, 1)[..., 8].copy().view(np.float32), d)
  rounded = realized(round_activations(Tensor(x).realize(), T.Q4_0, "ggml"), 2)
  np.testing.assert_array_equal(rounded, (q.astype(np.float32) * d[..., None]).reshape(x.shape))
