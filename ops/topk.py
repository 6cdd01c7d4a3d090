"""Top-k without a sort, for small last axes such as MoE router logits.

Element i's rank is the number of elements that beat it: larger, or equal at a lower index. Ranks are a permutation of
0..n-1, so the r-th output is the element whose rank is r: values sorted descending, ties in ascending index order.
The work is O(k n^2) in one kernel (the ranks counted where each pick reads them), against a bitonic sort's dozens.
"""
from tinygrad import Tensor, dtypes

def pairwise_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
  """x [..., n] -> values [..., k], indices [..., k] int32."""
  n = x.shape[-1]
  if not 1 <= k <= n: raise ValueError(f"k must be in [1, {n}], got {k}")
  xi, xj, idx = x.unsqueeze(-1), x.unsqueeze(-2), Tensor.arange(n)
  beats = (xj > xi) | ((xj == xi) & (idx < idx.unsqueeze(-1)))   # [..., i, j]: j beats i
  # rank [..., r, i, c]: how many j beat i, counted again for each pick r and each column c of the pick (value, index).
  # Counted once, it would be broadcast over those afterwards, which tinygrad realizes as a kernel of its own
  rank = beats.unsqueeze(-3).unsqueeze(-1).expand(*x.shape[:-1], k, n, n, 2).sum(axis=-2)
  pick = rank == Tensor.arange(k).reshape(k, 1, 1)   # [..., r, i, c] = rank[i] == r
  # values and indices (exact as float32 below 2^24) side by side, picked in one kernel: [..., r, 2]
  both = xj.cast(dtypes.float32).unsqueeze(-1).cat(idx.cast(dtypes.float32).reshape(n, 1).expand(*xj.shape, 1), dim=-1)
  picked = pick.where(both, 0).sum(axis=-2)
  return picked[..., 0].cast(x.dtype), picked[..., 1].cast(dtypes.int32)

def first_k(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
  """x [..., n] -> its first k values [..., k] and indices 0..k-1 [..., k] int32, as if they had been chosen: the routing's
  choice left out (skip `topk`), to measure the rest of a MoE block alone."""
  return x[..., :k], Tensor.arange(k, dtype=dtypes.int32).expand(*x.shape[:-1], k)

TOPK_ALGORITHMS = ("pairwise", "sort")   # "sort" is tinygrad's Tensor.topk (a bitonic sort)

def topk_by_name(name: str):
  if name not in TOPK_ALGORITHMS: raise ValueError(f"unknown top-k algorithm {name!r} (choose from {', '.join(TOPK_ALGORITHMS)})")
  return pairwise_topk if name == "pairwise" else Tensor.topk
