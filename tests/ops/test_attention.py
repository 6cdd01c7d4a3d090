import numpy as np
import pytest
from tinygrad import GlobalCounters, Tensor, TinyJit, UOp, dtypes
from ops.attention import CHUNK, SELF_MARGIN, VARIANTS, KVCache, attention, chunks_read, fused_attention, over_denominator, part_sums, soft_capped, \
  values_with_denominator
from ops.kernels import count_kernels
from ops.norm import rms_norm
from ops.rope import apply_rope, rope_tables

B, HQ, HKV, D, DV = 2, 4, 2, 8, 6

def ref_attention(q, k, v, start_pos, scale, window=None, sinks=None, softcap=None) -> np.ndarray:
  """Float64 attention with kv heads repeated per query group and the sink as an extra softmax column."""
  q, k, v = (a.astype(np.float64) for a in (q, k, v))
  k, v = np.repeat(k, q.shape[1] // k.shape[1], axis=1), np.repeat(v, q.shape[1] // v.shape[1], axis=1)
  logits = np.einsum("bhtd,bhsd->bhts", q, k) * scale
  if softcap is not None: logits = softcap * np.tanh(logits / softcap)
  i, j = start_pos + np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None]
  visible = (j <= i) & ((j > i - window) if window is not None else True)
  logits = np.where(visible, logits, -np.inf)
  if sinks is not None: logits = np.concatenate([logits, np.broadcast_to(sinks[None, :, None, None], logits.shape[:3] + (1,))], axis=-1)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p = (p / p.sum(-1, keepdims=True))[..., :k.shape[2]]
  return p @ v

def qkv(rng: np.random.Generator, T: int, S: int) -> tuple[np.ndarray, ...]:
  return tuple(rng.normal(size=s).astype(np.float32) for s in ((B, HQ, T, D), (B, HKV, S, D), (B, HKV, S, DV)))

def in_cache(rng: np.random.Generator, a: np.ndarray, chunks: int) -> Tensor:
  """a [B, H, S, d] as the first S positions of a cache of whole chunks, the rest large garbage the mask must hide."""
  rest = rng.normal(size=(*a.shape[:2], chunks * CHUNK - a.shape[2], a.shape[3])).astype(np.float32) * 1e3
  return Tensor(np.concatenate([a, rest], axis=2))

@pytest.mark.parametrize("features", [{}, {"window": 3}, {"sinks": True}, {"softcap": 2.0}, {"window": 2, "sinks": True, "softcap": 3.0}],
                         ids=["gqa-causal", "window", "sinks", "softcap", "all"])
