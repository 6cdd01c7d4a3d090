"""The one GGUF writer: a file written whole or not at all (everything goes to a temporary file beside the target, renamed
over it only once complete, so an interrupted write never leaves a half-written model behind), its tensors made one
at a time as they are written (a requantized copy of a large model never holds it all)."""
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable
import numpy as np
from gguf import GGMLQuantizationType as T, GGUFValueType, GGUFWriter
from gguf.quants import quant_shape_from_byte_shape, quant_shape_to_byte_shape
from tqdm import tqdm

FLOAT_VALUES = (T.F32, T.F16)   # types whose data may be given as values rather than bytes

@dataclass(frozen=True)
class Typed:
  """A metadata value written with this GGUF type (a key copied from another file keeps its own)."""
  value: Any
  vtype: GGUFValueType
  sub_type: GGUFValueType | None = None   # of an array's elements

@dataclass(frozen=True)
class RawTensor:
  """A tensor to write: its data values (F32/F16) of its logical shape, or bytes [*shape[:-1], row_bytes]; or a function
  that makes those when the tensor is written, with `shape` (logical) given."""
  name: str
  ggml_type: T
  data: np.ndarray | Callable[[], np.ndarray]
  shape: tuple[int, ...] | None = None

  def logical_shape(self) -> tuple[int, ...]:
    if self.shape is not None: return self.shape
    assert isinstance(self.data, np.ndarray)
    return self.data.shape if self.holds_values(self.data) else tuple(quant_shape_from_byte_shape(self.data.shape, self.ggml_type))

  def holds_values(self, data: np.ndarray) -> bool: return self.ggml_type in FLOAT_VALUES and data.dtype != np.uint8

  def array(self) -> np.ndarray:
    """The bytes (or float values) to write."""
    data = self.data() if callable(self.data) else self.data
    return np.ascontiguousarray(data if self.holds_values(data) else data.view(np.uint8))

def write_gguf(path: str | os.PathLike, arch: str, metadata: dict[str, Any], tensors: Iterable[RawTensor], progress: str | None = None) -> Path:
  """Writes `metadata` (key -> str, bool, int, float or a list of one of them, or a Typed value) and `tensors`, in order,
  with `general.architecture` from `arch`. Scalar ints are written as uint32 and ints in lists as int32 (as llama.cpp reads
  them), each as int64 where it does not fit; floats as float32. `progress`: a bar's title while the tensors are written."""
  path, tensors = Path(path), list(tensors)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  try:
    w = GGUFWriter(tmp, arch)
    for key, value in metadata.items(): _add(w, key, value)
    if "general.alignment" in metadata: w.data_alignment = int(getattr(metadata["general.alignment"], "value", metadata["general.alignment"]))
    for t in tensors:   # every tensor's info by its type and byte shape, whether its data comes as values or bytes
      byte_shape = quant_shape_to_byte_shape(t.logical_shape(), t.ggml_type)
      w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=t.ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in tqdm(tensors, desc=progress, unit="tensor", leave=False, disable=progress is None): w.write_tensor_data(t.array())
    w.close()
    os.replace(tmp, path)
  finally: tmp.unlink(missing_ok=True)
  return path

def _scalar_type(value: Any, in_list: bool = False) -> GGUFValueType:
  if isinstance(value, bool): return GGUFValueType.BOOL
  if isinstance(value, int):
    if in_list: return GGUFValueType.INT32 if -2**31 <= value < 2**31 else GGUFValueType.INT64
    return GGUFValueType.UINT32 if 0 <= value < 2**32 else GGUFValueType.INT64
  if isinstance(value, float): return GGUFValueType.FLOAT32
  if isinstance(value, str): return GGUFValueType.STRING
  raise TypeError(f"cannot write metadata value of type {type(value).__name__}")

def _add(w: GGUFWriter, key: str, value: Any) -> None:
  if isinstance(value, Typed): w.add_key_value(key, value.value, value.vtype, sub_type=value.sub_type)
  elif isinstance(value, (list, tuple)):
    if not value: raise ValueError(f"metadata {key!r}: an empty list has no element type")
    sub = max((_scalar_type(v, in_list=True) for v in value), key=lambda t: t == GGUFValueType.INT64)   # one wide int widens the whole array
    w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=sub)
  else: w.add_key_value(key, value, _scalar_type(value))
