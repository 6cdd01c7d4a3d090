"""The fusion breaks (norm `break` and `single`, `act_break`, `weights_break`) realize a matmul's input as a buffer of
its own, norm `fold` computes the norm inside the matmuls that read it: the same logits, and exactly the kernels they
add (a break: one per RMS norm a matmul reads, one per FFN, dense or MoE, one per attention's value sum; `single`: none,
its one kernel taking the place of the fused norm's sum of squares, and one per norm of a residual branch, of q or of k)
or save (the fold: one per norm a dense matmul reads)."""
import numpy as np
import pytest
from models.runtime import Runtime
from profiles.hints import resolve
from models.synth import synthesize

def decode(path, rng_ids: list[int], jits, **breaks) -> tuple[np.ndarray, int]:
  rt = Runtime(path, resolve({"strategy": "packed_words", "weights_break": False, **breaks}), 32, jits=jits)
  logits = rt.prefill(rng_ids)
  for i in range(3): logits = rt.decode(rng_ids[-1], len(rng_ids) + i)   # capture, then replays
  rt.keep_jits()
  return logits.numpy()[0], rt.kernels_per_token()

@pytest.mark.parametrize("preset", ["llama3.2-1b-tiny", "gpt-oss-20b-tiny", "gemma3-270m-tiny"])
def test_breaks_keep_logits_and_add_their_kernels(preset: str, tmp_path, seed: int, rng: np.random.Generator, jits):
  path = synthesize(preset, tmp_path / f"{preset}.gguf", quant="Q8_0")
  ids = rng.integers(3, 1000, size=5).tolist()
  base, kernels = decode(path, ids, jits, act_break=False)
  blocks = Runtime(path, max_context=32).cfg.n_layers
  # a folded norm saves its kernel where the matmuls read it: both of Llama's, and GPT-OSS's (its router and gate and up
  # experts each sum the FFN norm's squares beside their dots)
  # `single` also sums Gemma's post-attention and post-FFN norms in the kernel that adds them to the residual stream,
  # and its q and k norms where the logits and the cache write read them; `fold` does that too, beside its folded norms
  single = -4 * blocks if preset.startswith("gemma") else 0
  for breaks, added in (({"act_break": True}, blocks), ({"act_break": False, "weights_break": True}, blocks),
                        ({"act_break": False, "norm": "break"}, 2 * blocks + 1), ({"act_break": False, "norm": "single"}, single),
                        ({"act_break": False, "norm": "fold"}, single - 2 * blocks)):
    got, n = decode(path, ids, jits, **breaks)
    np.testing.assert_allclose(got, base, rtol=1e-4, atol=1e-4 * np.abs(base).max(), err_msg=f"{breaks} seed={seed}")
    assert n == kernels + added, f"{breaks}: {n} kernels against {kernels} without"
