"""A copy of a GGUF file with its matmul and embedding weights requantized to one GGML type.

Every 2-D `*.weight` tensor stored in a block type or F16/BF16 whose rows are whole blocks of the target is
dequantized (gguf.quants) and quantized again (quant.quantize); one already in the target type is copied as it is
(requantizing can only lose). Everything else (norms, biases, F32 tensors, rows that do not fit the target's blocks)
is copied byte for byte. The metadata is copied byte for byte too, so every key keeps its value and its GGUF type
(llama.cpp checks them), except `general.name`, which gains " (requantized to TYPE)", and `general.file_type`.

The file is written the way quant.gguf_write writes (a temporary file beside the target, renamed over it once
complete), but by hand: gguf_write infers metadata types from Python values, which would not keep them.
"""
import os
import struct
from pathlib import Path
from typing import Callable
import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES, GGUFEndian, GGUFValueType as V, LlamaFileType as F, quants
from tqdm import tqdm
from models.catalog import cache_dir
from quant.gguf_file import GGUFFile, TensorInfo
from quant.quantize import SUPPORTED, ggml_type_of, quantize

CHUNK_ELEMS = 1 << 22   # rows requantized at a time: about this many weights (a 262k-token embedding is never whole in fp32)
FILE_TYPES = {T.F32: F.ALL_F32, T.F16: F.MOSTLY_F16, T.BF16: F.MOSTLY_BF16, T.Q4_0: F.MOSTLY_Q4_0, T.Q4_1: F.MOSTLY_Q4_1,
              T.Q5_0: F.MOSTLY_Q5_0, T.Q8_0: F.MOSTLY_Q8_0, T.Q4_K: F.MOSTLY_Q4_K_S, T.Q5_K: F.MOSTLY_Q5_K_S, T.Q6_K: F.MOSTLY_Q6_K,
              T.MXFP4: F.MOSTLY_MXFP4_MOE}
_SCALARS = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i", V.UINT64: "Q", V.INT64: "q",
            V.FLOAT32: "f", V.FLOAT64: "d", V.BOOL: "?"}

def default_path(src: str | os.PathLike, ggml_type: "T | str") -> Path:
  return cache_dir() / "requant" / f"{Path(src).stem}.{ggml_type_of(ggml_type).name}.gguf"

def requantizes(info: TensorInfo, ggml_type: T) -> bool:
  """Whether requantized_copy converts this tensor: a 2-D `.weight` in a block type or F16/BF16, rows whole target blocks."""
  src_elems = GGML_QUANT_SIZES[info.ggml_type][0]
  return (info.name.endswith(".weight") and len(info.shape) == 2 and (src_elems > 1 or info.ggml_type in (T.F16, T.BF16))
          and info.shape[-1] % GGML_QUANT_SIZES[ggml_type][0] == 0 and info.ggml_type != ggml_type)

def requantized_copy(src: str | os.PathLike, ggml_type: "T | str", out: str | os.PathLike | None = None) -> Path:
  """Writes (or finds) the copy of GGUF `src` with its weights in `ggml_type` (see the module doc) and returns its
  path: `out`, by default cache_dir()/requant/<src stem>.<TYPE>.gguf. An existing `out` newer than `src` is reused."""
  t, src = ggml_type_of(ggml_type), Path(src)
  out = Path(out) if out is not None else default_path(src, t)
  if out.exists() and src.exists() and out.resolve() != src.resolve() and out.stat().st_mtime > src.stat().st_mtime: return out
  return write_copy(src, out, t, lambda info: requantizes(info, t))

Metadata = dict[str, str | int | bool]

def write_copy(src: str | os.PathLike, out: str | os.PathLike, t: T, select: Callable[[TensorInfo], bool], metadata: Metadata | None = None) -> Path:
  """Writes the copy of `src` at `out` with the tensors `select` picks (of those `requantizes` allows) in `t` and the
  keys of `metadata` set (added, or replacing the source's), whole or not at all; returns `out`."""
  src, out = Path(src), Path(out)
  if t not in SUPPORTED: raise ValueError(f"cannot requantize to {t.name} (supported: {', '.join(s.name for s in SUPPORTED)})")
  if out.exists() and src.exists() and out.resolve() == src.resolve(): raise ValueError(f"{out}: the copy would overwrite its source")
  g = GGUFFile(src)
  if g.reader.endianess != GGUFEndian.LITTLE: raise g.fail("big-endian GGUF files are not supported")
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
  try:
    with open(tmp, "wb") as f: _write(f, g, t, lambda info: requantizes(info, t) and select(info), metadata or {})
    os.replace(tmp, out)
  finally: tmp.unlink(missing_ok=True)
  return out