@pytest.mark.parametrize("start_pos", [5, CHUNK + 3], ids=["one-chunk", "two-chunks"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention(seed, rng, features, start_pos, variant):
  # 4 queries at positions start_pos.. over start_pos + 4 keys: the causal mask is offset by start_pos
  q, k, v = qkv(rng, 4, start_pos + 4)
  sinks = rng.normal(size=HQ).astype(np.float32) * 2 if features.get("sinks") else None
  kw = {"window": features.get("window"), "softcap": features.get("softcap")}
  out = attention(Tensor(q), in_cache(rng, k, 3), in_cache(rng, v, 3), start_pos, scale=D ** -0.5,
                  sinks=None if sinks is None else Tensor(sinks), variant=variant, **kw)
  ref = ref_attention(q, k, v, start_pos, D ** -0.5, sinks=sinks, **kw)
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5, err_msg=f"{features} {variant} seed={seed}")

def test_attention_rejects_uneven_groups_and_partial_chunks():
  with pytest.raises(ValueError, match="multiple of kv heads"):
    attention(Tensor.zeros(1, 3, 1, D), Tensor.zeros(1, 2, CHUNK, D), Tensor.zeros(1, 2, CHUNK, D), 0, scale=1.0)
  with pytest.raises(ValueError, match="whole chunks"):
    attention(Tensor.zeros(1, 2, 1, D), Tensor.zeros(1, 2, 9, D), Tensor.zeros(1, 2, 9, D), 0, scale=1.0)
  with pytest.raises(ValueError, match="unknown attention variant 'flash'"):
    attention(Tensor.zeros(1, 2, 1, D), Tensor.zeros(1, 2, CHUNK, D), Tensor.zeros(1, 2, CHUNK, D), 0, scale=1.0, variant="flash")

@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_kv_cache_prefill_then_decode(seed, rng, jit, variant):
  """Prefill 5 tokens, then feed the rest through the cache (eager: a 3-token chunk and 1 token; TinyJit: 1 token per call with a
  symbolic start_pos); every output row equals full-sequence attention over all 9 tokens."""
  chunks, max_ctx, window, scale = [5, 1, 1, 1, 1] if jit else [5, 3, 1], 2 * CHUNK, 4, D ** -0.5   # whole reads the 2nd chunk too
  q, k, v = qkv(rng, sum(chunks), sum(chunks))
  sinks = rng.normal(size=HQ).astype(np.float32)
  cache, tsinks = KVCache(B, HKV, max_ctx, D, DV), Tensor(sinks)

  def step(q: Tensor, k: Tensor, v: Tensor, start_pos) -> Tensor:
    ks, vs = cache.update(k, v, start_pos)
    return attention(q, ks, vs, start_pos, scale=scale, window=window, sinks=tsinks, variant=variant).realize()
  decode = TinyJit(step) if jit else step

  outs, p = [], 0
  for i, n in enumerate(chunks):
    start_pos = UOp.variable("start_pos", 0, max_ctx - 1).bind(p) if jit and i else p
    outs.append((decode if i else step)(*(Tensor(a[:, :, p:p + n]) for a in (q, k, v)), start_pos).numpy())
    p += n
  ref = ref_attention(q, k, v, 0, scale, window=window, sinks=sinks)
  np.testing.assert_allclose(np.concatenate(outs, axis=2), ref, rtol=1e-4, atol=1e-5, err_msg=f"{jit=} seed={seed}")

@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("half_cache", [False, True], ids=["f32-cache", "f16-cache"])
def test_query_rotated_where_the_logits_read_it(seed, rng, interleaved, half_cache):
  """q_rope rotates an unrotated q where the logits read it (partial rotary: 3 of 4 pairs) and a half cache meets q
  rounded to half: the same as rotating and rounding q first (tests/models/test_decode_kernels.py: in no kernel of its own)."""
  start_pos, T = 7, 3
  q, k, v = qkv(rng, T, start_pos + T)
  cos, sin = rope_tables(6, 10000.0, 16)
  rows = cos[start_pos:start_pos + T], sin[start_pos:start_pos + T]
  dtype = dtypes.float16 if half_cache else dtypes.float32
  ks, vs = (in_cache(rng, a, 1).cast(dtype).realize() for a in (k, v))
  q_rot = apply_rope(Tensor(q), *rows, interleaved)
  if half_cache: q_rot = q_rot.cast(dtypes.float16).cast(dtypes.float32)
  want = attention(q_rot.realize(), ks, vs, start_pos, scale=D ** -0.5)
  got = fused_attention(Tensor(q), ks, vs, start_pos, scale=D ** -0.5, q_rope=(*rows, interleaved))
  # rotated in another order, q may differ in its last float32 bit, which at a half rounding tie moves its half by one
  # step (2^-11 of an element of unit size: about 2e-4 on a logit and on the output)
  tol = dict(rtol=1e-3, atol=5e-4) if half_cache else dict(rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got.numpy(), want.numpy(), **tol, err_msg=f"seed={seed}")

def test_query_normalized_where_the_logits_read_it(seed, rng):
  """q_norm: q before its norm, times the norm weight and rotated as read, its 1/rms applied to the logits, is attention
  over the normalized, then rotated q (a rotation keeps the rms)."""
  start_pos, T = 7, 1
  q, k, v = qkv(rng, T, start_pos + T)
  w = rng.normal(size=D).astype(np.float32)
  cos, sin = rope_tables(D, 10000.0, 16)
  rope = (cos[start_pos:start_pos + T], sin[start_pos:start_pos + T], False)
  ks, vs = (in_cache(rng, a, 1).realize() for a in (k, v))
  want = attention(apply_rope(rms_norm(Tensor(q), Tensor(w), 1e-6), *rope).realize(), ks, vs, start_pos, scale=D ** -0.5)
  got = fused_attention(Tensor(q), ks, vs, start_pos, scale=D ** -0.5, q_rope=rope, q_norm=(Tensor(w), 1e-6))
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"seed={seed}")

