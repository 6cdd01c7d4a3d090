"""Host data moved to and from the device without tinygrad's scheduler: a model's weights as it loads, and the few values
that cross during decoding (token ids in, the sampled ids out, the sampler's random draws and recent tokens).

`Tensor(list).realize()` schedules and runs a copy, milliseconds of host time each, which per token would outweigh a
GPU's decode step. A `DeviceSlot` is allocated once and written and read straight
through its buffer's allocator; allocators order these copies with the device's own queue (tinygrad's copies use the
same calls), so a write lands after the kernels already launched that read the slot, and a read waits for the kernels
that wrote it.
"""
import numpy as np
from tinygrad import Device, Tensor
from tinygrad.device import Buffer
from tinygrad.dtype import DType, _from_np_dtype, _to_np_dtype

def upload(host: np.ndarray, device: str | None = None) -> Tensor:
  """A realized device tensor of `host`'s shape, dtype and contents, copied straight through its buffer's allocator.
  The device is synchronized after the copy, which gives back the host staging memory a GPU's copy takes at once."""
  t = Tensor.empty(*host.shape, dtype=_from_np_dtype(host.dtype), device=device)
  buf = t.uop.base.buffer.ensure_allocated()
  buf.allocator._copyin(buf._buf, memoryview(np.ascontiguousarray(host)).cast("B"))
  Device[buf.device].synchronize()
  return t

class DeviceSlot:
  """A realized device tensor of fixed shape and dtype whose contents the host replaces; pass `.tensor` to a TinyJit."""
  def __init__(self, shape: tuple[int, ...], dtype: DType, device: str | None = None):
    self._host = np.zeros(shape, dtype=_to_np_dtype(dtype))
    self.tensor = upload(self._host, device)
    self._buf: Buffer = self.tensor.uop.base.buffer

  def write(self, values) -> Tensor:
    self._host[...] = values
    self._buf.allocator._copyin(self._buf._buf, memoryview(self._host).cast("B"))
    return self.tensor

  def read(self) -> np.ndarray:
    """The slot's contents (kernels may write it too), waiting for the device."""
    out = np.empty_like(self._host)
    self._buf.allocator._copyout(memoryview(out).cast("B"), self._buf._buf)
    return out
