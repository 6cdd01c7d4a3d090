"""Small GGUF files for tests, written by quant.gguf_write, and where their fields sit (to damage them)."""
import struct
from pathlib import Path
import numpy as np
from gguf import GGMLQuantizationType as T
from quant.gguf_write import RawTensor, write_gguf

def small_gguf(path: Path, tensors: dict[str, tuple[T, np.ndarray, tuple[int, ...]]], meta: dict | None = None, arch: str = "llama") -> Path:
  """A file of `arch` with 2 blocks, a three-token tokenizer, `meta` and `tensors` (by name: type, raw bytes
  [..., row_bytes] and the logical shape they hold)."""
  meta = {f"{arch}.block_count": 2, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "c"], **(meta or {})}
  return write_gguf(path, arch, meta, [RawTensor(name, t, raw, shape) for name, (t, raw, shape) in tensors.items()])

def type_field_offset(data: bytes, name: str) -> int:
  """Byte offset of a tensor's GGML type in the tensor directory: after its name, n_dims and the dims."""
  i = data.index(name.encode()) + len(name)
  return i + 4 + 8 * struct.unpack_from("<I", data, i)[0]
