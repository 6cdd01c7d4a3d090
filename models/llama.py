"""Llama (and models that share its GGUF layout, such as SmolLM2): pre-norm blocks, SwiGLU, rope on interleaved pairs
(the converter permutes q and k so that llama.cpp's normal rope mode applies). `ffn` builds block i's feed-forward
(Mixtral swaps in its experts)."""
import math
from typing import Callable
from tinygrad import Tensor
from models.blocks import Attention, AttentionSpec, Block, FeedForward, Transformer
from models.config import ModelConfig
from models.weights import Weights
from ops.activations import swiglu
from ops.rope import rope_tables

def build(w: Weights, cfg: ModelConfig, max_context: int, ffn: Callable[[int], Callable[[Tensor], Tensor]] | None = None) -> Transformer:
  rope = rope_tables(cfg.rope_dims, cfg.rope_base, max_context, cfg.yarn, w.device)
  spec = AttentionSpec(rope, interleaved=True, scale=1 / math.sqrt(cfg.head_dim))
  ffn = ffn or (lambda i: FeedForward(w, f"blk.{i}", cfg.dim, cfg.ffn_dim, swiglu))
  blocks = [Block(w, f"blk.{i}", cfg, Attention(w, f"blk.{i}", cfg, spec, max_context), ffn(i)) for i in range(cfg.n_layers)]
  return Transformer(w, cfg, blocks)
