"""Slots written by the host and scalars read back without the scheduler: a JIT replay sees each new write."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes
from ops.host_io import DeviceSlot, read_scalar

def test_jit_replays_see_each_write(rng: np.random.Generator):
  slot = DeviceSlot((1, 4), dtypes.int32)
  table_np = rng.integers(-1000, 1000, (50, 3)).astype(np.float32)   # integer values: every summation order is exact
  table = Tensor(table_np).realize()
  jit = TinyJit(lambda ids: table[ids].sum().realize())
  for _ in range(6):   # eager, capture, then replays
    ids = rng.integers(0, 50, (1, 4))
    got = read_scalar(jit(slot.write(ids)))
    assert got == table_np[ids].sum()
  assert jit.captured is not None

def test_write_and_read_values():
  slot = DeviceSlot((3,), dtypes.float32)
  np.testing.assert_array_equal(slot.write([1.5, -2.0, 3.25]).numpy(), [1.5, -2.0, 3.25])
  assert read_scalar(Tensor([7], dtype=dtypes.int32).realize()) == 7

def test_bad_reads():
  with pytest.raises(ValueError, match="realized"): read_scalar(Tensor([1]) + 1)
  with pytest.raises(ValueError, match="one-element"): read_scalar(Tensor([1, 2]).realize())
