"""Top-k without a sort, for small last axes such as MoE router logits.

Element i's rank is the number of elements that beat it: larger, or equal at a lower index. Ranks are a permutation of
0..n-1, so the r-th output is the element whose rank is r: values sorted descending, ties in ascending index order.
The work is O(n^2) elementwise in three kernels (ranks, values, indices), against a bitonic sort's dozens.
"""
from tinygrad import Tensor, dtypes

def pairwise_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
  """x [..., n] -> values [..., k], indices [..., k] int32."""
  n = x.shape[-1]
  if not 1 <= k <= n: raise ValueError(f"k must be in [1, {n}], got {k}")
  xi, xj, idx = x.unsqueeze(-1), x.unsqueeze(-2), Tensor.arange(n)
  # [..., i]: how many j beat i; made contiguous so the two selections below share it instead of recomputing it
  rank = ((xj > xi) | ((xj == xi) & (idx < idx.unsqueeze(-1)))).sum(axis=-1).contiguous()
  pick = rank.unsqueeze(-2) == Tensor.arange(k).unsqueeze(-1)  # [..., r, i] = rank[i] == r
  values = pick.where(xj, 0).sum(axis=-1).cast(x.dtype)
  return values, pick.where(idx, 0).sum(axis=-1).cast(dtypes.int32)

TOPK_ALGORITHMS = ("pairwise", "sort")   # "sort" is tinygrad's Tensor.topk (a bitonic sort)

def topk_by_name(name: str):
  if name not in TOPK_ALGORITHMS: raise ValueError(f"unknown top-k algorithm {name!r} (choose from {', '.join(TOPK_ALGORITHMS)})")
  return pairwise_topk if name == "pairwise" else Tensor.topk
