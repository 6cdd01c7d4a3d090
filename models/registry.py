"""Architectures by GGUF `general.architecture`."""
from typing import Callable
from models import gemma3, llama
from models.blocks import Transformer
from models.config import ModelConfig
from models.weights import Weights
from quant.gguf_file import GGUFFile

Builder = Callable[[Weights, ModelConfig, int], Transformer]
ARCHITECTURES: dict[str, Builder] = {"llama": llama.build, "gemma3": gemma3.build}

def builder_for(g: GGUFFile) -> Builder:
  if (arch := g.architecture) not in ARCHITECTURES:
    raise g.fail(f"unsupported architecture {arch!r} (supported: {', '.join(sorted(ARCHITECTURES))})")
  return ARCHITECTURES[arch]
