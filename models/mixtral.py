"""Mixtral: Llama with a mixture of SwiGLU experts as every block's FFN (GGUF architecture `llama` with `expert_count`;
`feed_forward_length` is one expert's width). The router's softmax picks the top k (2), whose weights are renormalized
to sum to one."""
from models import llama
from models.blocks import Transformer
from models.config import ModelConfig
from models.moe import MoE, MoEConfig
from models.spec import TensorDef
from models.weights import Weights
from ops.activations import swiglu
from ops.routing import Gating

ARCH = llama.ARCH
EXPERT_WIDTH = "feed_forward_length"   # the metadata key of one expert's width

def moe_config(g) -> MoEConfig: return MoEConfig.from_gguf(g, Gating.SOFTMAX, renorm=True, width_key=EXPERT_WIDTH)

def tensors(cfg: ModelConfig, g) -> list[TensorDef]:
  moe = moe_config(g)
  return llama.tensors(cfg, g, lambda b: moe.tensors(b, cfg.dim))

def build(w: Weights, cfg: ModelConfig, max_context: int) -> Transformer:
  moe = moe_config(w.g)
  return llama.build(w, cfg, max_context, ffn=lambda i: MoE(w, f"blk.{i}", moe, swiglu))
