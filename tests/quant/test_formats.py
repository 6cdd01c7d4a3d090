"""Every block format's tinygrad dequantize against gguf.quants.dequantize (numpy), on random and edge-case blocks."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, quants
from quant.formats import FORMATS
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks

# fp16 scale values at the edges: zeros of both signs, negative, the smallest subnormals, the largest finite value
F16_EDGES = np.array([0.0, -0.0, -1.5, 2.0**-24, -(2.0**-20), 2.0**-15, 65504.0], dtype=np.float16)
E8M0_EDGES = np.array([0, 1, 254, 127, 128], dtype=np.uint8)

def assert_dequantizes_like_gguf(t: T, raw: np.ndarray, shape: tuple[int, ...]):
  want = quants.dequantize(raw, t).reshape(shape)
  got = QTensor.from_bytes(raw, t, shape).dequantize().numpy()
  np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=t.name)

@pytest.mark.parametrize("t", FORMATS, ids=lambda t: t.name)
def test_random_blocks(t: T, rng: np.random.Generator):
  shape = (3, 2 * 256)
  assert_dequantizes_like_gguf(t, random_blocks(t, shape, rng, scale=rng.uniform(0.01, 10)), shape)

@pytest.mark.parametrize("t", [t for t, f in FORMATS.items() if f.f16_fields], ids=lambda t: t.name)
def test_edge_fp16_scales(t: T, rng: np.random.Generator):
  fmt = FORMATS[t]
  shape = (len(F16_EDGES), 2 * 256)
  blocks = random_blocks(t, shape, rng).reshape(shape[0], -1, fmt.block_bytes)
  for off in fmt.f16_fields:   # every row uses one edge value for all its scales (and mins)
    blocks[..., off:off + 2] = np.repeat(F16_EDGES[:, None], blocks.shape[1], axis=1)[..., None].view(np.uint8)
  assert_dequantizes_like_gguf(t, blocks.reshape(shape[0], -1), shape)

@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")   # 2^126 * 12 is inf in fp32, for gguf too
def test_edge_e8m0_exponents(rng: np.random.Generator):
  shape = (len(E8M0_EDGES), 64)
  blocks = random_blocks(T.MXFP4, shape, rng).reshape(shape[0], 2, 17)
  blocks[..., 0] = E8M0_EDGES[:, None]
  assert_dequantizes_like_gguf(T.MXFP4, blocks.reshape(shape[0], -1), shape)

@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
@pytest.mark.parametrize("t", [T.F16, T.BF16, T.F32], ids=lambda t: t.name)
def test_float_specials(t: T):
  values = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 1e-40, 3.0e38], dtype=np.float32)
  raw = {T.F32: values, T.F16: values.astype(np.float16), T.BF16: (values.view(np.uint32) >> 16).astype(np.uint16)}[t]
  shape = (1, len(values))
  assert_dequantizes_like_gguf(t, raw.view(np.uint8).reshape(1, -1), shape)

def test_block_sizes_match_gguf():
  for t, fmt in FORMATS.items(): assert quants.GGML_QUANT_SIZES[t] == (fmt.block_elems, fmt.block_bytes), t.name

def test_loading_keeps_blocks_packed(rng: np.random.Generator):
  raw = random_blocks(T.Q4_K, (4, 512), rng)
  qt = QTensor.from_bytes(raw, T.Q4_K, (4, 512))
  assert qt.blocks.dtype.name == "unsigned char" and qt.blocks.shape == (4, 2, 144) and qt.nbytes == raw.nbytes
  np.testing.assert_array_equal(qt.blocks.numpy().reshape(4, -1), raw)
  with pytest.raises(ValueError, match="not whole Q4_K blocks"): QTensor.from_bytes(raw[:, :100], T.Q4_K, (4, 200))
