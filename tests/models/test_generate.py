"""Generation with the sampled token kept on the device and read back in batches gives the tokens that decoding one step
at a time with the host's token gives: greedy and seeded sampling with the repeat penalty, past a wrap of the ring of
sampled tokens, and a stop token inside a batch ends the generation there."""
import numpy as np
import pytest
from models.runtime import Runtime, Timing
from models.synth import synthesize
from ops.sampling import READBACK, Sampler, SamplerParams

N = READBACK + 12   # three single steps, one full batch, then a short one: the ring wraps

@pytest.fixture(scope="module")
def rt(tmp_path_factory) -> Runtime:
  return Runtime(synthesize("smollm2-135m-tiny", tmp_path_factory.mktemp("gen") / "tiny.gguf", quant="Q8_0"), max_context=96)

def stepwise(rt: Runtime, ids: list[int], n: int, sampler: Sampler) -> list[int]:
  """The reference loop: each token read back to the host before the next step is queued with it."""
  for t in ids: sampler.accept(t)
  out = [sampler(rt.prefill(ids))]
  while len(out) < n: out.append(sampler(rt.decode(out[-1], len(ids) + len(out) - 1)))
  return out

@pytest.mark.parametrize("params", [SamplerParams(temperature=0, repeat_penalty=1.0),
                                    SamplerParams(temperature=0.9, top_k=20, top_p=0.95, repeat_penalty=1.3, repeat_last_n=40)],
                         ids=["greedy", "sampled"])
def test_batched_generation_equals_stepwise(rt: Runtime, params: SamplerParams, seed: int, rng: np.random.Generator):
  rt.tokenizer.vocab.stop_ids = frozenset()   # run all N steps whatever the random weights pick
  ids = rng.integers(3, rt.cfg.vocab_size, size=5).tolist()
  want = stepwise(rt, ids, N, Sampler(params, seed))
  timing = Timing()
  got = list(rt.generate(ids, N, Sampler(params, seed), timing))
  assert got == want, f"seed={seed}"
  assert timing.decoded == N - 1 and timing.kernels_per_token > 0

def test_stop_token_inside_a_batch_ends_generation(rt: Runtime, seed: int, rng: np.random.Generator):
  params = SamplerParams(temperature=4.0, top_k=0, top_p=1.0)   # varied tokens, the same for the same seed
  ids = rng.integers(3, rt.cfg.vocab_size, size=5).tolist()
  rt.tokenizer.vocab.stop_ids = frozenset()
  free = list(rt.generate(ids, N, Sampler(params, seed)))
  # a token first sampled inside the first full batch of steps
  first = next(i for i in range(4, 3 + READBACK) if free[i] not in free[:i])
  rt.tokenizer.vocab.stop_ids = frozenset({free[first]})
  timing = Timing()
  got = list(rt.generate(ids, N, Sampler(params, seed), timing))
  assert got == free[:first + 1], f"seed={seed}"
  assert timing.decoded == first
