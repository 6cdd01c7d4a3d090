"""Synthetic checkpoints (models.synth): the tiny presets have the structure of their models, the full presets the real shapes and
metadata, the MoE and MLA presets the keys and tensors llama.cpp's loader requires, files are reproducible byte for byte, bad
arguments are one-line errors, the tokenizers are well formed, and every dense preset agrees with llama.cpp
(fixtures/make_synth_fixtures.py) through `tinyzoo logits` with its default ggml rounding (the MoE and MLA ones: test_moe.py).

Acceptance, on the exact file the fixture was made from (its sha256): identical tokenizations, top-20 overlap >= 15, the
shared top-20 logits within TOLERANCE, and the first 4 greedy tokens equal up to a step where llama.cpp's top-two margin is
below NOISE (from there the texts may part). Measured on seeds 0-3 of every preset (32 runs, logits of std ~4, top ones ~20):
the largest top-20 difference was 0.59 (gemma3-1b, seed 0; most runs 0.1-0.45), the lowest overlap 18, and greedy runs
parted only at margins of 0.12-0.29. Two causes. Both engines round activations to 8 bits before each quantized matmul: an
activation within float-summation noise of a rounding tie moves by a whole step in one engine only (one such element made all
of a 0.012 difference in llama3.2-1b's output matmul), and random weights carry it through every later block; tinyzoo's own
packed_dot and fused strategies differ by 0.17 on llama3.2-1b that way. And tinyzoo's ggml rounding misses some of llama.cpp's
fp16 roundings (tinygrad folds x.cast(half).cast(float) to x: the 8-bit activations' scales are rounded to fp16 on their bits
since f3aba30, quant/activations.py, but attention rounds the softmax weights before normalizing them where llama.cpp rounds
the normalized ones): with those emulated, the tiny presets agree to 1e-5 and the full ones within 0.35."""
import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from models import catalog, synth
from models.catalog import ModelNotFound, resolve_model
from models.config import ModelConfig
from models.deepseek2 import gating
from models import jit_cache
from models.registry import architecture_of
from models.spec import MetadataView
from ops.routing import Gating
from models.tokenizer import Tokenizer
from models.tokenizers.vocab import TokenType
from quant.files import file_sha256
from quant.gguf_file import GGUFFile

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "synth_llama_cpp.json").read_text(encoding="utf-8"))["presets"]
# the dense presets (the MoE and MLA ones are tested in test_moe.py)
DENSE = [n for n, p in synth.PRESETS.items() if p.moe is None and p.mla is None]
TINY = [n for n in DENSE if n.endswith("-tiny")]
FULL = [n for n in DENSE if not n.endswith("-tiny")]
TOLERANCE, NOISE = 0.8, 0.5   # 1.35x the largest difference measured, 1.7x the largest margin at which runs parted
CTX = 16   # the 8 probe tokens and 4 greedy steps fit; a small KV cache keeps the 1B presets' runs short

@pytest.fixture(scope="session")
def synthesized():
  """name -> the preset's file (default quant, seed 0) as the catalog writes it into the cache directory: once for each
  version of what decides its bytes (the 1B ones are ~0.8 GB)."""
  return catalog.synthesized

def sha256(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 24): h.update(chunk)
  return h.hexdigest()

def block_tensors(names) -> set[str]: return {n.split(".", 2)[2] for n in names if n.startswith("blk.0.")}

# ---- structure and shapes

