"""Qwen3: Llama's pre-norm blocks and SwiGLU with QK-norm (each head's q and k RMS-normalized before the rotation),
rope on half-split pairs (llama.cpp's neox mode), heads whose width is their own (attention.key_length), and an output
projection tied to the embedding where the file has none."""
import math
from models import spec
from models.blocks import Attention, AttentionSpec, Block, FeedForward, Transformer
from models.config import ModelConfig
from models.spec import TensorDef
from models.weights import Weights
from ops.activations import swiglu
from ops.rope import rope_tables

ARCH = "qwen3"

def tensors(cfg: ModelConfig, g) -> list[TensorDef]:
  def block(b: str) -> list[TensorDef]:
    return [spec.norm(f"{b}.attn_norm", cfg.dim), *spec.attention(b, cfg, biases=None), *spec.qk_norms(b, cfg), spec.norm(f"{b}.ffn_norm", cfg.dim),
            *spec.feed_forward(b, cfg.dim, cfg.ffn_dim)]
  return [spec.embedding(cfg), *(t for i in range(cfg.n_layers) for t in block(f"blk.{i}")), *spec.head(cfg)]

def build(w: Weights, cfg: ModelConfig, max_context: int) -> Transformer:
  rope = rope_tables(cfg.rope_dims, cfg.rope_base, max_context, cfg.yarn, w.device)
  attention = AttentionSpec(rope, interleaved=False, scale=1 / math.sqrt(cfg.head_dim), qk_norm=True)
  blocks = [Block(w, f"blk.{i}", cfg, Attention(w, f"blk.{i}", cfg, attention, max_context), FeedForward(w, f"blk.{i}", swiglu))
            for i in range(cfg.n_layers)]
  return Transformer(w, cfg, blocks)
