import functools
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes
from ops.sampling import Sampler, SamplerParams, first_argmax, penalize, sample

V = 64
FULL = SamplerParams(temperature=0.8, top_k=12, top_p=0.9, repeat_penalty=1.3, repeat_last_n=8)

def softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max())
  return e / e.sum()

def ref_penalize(logits: np.ndarray, recent: list[int], penalty: float) -> np.ndarray:
  out = logits.astype(np.float64)
  for t in set(recent): out[t] = out[t] / penalty if out[t] > 0 else out[t] * penalty
  return out

def ref_probs(logits: np.ndarray, p: SamplerParams, recent: list[int]) -> np.ndarray:
  """Final sampling distribution in float64, with sorts: penalty, top-k, top-p at temperature 1, then temperature."""
  l = ref_penalize(logits, recent, p.repeat_penalty)
  keep = np.ones(len(l), dtype=bool)
  if 0 < p.top_k < len(l): keep &= l >= np.sort(l)[::-1][p.top_k - 1]
  if p.top_p < 1:
    probs = softmax(np.where(keep, l, -np.inf))
    order = np.argsort(-probs, kind="stable")
    keep &= probs >= probs[order[np.searchsorted(np.cumsum(probs[order]), p.top_p)]]
  return softmax(np.where(keep, l / p.temperature, -np.inf))

def recent_tensor(recent: list[int], n: int) -> Tensor: return Tensor(recent + [-1] * (n - len(recent)), dtype=dtypes.int32)

def jitted(params: SamplerParams) -> TinyJit: return TinyJit(functools.partial(sample, params=params))

def test_greedy_is_argmax(seed, rng):
  sampler = Sampler(SamplerParams(temperature=0, repeat_last_n=0), seed=seed)
  for _ in range(3):
    logits = rng.normal(size=V).astype(np.float32)
    assert sampler(Tensor(logits)) == np.argmax(logits), f"seed={seed}"

def test_greedy_over_buffers_and_views_past_the_ring(seed, rng):
  """Logits in a buffer of their own (as a decode step leaves them, taken as they are) and in a view of one (copied),
  for more steps than the sampler's ring has slots (each slot's step variable bound once and kept)."""
  sampler = Sampler(SamplerParams(temperature=0, repeat_last_n=0), seed=seed)
  for step in range(2 * sampler.ring_size + 3):
    rows = rng.normal(size=(2, V)).astype(np.float32)
    logits = Tensor(rows).realize()[step % 2] if step % 3 else Tensor(rows[0]).realize()
    assert sampler(logits) == np.argmax(rows[step % 2 if step % 3 else 0]), f"step {step} seed={seed}"
  assert len(sampler._slots) == sampler.ring_size

@pytest.mark.parametrize("size", [1, 511, 4099, 200003])   # 200003: groups of 25 values
def test_first_argmax_takes_the_lowest_tied_index(seed, rng, size):
  x = rng.normal(size=size).astype(np.float32)
  tied = rng.choice(size, size=min(3, size), replace=False)
  x[tied] = x.max() + 1
  assert first_argmax(Tensor(x)).item() == np.argmax(x) == tied.min(), f"seed={seed}"
  x = -np.abs(x) - 1   # negative floats order by flipped bits
  assert first_argmax(Tensor(x)).item() == np.argmax(x), f"seed={seed}"
  x[:] = -np.inf
  assert first_argmax(Tensor(x)).item() == 0, f"seed={seed}"

@pytest.mark.parametrize("params", [SamplerParams(temperature=1.5, top_k=1, top_p=1.0), SamplerParams(temperature=1.5, top_k=0, top_p=1e-6)],
                         ids=["top_k=1", "top_p=1e-6"])
def test_narrow_filters_are_greedy(seed, rng, params):
  run, logits = jitted(params), rng.normal(size=V).astype(np.float32)
  for u in (0.0, *rng.random(4), 0.9999999):
    assert run(Tensor(logits), Tensor([u], dtype=dtypes.float32), None).item() == np.argmax(logits), f"{u=} seed={seed}"

