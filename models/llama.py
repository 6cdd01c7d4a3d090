"""Llama (and models that share its GGUF layout, such as SmolLM2): pre-norm blocks, SwiGLU, rope on interleaved pairs
(the converter permutes q and k so that llama.cpp's normal rope mode applies), Llama 3's rope scaling as the tensor
rope_freqs.weight. `ffn` builds block i's feed-forward and `ffn_tensors` describes it (Mixtral swaps in its experts)."""
import math
from typing import Callable
from tinygrad import Tensor
from models import spec
from models.blocks import Attention, AttentionSpec, Block, FeedForward, Transformer
from models.config import ModelConfig
from models.spec import TensorDef
from models.weights import Weights
from ops.activations import swiglu
from ops.rope import rope_tables

ARCH = "llama"

def tensors(cfg: ModelConfig, g, ffn_tensors: Callable[[str], list[TensorDef]] | None = None) -> list[TensorDef]:
  ffn_tensors = ffn_tensors or (lambda b: spec.feed_forward(b, cfg.dim, cfg.ffn_dim))
  def block(b: str) -> list[TensorDef]:
    return [spec.norm(f"{b}.attn_norm", cfg.dim), *spec.attention(b, cfg, biases=None, output_bias=None), spec.norm(f"{b}.ffn_norm", cfg.dim),
            *ffn_tensors(b)]
  blocks = [t for i in range(cfg.n_layers) for t in block(f"blk.{i}")]
  rope_freqs = TensorDef("rope_freqs.weight", (cfg.rope_dims // 2,), "rope_freqs", optional=True)
  return [spec.embedding(cfg), rope_freqs, *blocks, *spec.head(cfg)]

def metadata(p, n_layers: int) -> dict:
  """What a llama file says beyond the shared hyperparameters, as its converter writes it."""
  return {f"{ARCH}.rope.dimension_count": p.head_dim, f"{ARCH}.vocab_size": p.vocab_size}

def build(w: Weights, cfg: ModelConfig, max_context: int, ffn: Callable[[int], Callable[[Tensor], Tensor]] | None = None) -> Transformer:
  rope = rope_tables(cfg.rope_dims, cfg.rope_base, max_context, cfg.yarn, w.device)
  attention = AttentionSpec(rope, interleaved=True, scale=1 / math.sqrt(cfg.head_dim))
  ffn = ffn or (lambda i: FeedForward(w, f"blk.{i}", swiglu))
  blocks = [Block(w, f"blk.{i}", cfg, Attention(w, f"blk.{i}", cfg, attention, max_context), ffn(i)) for i in range(cfg.n_layers)]
  return Transformer(w, cfg, blocks)