def ref_normed_attention(q, k, v, wq, wk, cos, sin, start_pos: int) -> np.ndarray:
  """Float64 attention (ref_attention) over q [B, H, T, D] and the first start_pos + T keys, RMS-normalized (eps 1e-6)
  with weights wq and wk, then rotated (half-split pairs) at their positions."""
  S, scale = start_pos + q.shape[2], q.shape[-1] ** -0.5
  def normed(a, w): return a.astype(np.float64) / np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
  def rotated(a, c, s): return apply_rope(Tensor(a.astype(np.float32)), c, s, False).numpy().astype(np.float64)
  q_rot = rotated(normed(q, wq), cos[start_pos:S], sin[start_pos:S])
  return ref_attention(q_rot, rotated(normed(k[:, :, :S], wk), cos[:S], sin[:S]), v[:, :, :S], start_pos, scale)

def _normed_keys(rng: np.random.Generator, T: int, start_pos: int):
  """Queries, keys and values, norm weights, and the float64 attention over the q and k normalized, then rotated."""
  q, k, v = (a[:1] for a in qkv(rng, T, start_pos + T))
  wq, wk = (rng.normal(size=D) for _ in range(2))
  cos, sin = rope_tables(D, 10000.0, start_pos + T)
  q_rope = (cos[start_pos:start_pos + T], sin[start_pos:start_pos + T], False)
  return q, k, v, (wq, wk), (cos, sin), q_rope, ref_normed_attention(q, k, v, wq, wk, cos, sin, start_pos)

