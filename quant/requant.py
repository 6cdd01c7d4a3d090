"""A copy of a GGUF file with its matmul and embedding weights requantized to one GGML type.

Every 2-D `*.weight` tensor stored in a block type or F16/BF16 whose rows are whole blocks of the target is
dequantized (gguf.quants) and quantized again (quant.quantize); one already in the target type is copied as it is
(requantizing can only lose). Everything else (norms, biases, F32 tensors, rows that do not fit the target's blocks)
is copied byte for byte. The metadata is copied with every key's value and GGUF type (llama.cpp checks them), except
`general.name`, which gains " (requantized to TYPE)", and `general.file_type`. Written by quant.gguf_write, whole or not
at all, one tensor at a time.
"""
import os
from pathlib import Path
from typing import Any, Callable
import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES, GGUFValueType as V, LlamaFileType as F, quants
from ops.cache import cache_dir
from quant.gguf_file import GGUFFile, TensorInfo
from quant.gguf_write import RawTensor, Typed, write_gguf
from quant.quantize import SUPPORTED, ggml_type_of, quantize

CHUNK_ELEMS = 1 << 22   # rows requantized at a time: about this many weights (a 262k-token embedding is never whole in fp32)
FILE_TYPES = {T.F32: F.ALL_F32, T.F16: F.MOSTLY_F16, T.BF16: F.MOSTLY_BF16, T.Q4_0: F.MOSTLY_Q4_0, T.Q4_1: F.MOSTLY_Q4_1,
              T.Q5_0: F.MOSTLY_Q5_0, T.Q8_0: F.MOSTLY_Q8_0, T.Q4_K: F.MOSTLY_Q4_K_S, T.Q5_K: F.MOSTLY_Q5_K_S, T.Q6_K: F.MOSTLY_Q6_K,
              T.MXFP4: F.MOSTLY_MXFP4_MOE}
_INTEGERS = (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64)

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
  tensors = [_tensor(g, info, t if requantizes(info, t) and select(info) else None) for info in g.tensors.values()]
  write_gguf(out, g.architecture, _metadata(g, t, metadata or {}), tensors, progress=f"requantizing {src.name} to {t.name}")
  return out

def _metadata(g: GGUFFile, t: T, extra: Metadata) -> dict[str, Any]:
  """Every key with its value and type, general.name, general.file_type and the `extra` keys replaced (or added)."""
  new = {"general.name": f"{g.get('general.name') or Path(g.path).stem} (requantized to {t.name})", "general.file_type": int(FILE_TYPES[t]),
         **extra}
  out: dict[str, Any] = {}
  for key, field in g.fields.items():
    if key == "general.architecture": continue   # write_gguf's key
    if key == "general.file_type":   # keeps the integer type it had
      out[key] = Typed(new.pop(key), field.type if field.type in _INTEGERS else V.UINT32)
    elif key in new: out[key] = new.pop(key)
    else: out[key] = Typed(g.get(key), field.type, field.item)
  return out | new

def _tensor(g: GGUFFile, info: TensorInfo, t: T | None) -> RawTensor:
  """The tensor as it is (t None), or requantized to t a few rows at a time, when it is written."""
  raw = lambda: g.raw(info.name)
  if t is None: return RawTensor(info.name, info.ggml_type, raw, info.shape)
  def requantized() -> np.ndarray:
    rows, step = raw().reshape(-1, info.nbytes // int(np.prod(info.shape[:-1], dtype=np.int64))), max(1, CHUNK_ELEMS // info.shape[-1])
    return np.concatenate([quantize(quants.dequantize(rows[r:r + step], info.ggml_type).reshape(-1, info.shape[-1]), t).reshape(-1)
                           for r in range(0, len(rows), step)])
  return RawTensor(info.name, t, requantized, info.shape)
