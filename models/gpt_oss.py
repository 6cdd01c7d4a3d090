"""GPT-OSS: attention with biases on q, k, v and o and a learned sink logit per head, sliding-window (even) and full (odd)
layers, rope on half-split pairs with YaRN scaling from the metadata, and a mixture of experts as every FFN: the router
(with bias) keeps the top k logits and softmaxes over those alone; experts (with biases) use the clamped SwiGLU. The
norm before the FFN is stored as `post_attention_norm`."""
import math
from models import spec
from models.blocks import Attention, AttentionSpec, Block, Transformer, sliding_layers
from models.config import ModelConfig
from models.moe import MoE, MoEConfig
from models.spec import TensorDef
from models.weights import Weights
from ops.activations import swiglu_clamped
from ops.rope import rope_tables
from ops.routing import Gating

ARCH = "gpt-oss"

def moe_config(g) -> MoEConfig: return MoEConfig.from_gguf(g, Gating.TOPK_SOFTMAX)

def tensors(cfg: ModelConfig, g) -> list[TensorDef]:
  moe = moe_config(g)
  def block(b: str) -> list[TensorDef]:
    return [spec.norm(f"{b}.attn_norm", cfg.dim), *spec.attention(b, cfg, biases=True, output_bias=True),
            TensorDef(f"{b}.attn_sinks.weight", (cfg.n_heads,), "sinks"), spec.norm(f"{b}.post_attention_norm", cfg.dim),
            *moe.tensors(b, cfg.dim, biases=True)]
  return [spec.embedding(cfg), *(t for i in range(cfg.n_layers) for t in block(f"blk.{i}")), *spec.head(cfg, tied=False)]

def metadata(p, n_layers: int) -> dict:
  """What a gpt-oss file says beyond the shared hyperparameters, as its converter writes it."""
  return {f"{ARCH}.rope.dimension_count": p.head_dim, f"{ARCH}.expert_feed_forward_length": p.moe.ffn_dim}

def build(w: Weights, cfg: ModelConfig, max_context: int) -> Transformer:
  if cfg.sliding_window is None: raise w.g.fail(f"missing metadata key '{ARCH}.attention.sliding_window'")
  moe = moe_config(w.g)
  scale = 1 / math.sqrt(cfg.head_dim)
  rope = lambda base: rope_tables(cfg.rope_dims, base, max_context, cfg.yarn, w.device)
  full = AttentionSpec(rope(cfg.rope_base), interleaved=False, scale=scale, sinks=True)
  swa_base = w.g.get(f"{ARCH}.rope.freq_base_swa", cfg.rope_base)
  sliding = AttentionSpec(full.rope if swa_base == cfg.rope_base else rope(swa_base), False, scale, cfg.sliding_window, sinks=True)
  is_sliding = sliding_layers(w.g.get(f"{ARCH}.attention.sliding_window_pattern", 2), cfg.n_layers)
  blocks = [Block(w, f"blk.{i}", cfg, Attention(w, f"blk.{i}", cfg, sliding if is_sliding[i] else full, max_context),
                  MoE(w, f"blk.{i}", moe, swiglu_clamped), ffn_norm="post_attention_norm") for i in range(cfg.n_layers)]
  return Transformer(w, cfg, blocks)
