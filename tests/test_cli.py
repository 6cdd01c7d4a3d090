"""The tinyzoo command: `info` on real and written files, `run` on a real model, and one-line errors with exit status 1 on
bad input."""
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from quant.random_blocks import random_blocks
from tests.conftest import give_back
from tests.gguf_files import small_gguf, type_field_offset

def tinyzoo(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
  """The CLI in a process of its own, with `cache` as its cache directory if given."""
  env = {**os.environ, "TINYZOO_CACHE": str(cache)} if cache else None
  return subprocess.run([sys.executable, "-m", "tinyzoo", *args], capture_output=True, text=True, timeout=600, env=env)

@pytest.fixture
def small(tmp_path: Path, rng: np.random.Generator) -> Path:
  tensors = {"a.weight": (T.Q4_K, random_blocks(T.Q4_K, (4, 256), rng), (4, 256)), "b.weight": (T.F32, random_blocks(T.F32, (4, 8), rng), (4, 8)),
             "c.weight": (T.Q4_K, random_blocks(T.Q4_K, (2, 256), rng), (2, 256))}
  return small_gguf(tmp_path / "small.gguf", tensors, {"llama.rope.freq_base": 500000.0})

def test_info_small(small: Path):
  r = tinyzoo("info", str(small))
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert "architecture  llama" in r.stdout and any(l.split() == ["block_count", "2"] for l in lines)
  assert any(l.split() == ["rope.freq_base", "500000"] for l in lines)
  assert "tokenizer     gpt2 (byte-level BPE), 3 tokens" in r.stdout
  assert ["Q4_K", "2", f"{6 * 144:,}"] in [l.split() for l in lines] and ["F32", "1", "128"] in [l.split() for l in lines]

@pytest.mark.parametrize("model, facts", [
  ("gemma3-270m", ["architecture  gemma3", "SentencePiece), 262,144 tokens", "attention.sliding_window"]),
  ("smollm2-135m", ["architecture  llama", "byte-level BPE), 49,152 tokens, pre-tokenizer smollm", "rope.dimension_count"]),
])
def test_info_real_models(model: str, facts: list[str]):
  r = tinyzoo("info", model)
  assert r.returncode == 0, r.stderr
  for fact in facts: assert fact in r.stdout
  types = {l.split()[0] for l in r.stdout.splitlines()[-8:] if l.strip()}
  assert types >= ({"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"} if model == "gemma3-270m" else {"Q4_1", "Q8_0", "F32"})

def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str):
  assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
  assert r.stderr.count("\n") == 1 and r.stderr.startswith("tinyzoo: error: ") and "Traceback" not in r.stderr, r.stderr
  for n in needles: assert n in r.stderr, r.stderr

def test_bad_files(small: Path, tmp_path: Path):
  data = small.read_bytes()
  cases = {"text.gguf": (b"just some text\n", "not a GGUF file"), "short.gguf": (data[:len(data) - 64], "past the end of the file")}
  unknown = bytearray(data); struct.pack_into("<I", unknown, type_field_offset(data, "a.weight"), 1234)
  beyond = bytearray(data); struct.pack_into("<Q", beyond, type_field_offset(data, "b.weight") + 4, 1 << 36)
  cases["unknown.gguf"] = (bytes(unknown), "tensor 'a.weight' has unknown GGML type 1234")
  cases["beyond.gguf"] = (bytes(beyond), "tensor 'b.weight' data ends")
  for name, (content, needle) in cases.items():
    (tmp_path / name).write_bytes(content)
    assert_one_line_error(tinyzoo("info", str(tmp_path / name)), str(tmp_path / name), needle)

def test_a_bad_jit_cache_limit(monkeypatch):
  """An unreadable TINYZOO_JIT_CACHE_MB is one line from a command that keeps JITs; a command that keeps none runs."""
  monkeypatch.setenv("TINYZOO_JIT_CACHE_MB", "lots")
  assert_one_line_error(tinyzoo("cache"), "TINYZOO_JIT_CACHE_MB must be a whole number of MiB, got 'lots'")
  assert tinyzoo("info", "smollm2-135m").returncode == 0

def test_unknown_model_name():
  assert_one_line_error(tinyzoo("info", "no-such-model"), "not a registered model (registered: gemma3-270m, smollm2-135m; synthetic: llama3.2-1b,")

def test_matvec_bad_strategy(small: Path):
  assert_one_line_error(tinyzoo("matvec", str(small), "--strategies", "packed_dot,warp"), "unknown strategy 'warp'")

def test_matvec_bad_experts():
  for flags, needle in [(("--experts", "8"), "--experts takes N,K"), (("--experts", "2,3"), "need 1 <= K <= N, got 2,3"),
                        (("--mixed",), "a mixed gemv sums the chosen experts' outputs: give experts N,K")]:
    assert_one_line_error(tinyzoo("matvec", "--shape", "64x256", "--no-journal", *flags), needle)

def test_matvec_reports_each_strategy(small: Path):
  r = tinyzoo("matvec", str(small), "--iters", "2")
  assert r.returncode == 0, r.stderr
  rows = [l.split() for l in r.stdout.splitlines() if l.startswith("Q4_K")]
  assert [(row[1], row[3], row[4]) for row in rows] == [("a.weight", s, "1") for s in ("packed_dot", "fused", "dequant_cache")]

