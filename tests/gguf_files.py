"""Small GGUF files written with gguf's own writer, for tests."""
import struct
from pathlib import Path
import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter

def write_gguf(path: Path, tensors: dict[str, tuple[T, np.ndarray, tuple[int, ...]]], meta: dict | None = None, arch: str = "llama") -> Path:
  w = GGUFWriter(str(path), arch)
  w.add_uint32(f"{arch}.block_count", 2)
  w.add_string("tokenizer.ggml.model", "gpt2")
  w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
  for k, v in (meta or {}).items(): w.add_float32(k, v)
  for name, (t, raw, shape) in tensors.items(): w.add_tensor(name, raw, raw_dtype=t)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return path

def type_field_offset(data: bytes, name: str) -> int:
  """Byte offset of a tensor's GGML type in the tensor directory: after its name, n_dims and the dims."""
  i = data.index(name.encode()) + len(name)
  return i + 4 + 8 * struct.unpack_from("<I", data, i)[0]
