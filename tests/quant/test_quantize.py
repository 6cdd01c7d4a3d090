"""quant.quantize: bytes that gguf.quants and tinyzoo both dequantize alike, k-quants at least as close as the legacy
formats of the same size, values already on the k-quant grids reproduced byte for byte, clear errors."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES, quants
from tinygrad import Tensor
from quant.qtensor import QTensor
from quant.quantize import GGUF_QUANTIZED, SUPPORTED, quantize

def data(kind: str, rng: np.random.Generator, shape: tuple[int, int] = (64, 4096)) -> np.ndarray:
  x = {"gauss": lambda: rng.standard_normal(shape), "t3": lambda: rng.standard_t(3, shape), "offset": lambda: rng.standard_normal(shape) + 3,
       "rowscale": lambda: rng.standard_normal(shape) * np.exp(rng.standard_normal((shape[0], 1)))}[kind]()
  return (x * rng.uniform(0.001, 10)).astype(np.float32)

def rms_error(x: np.ndarray, t: T) -> float:
  return float(np.sqrt(np.mean((quants.dequantize(quantize(x, t), t).reshape(x.shape) - x) ** 2)))

@pytest.mark.parametrize("kind", ["gauss", "t3", "offset", "rowscale"])
def test_k_quants_beat_legacy_of_same_size(kind: str, rng: np.random.Generator):
  # a wrong layout (nibbles, scales or planes in the wrong place) gives errors near the data's own spread
  x = data(kind, rng)
  rel = {t: rms_error(x, t) / float(x.std()) for t in (T.Q4_0, T.Q4_K, T.Q5_0, T.Q5_K, T.Q6_K)}
  assert rel[T.Q4_K] < 0.92 * rel[T.Q4_0] and rel[T.Q4_K] < 0.11, rel
  assert rel[T.Q5_K] < 0.92 * rel[T.Q5_0] and rel[T.Q5_K] < 0.055, rel
  assert rel[T.Q6_K] < 0.5 * rel[T.Q5_0] and rel[T.Q6_K] < 0.045, rel

def on_k_grid(t: T, rng: np.random.Generator, n_blocks: int) -> np.ndarray:
  """Blocks a good quantizer must reproduce exactly: every sub-block uses its whole code range, and one sub-block of
  each super-block holds the largest 6-bit (or int8) scale and min, so that d and dmin are recovered from it."""
  d = rng.uniform(1e-3, 1e-1, (n_blocks, 1)).astype(np.float16)
  if t == T.Q6_K:
    sc = rng.integers(-127, 128, (n_blocks, 16)); sc[np.arange(n_blocks), rng.integers(0, 16, n_blocks)] = -128
    sc[sc == 0] = 1
    q = rng.integers(-31, 32, (n_blocks, 16, 16)); q[..., 0] = -32                    # -32 is the largest magnitude of each sub-block
    q = rng.permuted(q, axis=-1)
    return (d.astype(np.float32)[..., None] * sc.astype(np.float32)[..., None] * q).reshape(n_blocks, 256).astype(np.float32)
  nmax = 15 if t == T.Q4_K else 31
  dmin = rng.uniform(1e-3, 1e-1, (n_blocks, 1)).astype(np.float16)
  sc, mn = rng.integers(1, 64, (2, n_blocks, 8))
  sc[np.arange(n_blocks), rng.integers(0, 8, n_blocks)] = 63
  mn[np.arange(n_blocks), rng.integers(0, 8, n_blocks)] = 63
  q = rng.integers(0, nmax + 1, (n_blocks, 8, 32)); q[..., 0], q[..., 1] = 0, nmax
  q = rng.permuted(q, axis=-1)
  step = (d.astype(np.float32) * sc.astype(np.float32))[..., None]
  off = (dmin.astype(np.float32) * mn.astype(np.float32))[..., None]
  return (step * q - off).reshape(n_blocks, 256).astype(np.float32)

@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_values_on_the_grid_come_back_exactly(t: T, rng: np.random.Generator):
  x = on_k_grid(t, rng, 300)
  raw = quantize(x.reshape(3, -1), t)
  np.testing.assert_array_equal(quants.dequantize(raw, t).reshape(x.shape), x)
  again = quantize(quants.dequantize(raw, t), t)   # and quantizing what it dequantizes to is a fixed point
  np.testing.assert_array_equal(again, raw)

@pytest.mark.parametrize("t", SUPPORTED, ids=lambda t: t.name)
def test_tinyzoo_dequantizes_like_gguf(t: T, rng: np.random.Generator):
  shape = (3, 5, 512)
  x = data("t3", rng, (15, 512)).reshape(shape)
  raw = quantize(x, t)
  elems, nbytes = GGML_QUANT_SIZES[t]
  assert raw.dtype == np.uint8 and raw.shape == (3, 5, 512 // elems * nbytes)
  want = quants.dequantize(raw, t).reshape(shape)
  np.testing.assert_array_equal(QTensor.from_bytes(raw, t, shape).dequantize().numpy(), want)
  if t in GGUF_QUANTIZED: np.testing.assert_array_equal(raw.reshape(-1), np.ascontiguousarray(quants.quantize(x, t)).view(np.uint8).reshape(-1))

@pytest.mark.parametrize("t", SUPPORTED, ids=lambda t: t.name)
def test_rows_at_an_index_are_those_gguf_dequantizes(t: T, rng: np.random.Generator):
  """QTensor.rows, the embedding lookup: the rows at an index of any shape, repeated rows among them."""
  raw = quantize(data("gauss", rng, (40, 512)), t)
  index = rng.integers(0, 40, (2, 3))
  index[1, 2] = index[0, 0]
  got = QTensor.from_bytes(raw, t, (40, 512)).rows(Tensor(index.astype(np.int32))).numpy()
  np.testing.assert_array_equal(got, quants.dequantize(raw, t).reshape(40, 512)[index])

@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_flat_and_one_sided_blocks(t: T, rng: np.random.Generator):
  x = np.zeros((6, 256), dtype=np.float32)
  x[1], x[2], x[3] = 0.75, -0.5, rng.uniform(2, 3, 256)      # constants of either sign, values far from 0 on one side
  x[4, 100] = 1e-3                                           # one non-zero value
  x[5] = rng.standard_normal(256) * 1e-4                     # scales in fp16's subnormal range
  y = quants.dequantize(quantize(x, t), t).reshape(x.shape)
  np.testing.assert_array_equal(y[0], 0)
  np.testing.assert_allclose(y[1:3], x[1:3], rtol=1e-3)
  np.testing.assert_allclose(y[3:5], x[3:5], rtol=0, atol=0.2)   # Q4_K/Q5_K offsets are <= 0: 2..3 is fitted as 0..3, steps of 0.2
  assert np.isfinite(y[5]).all() and np.sqrt(np.mean((y[5] - x[5]) ** 2)) < 0.5 * x[5].std()

def test_errors():
  x = np.zeros((2, 256), dtype=np.float32)
  with pytest.raises(ValueError, match=r"cannot quantize to Q2_K \(supported: F32, F16, BF16, Q4_0"): quantize(x, T.Q2_K)
  with pytest.raises(ValueError, match="unknown GGML type 'Q9_Z'"): quantize(x, "Q9_Z")
  with pytest.raises(ValueError, match="rows of 96 elements are not whole Q4_K blocks of 256"): quantize(x[:, :96], "q4_k")
  with pytest.raises(ValueError, match="rows of 17 elements are not whole Q4_0 blocks of 32"): quantize(x[:, :17], T.Q4_0)
  with pytest.raises(ValueError, match="infinite or NaN"): quantize(np.full((1, 256), np.nan, np.float32), T.Q6_K)
  with pytest.raises(ValueError, match="scalar"): quantize(np.float32(1), T.F16)
  assert quantize(x, T.Q4_K).shape == (2, 144) and quantize(x, 8).shape == (2, 8 * 34)   # by name, case-insensitive, or number
