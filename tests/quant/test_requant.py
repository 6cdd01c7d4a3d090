"""quant.requant: the copy keeps every metadata key with its value and GGUF type (only general.name and general.file_type
change), converts exactly the weights it should, and is written whole or not at all."""
import os
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFValueType as V, GGUFWriter, LlamaFileType, quants
import quant.requant as requant
from quant.gguf_file import GGUFFile
from quant.quantize import quantize
from quant.random_blocks import random_blocks
from quant.requant import requantized_copy

# key -> (GGUF type, value, element type of an array)
METADATA = {
  "general.name": (V.STRING, "Tiny Test", None),
  "general.file_type": (V.UINT32, int(LlamaFileType.MOSTLY_Q8_0), None),
  "general.tags": (V.ARRAY, ["a", "b"], V.STRING),
  "llama.block_count": (V.UINT32, 2, None),
  "llama.context_length": (V.UINT64, 2**40, None),
  "llama.expert_count": (V.INT16, -3, None),
  "llama.rope.freq_base": (V.FLOAT32, 10000.0, None),
  "llama.rope.scale": (V.FLOAT64, 0.1, None),
  "llama.use_parallel_residual": (V.BOOL, True, None),
  "llama.small": (V.UINT8, 7, None),
  "tokenizer.ggml.model": (V.STRING, "gpt2", None),
  "tokenizer.ggml.tokens": (V.ARRAY, ["<s>", "</s>", "hé", "\u2581world", ""], V.STRING),
  "tokenizer.ggml.scores": (V.ARRAY, [0.0, -1.5, -2.25, 3e-8, float("-inf")], V.FLOAT32),
  "tokenizer.ggml.token_type": (V.ARRAY, [3, 3, 1, 1, 6], V.INT32),
  "tokenizer.ggml.merges": (V.ARRAY, ["h é", "\u2581 world"], V.STRING),
  "tokenizer.ggml.bytes": (V.ARRAY, [0, 255, 128], V.UINT8),
  "tokenizer.ggml.ids64": (V.ARRAY, [2**63 - 1, 0], V.UINT64),
  "tokenizer.ggml.doubles": (V.ARRAY, [1.0 / 3, -2.5], V.FLOAT64),
  "tokenizer.ggml.flags": (V.ARRAY, [True, False], V.BOOL),
  "tokenizer.ggml.bos_token_id": (V.UINT32, 0, None),
}

# name -> (type, logical shape); the comment says what a copy to Q4_K does with it
TENSORS = {
  "token_embd.weight": (T.Q8_0, (8, 512)),        # requantized
  "blk.0.attn_q.weight": (T.F16, (4, 256)),       # requantized
  "blk.0.attn_k.weight": (T.Q8_0, (4, 96)),       # rows are not whole Q4_K blocks: kept (Q4_0 takes them)
  "blk.0.attn_v.weight": (T.Q4_K, (2, 256)),      # already Q4_K: kept
  "blk.0.ffn_down.weight": (T.BF16, (3, 512)),    # requantized
  "blk.0.ffn_up.weight": (T.F32, (4, 256)),       # F32: kept
  "blk.0.attn_norm.weight": (T.F32, (256,)),      # 1-D: kept
  "blk.0.attn_q.bias": (T.F16, (2, 256)),         # not a .weight: kept
  "blk.0.ffn_gate_exps.weight": (T.Q8_0, (2, 2, 256)),   # 3-D: kept
}

@pytest.fixture
def src(tmp_path: Path, rng: np.random.Generator) -> Path:
  path = tmp_path / "tiny.gguf"
  w = GGUFWriter(path, "llama")
  w.add_custom_alignment(64)
  for key, (vtype, value, sub) in METADATA.items(): w.add_key_value(key, value, vtype, sub_type=sub)
  for name, (t, shape) in TENSORS.items():
    raw = random_blocks(t, shape, rng, scale=0.05)
    w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=t)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return path

def field_bytes(r: GGUFReader, key: str) -> bytes:
  f = r.fields[key]
  return b"".join(p.tobytes() for p in f.parts)

def converted(t: T) -> set[str]:
  return {n for n, (st, shape) in TENSORS.items()
          if n.endswith(".weight") and len(shape) == 2 and st != T.F32 and st != t and shape[-1] % quants.GGML_QUANT_SIZES[t][0] == 0}