@pytest.mark.parametrize("name", TINY)
def test_tiny_has_the_structure_of_its_model(name: str, synthesized):
  g = GGUFFile(synthesized(name))
  cfg, full = ModelConfig.from_gguf(g), synth.PRESETS[name.removesuffix("-tiny")]
  assert (cfg.arch, cfg.n_layers, cfg.rope_base, cfg.norm_eps, cfg.context_length) == (full.arch, 2, full.rope_base, pytest.approx(full.norm_eps),
                                                                                        full.context_length)
  assert cfg.n_heads // cfg.n_kv_heads == full.n_heads // full.n_kv_heads and cfg.n_heads % cfg.n_kv_heads == 0
  assert np.sign(cfg.n_heads * cfg.head_dim - cfg.dim) == np.sign(full.n_heads * full.head_dim - full.dim)   # queries wider than dim, or not
  assert cfg.dim < 256 and cfg.vocab_size <= 4096 and cfg.ffn_dim < 1024
  assert (cfg.sliding_window is None) == (full.sliding_window is None)
  assert (cfg.yarn is not None and cfg.yarn.freq_factors is not None) == (full.llama3_rope is not None)
  assert block_tensors(g.tensors) == block_tensors(t.name for t in synth.tensor_plan(full.name))   # qk-norm and sandwich norms as the model
  assert "output.weight" not in g.tensors and ("rope_freqs.weight" in g.tensors) == (full.llama3_rope is not None)   # tied, as the real ones
  tok = Tokenizer.from_gguf(g)
  assert (tok.vocab.model, tok.vocab.pre, tok.vocab_size) == (g.get("tokenizer.ggml.model"), getattr(full.vocab, "pre", "default"), cfg.vocab_size)
  assert g.get("general.name") == f"synthetic {name} (seed 0)"