@pytest.mark.parametrize("softmax", ["max", "self"])
@pytest.mark.parametrize("T,start_pos", [(1, 9), (1, CHUNK + 3), (3, 5)], ids=["one-chunk", "two-chunks", "prefill"])
def test_keys_normalized_where_the_logits_read_them(seed, rng, softmax, T, start_pos):
  """k_norm: keys cached before their norm and rotation (layout rows with Gemma's QK-norm), times the norm weight and
  rotated as read, each one's 1/rms on its logits (the query's own key's too under softmax self, on the pair axis),
  against float64 and against the plain path over q and keys normalized and rotated first."""
  q, k, v, (wq, wk), rope, q_rope, want = _normed_keys(rng, T, start_pos)
  f32 = lambda a: Tensor(a.astype(np.float32))
  vs = in_cache(rng, v, 2)
  got = fused_attention(Tensor(q), in_cache(rng, k, 2), vs, start_pos, scale=D ** -0.5, q_rope=q_rope,
                        q_norm=(f32(wq), 1e-6), key_rope=rope, k_norm=(f32(wk), 1e-6), softmax=softmax)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")
  keys = apply_rope(rms_norm(f32(k), f32(wk), 1e-6), rope[0][:k.shape[2]], rope[1][:k.shape[2]], False).numpy()
  plain = attention(apply_rope(rms_norm(f32(q), f32(wq), 1e-6), *q_rope), in_cache(rng, keys, 2), vs, start_pos, scale=D ** -0.5)
  np.testing.assert_allclose(got.numpy(), plain.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")

def test_normalized_keys_cost_no_kernel(rng):
  """A decode step over a row cache with normalized q and k and softmax self: the norms are summed where the logits read
  q and the keys, and the query's own key beside every key in one sum: as many kernels as without the norms."""
  q, k, v, (wq, wk), rope, q_rope, _ = _normed_keys(rng, 1, 40)
  ks, vs = in_cache(rng, k, 2).realize(), in_cache(rng, v, 2).realize()
  norms = {"q_norm": (Tensor(wq.astype(np.float32)).realize(), 1e-6), "k_norm": (Tensor(wk.astype(np.float32)).realize(), 1e-6)}
  counts = {}
  for name, kw in (("plain", {}), ("normed", norms)):
    jit = TinyJit(lambda q, pos: fused_attention(q, ks, vs, pos, scale=D ** -0.5, q_rope=(rope[0][pos:pos + 1], rope[1][pos:pos + 1], False),
                                           key_rope=rope, softmax="self", **kw).realize())
    for pos in (38, 39, 40): jit(Tensor(rng.normal(size=q.shape).astype(np.float32)).realize(), UOp.variable("pos", 0, 2 * CHUNK - 1).bind(pos))
    counts[name] = count_kernels(jit)
  assert counts["normed"] == counts["plain"], counts

@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_keys_rotated_where_the_logits_read_them(seed, rng, interleaved):
  """key_rope: unrotated keys in the cache (layout rows), rotated by their own positions as the logits read them, are the
  same attention as keys rotated before they were cached (partial rotary, tables shorter than the cache, two chunks)."""
  start_pos, T = CHUNK + 5, 2
  q, k, v = qkv(rng, T, start_pos + T)
  cos, sin = rope_tables(6, 10000.0, start_pos + T)
  q_rope = (cos[start_pos:start_pos + T], sin[start_pos:start_pos + T], interleaved)
  k_rot = apply_rope(Tensor(k), cos, sin, interleaved).numpy()
  want = attention(apply_rope(Tensor(q), *q_rope).realize(), in_cache(rng, k_rot, 2), in_cache(rng, v, 2), start_pos, scale=D ** -0.5)
  vs = in_cache(rng, v, 2)
  got = fused_attention(Tensor(q), in_cache(rng, k, 2), vs, start_pos, scale=D ** -0.5, q_rope=q_rope, key_rope=(cos, sin))
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"seed={seed}")
  with pytest.raises(ValueError, match="key_rope needs q_rope"):
    fused_attention(Tensor(q), in_cache(rng, k, 2), vs, start_pos, scale=1.0, key_rope=(cos, sin))

def test_a_row_cache_holds_each_positions_projections(seed, rng):
  """Layout rows: the joined q, k, v projections written at a position come back as that position's q and its k and v
  rows per kv head; positions not written stay zero."""
  cache = KVCache(1, HKV, CHUNK, D, DV, q_width=HQ * D)
  qkv_rows = rng.normal(size=(1, 2, HQ * D + HKV * (D + DV))).astype(np.float32)
  q, k, v = cache.write_rows(Tensor(qkv_rows), 3)
  assert cache.kv is None and cache.rows.shape == (1, CHUNK, qkv_rows.shape[-1])
  np.testing.assert_array_equal(q.numpy(), qkv_rows[..., :HQ * D])
  k_want = qkv_rows[0, :, HQ * D:HQ * D + HKV * D].reshape(2, HKV, D).transpose(1, 0, 2)
  np.testing.assert_array_equal(k.numpy()[0, :, 3:5], k_want)
  np.testing.assert_array_equal(v.numpy()[0, :, 3:5], qkv_rows[0, :, HQ * D + HKV * D:].reshape(2, HKV, DV).transpose(1, 0, 2))
  assert not k.numpy()[0, :, :3].any() and not v.numpy()[0, :, 5:].any()

