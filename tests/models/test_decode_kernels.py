"""Which kernels a decode step is made of: the elementwise ones are only the results that must be buffers."""
import numpy as np
import pytest
from tinygrad import TinyJit
from ops.kernels import jit_kernels
from models.moe import MoE
from models.runtime import Runtime
from profiles.hints import resolve
from models.synth import synthesize
from ops.sampling import Sampler, SamplerParams

def test_llama_decode_realizes_no_rotated_query(tmp_path):
  """A Llama decode step's elementwise kernels are the embedding row and, per block, the KV cache write, the FFN
  activation (act_break) and, with weights_break (the CPU's default), the attention weights: q is rotated where the
  attention logits read it, in no kernel of its own."""
  rt = Runtime(synthesize("llama3.2-1b-tiny", tmp_path / "llama.gguf", quant="Q8_0"), max_context=32)
  rt.prefill([5, 6, 7])
  for pos in range(3, 6): rt.decode(8, pos)   # capture, then replays
  elementwise = [k.name for k in jit_kernels(rt._decode) if k.name.startswith("E_")]
  assert len(elementwise) == 1 + (3 if rt.hints.weights_break else 2) * rt.cfg.n_layers, elementwise

@pytest.mark.parametrize("preset", ["llama3.2-1b-tiny", "deepseek-v2-lite-tiny"])
def test_jits_captured_at_their_first_call_are_those_tinygrad_captures_at_its_second(tmp_path, preset):
  """A runtime captures prefill, head and decode at their first calls: the same kernels (no kernel that made state,
  captured and replayed with the step) and the same logits over a prompt and decode steps as tinygrad's TinyJit, which
  runs the first call plainly and captures the second."""
  path = synthesize(preset, tmp_path / "model.gguf", quant="Q8_0")
  runs = {}
  for first in (True, False):
    rt = Runtime(path, resolve({}), 32)
    if not first: rt._prefill, rt._head, rt._decode = TinyJit(rt._chunk), TinyJit(rt._logits), TinyJit(rt._forward)
    logits = [rt.prefill_chunks(list(range(5, 25))).numpy() for _ in range(3)] + [rt.decode(8, pos).numpy() for pos in range(20, 24)]
    runs[first] = logits, [[k.name for k in jit_kernels(j)] for j in (rt._prefill, rt._head, rt._decode)]
  assert runs[True][1] == runs[False][1]
  for ours, tinygrads in zip(runs[True][0], runs[False][0]): np.testing.assert_allclose(ours, tinygrads, rtol=1e-5, atol=1e-5)

def test_whole_attention_reads_every_chunk_to_the_same_tokens(tmp_path, jits):
  """`attention=whole` reads every chunk of the cache (static shapes), `chunked` (the default) as many as hold valid
  positions; over a prompt and decode steps that cross a chunk boundary the logits and greedy tokens stay the same."""
  path = synthesize("llama3.2-1b-tiny", tmp_path / "llama.gguf", quant="Q8_0")
  outs = {}
  for variant in ("chunked", "whole"):
    rt = Runtime(path, resolve({"attention": variant}), 160, jits=jits)
    logits = rt.prefill(list(range(5, 65)))
    outs[variant] = (logits.numpy(), list(rt.continue_from(logits, 60, 8, Sampler(SamplerParams(temperature=0)))))
    rt.keep_jits()
  np.testing.assert_allclose(outs["whole"][0], outs["chunked"][0], rtol=1e-5, atol=1e-5)
  assert outs["whole"][1] == outs["chunked"][1]

@pytest.mark.parametrize("preset, saved, cache", [("llama3.2-1b-tiny", 1, "float"), ("gpt-oss-20b-tiny", 1, "float"),
                                                  ("gemma3-270m-tiny", 3, "float"), ("llama3.2-1b-tiny", 1, "half")])