def test_help_explains_every_command_and_hint():
  """`--help` lists every command with its summary; each model command's help shows every kernel hint as a flag, with
  what it does and its default."""
  from profiles.hints import HINTS
  from tinyzoo.cli import parser
  commands = next(a for a in parser()._actions if a.dest == "command")
  r = tinyzoo("--help")
  assert r.returncode == 0
  for name, sub in commands.choices.items():
    summary = next(c.help for c in commands._choices_actions if c.dest == name)
    assert name in r.stdout and " ".join(summary.split()[:4]) in " ".join(r.stdout.split()), name
  for command in ("run", "logits", "bench", "profile"):
    text = " ".join(commands.choices[command].format_help().split())
    for name, hint in HINTS.items():
      assert f"--{name.replace('_', '-')}" in text and " ".join(hint.help.split()[:6]) in text, (command, name)
  from experiments.tune import CPU_SEARCH, GPU_SEARCH, SEARCH
  tune = " ".join(commands.choices["tune"].format_help().split())
  assert all(name in tune for name in (*SEARCH, *CPU_SEARCH)) and "JIT batch size" in tune, "tune --help names every hint it searches"
  assert list(GPU_SEARCH) == ["jit_batch_size"]

def test_bad_sampling_parameters():
  for flag, value, needle in [("--temperature", "-1", "temperature must be >= 0"), ("--top-p", "0", "top_p must be in (0, 1]"),
                              ("--top-k", "-3", "top_k must be >= 0"), ("--repeat-penalty", "0", "repeat_penalty must be > 0")]:
    assert_one_line_error(tinyzoo("run", "smollm2-135m", "-p", "hi", flag, value), needle)

def test_prompt_longer_than_context():
  assert_one_line_error(tinyzoo("run", "smollm2-135m", "-p", "word " * 40, "-n", "4", "--ctx", "16"), "exceeds the context of 16 tokens")

def test_unsupported_architecture(tmp_path: Path, rng: np.random.Generator):
  path = small_gguf(tmp_path / "bert.gguf", {"token_embd.weight": (T.F32, random_blocks(T.F32, (3, 8), rng), (3, 8))},
                    arch="bert")
  assert_one_line_error(tinyzoo("run", str(path), "-p", "hi"),
                        "unsupported architecture 'bert' (supported: deepseek2, gemma3, gpt-oss, llama, qwen3)")

def test_logits_sizes_an_unset_prompt_chunk_to_its_longest_prompt():
  """`logits` knows its prompts before it loads: a prompt chunk that no flag, profile or manifest sets holds the longest
  in a power of two of at least 16 rows, at most the default (128 on the CPU), where a short prompt had been padded to
  the whole default chunk; a chunk set by a flag stays."""
  from tinyzoo.cli import parser
  from tinyzoo.run import load
  for extra, longest, rows in (([], 5, 16), ([], 40, 64), ([], 1000, 128), (["--prefill-chunk", "24"], 5, 24)):
    rt = load(parser().parse_args(["logits", "smollm2-135m-tiny", "-p", "hi", "--no-cache", "--ctx", "2048", *extra]), longest)
    assert (rt.chunk, rt.hints.sources["prefill_chunk"]) == (rows, "runtime"), (extra, longest)
  assert load(parser().parse_args(["logits", "smollm2-135m-tiny", "-p", "hi", "--no-cache"])).hints.sources["prefill_chunk"] == "default"

SUMMARY = (r"load [0-9.]+ s \| compile ([0-9.]+) s \((.+)\) \| first token ([0-9.]+) s after loading \| "
           r"prompt \d+ tokens at [0-9.]+ tok/s \| decode \d+ tokens at [0-9.]+ tok/s \| \d+ kernels/token")

def test_run_streams_text_keeps_its_jits_and_a_second_run_compiles_nothing(tmp_path: Path, linked_store):
  """The summary gives load, compile and the first token's time apart from prompt and decode; the second run of the same model takes all four
  JITs from the cache directory and says so; --no-cache neither takes nor keeps any; `tinyzoo cache` counts them and
  --clear removes them. The runs' cache directory starts with links to the suite's compiled programs and schedules (it
  holds no JIT), and those the runs made are linked into the suite's store for its next run."""
  run = ["run", "smollm2-135m-tiny", "-p", "The capital of France is", "-n", "6", "--temperature", "0", "--ctx", "64"]
  summaries, texts = [], []
  for extra in ([], [], ["--no-cache"]):
    r = tinyzoo(*run, *extra, cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is") and len(r.stdout.strip()) > len("The capital of France is")
    summaries.append(re.fullmatch(SUMMARY, r.stderr.strip().splitlines()[-1]))
    texts.append(r.stdout)
  assert all(summaries), summaries
  (first, second, uncached) = [(float(m.group(1)), m.group(2)) for m in summaries]
  assert all(float(m.group(3)) + 0.05 >= float(m.group(1)) for m in summaries), summaries   # after the compile (shown to 0.1 s)
  assert first[0] > 0 and first[1] == "0 of 4 JITs from the cache" and second == (0.0, "4 of 4 JITs from the cache"), (first, second)
  assert uncached[0] > 0 and uncached[1] == "--no-cache" and texts[0] == texts[1] == texts[2]
  give_back(linked_store)
  assert re.fullmatch(r".*/jits: 4 captured JITs, [1-9][0-9]* compiled programs and [1-9][0-9]* schedules, [0-9.]+ MiB of at most 2048 MiB\n",
                      tinyzoo("cache", cache=tmp_path).stdout)
  assert tinyzoo("cache", "--clear", cache=tmp_path).stdout.startswith("removed ")
  assert " 0 captured JITs" in tinyzoo("cache", cache=tmp_path).stdout