@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("layout", ["heads", "rows"])
@pytest.mark.parametrize("start_pos", [0, 9, CHUNK + 3], ids=["first", "one-chunk", "two-chunks"])
def test_softmax_stabilized_by_the_querys_own_logit(seed, rng, layout, start_pos, sinks):
  """softmax=self: a decode step's logits less the query's logit of its own key (its key rotated as read, with layout
  rows) give the float64 softmax, as the max does; a sink's term is met at the same stabilizer."""
  q, k, v = (a[:1] for a in qkv(rng, 1, start_pos + 1))   # one query row: a decode step
  sink = rng.normal(size=HQ).astype(np.float32) * 2 if sinks else None
  cos, sin = rope_tables(D, 10000.0, start_pos + 2)
  q_rope = (cos[start_pos:start_pos + 1], sin[start_pos:start_pos + 1], False)
  k_rot = apply_rope(Tensor(k), cos[:start_pos + 1], sin[:start_pos + 1], False).numpy()
  q_rot = apply_rope(Tensor(q), *q_rope).numpy()
  ks = in_cache(rng, k if layout == "rows" else k_rot, 2)
  got = fused_attention(Tensor(q), ks, in_cache(rng, v, 2), start_pos, scale=D ** -0.5, q_rope=q_rope, softmax="self",
                  key_rope=(cos, sin) if layout == "rows" else None, sinks=None if sink is None else Tensor(sink))
  # float32: the rotations of each key and of the query's own are rounded apart (outputs of unit size)
  np.testing.assert_allclose(got.numpy(), ref_attention(q_rot, k_rot, v, start_pos, D ** -0.5, sinks=sink), rtol=1e-5, atol=1e-5,
                             err_msg=f"seed={seed}")
  plain = attention(Tensor(q_rot), in_cache(rng, k_rot, 2), in_cache(rng, v, 2), start_pos, scale=D ** -0.5,
                    sinks=None if sink is None else Tensor(sink))
  np.testing.assert_allclose(got.numpy(), plain.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")

@pytest.mark.parametrize("spread", [0.0, 30.0, SELF_MARGIN + 60])
def test_softmax_by_self_holds_a_spread_of_logits(seed, rng, spread):
  """One key's logit `spread` above the query's own: within the margin exp neither overflows nor loses the own term."""
  start_pos = 20
  q, k, v = (a[:1] for a in qkv(rng, 1, start_pos + 1))
  q, k = np.ones_like(q), np.zeros_like(k)
  k[:, :, 4] = spread / (D * D ** -0.5)   # q.k * scale == spread at position 4, 0 everywhere else (the query's own key too)
  got = fused_attention(Tensor(q), in_cache(rng, k, 1), in_cache(rng, v, 1), start_pos, scale=D ** -0.5, softmax="self").numpy()
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, ref_attention(q, k, v, start_pos, D ** -0.5), rtol=1e-5, atol=1e-6, err_msg=f"seed={seed}")

@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_softmax_by_self_saves_the_max_kernel(rng, sinks):
  """A decode step's attention over a cache: the self stabilizer is one kernel fewer than the max (a kernel of its own),
  with a sink too (its term computed by the value kernel)."""
  q, k, v = (a[:1] for a in qkv(rng, 1, 40))
  ks, vs = in_cache(rng, k, 2).realize(), in_cache(rng, v, 2).realize()
  sink = Tensor(rng.normal(size=HQ).astype(np.float32)).realize() if sinks else None
  counts = {}
  for softmax in ("max", "self"):
    jit = TinyJit(lambda q, pos: fused_attention(q, ks, vs, pos, scale=D ** -0.5, softmax=softmax, sinks=sink).realize())
    for pos in (30, 31, 32): jit(Tensor(rng.normal(size=q.shape).astype(np.float32)).realize(), UOp.variable("pos", 0, 2 * CHUNK - 1).bind(pos))
    counts[softmax] = count_kernels(jit)
  assert counts["self"] == counts["max"] - 1, counts
  with pytest.raises(ValueError, match="unknown softmax stabilizer 'online'"): fused_attention(Tensor(q), ks, vs, 30, scale=1.0, softmax="online")

