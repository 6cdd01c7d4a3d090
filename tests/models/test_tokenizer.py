"""Tokenizers against llama.cpp: the real models on prompts llama.cpp tokenized (fixtures/make_tokenizer_fixtures.py), llama.cpp's own
tokenizer test vocabularies, decoding and streaming, chat templates, and the errors for what is not supported."""
import functools
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
import pytest
from gguf import GGUFWriter
from models.catalog import ModelNotFound, resolve_model
from ops.cache import cache_dir
from models.tokenizer import Tokenizer
from quant.gguf_file import GGUFFile

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "tokenizer_llama_cpp.json").read_text(encoding="utf-8"))["models"]
REFERENCES = Path("/work/shared/references")
LLAMA_CPP_PYTHON = "0.3.36"
# the tokenizer test vocabularies in its sdist (vendor/llama.cpp/models/ggml-vocab-*.gguf); .inp/.out hold inputs and expected ids
VOCABS = ["aquila", "baichuan", "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "gpt-neox",
          "llama-bpe", "llama-spm", "mpt", "nomic-bert-moe", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
UNSUPPORTED = {"bert-bge": "'bert'", "nomic-bert-moe": "'t5'"}   # WordPiece and Unigram

@functools.cache
def real(name: str) -> Tokenizer:
  try: return Tokenizer.from_gguf(GGUFFile(resolve_model(name)))
  except ModelNotFound as e: pytest.skip(str(e))

# ---- the real models: llama.cpp's ids, decoding back to the text

CASES = [(name, i) for name, cases in FIXTURES.items() for i in range(len(cases))]

@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_llama_cpp_ids(name: str, i: int):
  case, tok = FIXTURES[name][i], real(name)
  assert tok.encode(case["text"]) == case["ids"]
  assert tok.encode(case["text"], add_special=False, parse_special=True) == case["ids_special"]
  assert tok.decode(case["ids"]) == case["decoded"]

@pytest.mark.parametrize("name", FIXTURES)
def test_round_trip(name: str):
  tok = real(name)
  bos = tok.vocab.tokens[tok.bos_id] if tok.vocab.add_bos else ""
  for case in FIXTURES[name]:
    assert tok.decode(tok.encode(case["text"])) == case["text"]
    assert tok.decode(tok.encode(case["text"], parse_special=True), special=True) == bos + case["text"]

@pytest.mark.parametrize("name", FIXTURES)
def test_shared_references(name: str):
  if not (path := REFERENCES / f"{name}.json").exists(): pytest.skip(f"{path} is not on this machine")
  tok = real(name)
  for case in json.loads(path.read_text())["cases"]: assert tok.encode(case["prompt"]) == case["tokens"], case["prompt"]

def test_properties():
  gemma, smollm = real("gemma3-270m"), real("smollm2-135m")
  assert (gemma.kind, gemma.vocab_size, gemma.bos_id, gemma.eos_id) == ("SentencePiece", 262144, 2, 1)
  assert {1, 106} <= gemma.stop_ids and gemma.vocab.tokens[106] == "<end_of_turn>"
  assert (smollm.kind, smollm.vocab_size, smollm.bos_id, smollm.eos_id) == ("byte-level BPE", 49152, 1, 2)
  assert smollm.stop_ids == {0, 2}   # <|endoftext|>, <|im_end|>
  assert gemma.encode("Hi")[0] == 2 and smollm.encode("Hi") == smollm.encode("Hi", add_special=False)   # gemma adds BOS, smollm does not

# ---- streaming

@pytest.mark.parametrize("name", FIXTURES)
def test_stream_decoder(name: str):
  tok, text = real(name), "llamas 🦙 melt 🫠 ok"
  ids = tok.encode(text, add_special=False)
  stream = tok.stream()
  chunks = [stream.add(i) for i in ids] + [stream.flush()]
  assert "".join(chunks) == text and "\ufffd" not in "".join(chunks)
  assert all(len(tok.piece_bytes(i)) for i in ids)
  if name == "smollm2-135m": assert "" in chunks[:-1]   # byte-level BPE spells 🫠 with tokens that end inside the character

def test_stream_decoder_holds_partial_characters():
  tok = real("gemma3-270m")
  byte_ids = [tok.vocab.token_to_id[f"<0x{b:02X}>"] for b in "🦙".encode()]
  stream = tok.stream()
  assert [stream.add(i) for i in byte_ids] == ["", "", "", "🦙"]
  assert stream.add(byte_ids[0]) == "" and stream.flush() == "\ufffd"

# ---- chat templates

def test_chat_smollm():
  tok = real("smollm2-135m")
  assert tok.render_chat([{"role": "user", "content": "Hi"}]) == (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
  assert tok.render_chat(chat, add_generation_prompt=False) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
  expected = next(c for c in FIXTURES["smollm2-135m"] if c["text"].startswith("<|im_start|>system\nBe brief."))["ids_special"]
  assert tok.encode_chat(chat, add_generation_prompt=False) == expected

def test_chat_gemma():
  tok = real("gemma3-270m")
  chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
          {"role": "user", "content": " Why? "}]
  assert tok.render_chat(chat) == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                                    "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")
  expected = next(c for c in FIXTURES["gemma3-270m"] if c["text"].startswith("<start_of_turn>user\nHi there"))["ids_special"]
  assert tok.encode_chat([{"role": "user", "content": "Hi there"}]) == [tok.bos_id] + expected   # one BOS, written by the template
  with pytest.raises(ValueError, match="alternate"): tok.render_chat([{"role": "assistant", "content": "Hi"}])

