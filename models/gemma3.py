"""Gemma 3: sandwich norms (stored as 1 + w), QK-norm, GeGLU, embeddings scaled by sqrt(dim), and five local
sliding-window layers (rope base 10000) for every global one (the metadata's rope base and scaling)."""
import math
from models import spec
from models.blocks import Attention, AttentionSpec, Block, FeedForward, Transformer, sliding_layers
from models.config import ModelConfig
from models.spec import TensorDef
from models.weights import Weights
from ops.activations import geglu, geglu_fp16_table
from ops.rope import rope_tables

ARCH = "gemma3"
GLOBAL_EVERY = 6         # without a pattern in the metadata, layers 5, 11, 17, ... attend globally
LOCAL_ROPE_BASE = 10000.0

def tensors(cfg: ModelConfig, g) -> list[TensorDef]:
  def block(b: str) -> list[TensorDef]:
    return [spec.norm(f"{b}.attn_norm", cfg.dim), *spec.attention(b, cfg), *spec.qk_norms(b, cfg), spec.norm(f"{b}.post_attention_norm", cfg.dim),
            spec.norm(f"{b}.ffn_norm", cfg.dim), *spec.feed_forward(b, cfg.dim, cfg.ffn_dim), spec.norm(f"{b}.post_ffw_norm", cfg.dim)]
  return [spec.embedding(cfg), *(t for i in range(cfg.n_layers) for t in block(f"blk.{i}")), *spec.head(cfg)]

def build(w: Weights, cfg: ModelConfig, max_context: int) -> Transformer:
  if cfg.sliding_window is None: raise w.g.fail(f"missing metadata key '{ARCH}.attention.sliding_window'")
  scale = 1 / math.sqrt(cfg.head_dim)
  act = geglu_fp16_table if w.hints.rounding == "ggml" else geglu
  local_base = w.g.get(f"{ARCH}.rope.freq_base_swa", LOCAL_ROPE_BASE)
  local = AttentionSpec(rope_tables(cfg.rope_dims, local_base, max_context, None, w.device), False, scale, cfg.sliding_window, qk_norm=True)
  glob = AttentionSpec(rope_tables(cfg.rope_dims, cfg.rope_base, max_context, cfg.yarn, w.device), False, scale, None, qk_norm=True)
  is_local = sliding_layers(w.g.get(f"{ARCH}.attention.sliding_window_pattern", GLOBAL_EVERY), cfg.n_layers)
  blocks = [Block(w, f"blk.{i}", cfg, Attention(w, f"blk.{i}", cfg, local if is_local[i] else glob, max_context),
                  FeedForward(w, f"blk.{i}", act), sandwich=True) for i in range(cfg.n_layers)]
  return Transformer(w, cfg, blocks, embed_scale=math.sqrt(cfg.dim))