def test_soft_cap_bounds_the_logits_and_keeps_small_ones(rng):
  x = rng.normal(size=64).astype(np.float32) * 20
  capped = soft_capped(Tensor(x), 5.0).numpy()
  assert np.abs(capped).max() <= 5.0 and np.all(np.diff(capped[np.argsort(x)]) >= 0)
  np.testing.assert_allclose(capped, 5.0 * np.tanh(x / 5.0), rtol=1e-6, atol=1e-6)

@pytest.mark.parametrize("parts", [0, 2], ids=["one-sum", "parts"])
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_half_cache_values_multiply_in_float32(seed, rng, sinks, parts):
  """The fp16 path (a half cache, as llama.cpp's): each softmax weight times its value in float32, summed in float32;
  the denominator the weights' sum, a sink's term beside it. Equal to that arithmetic in float64, and as many kernels
  as the float path (the denominator a column of the value sum), whole or in parts."""
  e = np.exp(rng.normal(size=(1, 2, 2, 1, 2, CHUNK))).astype(np.float32)
  values = rng.normal(size=(1, 2, 1, 1, 2, CHUNK, DV)).astype(np.float16)
  sink = rng.uniform(0.5, 2, size=(1, 2, 2, 1, 1)).astype(np.float32) if sinks else None
  products = e.astype(np.float64)[..., None] * values
  want = products.sum((-3, -2)) / (e.astype(np.float64).sum((-2, -1))[..., None] + (0 if sink is None else sink.astype(np.float64)))
  def run(values: Tensor) -> tuple[Tensor, int]:
    te, tv, ts = Tensor(e).realize(), values.realize(), None if sink is None else Tensor(sink).realize()
    if parts:
      sums = part_sums(te.reshape(1, 2, 2, 1, 2, 1, CHUNK), tv.reshape(1, 2, 1, 1, 2, 1, CHUNK, DV))
      out = over_denominator(sums[..., :DV + 1].sum(-2), ts)
    else: out = values_with_denominator(te, tv, ts)
    GlobalCounters.reset()
    return out.realize(), GlobalCounters.kernel_count
  (got, kernels), (_, float_kernels) = run(Tensor(values)), run(Tensor(values.astype(np.float32)))
  assert got.dtype == dtypes.float32 and kernels == float_kernels, (kernels, float_kernels)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=f"seed={seed}")

@pytest.mark.parametrize("split", [0, 1], ids=["one-sum", "split"])
def test_half_cache_under_softmax_self_equals_max(seed, rng, split):
  """A decode step over a half cache stabilized by the query's own logit (softmax self, whose weights carry
  e^-SELF_MARGIN) equals the same step stabilized by the max: with the weights rounded to half, every one was 0 and so
  was the output."""
  Hkv, G, D, L = 2, 2, 16, 2 * CHUNK
  q = Tensor(rng.standard_normal((1, Hkv * G, 1, D)).astype(np.float32))
  k, v = (Tensor(rng.standard_normal((1, Hkv, L, D)).astype(np.float16)).realize() for _ in range(2))
  by_self, by_max = (fused_attention(q, k, v, L - 3, scale=D ** -0.5, softmax=s, split=split).numpy() for s in ("self", "max"))
  assert np.abs(by_max).max() > 0.05
  np.testing.assert_allclose(by_self, by_max, rtol=1e-4, atol=1e-5, err_msg=f"seed={seed}")

