"""Mixtral: Llama with a mixture of SwiGLU experts as every block's FFN (GGUF architecture `llama` with `expert_count`;
`feed_forward_length` is one expert's width). The router's softmax picks the top k (2), whose weights are renormalized
to sum to one."""
from models import llama
from models.blocks import Transformer
from models.config import ModelConfig
from models.moe import MoE, MoEConfig
from models.weights import Weights
from ops.activations import swiglu
from ops.routing import Gating

def build(w: Weights, cfg: ModelConfig, max_context: int) -> Transformer:
  moe = MoEConfig.from_gguf(w, Gating.SOFTMAX, renorm=True, ffn_key="feed_forward_length")
  return llama.build(w, cfg, max_context, ffn=lambda i: MoE(w, f"blk.{i}", cfg.dim, moe, swiglu))
