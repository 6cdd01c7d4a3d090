"""GGUF reading: packed tensors and metadata round-trip through gguf's writer; bad files give one-line errors."""
import struct
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from quant.formats import FORMATS
from quant.gguf_file import GGUFError, GGUFFile
from quant.random_blocks import random_blocks
from tests.gguf_files import small_gguf, type_field_offset

@pytest.fixture
def every_type(tmp_path: Path, rng: np.random.Generator):
  tensors = {f"t.{t.name}": (t, random_blocks(t, (3, 256), rng), (3, 256)) for t in FORMATS}
  tensors["experts.Q4_0"] = (T.Q4_0, random_blocks(T.Q4_0, (4, 2, 64), rng), (4, 2, 64))
  return small_gguf(tmp_path / "every.gguf", tensors, {"llama.rope.freq_base": 10000.0}), tensors

def test_round_trip_keeps_blocks(every_type):
  path, tensors = every_type
  g = GGUFFile(path)
  assert g.architecture == "llama" and g.get("llama.block_count") == 2 and g.get("llama.rope.freq_base") == 10000.0
  assert g.array_len("tokenizer.ggml.tokens") == 3 and g.get("tokenizer.ggml.tokens") == ["a", "b", "c"] and g.get("nope", 7) == 7
  assert set(g.tensors) == set(tensors)
  for name, (t, raw, shape) in tensors.items():
    qt = g.load(name)
    # one-element blocks (F32, F16, BF16) are kept as unsigned integers of their width, the others as bytes
    stored = "unsigned char" if qt.format.block_elems > 1 else {2: "unsigned short", 4: "unsigned int"}[qt.format.block_bytes]
    assert (qt.ggml_type, qt.shape, qt.blocks.dtype.name) == (t, shape, stored), name
    np.testing.assert_array_equal(qt.blocks.numpy().view(np.uint8).ravel(), np.ascontiguousarray(raw).view(np.uint8).ravel(), err_msg=name)
  assert len(dict(g.load_all(progress=False))) == len(tensors)

def test_missing_key_and_tensor(every_type):
  g = GGUFFile(every_type[0])
  with pytest.raises(GGUFError, match=r"every\.gguf: missing metadata key 'llama\.context_length'"): g.require("llama.context_length")
  with pytest.raises(GGUFError, match=r"every\.gguf: missing tensor 'output\.weight'"): g.load("output.weight")

def test_unsupported_type_is_named(tmp_path: Path, rng: np.random.Generator):
  path = small_gguf(tmp_path / "q2k.gguf", {"w": (T.Q2_K, rng.integers(0, 256, (2, 84), dtype=np.uint8), (2, 256))})
  with pytest.raises(GGUFError, match=r"q2k\.gguf: tensor 'w': GGML type Q2_K is not supported \(supported: F32, "): GGUFFile(path).load("w")

def corrupt(path: Path, data: bytes) -> str:
  path.write_bytes(data)
  with pytest.raises(GGUFError) as e: GGUFFile(path)
  msg = str(e.value)
  assert msg.startswith(str(path) + ": ") and "\n" not in msg
  return msg

def test_not_gguf(tmp_path: Path):
  assert "not a GGUF file (starts with b'PK" in corrupt(tmp_path / "x.gguf", b"PK\x03\x04" + bytes(100))
  assert "not a GGUF file (empty" in corrupt(tmp_path / "x.gguf", b"")
  with pytest.raises(GGUFError, match="No such file"): GGUFFile(tmp_path / "absent.gguf")

def test_truncated(every_type, tmp_path: Path):
  data = every_type[0].read_bytes()
  assert "truncated or corrupt GGUF header or metadata" in corrupt(tmp_path / "h.gguf", data[:40])
  assert "past the end of the file" in corrupt(tmp_path / "d.gguf", data[:-100])
  assert "past the end of the file" in corrupt(tmp_path / "m.gguf", data[:len(data) * 3 // 4])

def test_unknown_type(every_type, tmp_path: Path):
  data = bytearray(every_type[0].read_bytes())
  struct.pack_into("<I", data, type_field_offset(data, "t.Q4_K"), 77)
  assert corrupt(tmp_path / "u.gguf", bytes(data)).endswith("tensor 't.Q4_K' has unknown GGML type 77")

def test_data_offset_past_end(every_type, tmp_path: Path):
  data = bytearray(every_type[0].read_bytes())
  struct.pack_into("<Q", data, type_field_offset(data, "t.F32") + 4, 1 << 40)
  assert "tensor 't.F32' data ends at byte" in corrupt(tmp_path / "o.gguf", bytes(data))