@pytest.mark.parametrize("plain", [False, True], ids=["fused", "plain"])
@pytest.mark.parametrize("features", [{}, {"sinks": True, "window": 3}], ids=["", "sinks-window"])
def test_a_chunks_gemms_in_half(seed, rng, features, plain):
  """Several query rows (a prompt chunk) sum the values (and on the plain path take the logits) by GEMMs: in float32
  they are the float64 attention (test_attention); in half, the float64 attention of the half-rounded values (and q
  and keys) within the half rounding of the softmax weights."""
  start_pos, T = CHUNK - 3, 6
  q, k, v = qkv(rng, T, start_pos + T)
  sinks = rng.normal(size=HQ).astype(np.float32) if features.get("sinks") else None
  got = (attention if plain else fused_attention)(Tensor(q), in_cache(rng, k, 2), in_cache(rng, v, 2), start_pos, scale=D ** -0.5,
                                                  window=features.get("window"), sinks=None if sinks is None else Tensor(sinks),
                                                  chunk_dtype=dtypes.float16).numpy()
  h = lambda a: a.astype(np.float16).astype(np.float32)
  want = ref_attention(h(q) if plain else q, h(k) if plain else k, h(v), start_pos, D ** -0.5, window=features.get("window"), sinks=sinks)
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, err_msg=f"seed={seed}")

def test_the_plain_path_over_a_half_cache(seed, rng):
  """A half cache meets q rounded to half: plain attention over it is the float64 attention of the rounded q and cache,
  within the half rounding of the softmax weights."""
  start_pos, T = 9, 2
  q, k, v = qkv(rng, T, start_pos + T)
  ks, vs = (in_cache(rng, a, 1).cast(dtypes.float16).realize() for a in (k, v))
  got = attention(Tensor(q), ks, vs, start_pos, scale=D ** -0.5).numpy()
  h = lambda a: a.astype(np.float16).astype(np.float32)
  np.testing.assert_allclose(got, ref_attention(h(q), h(k), h(v), start_pos, D ** -0.5), rtol=2e-3, atol=2e-3, err_msg=f"seed={seed}")

@pytest.mark.parametrize("half_cache", [False, True], ids=["f32-cache", "f16-cache"])
@pytest.mark.parametrize("features", [{}, {"window": 70}, {"sinks": True}, {"softcap": 2.0}, {"window": 3, "sinks": True}],
                         ids=["gqa-causal", "window-past-a-chunk", "sinks", "softcap", "window-sinks"])
def test_split_over_chunks_equals_one_sum(seed, rng, features, half_cache):
  """`split=1`: a decode step's value sums per chunk, each stabilized by its own max, rescaled and added by a second
  kernel, are the float64 attention at positions in the first, second and third chunk; over a half cache, the same as the
  one sum over it. A window's layer keeps the one sum."""
  sinks = rng.normal(size=HQ).astype(np.float32) * 2 if features.get("sinks") else None
  kw = {"window": features.get("window"), "softcap": features.get("softcap")}
  for start_pos in (0, CHUNK + 5, 2 * CHUNK + 40):
    q, k, v = (a[:1] for a in qkv(rng, 1, start_pos + 1))
    ks, vs = in_cache(rng, k, 3), in_cache(rng, v, 3)
    if half_cache: ks, vs = ks.cast(dtypes.float16).realize(), vs.cast(dtypes.float16).realize()
    run = lambda split: attention(Tensor(q), ks, vs, start_pos, scale=D ** -0.5, sinks=None if sinks is None else Tensor(sinks), split=split, **kw)
    got = run(1).numpy()
    assert np.isfinite(got).all(), f"{start_pos=} seed={seed}"
    if half_cache: np.testing.assert_allclose(got, run(0).numpy(), rtol=2e-3, atol=2e-3, err_msg=f"{start_pos=} seed={seed}")
    else: np.testing.assert_allclose(got, ref_attention(q, k, v, start_pos, D ** -0.5, sinks=sinks, **kw), rtol=1e-4, atol=1e-5,
                                     err_msg=f"{start_pos=} seed={seed}")