def _string(s: str | bytes) -> bytes:
  b = s.encode() if isinstance(s, str) else s
  return struct.pack("<Q", len(b)) + b

def _kv(key: str, vtype: V, value) -> bytes:
  return _string(key) + struct.pack("<I", vtype) + (_string(value) if vtype == V.STRING else struct.pack("<" + _SCALARS[vtype], value))

def _vtype(value: str | int | bool) -> V: return V.STRING if isinstance(value, str) else V.BOOL if isinstance(value, bool) else V.UINT32

def _metadata(g: GGUFFile, t: T, extra: Metadata) -> list[bytes]:
  """Every key-value pair as its bytes in the file, with general.name, general.file_type and the `extra` keys replaced
  (or added)."""
  data, fields = g.reader.data, g.reader.fields
  new = {"general.name": f"{g.get('general.name') or Path(g.path).stem} (requantized to {t.name})", "general.file_type": int(FILE_TYPES[t]),
         **extra}
  kvs = []
  for key, field in fields.items():
    if key.startswith("GGUF."): continue   # the reader's view of the header, not metadata
    if key == "general.file_type":   # keeps the integer type it had
      keep = len(field.types) == 1 and field.types[0] in _SCALARS and field.types[0] not in (V.FLOAT32, V.FLOAT64, V.BOOL)
      kvs.append(_kv(key, field.types[0] if keep else V.UINT32, new.pop(key)))
    elif key in new: kvs.append(_kv(key, _vtype(new[key]), new.pop(key)))
    else: kvs.append(bytes(data[field.offset:field.offset + sum(p.nbytes for p in field.parts)]))
  kvs += [_kv(k, _vtype(v), v) for k, v in new.items()]
  return kvs

def _pad(f, align: int) -> None: f.write(bytes(-f.tell() % align))

def _write(f, g: GGUFFile, t: T, select: Callable[[TensorInfo], bool], extra: Metadata) -> None:
  infos, align = list(g.tensors.values()), int(g.reader.alignment)
  targets = [t if select(i) else None for i in infos]
  sizes = [i.nbytes if tt is None else int(np.prod(i.shape[:-1], dtype=np.int64)) * (i.shape[-1] // GGML_QUANT_SIZES[t][0]) * GGML_QUANT_SIZES[t][1]
           for i, tt in zip(infos, targets)]
  kvs = _metadata(g, t, extra)
  f.write(b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kvs)))
  for kv in kvs: f.write(kv)
  offset = 0
  for info, tt, size in zip(infos, targets, sizes):
    f.write(_string(info.name) + struct.pack(f"<I{len(info.shape)}QIQ", len(info.shape), *reversed(info.shape), tt or info.ggml_type, offset))
    offset += size + (-size % align)
  _pad(f, align)
  for info, tt, size in tqdm(list(zip(infos, targets, sizes)), desc=f"requantizing {Path(g.path).name} to {t.name}", unit="tensor", leave=False):
    raw = g.reader.data[info.offset:info.offset + info.nbytes]
    start = f.tell()
    if tt is None: f.write(raw)
    else:
      rows = raw.reshape(-1, info.nbytes // int(np.prod(info.shape[:-1], dtype=np.int64)))
      step = max(1, CHUNK_ELEMS // info.shape[-1])
      for r in range(0, len(rows), step):
        values = quants.dequantize(rows[r:r + step], info.ggml_type).reshape(-1, info.shape[-1])
        f.write(quantize(values, tt))
    if f.tell() - start != size: raise RuntimeError(f"tensor {info.name!r}: wrote {f.tell() - start} bytes, expected {size}")
    _pad(f, align)