# the real models: llama3.2-1b from Meta's GGUF conversions, smollm2-135m and gemma3-270m from `tinyzoo info`, gemma3-1b and
# qwen3-0.6b from their configs
REAL = {  # arch, blocks, dim, heads, kv heads, head dim, ffn, vocab, context, rope base, sliding window, tokenizer model, pre
  "llama3.2-1b": ("llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0, None, "gpt2", "llama-bpe"),
  "smollm2-135m": ("llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0, None, "gpt2", "smollm"),
  "gemma3-270m": ("gemma3", 18, 640, 4, 1, 256, 2048, 262144, 32768, 1e6, 512, "llama", "default"),
  "gemma3-1b": ("gemma3", 26, 1152, 4, 1, 256, 6912, 262144, 32768, 1e6, 512, "llama", "default"),
  "qwen3-0.6b": ("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1e6, None, "gpt2", "qwen2"),
}

@pytest.mark.parametrize("name", FULL)
def test_full_presets_have_the_real_shapes(name: str):
  arch, n, dim, heads, kv, hd, ffn, vocab, ctx, base, window, model, pre = REAL[name]
  meta, plan = synth.metadata(name), {t.name: t for t in synth.tensor_plan(name)}
  a = arch + "."
  assert (meta[a + "block_count"], meta[a + "embedding_length"], meta[a + "attention.head_count"], meta[a + "attention.head_count_kv"],
          meta[a + "attention.key_length"], meta[a + "feed_forward_length"], meta[a + "context_length"], meta[a + "rope.freq_base"]) == \
         (n, dim, heads, kv, hd, ffn, ctx, base)
  assert meta.get(a + "attention.sliding_window") == window and (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == (model, pre)
  assert len(meta["tokenizer.ggml.tokens"]) == vocab == plan["token_embd.weight"].shape[0]
  assert plan["blk.0.attn_q.weight"].shape == (heads * hd, dim) and plan["blk.0.attn_k.weight"].shape == (kv * hd, dim)
  assert plan["blk.0.ffn_down.weight"].shape == (dim, ffn) and f"blk.{n - 1}.ffn_up.weight" in plan and f"blk.{n}.ffn_up.weight" not in plan
  per_block = {"llama": 9, "qwen3": 11, "gemma3": 13}[arch]   # qk-norms and sandwich norms
  assert len(plan) == 2 + n * per_block + (name == "llama3.2-1b")
  size = sum(int(np.prod(t.shape)) * GGML_QUANT_SIZES[t.ggml_type][1] // GGML_QUANT_SIZES[t.ggml_type][0] for t in plan.values())
  assert 0.1e9 < size < 1.3e9

def test_llama3_rope_factors():
  """rope_freqs.weight as Meta's reference computes Llama 3.2's scaling (factor 32, low/high frequency factors 1 and 4, 8192
  original positions), written independently here; tinyzoo's config reads them into the rope tables."""
  factors = synth.tensor_plan("llama3.2-1b")[1].values
  inv_freq = 500000.0 ** -(np.arange(0, 64, 2) / 64)
  want = []
  for f in inv_freq:
    wavelen = 2 * np.pi / f
    if wavelen < 8192 / 4: want.append(1.0)
    elif wavelen > 8192 / 1: want.append(32.0)
    else: smooth = (8192 / wavelen - 1) / (4 - 1); want.append(1 / ((1 - smooth) / 32 + smooth))
  np.testing.assert_allclose(factors, want, rtol=1e-6)
  assert factors[0] == 1.0 and factors[-1] == 32.0 and any(1 < f < 32 for f in factors)

def test_config_reads_rope_freqs(synthesized):
  cfg = ModelConfig.from_gguf(GGUFFile(synthesized("llama3.2-1b-tiny")))
  p = synth.PRESETS["llama3.2-1b-tiny"]
  assert cfg.yarn.factor == 1.0 and cfg.yarn.ext_factor == 0.0
  np.testing.assert_array_equal(cfg.yarn.freq_factors, p.llama3_rope.freq_factors(p.head_dim, p.rope_base))

# ---- the presets as llama.cpp loads them

MOE = [n for n, p in synth.PRESETS.items() if p.moe is not None or p.mla is not None]
MOE_FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "moe_llama_cpp.json").read_text(encoding="utf-8"))["cases"]

def llama_cpp_tensors(meta: dict) -> tuple[dict[str, tuple[int, ...]], set[str]]:
  """The tensors a file of this metadata holds, each with its llama.cpp ne (the numpy shape reversed), and the optional
  ones among them, as its architecture's description says (models/spec.py); a key the description requires is read as
  llama.cpp reads it, so a missing one fails here as it fails there."""
  g = MetadataView(meta)
  tensors = architecture_of(g).tensors(ModelConfig.from_gguf(g), g)
  return {t.name: t.shape[::-1] for t in tensors}, {t.name for t in tensors if t.optional}

def assert_llama_cpp_reads(arch: str, meta: dict) -> None:
  """What llama.cpp's loader asks of the metadata itself, written from its source independently of tinyzoo's reading of
  it: the keys it requires, and the shapes it refuses."""
  key = lambda k: f"{arch}.{k}"
  required = ["context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon"]
  if arch == "gpt-oss": required += ["expert_feed_forward_length", "attention.sliding_window"]
  if arch == "deepseek2":
    n_layer, vocab = meta[key("block_count")], meta.get(key("vocab_size"), len(meta["tokenizer.ggml.tokens"]))
    required += ["attention.kv_lora_rank", "expert_feed_forward_length", "expert_shared_count", "attention.key_length_mla",
                 "attention.value_length_mla"] + ([] if n_layer in (26, 27) or (n_layer == 48 and vocab == 128256) else ["attention.q_lora_rank"])
    assert meta[key("attention.key_length")] == meta[key("attention.kv_lora_rank")] + meta[key("rope.dimension_count")]   # the MLA form
    assert meta[key("attention.value_length")] == meta[key("attention.kv_lora_rank")]
  assert not [k for k in required if key(k) not in meta], [k for k in required if key(k) not in meta]
  head_k = meta.get(key("attention.key_length"), meta[key("embedding_length")] // meta[key("attention.head_count")])
  if arch in ("llama", "qwen3"): assert meta.get(key("rope.dimension_count"), head_k) == head_k   # llama.cpp's "invalid n_rot"
  n_expert, n_used = meta.get(key("expert_count"), 0), meta.get(key("expert_used_count"), 0)
  assert n_used <= n_expert and (n_used > 0) == (n_expert > 0)

def assert_llama_cpp_loads(name: str, meta: dict, shapes: dict[str, tuple[int, ...]]) -> None:
  """The metadata is what llama.cpp reads, every tensor llama.cpp requires is there, none it does not create (it refuses a
  file with tensors left over), all of its shapes."""
  assert_llama_cpp_reads(synth.PRESETS[name].arch, meta)
  want, optional = llama_cpp_tensors({"general.architecture": synth.PRESETS[name].arch, **meta})
  assert not shapes.keys() - want.keys(), f"tensors llama.cpp does not create: {sorted(shapes.keys() - want.keys())[:5]}"
  assert not want.keys() - optional - shapes.keys(), f"tensors llama.cpp requires: {sorted(want.keys() - optional - shapes.keys())[:5]}"
  assert {n: s[::-1] for n, s in shapes.items()} == {n: want[n] for n in shapes}
  if synth.PRESETS[name].arch == "deepseek2" and synth.PRESETS[name].moe is not None:
    g = MetadataView({"general.architecture": "deepseek2", **meta})
    assert gating(g, meta["deepseek2.block_count"]) == (Gating.SIGMOID if name.startswith("glm") else Gating.SOFTMAX)
  assert len(meta["tokenizer.ggml.token_type"]) == len(meta["tokenizer.ggml.tokens"])

@pytest.mark.parametrize("name", [n for n in synth.PRESETS if not n.endswith("-tiny")])
def test_full_presets_are_what_llama_cpp_loads(name: str):
  assert_llama_cpp_loads(name, synth.metadata(name), {t.name: t.shape for t in synth.tensor_plan(name)})

@pytest.mark.parametrize("name", [n for n in synth.PRESETS if n.endswith("-tiny")])
def test_tiny_files_are_what_llama_cpp_loads(name: str, synthesized):
  g, p = GGUFFile(synthesized(name)), synth.PRESETS[name]
  meta = {k: g.get(k) for k in g.keys()}
  assert meta.keys() == {"general.architecture", *synth.metadata(name)} and g.architecture == p.arch
  assert_llama_cpp_loads(name, meta, {n: t.shape for n, t in g.tensors.items()})
  assert [(n, t.shape) for n, t in g.tensors.items()] == [(t.name, t.shape) for t in synth.tensor_plan(name)]
  # tinyzoo reads the tokenizer too, with the real model's pre-tokenizer where it knows it (see models.synth)
  tok = Tokenizer.from_gguf(g)
  assert (tok.vocab.model, tok.vocab.pre, tok.vocab_size) == (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"], p.vocab_size)
  if p.arch == "gpt-oss":   # its default quant: MXFP4 experts, Q8_0 every other matmul, F32 routers, biases, sinks and norms
    types = {n: t.ggml_type for n, t in g.tensors.items()}
    assert {types[n] for n in types if "_exps.weight" in n} == {T.MXFP4} and len(g.tensors["blk.0.ffn_up_exps.weight"].shape) == 3
    assert {types[n] for n in types if n.endswith(".weight") and len(g.tensors[n].shape) == 2 and "gate_inp" not in n} == {T.Q8_0}
    assert {types[n] for n in types if n.endswith(".bias") or len(g.tensors[n].shape) == 1 or "gate_inp" in n} == {T.F32}

def test_glm_gating_key():
  """Converted GLM-4.7-Flash files have no gating key (llama.cpp picks sigmoid by their shape); the tiny one, which that rule
  misses, writes sigmoid (2), and the DeepSeek-V2-Lite presets softmax (1) as their converter does."""
  assert "deepseek2.expert_gating_func" not in synth.metadata("glm-4.7-flash")
  assert synth.metadata("glm-4.7-flash-tiny")["deepseek2.expert_gating_func"] == 2
  assert {synth.metadata(n)["deepseek2.expert_gating_func"] for n in ("deepseek-v2-lite", "deepseek-v2-lite-tiny")} == {1}
  assert "deepseek2.attention.q_lora_rank" not in synth.metadata("deepseek-v2-lite")   # as its converter: llama.cpp reads none at 27 blocks
  assert synth.metadata("deepseek-v2-lite-tiny")["deepseek2.attention.q_lora_rank"] == 0   # required at 3 blocks

def test_moe_preset_bytes_are_pinned(tmp_path: Path, synthesized):
  """gpt-oss-20b-tiny (MXFP4 experts) is byte for byte the file moe_llama_cpp.json was made from, written again or not."""
  name = "gpt-oss-20b-tiny"
  want = next(c["sha256"] for c in MOE_FIXTURES if (c["preset"], c["quant"], c["seed"]) == (name, "MXFP4", 0))
  again, other = synth.synthesize(name, tmp_path / "again.gguf"), synth.synthesize(name, tmp_path / "other.gguf", seed=1)
  assert sha256(again) == sha256(synthesized(name)) == want != sha256(other)

# ---- reproducibility and errors

def test_same_seed_same_bytes(tmp_path: Path, synthesized):
  name = "gemma3-1b-tiny"
  again, other = synth.synthesize(name, tmp_path / "again.gguf"), synth.synthesize(name, tmp_path / "other.gguf", seed=1)
  assert sha256(again) == sha256(synthesized(name)) != sha256(other)
  assert GGUFFile(other).get("general.name") == f"synthetic {name} (seed 1)"

def test_layers_and_quant(tmp_path: Path, synthesized):
  g2, g3 = GGUFFile(synthesized("llama3.2-1b-tiny")), GGUFFile(synth.synthesize("llama3.2-1b-tiny", tmp_path / "l3.gguf", layers=3))
  assert (ModelConfig.from_gguf(g3).n_layers, len(g3.tensors) - len(g2.tensors)) == (3, 9)
  raw = lambda g, n: bytes(g.raw(n))
  assert raw(g2, "blk.1.ffn_down.weight") == raw(g3, "blk.1.ffn_down.weight")   # each tensor's stream depends on its name only
  for quant in ("F16", "BF16", "Q4_1", "Q5_0", "Q8_0"):
    g = GGUFFile(synth.synthesize("smollm2-135m-tiny", tmp_path / f"{quant}.gguf", quant=quant))
    assert g.tensors["blk.0.attn_q.weight"].ggml_type == T[quant]
    assert g.tensors["token_embd.weight"].ggml_type == (T[quant] if quant in ("F16", "BF16") else T.Q8_0)

@pytest.mark.parametrize("args,message", [
  (("llama9",), r"unknown synthetic preset 'llama9' \(choose from llama3.2-1b, llama3.2-1b-tiny, .*qwen3-0.6b-tiny\)"),
  (("gemma3-1b-tiny", "Q3_K"), r"unknown quant type 'Q3_K' \(choose from F32, F16, BF16, Q4_0, .*MXFP4\)"),
  (("smollm2-135m-tiny", "Q4_K"), r"Q4_K needs rows of whole 256-element blocks; smollm2-135m-tiny's blk.0.attn_q.weight has rows of 96"),
  (("gemma3-1b-tiny", None, 0, 0), r"layers must be an integer >= 1, got 0"),
  (("gemma3-1b-tiny", None, -1), r"seed must be an integer >= 0, got -1"),
  (("gpt-oss-20b-tiny", "Q4_K"), r"Q4_K needs rows of whole 256-element blocks; gpt-oss-20b-tiny's blk.0.attn_q.weight has rows of 96"),
  (("smollm2-135m-tiny", "MXFP4"), r"MXFP4 is for expert weights, and smollm2-135m-tiny has no experts"),
  (("glm-4.7-flash-tiny", None, 0, 27), r"llama.cpp reads no q-LoRA rank from a deepseek2 file of 27 blocks .*glm-4.7-flash-tiny has q-LoRA"),
])
def test_bad_arguments(tmp_path: Path, args: tuple, message: str):
  with pytest.raises(ValueError, match=message): synth.synthesize(args[0], tmp_path / "x.gguf", *args[1:])
  assert not list(tmp_path.iterdir())

# ---- tokenizers

def test_bpe_vocabulary_is_well_formed():
  for name in ("llama3.2-1b", "smollm2-135m-tiny"):
    meta = synth.metadata(name)
    tokens, types, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.merges"]
    ids = {t: i for i, t in enumerate(tokens)}
    assert len(ids) == len(tokens) == synth.PRESETS[name].vocab_size and " " not in "".join(tokens[:-256])
    n_special = len(synth.PRESETS[name].vocab.specials)
    assert len(merges) == len(tokens) - 256 - n_special and set(types[-n_special:]) == {TokenType.CONTROL} and set(types[:-n_special]) == {1}
    for rank, merge in enumerate(merges):
      left, right = merge.split(" ")
      assert ids[left] < 256 + rank and ids[right] < 256 + rank and ids[left + right] == 256 + rank, merge
    assert tokens[meta["tokenizer.ggml.bos_token_id"]] == synth.PRESETS[name].vocab.bos

def test_spm_vocabulary_is_well_formed():
  meta = synth.metadata("gemma3-1b-tiny")
  tokens, types, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], np.array(meta["tokenizer.ggml.scores"])
  assert tokens[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"] and tokens[4:260] == [f"<0x{b:02X}>" for b in range(256)]
  assert types[:260] == [3, 3, 3, 2] + [6] * 256 and set(types[260:]) == {1} and len(set(tokens)) == len(tokens) == 2048
  assert (np.diff(scores[260:]) < 0).all() and tokens[260] == "\u2581"
  pieces = set(tokens[260:])
  assert all(len(p) == 1 or any(p[:i] in pieces and p[i:] in pieces for i in range(1, len(p))) for p in pieces)   # reachable by merges

# ---- the catalog

def test_catalog_synthesizes_presets_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path))
  path = resolve_model("gemma3-270m-tiny")
  assert path == tmp_path / "synth" / f"gemma3-270m-tiny-{synth.digest('gemma3-270m-tiny')[:16]}.gguf"
  assert GGUFFile(path).get("general.name") == "synthetic gemma3-270m-tiny (seed 0)"
  stamp = path.stat().st_mtime_ns
  assert resolve_model("synth:gemma3-270m-tiny") == path and path.stat().st_mtime_ns == stamp
  # the file written by another source is replaced, and other presets' files stay
  stale, other = tmp_path / "synth" / "gemma3-270m-tiny-0123456789abcdef.gguf", tmp_path / "synth" / "gemma3-270m-tiny-x-0123456789abcdef.gguf"
  path.rename(stale)
  other.write_bytes(b"")
  assert resolve_model("gemma3-270m-tiny") == path and not stale.exists() and other.exists()
  assert catalog.synthetic_names()[:3] == ["llama3.2-1b", "llama3.2-1b-tiny", "synth:smollm2-135m"]
  with pytest.raises(ModelNotFound, match=r"nope: no such file.*synthetic: llama3.2-1b, .*synth:gemma3-270m, gemma3-270m-tiny"):
    resolve_model("nope")
  with pytest.raises(ModelNotFound, match="synth:nope: no such file"): resolve_model("synth:nope")

def test_a_presets_digest_follows_what_decides_its_bytes(monkeypatch: pytest.MonkeyPatch):
  """The catalog's file of a preset is named by synth.digest: it changes with the preset, the quant, the seed, the layers
  and the code that writes the bytes (WRITERS), and reads no other source of tinyzoo's."""
  name = "llama3.2-1b-tiny"
  base = synth.digest(name)
  assert synth.digest(name) == base and len({base, synth.digest(name, "Q8_0"), synth.digest(name, seed=1), synth.digest(name, layers=3)}) == 4
  read = []
  monkeypatch.setattr(jit_cache, "source_digest", lambda paths=None: read.append(paths) or f"other {paths}")
  assert synth.digest(name) != base and read == [synth.WRITERS]
  monkeypatch.undo()
  monkeypatch.setitem(synth.PRESETS, name, dataclasses.replace(synth.PRESETS[name], ffn_dim=768))
  assert synth.digest(name) != base

# ---- agreement with llama.cpp

@pytest.mark.parametrize("name", DENSE)
def test_agrees_with_llama_cpp(name: str, synthesized):
  want, path = FIXTURES[name], synthesized(name)
  assert file_sha256(path) == want["sha256"], "the file is not the one the fixture was made from: rerun make_synth_fixtures.py"
  tok = Tokenizer.from_gguf(GGUFFile(path))
  for case in want["tokenized"]:
    assert tok.encode(case["text"]) == case["ids"] and tok.encode(case["text"], parse_special=True) == case["ids_special"], case["text"]
  r = subprocess.run([sys.executable, "-m", "tinyzoo", "logits", str(path), "--tokens", ",".join(map(str, want["tokens"])), "--top", "20",
                      "--greedy", "4", "--ctx", str(CTX), "--json"], capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr
  have = json.loads(r.stdout)["cases"][0]
  assert have["tokens"] == want["tokens"]
  ours, theirs = dict(have["top"]), dict(want["top20"])
  assert len(ours.keys() & theirs.keys()) >= 15, f"top-20 overlap {len(ours.keys() & theirs.keys())}"
  worst = max(abs(ours[t] - theirs[t]) for t in ours.keys() & theirs.keys())
  assert worst <= TOLERANCE, f"a top-20 logit differs by {worst:.3f}"
  assert_greedy_parts_only_at_a_near_tie(have["greedy"], want)

def assert_greedy_parts_only_at_a_near_tie(greedy: list[int], want: dict) -> None:
  """The greedy tokens equal the fixture's up to a step where the fixture's top two logits lay within NOISE of each other
  (there two builds' roundings may choose either, and the steps after follow another text)."""
  for step, (a, b, margin) in enumerate(zip(greedy, want["greedy"], want["greedy_margins"])):
    if a == b: continue
    assert margin < NOISE, f"greedy step {step} gives {a}, llama.cpp {b} by a margin of {margin:.3f}"
    break

@pytest.mark.parametrize("name", DENSE)
def test_fixture_is_current_llama_cpp(name: str, synthesized):
  """Only where llama-cpp-python is installed: this llama.cpp reproduces the fixture on the file, and tokenizes more texts
  as tinyzoo. A llama.cpp built for another CPU computes its quantized dots another way: AVX2 only (this repo's AMD EPYC)
  against the AVX-512 build the fixture came from moved these logits by up to 0.18, reordering near ties (qwen3-0.6b's
  second greedy step, a margin of 0.010); the agreement test's tolerance and its rule for near ties cover that."""
  pytest.importorskip("llama_cpp")
  from tests.models.fixtures.make_synth_fixtures import greedy_case
  import llama_cpp
  want, path = FIXTURES[name], synthesized(name)
  llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
  have = greedy_case(llm, want["tokens"])
  assert_greedy_parts_only_at_a_near_tie(have["greedy"], want)
  ours, theirs = dict(have["top20"]), dict(want["top20"])
  assert len(ours.keys() & theirs.keys()) >= 15 and max(abs(ours[t] - theirs[t]) for t in ours.keys() & theirs.keys()) <= TOLERANCE
  tok = Tokenizer.from_gguf(GGUFFile(path))
  for text in ["ÀÉÎÕÜ ßẞ ﬁ", "a" * 40, " ", "", "x\r\ny\u3000z", "<|eot_id|><end_of_turn><|im_end|>", "12345678901234567890"]:
    for special in (False, True):
      assert tok.encode(text, parse_special=special) == llm.tokenize(text.encode(), add_bos=True, special=special), (text, special)