def test_repeat_penalty_rule(seed, rng):
  recent = [int(t) for t in rng.integers(0, V, size=6)]
  logits = (rng.normal(size=V) * 3).astype(np.float32)
  out = penalize(Tensor(logits), recent_tensor(recent, 10), 1.7).numpy()
  np.testing.assert_allclose(out, ref_penalize(logits, recent, 1.7), rtol=1e-6, err_msg=f"{recent=} seed={seed}")

@pytest.mark.parametrize("top,second", [(3.0, 2.0), (-0.5, -0.8)], ids=["positive", "negative"])
def test_repeat_penalty_changes_greedy_choice(seed, rng, top, second):
  # a recent best token loses to the runner-up: 3/2 < 2 when positive, -0.5*2 < -0.8 when negative (dividing would keep it best)
  logits = np.minimum(rng.normal(size=V), second - 1).astype(np.float32)
  best, runner_up = rng.choice(V, size=2, replace=False)
  logits[best], logits[runner_up] = top, second
  params = SamplerParams(temperature=0, repeat_penalty=2.0, repeat_last_n=4)
  token = sample(Tensor(logits), Tensor([0.5]), recent_tensor([int(best)], 4), params).item()
  assert token == runner_up, f"{best=} {runner_up=} seed={seed}"

def test_temperature_sampling_matches_reference(seed, rng):
  """For each u the token's interval of the reference CDF holds u; over a uniform grid of u the counts follow the reference."""
  logits, recent = (rng.normal(size=V) * 2).astype(np.float32), [int(t) for t in rng.integers(0, V, size=5)]
  probs = ref_probs(logits, FULL, recent)
  cdf = np.concatenate([[0.0], np.cumsum(probs)])
  run, grid = jitted(FULL), (np.arange(128) + 0.5) / 128
  tokens = [run(Tensor(logits), Tensor([u], dtype=dtypes.float32), recent_tensor(recent, FULL.repeat_last_n)).item() for u in grid]
  for u, t in zip(grid, tokens):
    assert cdf[t] - 1e-5 <= u <= cdf[t + 1] + 1e-5, f"{u=} {t=} p={probs[t]} seed={seed}"
  assert np.all(np.abs(np.bincount(tokens, minlength=V) - len(grid) * probs) <= 1.01), f"seed={seed}"

def test_a_decode_steps_row_of_logits_samples_as_a_vector(seed, rng):
  """Logits [1, V] as a decode step returns them: without filters too (the CDF's total was a whole row: token 0 every time)."""
  params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0)
  logits = rng.normal(size=V).astype(np.float32)
  for u in rng.random(8):
    u_t = Tensor([u], dtype=dtypes.float32)
    assert sample(Tensor(logits[None]), u_t, None, params).item() == sample(Tensor(logits), u_t, None, params).item(), f"{u=} seed={seed}"

def test_sampler_seed_reproduces(seed, rng):
  steps = [(rng.normal(size=V) * 2).astype(np.float32) for _ in range(6)]
  runs = []
  for _ in range(2):
    sampler = Sampler(FULL, seed=seed)
    for t in (1, 2, 3): sampler.accept(t)
    runs.append([sampler(Tensor(logits)) for logits in steps])
  assert runs[0] == runs[1], f"seed={seed}"
  # the Sampler draws u from numpy's Generator(seed) and penalizes its last repeat_last_n tokens
  draws, recent = np.random.default_rng(seed), [1, 2, 3]
  for logits, token in zip(steps, runs[0]):
    cdf = np.concatenate([[0.0], np.cumsum(ref_probs(logits, FULL, recent[-FULL.repeat_last_n:]))])
    u = draws.random(1, dtype=np.float32)[0]
    assert cdf[token] - 1e-5 <= u <= cdf[token + 1] + 1e-5, f"{u=} {token=} seed={seed}"
    recent.append(token)

@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(repeat_penalty=0.0), dict(repeat_last_n=-1)])
def test_params_out_of_range(bad):
  with pytest.raises(ValueError, match=next(iter(bad))): SamplerParams(**bad)
