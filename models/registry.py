"""Architectures by GGUF `general.architecture` (a `llama` file with experts is Mixtral). Each is a module that says what
its files hold (`tensors(cfg, g)`: models/spec.py) and builds the model (`build(w, cfg, max_context)`); where synthetic
files of it carry metadata of its own, `metadata(preset, n_layers)` says which."""
from types import ModuleType
from models import deepseek2, gemma3, gpt_oss, llama, mixtral, qwen3
from quant.gguf_file import GGUFFile

ARCHITECTURES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, gemma3, gpt_oss, deepseek2, qwen3)}

def architecture_of(g: GGUFFile) -> ModuleType:
  """The module of a file's architecture (g a GGUFFile, or the MetadataView of a synthetic file's metadata)."""
  if (arch := g.architecture) not in ARCHITECTURES:
    raise g.fail(f"unsupported architecture {arch!r} (supported: {', '.join(sorted(ARCHITECTURES))})")
  if arch == llama.ARCH and g.get(f"{arch}.expert_count", 0): return mixtral
  return ARCHITECTURES[arch]
