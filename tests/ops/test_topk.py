import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes
from ops.kernels import count_kernels
from ops.topk import pairwise_topk

# measured on tinygrad 0.14.0: values and indices picked (the ranks counted inside), then one of the two outputs (one
# kernel for one reader)
PAIRWISE_KERNELS = 2

def ref_topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  idx = np.argsort(-x.astype(np.float64), axis=-1, kind="stable")[..., :k]
  return np.take_along_axis(x, idx, axis=-1), idx

@pytest.mark.parametrize("shape,k", [((1,), 1), ((3, 5), 3), ((2, 16), 16), ((4, 2, 64), 8)])
def test_pairwise_topk(seed, rng, shape, k):
  # small integers force many ties, which must come out in ascending index order; floats check plain ordering
  for x in (rng.normal(size=shape).astype(np.float32), rng.integers(-2, 3, size=shape).astype(np.float32)):
    values, indices = pairwise_topk(Tensor(x), k)
    ref_values, ref_indices = ref_topk(x, k)
    assert indices.dtype == dtypes.int32
    np.testing.assert_array_equal(indices.numpy(), ref_indices, err_msg=f"x={x} seed={seed}")
    np.testing.assert_array_equal(values.numpy(), ref_values, err_msg=f"x={x} seed={seed}")

@pytest.mark.parametrize("k", [0, 6])
def test_pairwise_topk_rejects_k(k):
  with pytest.raises(ValueError): pairwise_topk(Tensor.zeros(2, 5), k)

def jit_kernels(topk) -> int:
  @TinyJit
  def run(x: Tensor) -> tuple[Tensor, Tensor]: return tuple(t.realize() for t in topk(x, 8))
  for _ in range(3): run(Tensor.randn(1, 64).realize())
  return count_kernels(run)

def test_kernel_count_pairwise_vs_tensor_topk():
  pairwise, bitonic = jit_kernels(pairwise_topk), jit_kernels(Tensor.topk)
  print(f"\ntop-8 of 64 experts in TinyJit: pairwise_topk {pairwise} kernels, Tensor.topk {bitonic} kernels")
  assert pairwise == PAIRWISE_KERNELS and pairwise < bitonic