def test_a_row_cache_written_by_the_qkv_matmul_saves_a_kernel_a_block(tmp_path, preset, saved, cache, jits):
  """`kv_layout=rows`: the joined q/k/v matmul stores each position's projections into the cache (k rotated where read),
  so the cache write is no kernel of its own; the logits and greedy tokens over a prompt and decode steps that cross a
  chunk boundary stay those of the per-head cache. Gemma 3's q and k norms are then applied where the logits read q
  and the keys: their two kernels go too. An fp16 cache (`kv_cache=half`) holds rows too, saving the same kernel; its
  rows hold q and the keys as projected, rounded to fp16 before they are rotated, where the per-head cache rounds them
  after."""
  path = synthesize(preset, tmp_path / f"{preset}.gguf", quant="Q8_0")
  outs = {}
  for layout in ("heads", "rows"):
    rt = Runtime(path, resolve({"kv_layout": layout, "strategy": "packed_words", "kv_cache": cache}), 160, jits=jits)
    logits = rt.prefill(list(range(5, 65)))
    outs[layout] = (logits.numpy(), list(rt.continue_from(logits, 60, 8, Sampler(SamplerParams(temperature=0)))), rt.kernels_per_token())
    rt.keep_jits()
  base = outs["heads"][0]   # Gemma's k norm sums its squares in another order: float32 rounding apart
  tol = 1e-5 if cache == "float" else 2e-3   # an fp16 rounding (2^-11) of q and the keys at other points
  np.testing.assert_allclose(outs["rows"][0], base, rtol=tol, atol=tol * np.abs(base).max())
  assert outs["rows"][1] == outs["heads"][1]
  assert outs["rows"][2] == outs["heads"][2] - saved * rt.cfg.n_layers

@pytest.mark.parametrize("preset, quant, norm, per_block", [("llama3.2-1b-tiny", "Q8_0", "single", 8), ("llama3.2-1b-tiny", "Q8_0", "fold", 6),
                                                            ("gemma3-270m-tiny", "Q8_0", "fold", 8), ("gpt-oss-20b-tiny", None, "fold", 8)])
def test_decodes_in_eight_kernels_a_block_or_fewer(tmp_path, preset, quant, norm, per_block, jits):
  """With the row cache, the softmax stabilized by each query's own logit and the activation computed by the gate and up
  matmul's kernel, a Llama block is 8 kernels with the norm realized by one kernel (norm, q/k/v into the cache, logits,
  values, output projection, norm, gate+up with the activation, down), 6 with the norms folded into the matmuls that
  read them; a Gemma 3 block with folded norms is 8 (its post norms each a kernel, its q and k norms applied where the
  logits read them); a GPT-OSS block (MXFP4 experts, a float32 router) is 8: q/k/v into the cache, logits, values with
  the sinks' terms, output projection, router, top-k, gate+up experts with the activation, down experts, its norms
  folded into the router and the experts. The issue's bound. The logits and greedy tokens over a prompt and steps that
  cross a chunk boundary stay those of the default kernels."""
  path = synthesize(preset, tmp_path / f"{preset}.gguf", quant=quant)
  outs = {}
  for name, hints in (("default", {}), ("eight", dict(norm=norm, kv_layout="rows", softmax="self", act_in_matmul=True))):
    rt = Runtime(path, resolve({"strategy": "packed_words", **hints}), 160, jits=jits)
    logits = rt.prefill(list(range(5, 65)))
    outs[name] = (logits.numpy(), list(rt.continue_from(logits, 60, 8, Sampler(SamplerParams(temperature=0)))), jit_kernels(rt._decode))
    rt.keep_jits()
  base = outs["default"][0]   # the norms sum in another order: float32 rounding apart, as in test_breaks
  np.testing.assert_allclose(outs["eight"][0], base, rtol=1e-4, atol=1e-4 * np.abs(base).max())
  assert outs["eight"][1] == outs["default"][1]
  # outside the blocks: the embedding row, the output norm (its sum of squares, when folded) and the output matmul
  assert len(outs["eight"][2]) == per_block * rt.cfg.n_layers + 3, [k.name for k in outs["eight"][2]]

