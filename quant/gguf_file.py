"""Reading a GGUF file (memory-mapped) into metadata and packed tensors, with one-line errors. The header is parsed here:
the `gguf` package's reader makes a numpy view of every element of every array, seconds for a large vocabulary."""
import functools
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator
import numpy as np
from gguf import GGUFValueType as V, GGMLQuantizationType, GGML_QUANT_SIZES
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

SCALARS = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i", V.FLOAT32: "<f", V.BOOL: "?",
           V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d"}
DEFAULT_ALIGNMENT = 32

@dataclass(frozen=True)
class Field:
  """A metadata value as the file stores it: strings as bytes (decoded when read), arrays of numbers as numpy arrays."""
  type: V
  item: V | None   # an array's element type
  raw: Any

  def value(self) -> Any:
    if self.type == V.STRING: return self.raw.decode("utf-8")
    if self.type != V.ARRAY: return self.raw
    return [b.decode("utf-8") for b in self.raw] if self.item == V.STRING else self.raw.tolist()

class _Parser:
  """Reads the header, key-value section and tensor directory of a little-endian GGUF file, front to back."""
  def __init__(self, data: np.ndarray):
    self.buf, self.pos = memoryview(data), 0

  def take(self, fmt: str) -> Any:
    (v,) = struct.unpack_from(fmt, self.buf, self.pos)
    self.pos += struct.calcsize(fmt)
    return v

  def string(self) -> bytes:
    n = self.take("<Q")
    if self.pos + n > len(self.buf): raise IndexError("string past the end")
    self.pos += n
    return bytes(self.buf[self.pos - n:self.pos])

  def field(self) -> Field:
    kind = V(self.take("<I"))
    if kind == V.STRING: return Field(kind, None, self.string())
    if kind != V.ARRAY: return Field(kind, None, self.take(SCALARS[kind]))
    item, n = V(self.take("<I")), self.take("<Q")
    if item == V.STRING: return Field(kind, item, [self.string() for _ in range(n)])
    values = np.frombuffer(self.buf, SCALARS[item], n, self.pos)   # a nested array's item type has no entry: corrupt
    self.pos += values.nbytes
    return Field(kind, item, values)

def _parse(data: np.ndarray) -> tuple[dict[str, Field], dict[str, TensorInfo]]:
  p = _Parser(data)
  p.pos = 4
  if (version := p.take("<I")) & 0xFFFF == 0: raise GGUFError("big-endian GGUF files are not supported")
  if version < 2: raise GGUFError(f"GGUF version {version} is not supported (2 and later are)")
  n_tensors, n_fields = p.take("<Q"), p.take("<Q")
  fields = {p.string().decode("utf-8"): p.field() for _ in range(n_fields)}
  directory = []
  for _ in range(n_tensors):
    name = p.string().decode("utf-8", "replace")
    dims = [p.take("<Q") for _ in range(p.take("<I"))]
    raw_type, offset = p.take("<I"), p.take("<Q")
    try: ggml_type = GGMLQuantizationType(raw_type)
    except ValueError: raise GGUFError(f"tensor {name!r} has unknown GGML type {raw_type}") from None
    directory.append((name, tuple(reversed(dims)), ggml_type, offset))
  align = fields["general.alignment"].raw if "general.alignment" in fields else DEFAULT_ALIGNMENT
  if not isinstance(align, int) or align <= 0 or align & (align - 1): raise ValueError(f"alignment {align!r} is no power of two")
  start = -(-p.pos // align) * align
  tensors = {}
  for name, shape, ggml_type, offset in directory:
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    nbytes = int(np.prod(shape, dtype=np.int64)) * block_bytes // block_elems
    if (end := start + offset + nbytes) > len(data):
      raise GGUFError(f"tensor {name!r} data ends at byte {end:,}, past the end of the file ({len(data):,} bytes): truncated?")
    tensors[name] = TensorInfo(name, ggml_type, shape, start + offset, nbytes)
  return fields, tensors

class GGUFFile:
  """Metadata and tensor directory of a GGUF file; tensors are loaded on request, packed."""
  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self.data, self.fields, self.tensors = _open(self.path)

  def fail(self, problem: str) -> GGUFError: return GGUFError(f"{self.path}: {problem}")

  def __contains__(self, key: str) -> bool: return key in self.fields

  def keys(self) -> list[str]: return list(self.fields)

  def get(self, key: str, default: Any = None) -> Any:
    """The value of a metadata key (str, int, float, bool, or a list of them), or default when absent."""
    field = self.fields.get(key)
    if field is None: return default
    try: return field.value()
    except UnicodeDecodeError: raise self.fail(f"metadata key {key!r} holds text that is not UTF-8") from None

  def require(self, key: str) -> Any:
    if key not in self.fields: raise self.fail(f"missing metadata key {key!r}")
    return self.get(key)

  def array_len(self, key: str) -> int:
    """Length of an array-valued key without decoding it (tokenizer vocabularies are large)."""
    field = self.fields.get(key)
    return 0 if field is None or field.type != V.ARRAY else len(field.raw)

  @property
  def architecture(self) -> str: return self.require("general.architecture")

  def raw(self, name: str) -> np.ndarray:
    """A tensor's bytes as the file stores them (a view of the mapped file)."""
    if (info := self.tensors.get(name)) is None: raise self.fail(f"missing tensor {name!r}")
    return self.data[info.offset:info.offset + info.nbytes]

  def load(self, name: str, device: str | None = None) -> QTensor:
    raw, info = self.raw(name), self.tensors[name]
    try: return QTensor.from_bytes(raw, info.ggml_type, info.shape, device)
    except ValueError as e: raise self.fail(f"tensor {name!r}: {e}") from None

  def load_all(self, device: str | None = None, progress: bool = True) -> Iterator[tuple[str, QTensor]]:
    for name in tqdm(self.tensors, desc=f"loading {os.path.basename(self.path)}", unit="tensor", disable=not progress, leave=False):
      yield name, self.load(name, device)

def _open(path: str) -> tuple[np.ndarray, dict[str, Field], dict[str, TensorInfo]]:
  try: st = os.stat(path)
  except OSError as e: raise GGUFError(f"{path}: {e.strerror}") from None
  return _read(path, os.path.abspath(path), st.st_size, st.st_mtime_ns)

# parsing a large vocabulary's metadata takes seconds (gemma3-270m: ~5 s on this repo's CPU), and a file is opened more
# than once per process (its kernel hints, then the model; every run of an experiment): one reader per unchanged file
@functools.lru_cache(maxsize=4)
def _read(path: str, _abspath: str, _size: int, _mtime_ns: int) -> tuple[np.ndarray, dict[str, Field], dict[str, TensorInfo]]:
  try:
    with open(path, "rb") as f: magic = f.read(4)
  except OSError as e: raise GGUFError(f"{path}: {e.strerror}") from None
  if magic != b"GGUF": raise GGUFError(f"{path}: not a GGUF file ({f'starts with {magic!r}' if magic else 'empty'}, expected b'GGUF')")
  # copy-on-write: the file is never changed, but a host buffer that a copy to a GPU reads must be writable; a plain
  # ndarray over the map, since every slice of an np.memmap pays for __array_finalize__
  data = np.memmap(path, dtype=np.uint8, mode="c").view(np.ndarray)
  try: return (data, *_parse(data))
  except GGUFError as e: raise GGUFError(f"{path}: {e}") from None
  except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError, struct.error):
    raise GGUFError(f"{path}: truncated or corrupt GGUF header or metadata") from None
