"""The mixture-of-experts feed-forward: a router picks k experts per token, only those experts' packed weights are read
(QuantExperts), their outputs are summed with the routing weights, and shared experts (DeepSeek) are added for every token."""
from dataclasses import dataclass, replace
from math import prod
from tinygrad import Tensor
from models import spec
from models.blocks import FeedForward, gated_down_input
from models.spec import TensorDef
from ops.activations import Gated
from models.weights import Weights
from ops.norm import NormedInput
from ops.routing import ExpertGroups, Gating, route
from ops.topk import first_k, topk_by_name

@dataclass(frozen=True)
class MoEConfig:
  n_experts: int
  n_used: int
  ffn_dim: int               # of one expert
  gating: Gating
  renorm: bool = False       # divide the k weights by their sum
  scale: float = 1.0         # then multiply them by this
  n_shared: int = 0          # shared experts, stored as one FFN of n_shared * ffn_dim

  @staticmethod
  def from_gguf(g, gating: Gating, renorm: bool = False, width_key: str = "expert_feed_forward_length") -> "MoEConfig":
    """The experts a file's metadata describes (`width_key`: the key of one expert's width); g a GGUFFile or MetadataView."""
    arch = g.architecture
    n_experts, n_used = g.require(f"{arch}.expert_count"), g.require(f"{arch}.expert_used_count")
    if not 1 <= n_used <= n_experts: raise g.fail(f"'{arch}.expert_used_count' is {n_used}, but there are {n_experts} experts")
    # llama.cpp reads 0 as "no scaling"
    scale = g.get(f"{arch}.expert_weights_scale", 0.0) or 1.0
    return MoEConfig(n_experts, n_used, g.require(f"{arch}.{width_key}"), gating, renorm, scale, g.get(f"{arch}.expert_shared_count", 0))

  def tensors(self, b: str, dim: int, biases: bool = False, selection_bias: bool = False) -> list[TensorDef]:
    """Block b's router, experts (with `biases`, each with a bias; spec.experts) and shared experts."""
    shared = spec.feed_forward(b, dim, self.n_shared * self.ffn_dim, "_shexp") if self.n_shared else []
    return spec.experts(b, dim, self.n_experts, self.ffn_dim, biases, selection_bias) + shared

class MoE:
  """x [B, T, dim] -> [B, T, dim]. Gate and up experts are `ffn_gate_exps` and `ffn_up_exps`, or one `ffn_gate_up_exps`
  whose first half of rows is the gate (as recent converters write GPT-OSS); biases where the file has them. Skip
  `shared_expert` leaves the shared experts out, skip `topk` the routing's choice (every token takes the first k experts)."""
  def __init__(self, w: Weights, prefix: str, cfg: MoEConfig, activation: Gated):
    self.cfg, self.activation = cfg, activation
    self.topk = first_k if "topk" in w.hints.skip else topk_by_name(w.hints.topk)
    self.act_break, self.act_in_matmul, self.expert_tile = w.hints.act_break, w.hints.act_in_matmul, w.hints.expert_tile
    self.shared_break = w.hints.shared_break
    self.router = w.linear(f"{prefix}.ffn_gate_inp")
    self.selection_bias = w.vector(f"{prefix}.exp_probs_b.bias") if w.has(f"{prefix}.exp_probs_b.bias") else None
    # gate and up as one matmul over their joined rows, whether the file joins them or not
    if w.has(f"{prefix}.ffn_gate_up_exps.weight"): self.gate_up = w.experts([f"{prefix}.ffn_gate_up_exps"])
    else: self.gate_up = w.experts([f"{prefix}.ffn_gate_exps", f"{prefix}.ffn_up_exps"])
    self.down = w.experts([f"{prefix}.ffn_down_exps"])
    self.shared = FeedForward(w, prefix, activation, suffix="_shexp") if cfg.n_shared and "shared_expert" not in w.hints.skip else None

  def __call__(self, x: Tensor | NormedInput) -> Tensor:
    """With x a NormedInput (norm `fold`) the router and the gate and up experts fold the norm in where they can. A
    prompt chunk's rows (a prefill GEMM's) are grouped by the experts they chose (ExpertGroups, in tiles of the
    `expert_tile` hint's rows), and each expert's GEMM reads its weights once for the rows that chose it."""
    c = self.cfg
    logits = self.router.normed(x) if isinstance(x, NormedInput) else self.router(x)
    weights, sel = route(logits, c.n_used, c.gating, bias=self.selection_bias, renorm=c.renorm, scale=c.scale, topk=self.topk)
    if self.gate_up.gemm_rows(x):
      groups = ExpertGroups.of(sel, c.n_experts, self.expert_tile)
      gate_up = self.gate_up.grouped(groups.rows(x.value() if isinstance(x, NormedInput) else x), groups)
      h = gated_down_input(self.activation, gate_up, False, self.act_break, self.act_in_matmul)
      out = groups.combine(self.down.grouped(h, groups), weights)
    else:
      # one input row [B, T, 1, dim] shared by the k experts
      if isinstance(x, NormedInput): gate_up = self.gate_up.normed(replace(x, x=x.x.unsqueeze(-2)), sel)
      else: gate_up = self.gate_up(x.unsqueeze(-2), sel)
      h = gated_down_input(self.activation, gate_up, prod(x.shape[:-1]) == 1, self.act_break, self.act_in_matmul)
      out = self.down.mixed(h, sel, weights)
    if self.shared is None: return out
    # the shared experts' output realized apart (`shared_break`): added to the sum over the chosen experts, their down matmul
    # would be one kernel with it, of two reduces in turn: a prompt chunk's GEMM off the tensor cores (and the CPU's GEMM
    # tile), a decode step's down experts in another shape than their own (not the one their launch sizes were tuned for)
    shared = self.shared(x)
    return out + (shared.contiguous() if self.shared_break else shared)