# ---- llama.cpp's tokenizer test vocabularies

@pytest.fixture(scope="session")
def llama_vocabs() -> Path:
  """The ggml-vocab-* files of the llama-cpp-python sdist, downloaded once into the cache (moved into place whole)."""
  target = cache_dir() / f"llama.cpp-vocabs-{LLAMA_CPP_PYTHON}"
  if target.exists(): return target
  target.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp]
    if (r := subprocess.run(cmd, capture_output=True, text=True)).returncode: pytest.skip(f"pip download failed: {r.stderr.strip()[-500:]}")
    (out := Path(tmp) / "vocabs").mkdir()
    with tarfile.open(next(Path(tmp).glob("*.tar.gz"))) as tar:
      for member in tar.getmembers():
        if member.isfile() and "/vendor/llama.cpp/models/ggml-vocab-" in member.name:
          member.name = Path(member.name).name
          tar.extract(member, out, filter="data")
    try: os.replace(out, target)
    except OSError:
      if not target.exists(): raise   # else a concurrent run put it there first
  return target

@functools.cache
def vocab_tokenizer(path: Path) -> Tokenizer: return Tokenizer.from_gguf(GGUFFile(path))

def vocab_cases(path: Path) -> list[tuple[str, list[int]]]:
  """Inputs split as llama.cpp's test-tokenizer-0 splits them, with the expected ids, one line each."""
  sep, raw = "\n__ggml_vocab_test__\n", path.with_suffix(".gguf.inp").read_text(encoding="utf-8")
  texts = raw.removesuffix(sep).split(sep)   # a final separator ends the last input, it does not start an empty one
  expected = [[int(t) for t in line.split()] for line in path.with_suffix(".gguf.out").read_text().splitlines()]
  assert len(texts) == len(expected)
  return list(zip(texts, expected))

@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vocab(name: str, llama_vocabs: Path):
  path = llama_vocabs / f"ggml-vocab-{name}.gguf"
  if name in UNSUPPORTED:
    with pytest.raises(ValueError, match=f"unsupported tokenizer.ggml.model {UNSUPPORTED[name]}"): vocab_tokenizer(path)
    return
  tok = vocab_tokenizer(path)
  if not path.with_suffix(".gguf.inp").exists():   # no expected ids: the text must survive the trip
    for case in FIXTURES["smollm2-135m"]: assert tok.decode(tok.encode(case["text"], add_special=False)) == case["text"]
    return
  for text, expected in vocab_cases(path): assert tok.encode(text, add_special=False) == expected, text

# ids from llama.cpp (llama-cpp-python 0.3.36) for behaviour the .inp files do not reach
QUIRKS = [
  ("phi-3", "<|user|>\nHi<|end|>\n<|assistant|>\n", True, [1, 32010, 6324, 32007, 32001]),   # Phi-3's specials swallow the whitespace after them
  ("phi-3", "<|user|> Hi <|end|>  \n", True, [1, 32010, 6324, 29871, 32007]),
  ("phi-3", "<|user|> Hi <|end|>  \n", False, [1, 529, 29989, 1792, 29989, 29958, 6324, 529, 29989, 355, 29989, 29958, 259, 13]),
  ("deepseek-llm", "a    \u3000b", False, [64, 251, 88946, 65]),   # U+3000 is "\v" to its regexes, not the U+3000 in its punctuation class
]

@pytest.mark.parametrize("name,text,parse_special,expected", QUIRKS)
def test_llama_cpp_quirks(name: str, text: str, parse_special: bool, expected: list[int], llama_vocabs: Path):
  tok = vocab_tokenizer(llama_vocabs / f"ggml-vocab-{name}.gguf")
  assert tok.encode(text, add_special=name == "phi-3", parse_special=parse_special) == expected

# ---- what is not supported, on small GGUF files

def write_vocab(path: Path, meta: dict) -> GGUFFile:
  w = GGUFWriter(str(path), "llama")
  for key, value in meta.items():
    if isinstance(value, list): w.add_array(key, value)
    else: w.add_string(key, value)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return GGUFFile(path)

TINY_BPE = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}

def test_unsupported_vocabularies(tmp_path: Path):
  with pytest.raises(ValueError, match=r"tokenizer.ggml.model 'rwkv' \(supported: llama, gpt2, gemma4\)"):
    Tokenizer.from_gguf(write_vocab(tmp_path / "a.gguf", {**TINY_BPE, "tokenizer.ggml.model": "rwkv"}))
  with pytest.raises(ValueError, match=r"tokenizer.ggml.pre 'nonesuch' \(supported: .*smollm"):
    Tokenizer.from_gguf(write_vocab(tmp_path / "b.gguf", {**TINY_BPE, "tokenizer.ggml.pre": "nonesuch"}))
  with pytest.raises(ValueError, match="without tokenizer.ggml.merges"):
    Tokenizer.from_gguf(write_vocab(tmp_path / "c.gguf", {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]}))

def test_tiny_bpe_without_template(tmp_path: Path):
  tok = Tokenizer.from_gguf(write_vocab(tmp_path / "v.gguf", {**TINY_BPE, "tokenizer.ggml.pre": "gpt-2"}))
  assert tok.encode("abba") == [2, 1, 0] and tok.decode([2, 1, 0]) == "abba" and tok.encode("c") == []   # no token for "c": dropped
  with pytest.raises(ValueError, match="no tokenizer.chat_template"): tok.render_chat([{"role": "user", "content": "Hi"}])
