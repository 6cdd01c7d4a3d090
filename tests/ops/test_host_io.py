"""Slots written and read by the host without the scheduler: a JIT replay sees each new write, a read what kernels wrote."""
import numpy as np
from tinygrad import Tensor, TinyJit, dtypes
from ops.host_io import DeviceSlot

def test_jit_replays_see_each_write(rng: np.random.Generator):
  slot = DeviceSlot((1, 4), dtypes.int32)
  table_np = rng.integers(-1000, 1000, (50, 3)).astype(np.float32)   # integer values: every summation order is exact
  table = Tensor(table_np).realize()
  jit = TinyJit(lambda ids: table[ids].sum().realize())
  for _ in range(6):   # eager, capture, then replays
    ids = rng.integers(0, 50, (1, 4))
    got = jit(slot.write(ids)).item()
    assert got == table_np[ids].sum()
  assert jit.captured is not None

def test_write_and_read_values():
  slot = DeviceSlot((3,), dtypes.float32)
  np.testing.assert_array_equal(slot.write([1.5, -2.0, 3.25]).numpy(), [1.5, -2.0, 3.25])
  np.testing.assert_array_equal(slot.read(), [1.5, -2.0, 3.25])

def test_read_sees_what_a_jit_wrote(rng: np.random.Generator):
  slot = DeviceSlot((4,), dtypes.int32)
  jit = TinyJit(lambda x: slot.tensor.assign(slot.tensor + x).realize())
  total = np.zeros(4, dtype=np.int32)
  for _ in range(5):
    x = rng.integers(-50, 50, 4).astype(np.int32)
    jit(Tensor(x).realize())
    total += x
    np.testing.assert_array_equal(slot.read(), total)
