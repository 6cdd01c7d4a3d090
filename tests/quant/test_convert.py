"""`tinyzoo convert`: which tensors change type, the metadata it records (the manifest of kernel hints among it), the
converted model's answers against the original's, and clear errors."""
import json
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from models.catalog import resolve_model
from quant.files import file_sha256
from models.runtime import Runtime
from models.synth import synthesize
from ops.sampling import Sampler, SamplerParams
from profiles.device import resolve_hints
from quant.convert import convert
from quant.gguf_file import GGUFFile
from tinyzoo.cli import main

REFERENCES = Path(__file__).resolve().parents[2].parent / "shared" / "references"

@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
  return synthesize("llama3.2-1b-tiny", tmp_path_factory.mktemp("src") / "tiny.gguf", quant="Q8_0")

def test_only_the_part_asked_for_and_what_was_done(tiny: Path, tmp_path: Path, capsys):
  out = tmp_path / "ffn.gguf"
  assert main(["convert", str(tiny), "-o", str(out), "--quant", "q4_0", "--only", "ffn", "--hints", "strategy=packed_words;norm=break"]) == 0
  assert capsys.readouterr().out.strip() == str(out) and [p.name for p in tmp_path.iterdir()] == ["ffn.gguf"]
  src, g = GGUFFile(tiny), GGUFFile(out)
  for name, info in g.tensors.items():
    want = T.Q4_0 if ".ffn_" in name and name.endswith(".weight") and len(info.shape) == 2 else src.tensors[name].ggml_type
    assert info.ggml_type == want, name
  assert g.get("tinyzoo.convert.source") == "tiny.gguf" and g.get("tinyzoo.convert.source_sha256") == file_sha256(tiny)
  assert g.get("tinyzoo.convert.command").startswith("tinyzoo convert ") and g.get("tinyzoo.convert.only") == "ffn"
  assert g.get("tinyzoo.convert.quant") == "Q4_0" and g.get("tinyzoo.convert.converter").startswith("tinyzoo ")
  hints = resolve_hints(out, {}, profile=False)
  assert (hints.strategy, hints.sources["strategy"], hints.norm, hints.sources["norm"]) == ("packed_words", "manifest", "break", "manifest")
  rt = Runtime(out, max_context=16)
  assert np.isfinite(rt.prefill([5, 6, 7]).numpy()).all()

def test_embeddings_only_when_asked(tiny: Path, tmp_path: Path):
  kept, converted = (GGUFFile(convert(tiny, tmp_path / f"{e}.gguf", "Q4_1", embeddings=e)) for e in (False, True))
  assert kept.tensors["token_embd.weight"].ggml_type == T.Q8_0 and converted.tensors["token_embd.weight"].ggml_type == T.Q4_1
  assert kept.tensors["blk.0.attn_q.weight"].ggml_type == T.Q4_1 and kept.tensors["blk.0.attn_norm.weight"].ggml_type == T.F32

@pytest.mark.parametrize("args,error", [(["--quant", "Q5_K"], "argument --quant: invalid choice: 'Q5_K'"),
                                        (["--quant", "Q4_0", "--only", "mlp"], "argument --only: invalid choice: 'mlp'")])
def test_bad_choices(tiny: Path, tmp_path: Path, capsys, args: list[str], error: str):
  with pytest.raises(SystemExit) as e: main(["convert", str(tiny), "-o", str(tmp_path / "x.gguf"), *args])
  assert e.value.code == 2 and error in capsys.readouterr().err

@pytest.mark.parametrize("hints,error", [("norm=realized", "--hints: hint norm: 'realized' is not one of fused, break, single, fold"),
                                         ("beams=2", "--hints: unknown hint 'beams'")])
def test_bad_hints_one_line_and_no_file(tiny: Path, tmp_path: Path, capsys, hints: str, error: str):
  assert main(["convert", str(tiny), "-o", str(tmp_path / "x.gguf"), "--quant", "Q4_0", "--hints", hints]) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"tinyzoo: error: {error}") and err.count("\n") == 1 and not any(tmp_path.iterdir())

def test_refuses_to_overwrite_its_source(tiny: Path):
  with pytest.raises(ValueError, match="would overwrite its source"): convert(tiny, tiny, "Q4_0")

def test_converted_gemma_answers_as_the_original(tmp_path: Path, jits):
  """gemma3-270m (Q4_K_M) with its matmuls in Q8_0: the same greedy tokens and argmax on the reference prompts. The
  original's JITs come from the suite's store (the converted file's bytes, its time of conversion among them, are new
  each run)."""
  src = resolve_model("gemma3-270m")
  out = convert(src, tmp_path / "gemma3-270m.Q8_0.gguf", "Q8_0")
  prompts = [c["prompt"] for c in json.loads((REFERENCES / "gemma3-270m.json").read_text())["cases"]][:3] if REFERENCES.exists() \
    else ["The capital of France is", "def fibonacci(n):"]
  answers = []
  for path in (src, out):
    rt, greedy = Runtime(path, max_context=64, jits=jits if path == src else None), Sampler(SamplerParams(temperature=0, repeat_penalty=1.0))
    cases = []
    for p in prompts:
      logits = rt.prefill(ids := rt.tokenizer.encode(p))
      cases.append((int(logits.numpy().argmax()), list(rt.continue_from(logits, len(ids), 4, greedy))))
    answers.append(cases)
    rt.keep_jits()
  assert answers[0] == answers[1]

@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0"])
def test_llama_cpp_loads_the_result(quant: str, tiny: Path, tmp_path: Path):
  """Where llama-cpp-python is installed: llama.cpp reads the converted file and its logits for a prompt agree with
  tinyzoo's on the same file (argmax; every logit within the agreement tests' 0.8: llama.cpp rounds activations to
  8 bits, measured at most 0.37 here on a scale of 17)."""
  llama_cpp = pytest.importorskip("llama_cpp")
  out, ids = convert(tiny, tmp_path / "c.gguf", quant), [1, 5, 9, 200, 33, 7]
  llm = llama_cpp.Llama(model_path=str(out), n_ctx=32, n_threads=2, logits_all=True, verbose=False)
  llm.eval(ids)
  theirs, ours = np.array(llm.scores[len(ids) - 1]), Runtime(out, max_context=32).prefill(ids).numpy().reshape(-1)
  assert ours.argmax() == theirs.argmax() and np.abs(ours - theirs).max() <= 0.8
