"""Reading a GGUF file (the `gguf` package, memory-mapped) into metadata and packed tensors, with one-line errors."""
import functools
import os
from dataclasses import dataclass
from typing import Any, Iterator
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGMLQuantizationType, GGML_QUANT_SIZES
from tqdm import tqdm
from quant.qtensor import QTensor

class GGUFError(Exception):
  """A GGUF file tinyzoo cannot use; str() is one line naming the file and the problem."""

@dataclass(frozen=True)
class TensorInfo:
  name: str
  ggml_type: GGMLQuantizationType
  shape: tuple[int, ...]    # logical, row-major: the GGUF dims reversed
  offset: int               # absolute byte offset of the data in the file
  nbytes: int

class _CheckedReader(GGUFReader):
  """GGUFReader that names the tensor when its type is unknown or its data runs past the end of the file."""
  @property
  def data(self) -> np.ndarray: return self._data

  @data.setter
  def data(self, mapped: np.memmap) -> None:
    # a plain ndarray over the same map: every np.memmap slice pays for __array_finalize__, and the reader takes
    # hundreds of thousands of slices parsing a large vocabulary
    self._data = mapped.view(np.ndarray)

  def _build_tensors(self, start_offs: int, fields: list) -> None:
    size = len(self.data)
    for field in fields:
      _, name, _, dims, raw_type, offset = field.parts
      name = bytes(name).decode("utf-8", "replace")
      try: ggml_type = GGMLQuantizationType(int(raw_type[0]))
      except ValueError: raise GGUFError(f"tensor {name!r} has unknown GGML type {int(raw_type[0])}") from None
      block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
      n = int(np.prod(dims, dtype=np.int64))
      end = start_offs + int(offset[0]) + n * block_bytes // block_elems
      if end > size: raise GGUFError(f"tensor {name!r} data ends at byte {end:,}, past the end of the file ({size:,} bytes): truncated?")
    super()._build_tensors(start_offs, fields)

class GGUFFile:
  """Metadata and tensor directory of a GGUF file; tensors are loaded on request, packed."""
  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self.reader = _open(self.path)
    self.tensors: dict[str, TensorInfo] = {
      t.name: TensorInfo(t.name, t.tensor_type, tuple(int(d) for d in reversed(t.shape)), int(t.data_offset), int(t.n_bytes))
      for t in self.reader.tensors}

  def fail(self, problem: str) -> GGUFError: return GGUFError(f"{self.path}: {problem}")

  def __contains__(self, key: str) -> bool: return key in self.reader.fields

  def keys(self) -> list[str]: return list(self.reader.fields)

  def get(self, key: str, default: Any = None) -> Any:
    """The value of a metadata key (str, int, float, bool, or a list of them), or default when absent."""
    field = self.reader.fields.get(key)
    return default if field is None else field.contents()

  def require(self, key: str) -> Any:
    if key not in self.reader.fields: raise self.fail(f"missing metadata key {key!r}")
    return self.get(key)

  def array_len(self, key: str) -> int:
    """Length of an array-valued key without decoding it (tokenizer vocabularies are large)."""
    field = self.reader.fields.get(key)
    return 0 if field is None or field.types[0] != GGUFValueType.ARRAY else len(field.data)

  @property
  def metadata_keys(self) -> list[str]: return [k for k in self.reader.fields if not k.startswith("GGUF.")]

  @property
  def architecture(self) -> str: return self.require("general.architecture")

  def raw(self, name: str) -> np.ndarray:
    """A tensor's bytes as the file stores them (a view of the mapped file)."""
    if (info := self.tensors.get(name)) is None: raise self.fail(f"missing tensor {name!r}")
    return self.reader.data[info.offset:info.offset + info.nbytes]

  def load(self, name: str, device: str | None = None) -> QTensor:
    raw, info = self.raw(name), self.tensors[name]
    try: return QTensor.from_bytes(raw, info.ggml_type, info.shape, device)
    except ValueError as e: raise self.fail(f"tensor {name!r}: {e}") from None

  def load_all(self, device: str | None = None, progress: bool = True) -> Iterator[tuple[str, QTensor]]:
    for name in tqdm(self.tensors, desc=f"loading {os.path.basename(self.path)}", unit="tensor", disable=not progress, leave=False):
      yield name, self.load(name, device)

def _open(path: str) -> GGUFReader:
  try: st = os.stat(path)
  except OSError as e: raise GGUFError(f"{path}: {e.strerror}") from None
  return _read(path, os.path.abspath(path), st.st_size, st.st_mtime_ns)

# parsing a large vocabulary's metadata takes seconds (gemma3-270m: ~5 s on this repo's CPU), and a file is opened more
# than once per process (its kernel hints, then the model; every run of an experiment): one reader per unchanged file
@functools.lru_cache(maxsize=4)
def _read(path: str, _abspath: str, _size: int, _mtime_ns: int) -> GGUFReader:
  try:
    with open(path, "rb") as f: magic = f.read(4)
  except OSError as e: raise GGUFError(f"{path}: {e.strerror}") from None
  if magic != b"GGUF": raise GGUFError(f"{path}: not a GGUF file ({f'starts with {magic!r}' if magic else 'empty'}, expected b'GGUF')")
  # copy-on-write: the file is never changed, but the arrays are writable, which tinygrad's copy to a GPU asks of a host buffer
  try: return _CheckedReader(path, "c")
  except GGUFError as e: raise GGUFError(f"{path}: {e}") from None
  except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError):
    raise GGUFError(f"{path}: truncated or corrupt GGUF header or metadata") from None
