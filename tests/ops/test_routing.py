import numpy as np
import pytest
from tinygrad import Tensor, TinyJit
from ops.kernels import count_kernels
from ops.routing import ExpertGroups, Gating, route

N_EXPERTS, K = 16, 4

def softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def ref_route(logits, gating, bias=None, renorm=False, scale=1.0) -> tuple[np.ndarray, np.ndarray]:
  logits = logits.astype(np.float64)
  scores = {Gating.SOFTMAX: softmax(logits), Gating.TOPK_SOFTMAX: logits, Gating.SIGMOID: 1 / (1 + np.exp(-logits))}[gating]
  choice = scores if bias is None else scores + bias
  experts = np.argsort(-choice, axis=-1, kind="stable")[..., :K]
  weights = np.take_along_axis(scores, experts, axis=-1)
  if gating is Gating.TOPK_SOFTMAX: weights = softmax(weights)
  if renorm: weights = weights / weights.sum(-1, keepdims=True)
  return weights * scale, experts

CASES = {
  "mixtral": dict(gating=Gating.SOFTMAX, renorm=True),
  "deepseek-v2": dict(gating=Gating.SOFTMAX, scale=16.0),
  "gpt-oss": dict(gating=Gating.TOPK_SOFTMAX),
  "deepseek-v3": dict(gating=Gating.SIGMOID, bias=True, renorm=True, scale=2.5),
  "sigmoid-plain": dict(gating=Gating.SIGMOID),
}

# every mode with the default pairwise_topk, and the Tensor.topk switch on the most involved mode
@pytest.mark.parametrize("case,use_tensor_topk", [(case, False) for case in CASES] + [("deepseek-v3", True)])
def test_route(seed, rng, case, use_tensor_topk):
  kw = dict(CASES[case])
  logits = rng.normal(size=(3, N_EXPERTS)).astype(np.float32) * 2
  # a bias on the scale of the sigmoid scores, so the biased choice differs from the unbiased ranking
  bias = rng.normal(size=N_EXPERTS).astype(np.float32) if kw.pop("bias", False) else None
  topk = {"topk": Tensor.topk} if use_tensor_topk else {}
  weights, experts = route(Tensor(logits), K, bias=None if bias is None else Tensor(bias), **kw, **topk)
  ref_weights, ref_experts = ref_route(logits, bias=bias, **kw)
  np.testing.assert_array_equal(experts.numpy(), ref_experts, err_msg=f"{case} seed={seed}")
  np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=1e-5, atol=1e-6, err_msg=f"{case} seed={seed}")

@pytest.mark.parametrize("case, kernels", [("gpt-oss", 2), ("mixtral", 2), ("deepseek-v2", 3), ("deepseek-v3", 3)])
def test_routing_weights_cost_few_kernels(rng, case: str, kernels: int):
  """Routing a token and mixing the chosen experts' outputs with the weights: the pairwise top-k is one kernel (values and
  indices, the ranks counted inside), the reader another, and the weights are computed where they are read. GPT-OSS's
  softmax over the k chosen and a renormalized softmax over every expert (Mixtral: the same weights) add no kernel,
  choosing by the logits; a softmax without renorm (DeepSeek-V2) adds its denominator's sum, stabilized by the top
  logit (no max kernel); sigmoid scores with a selection bias (DeepSeek-V3) add the gather of the chosen scores, their
  renorm none."""
  kw = dict(CASES[case])
  bias = Tensor(rng.standard_normal(32).astype(np.float32)).realize() if kw.pop("bias", False) else None
  def mixed(logits: Tensor, y: Tensor) -> Tensor:
    weights, experts = route(logits, 4, bias=bias, **kw)
    return (y[0][experts] * weights).sum(-1).realize()
  mix = TinyJit(mixed)
  for _ in range(3): mix(*(Tensor(rng.standard_normal((1, n), dtype=np.float32)).realize() for n in (32, 32)))
  assert count_kernels(mix) == kernels

@pytest.mark.parametrize("experts,k,rows,tile", [(8, 2, 5, 4), (64, 6, 37, 8), (4, 3, 16, 16), (32, 4, 1, 32)])
def test_expert_groups_sort_each_choice_into_a_tile_of_its_expert(experts: int, k: int, rows: int, tile: int, rng):
  """Every choice gets a slot of its own, in a tile of its expert, holding its row; the tiles past
  every run are marked empty (-1); the rows come out in slot order with
  zeros in the padding, and combine gives each row its choices' outputs summed with its weights."""
  sel = np.stack([rng.choice(experts, k, replace=False) for _ in range(rows)]).astype(np.int32)
  g = ExpertGroups.of(Tensor(sel), experts, tile)
  slot, row, held, tile_expert = (t.numpy() for t in (g.slot, g.row, g.held, g.tile_expert))
  assert g.tile == tile and len(set(slot.tolist())) == rows * k and held.sum() == rows * k
  assert all(held[s] and row[s] == c // k and tile_expert[s // tile] == sel.flat[c] for c, s in enumerate(slot))
  live = sum(-(-int((sel == e).sum()) // tile) for e in range(experts))   # the tiles the runs fill; the rest are empty
  assert (tile_expert[:live] >= 0).all() and (tile_expert[live:] == -1).all() and not held[live * tile:].any()
  x = rng.standard_normal((rows, 3)).astype(np.float32)
  gathered = g.rows(Tensor(x)).numpy()
  np.testing.assert_array_equal(gathered[held], x[row[held]])
  assert not gathered[~held].any()
  y, weights = rng.standard_normal((len(held), 2)).astype(np.float32), rng.random((rows, k)).astype(np.float32)
  want = np.einsum("rk,rko->ro", weights, y[slot.reshape(rows, k)])
  np.testing.assert_allclose(g.combine(Tensor(y), Tensor(weights)).numpy(), want, rtol=1e-6, atol=1e-6)
