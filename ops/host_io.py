"""The few values that cross between host and device on every decoded token (the token id in, the sampled id out, the
sampler's random draw and recent tokens), moved without tinygrad's scheduler.

`Tensor(list).realize()` schedules and runs a copy: 1.6-5 ms on this repo's CI-class CPU, and three of them per token
were more than half of a decode step on an H100. A `DeviceSlot` is allocated once and written straight through its
buffer's allocator, and `read_scalar` copies one value out the same way; allocators order these copies with the
device's own queue (tinygrad's copies use the same calls), so a write lands after the kernels already launched that read
the slot, and a read waits for the kernels that wrote the value.
"""
import numpy as np
from tinygrad import Tensor
from tinygrad.device import Buffer
from tinygrad.dtype import DType, _to_np_dtype

def _buffer(t: Tensor) -> Buffer:
  buf = t.uop.base.realized
  if buf is None: raise ValueError("the tensor must be realized before its buffer is read or written")
  return buf

class DeviceSlot:
  """A realized device tensor of fixed shape and dtype whose contents the host replaces; pass `.tensor` to a TinyJit."""
  def __init__(self, shape: tuple[int, ...], dtype: DType, device: str | None = None):
    self.tensor = Tensor.zeros(*shape, dtype=dtype, device=device).contiguous().realize()
    self._host = np.zeros(shape, dtype=_to_np_dtype(dtype))
    self._buf = _buffer(self.tensor)

  def write(self, values) -> Tensor:
    self._host[...] = values
    self._buf.allocator._copyin(self._buf._buf, memoryview(self._host).cast("B"))
    return self.tensor

def read_scalar(t: Tensor) -> int | float:
  """The one value of a realized tensor (a JIT's output), waiting for the device."""
  buf = _buffer(t)
  out = np.empty(1, dtype=_to_np_dtype(buf.dtype))
  if buf.nbytes != out.nbytes: raise ValueError(f"read_scalar needs a one-element tensor, got {buf.size} elements")
  buf.allocator._copyout(memoryview(out).cast("B"), buf._buf)
  return out.item()
