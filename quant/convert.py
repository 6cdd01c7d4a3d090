"""`tinyzoo convert`: a GGUF file's matmul weights requantized to one type (e.g. Q4_K to Q4_0, so that packed-dot reads
them), with what was done recorded in the result's metadata.

Norms, biases, F32 tensors and the token embedding (unless `embeddings`) are copied as they are; `only` limits the
conversion to one part of each block. The result carries `tinyzoo.convert.*` (source file and sha256, command, time,
converter) and the metadata given (`manifest`: kernel hints as `tinyzoo.hints.<name>`, profiles/hints.py). Written whole
or not at all (quant/requant.py)."""
import datetime
import importlib.metadata
import os
from pathlib import Path
from typing import Any
from gguf import GGMLQuantizationType as T
from quant.files import file_sha256
from quant.gguf_file import TensorInfo
from quant.quantize import ggml_type_of
from quant.requant import write_copy

TARGETS = (T.Q4_0, T.Q4_1, T.Q8_0, T.F16, T.MXFP4)
PARTS = {"experts": "_exps.", "attention": ".attn_", "ffn": ".ffn_"}   # a part's tensors have this in their name
EMBEDDINGS = ("token_embd.weight",)

def convert(src: str | os.PathLike, out: str | os.PathLike, quant: str, only: str | None = None, embeddings: bool = False,
            manifest: dict[str, Any] | None = None, command: str = "") -> Path:
  t, src = ggml_type_of(quant), Path(src)
  if t not in TARGETS: raise ValueError(f"cannot convert to {t.name} (choose from {', '.join(x.name for x in TARGETS)})")
  if only is not None and only not in PARTS: raise ValueError(f"unknown part {only!r} (choose from {', '.join(PARTS)})")
  def select(info: TensorInfo) -> bool:
    return (only is None or PARTS[only] in info.name) and (embeddings or info.name not in EMBEDDINGS)
  try: version = importlib.metadata.version("tinyzoo")
  except importlib.metadata.PackageNotFoundError: version = "unknown"
  metadata = {"tinyzoo.convert.source": src.name, "tinyzoo.convert.source_sha256": file_sha256(src), "tinyzoo.convert.command": command,
              "tinyzoo.convert.time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "tinyzoo.convert.converter": f"tinyzoo {version}", "tinyzoo.convert.quant": t.name, "tinyzoo.convert.only": only or "all",
              **(manifest or {})}
  return write_copy(src, out, t, select, metadata)
