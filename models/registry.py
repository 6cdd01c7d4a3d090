"""Architectures by GGUF `general.architecture` (a `llama` file with experts is Mixtral)."""
from typing import Callable
from models import deepseek2, gemma3, gpt_oss, llama, mixtral
from models.blocks import Transformer
from models.config import ModelConfig
from models.weights import Weights
from quant.gguf_file import GGUFFile

Builder = Callable[[Weights, ModelConfig, int], Transformer]
ARCHITECTURES: dict[str, Builder] = {"llama": llama.build, "gemma3": gemma3.build, "gpt-oss": gpt_oss.build, "deepseek2": deepseek2.build}

def builder_for(g: GGUFFile) -> Builder:
  if (arch := g.architecture) not in ARCHITECTURES:
    raise g.fail(f"unsupported architecture {arch!r} (supported: {', '.join(sorted(ARCHITECTURES))})")
  if arch == "llama" and g.get("llama.expert_count", 0): return mixtral.build
  return ARCHITECTURES[arch]