@pytest.mark.parametrize("weights_break", [False, True], ids=["", "weights-break"])
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("softmax", ["max", "self"])
def test_fused_split_in_a_jit_over_chunk_boundaries(seed, rng, softmax, sinks, weights_break):
  """The fused path split into parts of 2 chunks, captured with a symbolic position and replayed past two chunk
  boundaries (one part, then two, the chunks past the newest read and masked), equals the float64 attention of the
  rotated q and keys at each step, whether or not the weights are realized first (`weights_break`); split costs the
  second kernel that adds the parts up, and under softmax max a per-part max in place of the max over every position,
  and a kernel for the largest of the parts' maxes that the second one rescales them to. A cache not in whole parts is
  an error."""
  S = 2 * CHUNK + 3
  q, k, v = (a[:1] for a in qkv(rng, S, S))
  sink = rng.normal(size=HQ).astype(np.float32) if sinks else None
  cos, sin = rope_tables(D, 10000.0, 3 * CHUNK)
  k_rot = apply_rope(Tensor(k), cos[:S], sin[:S], False).numpy()
  ks, vs = in_cache(rng, k_rot, 4).realize(), in_cache(rng, v, 4).realize()
  tsink = None if sink is None else Tensor(sink).realize()
  counts = {}
  for split in (0, 2):
    def step(qt: Tensor, pos) -> Tensor:
      return fused_attention(qt, ks, vs, pos, scale=D ** -0.5, q_rope=(cos[pos:pos + 1], sin[pos:pos + 1], False), softmax=softmax,
                             sinks=tsink, split=split, weights_break=weights_break).realize()
    jit = TinyJit(step)
    for p in (CHUNK - 2, CHUNK - 1, CHUNK, 2 * CHUNK - 1, 2 * CHUNK + 2):
      got = jit(Tensor(q[:, :, p:p + 1]).realize(), UOp.variable("pos", 0, 4 * CHUNK - 1).bind(p)).numpy()
      q_rot = apply_rope(Tensor(q[:, :, p:p + 1]), cos[p:p + 1], sin[p:p + 1], False).numpy()
      want = ref_attention(q_rot, k_rot[:, :, :p + 1], v[:, :, :p + 1], p, D ** -0.5, sinks=sink)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{split=} {p=} seed={seed}")
    counts[split] = count_kernels(jit)
  assert counts[2] == counts[0] + (1 if softmax == "self" else 2), counts
  with pytest.raises(ValueError, match="a cache of 4 chunks is not parts of 3"): fused_attention(Tensor(q[:, :, :1]), ks, vs, 5, scale=1.0, split=3)

@pytest.mark.parametrize("split", [0, 1], ids=["", "split"])
def test_a_window_reads_only_the_chunks_it_reaches(seed, rng, split):
  """A sliding window's decode step, captured with a symbolic position, reads the chunks that hold valid positions, at
  most as many as the window reaches (3 for 70 positions): the newest three, the first moving with the position. At each
  step it equals the float64 attention over the window; the cache past the valid positions is large garbage that the
  mask must hide."""
  window, S = 70, 4 * CHUNK + 11
  q, k, v = (a[:1] for a in qkv(rng, S, S))
  ks, vs = in_cache(rng, k, 5).realize(), in_cache(rng, v, 5).realize()
  jit = TinyJit(lambda qt, pos: attention(qt, ks, vs, pos, scale=D ** -0.5, window=window, split=split).realize())
  for p in (5, CHUNK + 2, 2 * CHUNK + 7, 3 * CHUNK + 6, 3 * CHUNK + 7, 4 * CHUNK + 10):
    got = jit(Tensor(q[:, :, p:p + 1]).realize(), UOp.variable("pos", 0, 5 * CHUNK - 1).bind(p)).numpy()
    want = ref_attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], p, D ** -0.5, window=window)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{p=} seed={seed}")
  assert chunks_read(5 * CHUNK, 4 * CHUNK + 10, 1, "chunked", window) == (2, 3)
  assert chunks_read(5 * CHUNK, 10, 1, "chunked", window) == (0, 1)
