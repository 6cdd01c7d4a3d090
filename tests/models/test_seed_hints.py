"""The hints that reproduce seed 003's findings, against the plain path on a tiny GLM-4.7-Flash (latent attention, a
dense block, then MoE blocks with a shared expert): the shared experts added to the down experts' sum in their kernel
(shared_break off) and a value cache of latent attention's own (mla_v_cache) keep the logits and greedy tokens, one
kernel fewer a MoE block and one more a block; leaving out the shared experts or the routing's choice (skip) drops
their kernels; dropping the float32 casts (casts) keeps the kernels and moves the logits by fp16's roundings only where
fp16 operands meet (a half cache and a half prefill), and nowhere else."""
from pathlib import Path
import numpy as np
import pytest
from experiments.profile import attribute, buffer_labels
from models.moe import MoE
from models.runtime import Runtime
from models.synth import synthesize
from ops.kernels import jit_kernels
from ops.sampling import Sampler, SamplerParams
from profiles.hints import resolve

PROMPT = list(range(5, 25))   # longer than prefill_steps: a prefill chunk

@pytest.fixture(scope="module")
def glm(tmp_path_factory) -> Path: return synthesize("glm-4.7-flash-tiny", tmp_path_factory.mktemp("synth") / "glm.gguf")

def decode(path: Path, jits, **hints) -> tuple[np.ndarray, list[int], Runtime]:
  """The prompt's logits, then the last decode step's beside them, and 6 greedy tokens."""
  rt = Runtime(path, resolve(hints), 96, jits=jits)
  logits = rt.prefill(PROMPT).numpy()
  tokens = list(rt.continue_from(rt.prefill(PROMPT), len(PROMPT), 6, Sampler(SamplerParams(temperature=0))))
  last = rt.decode(tokens[-1], len(PROMPT) + len(tokens) - 1).numpy()
  rt.keep_jits()
  return np.concatenate([logits, last]), tokens, rt

def close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4):
  np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())

def test_shared_experts_in_the_down_kernel_and_a_value_cache_keep_the_answers(glm: Path, jits):
  """The prompt's chunk in the expanded form (its latent read from the value cache), the decode steps absorbed."""
  base, tokens, rt = decode(glm, jits, mla_prefill="expanded")
  n_moe = sum(isinstance(b.ffn, MoE) for b in rt.model.blocks)
  got, got_tokens, moved = decode(glm, jits, mla_prefill="expanded", shared_break=False, mla_v_cache=True)
  close(got, base)
  assert got_tokens == tokens and moved.kernels_per_token() == rt.kernels_per_token() - n_moe + rt.cfg.n_layers
  reads = [r for *_, r in attribute(jit_kernels(moved._decode), buffer_labels(moved.weights.labels))]
  assert sum(any(n.endswith("ffn_down_exps") for n in r) and any(n.endswith("ffn_down_shexp") for n in r) for r in reads) == n_moe, reads
  assert sum(any(n.endswith("v_cache") for n in r) for r in reads) >= rt.cfg.n_layers

def test_skipped_shared_experts_and_choice_drop_their_kernels(glm: Path, jits):
  """Without its shared experts a MoE block loses their gate and up, activation and down kernels; without the routing's
  choice the top-k's kernel (every token takes the first k experts)."""
  base, _, rt = decode(glm, jits)
  n_moe = sum(isinstance(b.ffn, MoE) for b in rt.model.blocks)
  got, _, skipped = decode(glm, jits, skip=("shared_expert", "topk"))
  assert skipped.kernels_per_token() == rt.kernels_per_token() - 4 * n_moe and not np.allclose(got, base)
  assert all(b.ffn.shared is None for b in skipped.model.blocks if isinstance(b.ffn, MoE))

def test_dropped_casts_round_as_fp16_where_fp16_operands_meet(glm: Path, jits):
  floats = {"kv_cache": "float", "prefill": "float"}   # nothing to cast
  base, tokens, _ = decode(glm, jits, **floats)
  plain, plain_tokens, _ = decode(glm, jits, casts="drop", **floats)
  assert np.array_equal(plain, base) and plain_tokens == tokens
  half = {"kv_cache": "half", "prefill": "half"}
  kept, _, kept_rt = decode(glm, jits, **half)
  dropped, _, dropped_rt = decode(glm, jits, casts="drop", **half)
  assert dropped_rt.kernels_per_token() == kept_rt.kernels_per_token()
  close(dropped, kept, rtol=2e-2)
  assert not np.array_equal(dropped, kept)
