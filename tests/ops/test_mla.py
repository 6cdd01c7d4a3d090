import numpy as np
from tinygrad import Tensor, TinyJit, UOp
from ops.mla import LatentCache, mla_attention

B, H, D_NOPE, D_ROPE, RANK, D_V = 2, 4, 8, 4, 16, 6

def ref_mla(q_nope, q_pe, c, k_pe, wk, wv, scale) -> np.ndarray:
  """The non-absorbed definition in float64: per-head keys and values expanded from the latent c, causal from position 0."""
  q_nope, q_pe, c, k_pe, wk, wv = (a.astype(np.float64) for a in (q_nope, q_pe, c, k_pe, wk, wv))
  k_nope = np.einsum("bsr,hdr->bhsd", c, wk)
  v = np.einsum("bsr,hdr->bhsd", c, wv)
  key = np.concatenate([k_nope, np.broadcast_to(k_pe[:, None], k_nope.shape[:3] + (D_ROPE,))], axis=-1)
  logits = np.einsum("bhtd,bhsd->bhts", np.concatenate([q_nope, q_pe], axis=-1), key) * scale
  T = logits.shape[2]
  logits = np.where(np.tril(np.ones((T, T), dtype=bool)), logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return (p / p.sum(-1, keepdims=True)) @ v

def test_mla_absorbed_matches_definition(seed, rng):
  """Prefill 4 tokens, then decode 4 more one at a time under TinyJit with a symbolic start_pos."""
  prefill, total, max_ctx, scale = 4, 8, 16, (D_NOPE + D_ROPE) ** -0.5
  q_nope, q_pe = rng.normal(size=(B, H, total, D_NOPE)), rng.normal(size=(B, H, total, D_ROPE))
  c, k_pe = rng.normal(size=(B, total, RANK)), rng.normal(size=(B, total, D_ROPE))
  wk, wv = rng.normal(size=(H, D_NOPE, RANK)) / RANK ** 0.5, rng.normal(size=(H, D_V, RANK)) / RANK ** 0.5
  q_nope, q_pe, c, k_pe, wk, wv = (a.astype(np.float32) for a in (q_nope, q_pe, c, k_pe, wk, wv))
  cache, twk, twv = LatentCache(B, max_ctx, RANK, D_ROPE), Tensor(wk), Tensor(wv)

  def step(q_nope: Tensor, q_pe: Tensor, c: Tensor, k_pe: Tensor, start_pos) -> Tensor:
    latent = mla_attention(q_nope @ twk, q_pe, cache.update(c, k_pe, start_pos), start_pos, scale=scale)
    return (latent @ twv.transpose(-1, -2)).realize()
  decode = TinyJit(step)

  def inputs(lo: int, hi: int) -> list[Tensor]:
    return [Tensor(q_nope[:, :, lo:hi]), Tensor(q_pe[:, :, lo:hi]), Tensor(c[:, lo:hi]), Tensor(k_pe[:, lo:hi])]
  outs = [step(*inputs(0, prefill), 0).numpy()]
  for p in range(prefill, total): outs.append(decode(*inputs(p, p + 1), UOp.variable("start_pos", 0, max_ctx - 1).bind(p)).numpy())
  ref = ref_mla(q_nope, q_pe, c, k_pe, wk, wv, scale)
  np.testing.assert_allclose(np.concatenate(outs, axis=2), ref, rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")
  # one cache row per position holds concat(c, k_pe); there is no separate value cache
  np.testing.assert_allclose(cache.rows.numpy()[:, :total], np.concatenate([c, k_pe], axis=-1), err_msg=f"seed={seed}")
