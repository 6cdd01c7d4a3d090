"""Mixture-of-experts routing: router logits [..., n_experts] -> (weights [..., k] float32, expert indices [..., k] int32).

Gating modes:
  SOFTMAX       softmax over all experts, then top-k (Mixtral; DeepSeek-V2 with renorm=False, Qwen-MoE with renorm=True)
  TOPK_SOFTMAX  top-k over the raw logits, softmax over the k selected (GPT-OSS)
  SIGMOID       independent sigmoid per expert (DeepSeek-V3, GLM-4.5: with bias, renorm=True and a scale)
`bias` (per expert) is added only to choose the experts; the weights are the unbiased scores of the chosen ones.
`renorm` divides the k weights by their sum (at least 2^-14, as llama.cpp clamps it), then everything is multiplied by `scale`.
`topk` is the selection algorithm: pairwise_topk (few kernels) or Tensor.topk (bitonic sort).
"""
import enum
from typing import Callable
from tinygrad import Tensor, dtypes
from ops.topk import pairwise_topk

TopK = Callable[[Tensor, int], tuple[Tensor, Tensor]]

class Gating(enum.Enum):
  SOFTMAX = "softmax"
  TOPK_SOFTMAX = "topk_softmax"
  SIGMOID = "sigmoid"

def route(logits: Tensor, k: int, gating: Gating = Gating.SOFTMAX, *, bias: Tensor|None = None, renorm: bool = False,
          scale: float = 1.0, topk: TopK = pairwise_topk) -> tuple[Tensor, Tensor]:
  logits = logits.cast(dtypes.float32)
  scores = logits.softmax(-1) if gating is Gating.SOFTMAX else logits.sigmoid() if gating is Gating.SIGMOID else logits
  values, experts = topk(scores if bias is None else scores + bias, k)
  weights = values if bias is None else scores.gather(-1, experts)
  if gating is Gating.TOPK_SOFTMAX:
    # the top-k come sorted, so the first is their maximum; the sum over k as k - 1 additions: tinygrad computes these
    # where the weights are read, while a max or sum reduce would each be a kernel of its own
    e = (weights - weights[..., :1]).exp()
    weights = e / sum((e[..., i:i + 1] for i in range(1, k)), e[..., :1])
  if renorm: weights = weights / weights.sum(axis=-1, keepdim=True).maximum(2 ** -14)
  return weights * scale, experts.cast(dtypes.int32)