@pytest.mark.parametrize("t", [T.Q4_K, T.Q4_0], ids=lambda t: t.name)
def test_copy_keeps_metadata_and_converts_weights(src: Path, tmp_path: Path, t: T):
  out = requantized_copy(src, t, tmp_path / "out" / "tiny.gguf")
  assert out == tmp_path / "out" / "tiny.gguf" and os.listdir(out.parent) == ["tiny.gguf"]
  a, b = GGUFReader(src), GGUFReader(out)
  assert list(a.fields) == list(b.fields) and b.alignment == 64
  for key in a.fields:
    if key in ("general.name", "general.file_type"): continue
    assert a.fields[key].types == b.fields[key].types, key
    assert field_bytes(a, key) == field_bytes(b, key), key
  assert b.fields["general.name"].contents() == f"Tiny Test (requantized to {t.name})" and b.fields["general.name"].types == [V.STRING]
  want_ftype = {T.Q4_K: LlamaFileType.MOSTLY_Q4_K_S, T.Q4_0: LlamaFileType.MOSTLY_Q4_0}[t]
  assert b.fields["general.file_type"].contents() == want_ftype and b.fields["general.file_type"].types == [V.UINT32]
  assert GGUFFile(out).get("tokenizer.ggml.scores")[-1] == float("-inf")

  assert converted(t) == ({"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight"} | ({"blk.0.attn_k.weight", "blk.0.attn_v.weight"}
                                                                                                       if t == T.Q4_0 else set()))
  ga, gb = GGUFFile(src), GGUFFile(out)
  assert list(ga.tensors) == list(gb.tensors)
  for name, (st, shape) in TENSORS.items():
    ia, ib = ga.tensors[name], gb.tensors[name]
    raw_a, raw_b = ga.raw(ia.name), gb.raw(ib.name)
    assert ib.shape == shape and ib.offset % 64 == 0, name
    if name not in converted(t):
      assert ib.ggml_type == st and raw_a.tobytes() == raw_b.tobytes(), name
      continue
    assert ib.ggml_type == t, name
    values = quants.dequantize(raw_a, st).reshape(shape)
    np.testing.assert_array_equal(raw_b.reshape(*shape[:-1], -1), quantize(values, t), err_msg=name)
    got = gb.load(name).dequantize().numpy()   # tinyzoo reads it back, close to the source weights
    assert np.sqrt(np.mean((got - values) ** 2)) < 0.15 * values.std(), name

def test_default_path_and_reuse(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path / "cache"))
  out = requantized_copy(src, "q4_0")
  assert out == tmp_path / "cache" / "requant" / "tiny.Q4_0.gguf" and out.exists()
  stamp = out.stat().st_mtime_ns
  monkeypatch.setattr(requant, "quantize", lambda *a: pytest.fail("an up-to-date copy was written again"))
  assert requantized_copy(src, T.Q4_0) == out and out.stat().st_mtime_ns == stamp
  monkeypatch.undo()
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path / "cache"))
  os.utime(src, ns=(stamp + 10**9, stamp + 10**9))   # a newer source is copied again
  assert requantized_copy(src, T.Q4_0) == out and out.stat().st_mtime_ns != stamp

def test_failure_leaves_nothing(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  calls = []
  def failing(values, t):
    calls.append(t)
    if len(calls) == 2: raise RuntimeError("quantizer failed")
    return quantize(values, t)
  monkeypatch.setattr(requant, "quantize", failing)
  out = tmp_path / "out" / "tiny.gguf"
  with pytest.raises(RuntimeError, match="quantizer failed"): requantized_copy(src, T.Q4_K, out)
  assert len(calls) == 2 and os.listdir(out.parent) == []
  out.write_bytes(b"old")   # an existing copy older than the source is left as it was
  os.utime(out, (0, 0))
  calls.clear()
  with pytest.raises(RuntimeError, match="quantizer failed"): requantized_copy(src, T.Q4_K, out)
  assert out.read_bytes() == b"old" and os.listdir(out.parent) == ["tiny.gguf"]

def test_errors(src: Path, tmp_path: Path):
  with pytest.raises(ValueError, match=r"cannot requantize to Q2_K \(supported: "): requantized_copy(src, T.Q2_K, tmp_path / "x.gguf")
  with pytest.raises(ValueError, match="unknown GGML type 'Q9'"): requantized_copy(src, "Q9", tmp_path / "x.gguf")
  with pytest.raises(ValueError, match="would overwrite its source"): requantized_copy(src, T.Q4_0, src)
  assert not (tmp_path / "x.gguf").exists()