@pytest.mark.parametrize("softmax", ["max", "self"])
@pytest.mark.parametrize("preset", ["llama3.2-1b-tiny", "gemma3-270m-tiny", "gpt-oss-20b-tiny", "deepseek-v2-lite-tiny"])
def test_split_kv_decodes_the_same_tokens(tmp_path, preset, softmax, jits):
  """`split_kv=2`: decode steps past two chunk boundaries (parts of two chunks; Gemma's and GPT-OSS's windowed layers then
  read from their second chunk on, in one sum), with a GQA cache, sinks and latent attention, give the logits and greedy
  tokens of the one sum; each block without a window costs one kernel more (adding the parts up), two under softmax max
  (and the largest of the parts' maxes; both of the tiny Gemma's blocks slide a window, one of GPT-OSS's two), latent
  attention's too."""
  path = synthesize(preset, tmp_path / f"{preset}.gguf", quant="Q8_0" if preset != "gpt-oss-20b-tiny" else None)
  outs = {}
  for split in (0, 2):
    rt = Runtime(path, resolve({"split_kv": split, "softmax": softmax}), 160, jits=jits)
    logits = rt.prefill(list(range(5, 130)))
    outs[split] = (logits.numpy(), list(rt.continue_from(logits, 125, 8, Sampler(SamplerParams(temperature=0)))), rt.kernels_per_token())
    rt.keep_jits()
  np.testing.assert_allclose(outs[2][0], outs[0][0], rtol=1e-5, atol=1e-5 * np.abs(outs[0][0]).max())
  assert outs[2][1] == outs[0][1]
  unwindowed = sum(getattr(getattr(b.attn, "spec", None), "window", None) is None for b in rt.model.blocks)
  assert unwindowed == {"gemma3-270m-tiny": 0, "gpt-oss-20b-tiny": 1}.get(preset, rt.cfg.n_layers)
  more = 2 if softmax == "max" else 1
  assert outs[2][2] == outs[0][2] + more * unwindowed, (outs[2][2], outs[0][2])

def test_latent_blocks_normalize_the_latent_where_the_cache_is_written(tmp_path, jits):
  """Under norm `single` a latent block's decode step normalizes the latent in the kernel that writes it to the cache
  (no kernel sums its squares apart, as under `fused`). A DeepSeek-V2-Lite block is then 11 kernels dense (norm, q with
  the latent, latent into the cache, q absorbed, logits, values, latent output expanded, output projection, norm,
  gate+up with the activation, down) and 16 with experts (after the second norm: shared gate+up, router, shared down,
  top-k, gate+up experts, the softmax's sum over every expert, down experts); the logits and greedy tokens stay those of
  `fused`."""
  path = synthesize("deepseek-v2-lite-tiny", tmp_path / "ds.gguf", quant="Q8_0")
  outs = {}
  for norm in ("fused", "single"):
    rt = Runtime(path, resolve({"strategy": "packed_words", "norm": norm, "softmax": "self", "act_in_matmul": True}), 160, jits=jits)
    logits = rt.prefill(list(range(5, 65)))
    outs[norm] = (logits.numpy(), list(rt.continue_from(logits, 60, 8, Sampler(SamplerParams(temperature=0)))), rt.kernels_per_token())
    rt.keep_jits()
  base = outs["fused"][0]
  np.testing.assert_allclose(outs["single"][0], base, rtol=1e-4, atol=1e-4 * np.abs(base).max())
  assert outs["single"][1] == outs["fused"][1]
  n_moe = sum(isinstance(b.ffn, MoE) for b in rt.model.blocks)
  assert outs["single"][2] == 11 * (rt.cfg.n_layers - n_moe) + 16 * n_moe + 3
  assert outs["fused"][2] == outs["single"][2] + rt.cfg.n_layers
