import numpy as np
import pytest
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

@pytest.mark.parametrize("batch, softmax, split, values", [(B, "max", 0, False), (1, "self", 0, False), (1, "self", 1, False), (B, "max", 0, True)])
def test_mla_absorbed_matches_definition(seed, rng, batch: int, softmax: str, split: int, values: bool):
  """Prefill 4 tokens, then decode 4 more one at a time under TinyJit with a symbolic start_pos: each decode step's
  softmax stabilized by the logits' max, or by each head's logit of the newest row (one token), in one sum or split
  into parts of a chunk (ops/attention.py); the values read from the key rows or from a value cache of their own."""
  prefill, total, max_ctx, scale = 4, 8, 16, (D_NOPE + D_ROPE) ** -0.5
  q_nope, q_pe = rng.normal(size=(batch, H, total, D_NOPE)), rng.normal(size=(batch, H, total, D_ROPE))
  c, k_pe = rng.normal(size=(batch, total, RANK)), rng.normal(size=(batch, total, D_ROPE))
  wk, wv = rng.normal(size=(H, D_NOPE, RANK)) / RANK ** 0.5, rng.normal(size=(H, D_V, RANK)) / RANK ** 0.5
  q_nope, q_pe, c, k_pe, wk, wv = (a.astype(np.float32) for a in (q_nope, q_pe, c, k_pe, wk, wv))
  cache, twk, twv = LatentCache(batch, max_ctx, RANK, D_ROPE, per_part=max(1, split), values=values), Tensor(wk), Tensor(wv)

  def step(q_nope: Tensor, q_pe: Tensor, c: Tensor, k_pe: Tensor, start_pos) -> Tensor:
    latent = mla_attention(q_nope @ twk, q_pe, *cache.update(c, k_pe, start_pos), start_pos, scale=scale, softmax=softmax, split=split)
    return (latent @ twv.transpose(-1, -2)).realize()
  decode = TinyJit(step)

  def inputs(lo: int, hi: int) -> list[Tensor]:
    return [Tensor(q_nope[:, :, lo:hi]), Tensor(q_pe[:, :, lo:hi]), Tensor(c[:, lo:hi]), Tensor(k_pe[:, lo:hi])]
  outs = [step(*inputs(0, prefill), 0).numpy()]
  for p in range(prefill, total): outs.append(decode(*inputs(p, p + 1), UOp.variable("start_pos", 0, max_ctx - 1).bind(p)).numpy())
  ref = ref_mla(q_nope, q_pe, c, k_pe, wk, wv, scale)
  np.testing.assert_allclose(np.concatenate(outs, axis=2), ref, rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")
  # one cache row per position holds concat(c, k_pe); a value cache, where there is one, holds c again
  np.testing.assert_allclose(cache.rows.numpy()[:, :total], np.concatenate([c, k_pe], axis=-1), err_msg=f"seed={seed}")
  assert cache.v is None if not values else np.array_equal(cache.v.numpy()[:, :total], c)

def test_mla_expanded_matches_definition(seed, rng):
  """A chunk of 5 rows in the expanded form, at a symbolic start past the first cache chunk, against the definition
  over every position before it (written there first)."""
  from ops.attention import CHUNK
  from ops.mla import expanded_attention
  before, T, scale = CHUNK + 3, 5, (D_NOPE + D_ROPE) ** -0.5
  total, max_ctx = before + T, 2 * CHUNK + 16
  q_nope, q_pe = rng.normal(size=(B, H, total, D_NOPE)), rng.normal(size=(B, H, total, D_ROPE))
  c, k_pe = rng.normal(size=(B, total, RANK)), rng.normal(size=(B, total, D_ROPE))
  wk, wv = rng.normal(size=(H, D_NOPE, RANK)) / RANK ** 0.5, rng.normal(size=(H, D_V, RANK)) / RANK ** 0.5
  q_nope, q_pe, c, k_pe, wk, wv = (a.astype(np.float32) for a in (q_nope, q_pe, c, k_pe, wk, wv))
  cache, twk, twv = LatentCache(B, max_ctx, RANK, D_ROPE), Tensor(wk), Tensor(wv)
  cache.update(Tensor(c[:, :before]), Tensor(k_pe[:, :before]), 0)[0].realize()

  def expand(lat: Tensor) -> tuple[Tensor, Tensor]:
    heads = lat.unsqueeze(-2).expand(*lat.shape[:-1], H, RANK)
    return (heads.unsqueeze(-2) * twk).sum(-1), (heads.unsqueeze(-2) * twv).sum(-1)
  start = UOp.variable("start_pos", 0, max_ctx - 1).bind(before)
  rows, _ = cache.update(Tensor(c[:, before:]), Tensor(k_pe[:, before:]), start)
  q = Tensor(np.concatenate([q_nope, q_pe], axis=-1)[:, :, before:])
  got = TinyJit(lambda q, rows, start: expanded_attention(q, rows, rows[..., :RANK], start, expand, scale=scale).realize())(q, rows, start).numpy()
  ref = ref_mla(q_nope, q_pe, c, k_pe, wk, wv, scale)[:, :, before:]
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")

def test_expanded_is_cheaper_exactly_where_it_multiplies_less():
  """expanded_cheaper against the multiplications of each form counted term by term, for DeepSeek-V2-Lite's shape and
  GLM-4.7-Flash's, over chunk sizes and numbers of positions read (at least the chunk's own)."""
  from ops.mla import expanded_cheaper
  def absorbed(T: int, n: int, r: int, nope: int, rope: int, v: int) -> int:
    return T * nope * r + T * n * (r + rope) + T * n * r + T * r * v   # absorb q, logits, latent value sums, expand them
  def expanded(T: int, n: int, r: int, nope: int, rope: int, v: int) -> int:
    return n * r * (nope + v) + T * n * (nope + rope) + T * n * v   # expand every position, logits, value sums
  for r, nope, rope, v in [(512, 128, 64, 128), (512, 192, 64, 256)]:
    flips = [T for T in range(1, 1025) if expanded_cheaper(T, r, nope, v) != expanded_cheaper(T - 1, r, nope, v)]
    assert len(flips) == 1, flips   # absorbed for short chunks, expanded from some size on
    for T in (1, 8, 32, 170, 171, 397, 400, 512, 1024):
      cheaper = [expanded(T, n, r, nope, rope, v) < absorbed(T, n, r, nope, rope, v) for n in (T, 4 * T, 10 ** 6)]
      if expanded_cheaper(T, r, nope, v): assert all(cheaper), (T, r)
      else: assert not cheaper[-1], (T, r)
