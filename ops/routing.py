"""Mixture-of-experts routing: router logits [..., n_experts] -> (weights [..., k] float32, expert indices [..., k] int32).

Gating modes:
  SOFTMAX       softmax over all experts, then top-k (Mixtral; DeepSeek-V2 with renorm=False, Qwen-MoE with renorm=True)
  TOPK_SOFTMAX  top-k over the raw logits, softmax over the k selected (GPT-OSS)
  SIGMOID       independent sigmoid per expert (DeepSeek-V3, GLM-4.5: with bias, renorm=True and a scale)
`bias` (per expert) is added only to choose the experts; the weights are the unbiased scores of the chosen ones.
`renorm` divides the k weights by their sum (at least 2^-14, as llama.cpp clamps it), then everything is multiplied by `scale`.
`topk` is the selection algorithm: pairwise_topk (few kernels) or Tensor.topk (bitonic sort).

A prompt chunk's choices are grouped by expert (ExpertGroups) so that a GEMM reads each chosen expert's weights once for
all the rows that chose it.
"""
import enum
from dataclasses import dataclass
from typing import Callable
from tinygrad import Tensor, dtypes
from ops.topk import pairwise_topk

TopK = Callable[[Tensor, int], tuple[Tensor, Tensor]]

class Gating(enum.Enum):
  SOFTMAX = "softmax"
  TOPK_SOFTMAX = "topk_softmax"
  SIGMOID = "sigmoid"

def _sum_k(t: Tensor) -> Tensor:
  """t [..., k] summed over its last axis as k - 1 additions: tinygrad computes them where the sum is read, where a sum
  reduce would be a kernel of its own."""
  return sum((t[..., i:i + 1] for i in range(1, t.shape[-1])), t[..., :1])

def route(logits: Tensor, k: int, gating: Gating = Gating.SOFTMAX, *, bias: Tensor|None = None, renorm: bool = False,
          scale: float = 1.0, topk: TopK = pairwise_topk) -> tuple[Tensor, Tensor]:
  logits = logits.cast(dtypes.float32)
  if gating is Gating.SOFTMAX and bias is None:
    # the softmax keeps the logits' order, so the top-k logits choose, and the first of them (their max) stabilizes the
    # exps: no kernel takes the logits' max. Renormalized, the softmax over every expert is the one over the k chosen
    # (llama.cpp's clamp of the k weights' sum at 2^-14 never binds: k of n weights sum to at least k / n); otherwise
    # the denominator is one sum over every expert
    values, experts = topk(logits, k)
    e = (values - values[..., :1]).exp()
    weights = e / (_sum_k(e) if renorm else (logits - values[..., :1]).exp().sum(axis=-1, keepdim=True))
    return weights * scale, experts.cast(dtypes.int32)
  scores = logits.sigmoid() if gating is Gating.SIGMOID else logits.softmax(-1) if gating is Gating.SOFTMAX else logits
  values, experts = topk(scores if bias is None else scores + bias, k)
  weights = values if bias is None else scores.gather(-1, experts)
  if gating is Gating.TOPK_SOFTMAX:
    # the top-k come sorted, so the first is their maximum
    e = (weights - weights[..., :1]).exp()
    weights = e / _sum_k(e)
  if renorm: weights = weights / _sum_k(weights).maximum(2 ** -14)
  return weights * scale, experts.cast(dtypes.int32)

@dataclass(frozen=True)
class ExpertGroups:
  """A prompt chunk's choices (a row and one of its k experts) sorted by expert into slots, each expert's run of slots
  padded to whole tiles of `tile`, so that every tile belongs to one expert: `slot` [rows * k] is each choice's slot,
  `row` [slots] the row a slot holds and `held` [slots] whether it holds one (padding does not), `tile_expert`
  [slots // tile] each tile's expert, -1 for tiles past every run (slots are counted for the most padding any choices
  can need, so most chunks leave some tiles empty, which a GEMM can skip)."""
  slot: Tensor
  row: Tensor
  held: Tensor
  tile_expert: Tensor

  @property
  def tile(self) -> int: return self.row.shape[0] // self.tile_expert.shape[0]

  @property
  def slot_experts(self) -> Tensor:
    """Each slot's expert (its tile's; expert 0 for the empty tiles, whose rows are zeros), [slots // tile, tile]."""
    return self.tile_expert.maximum(0).unsqueeze(-1).expand(-1, self.tile)

  @staticmethod
  def of(sel: Tensor, n_experts: int, tile: int) -> "ExpertGroups":
    """The groups of sel [..., k] (each row's experts); slots for the most padding any choices can need."""
    expert = sel.flatten()
    n, k = expert.shape[0], sel.shape[-1]
    i = Tensor.arange(n)
    earlier_same = (expert.unsqueeze(0) == expert.unsqueeze(1)) & (i.unsqueeze(0) < i.unsqueeze(1))   # [choice, other choice]
    padded = ((expert.unsqueeze(-1) == Tensor.arange(n_experts)).sum(0) + tile - 1) // tile * tile   # each expert's run
    end = padded.cumsum()
    slot = (end - padded)[expert] + earlier_same.sum(-1)
    slots = -(-(n + min(n, n_experts) * (tile - 1)) // tile) * tile
    holds = slot.unsqueeze(0) == Tensor.arange(slots).unsqueeze(1)   # [slot, choice]
    tile_expert = (end.unsqueeze(0) <= Tensor.arange(0, slots, tile).unsqueeze(1)).sum(-1)
    tile_expert = (tile_expert < n_experts).where(tile_expert, -1)
    return ExpertGroups(slot, holds.where(i.unsqueeze(0) // k, 0).sum(-1), holds.any(-1), tile_expert)

  def rows(self, x: Tensor) -> Tensor:
    """The rows of x [..., in] (those sel had) in slot order: [slots, in], zeros in the padding."""
    return self.held.unsqueeze(-1).where(x.reshape(-1, x.shape[-1])[self.row], 0)

  def combine(self, y: Tensor, weights: Tensor) -> Tensor:
    """Each row's sum of its choices' outputs y [slots, out] with the routing weights [..., k] -> [..., out]."""
    return (y[self.slot].reshape(*weights.shape, y.shape[-1]) * weights.unsqueeze(-1)).sum(-2)
