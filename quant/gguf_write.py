"""Writing a GGUF file whole or not at all: everything goes to a temporary file beside the target, renamed over it
only once complete, so an interrupted write never leaves a half-written model behind."""
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

@dataclass(frozen=True)
class RawTensor:
  name: str
  ggml_type: GGMLQuantizationType
  data: np.ndarray   # bytes [*shape[:-1], row_bytes] for block types, or values (F32/F16) of the logical shape

def write_gguf(path: str | os.PathLike, arch: str, metadata: dict[str, Any], tensors: list[RawTensor]) -> Path:
  """Writes `metadata` (key -> str, bool, int, float or a list of one of them) and `tensors`, in order, with
  `general.architecture` from `arch`. Scalar ints are written as uint32 and ints in lists as int32 (as llama.cpp reads
  them), each as int64 where it does not fit; floats as float32."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  try:
    w = GGUFWriter(tmp, arch)
    for key, value in metadata.items(): _add(w, key, value)
    for t in tensors:
      data = np.ascontiguousarray(t.data)
      if t.ggml_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16): w.add_tensor(t.name, data)
      else: w.add_tensor(t.name, data.view(np.uint8), raw_shape=data.shape, raw_dtype=t.ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
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
  if isinstance(value, (list, tuple)):
    if not value: raise ValueError(f"metadata {key!r}: an empty list has no element type")
    sub = max((_scalar_type(v, in_list=True) for v in value), key=lambda t: t == GGUFValueType.INT64)   # one wide int widens the whole array
    w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=sub)
  else: w.add_key_value(key, value, _scalar_type(value))
