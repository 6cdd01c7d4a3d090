"""Reproducing the seed: an experiment refuses, in one line, a model or device that cannot show its effect (its
`needs`) and accepts one that can; a definition names its model per device; `exp reproduce` runs every seed experiment
the device can run, at one clean commit, its records sharing one reproduction id, and refuses a tree with uncommitted
changes."""
import json
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from tinygrad import Device
from experiments import journal, named
from models.catalog import resolve_model
from models.synth import synthesize
from quant.gguf_write import RawTensor, write_gguf
from quant.random_blocks import random_blocks
from tinyzoo.cli import main

@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Path: return synthesize("smollm2-135m-tiny", tmp_path_factory.mktemp("synth") / "dense.gguf", quant="Q4_0")

def one_line_error(capsys, *args: str) -> str:
  code, err = main(list(args)), capsys.readouterr().err
  assert code == 1 and err.startswith("tinyzoo: error:") and len(err.strip().splitlines()) == 1, err
  return err

def test_a_model_that_cannot_show_the_effect_is_refused_in_one_line(dense: Path, capsys):
  assert "moe-topk needs experts (MoE blocks): " in one_line_error(capsys, "exp", "run", "moe-topk", "--model", str(dense), "--no-journal")
  assert (f"q4-formats needs weights that Q4_0 and Q4_K can both hold (rows of whole 256-value super-blocks): {dense}'s token_embd.weight "
          "has rows of 96") in one_line_error(capsys, "exp", "run", "q4-formats", "--model", str(dense), "--no-journal")

def test_a_model_that_can_show_it_is_accepted(dense: Path, tmp_path: Path, rng: np.random.Generator):
  exps = named.load_all()
  assert named.unmet(exps["moe-topk"], "glm-4.7-flash-tiny", resolve_model, "CPU") is None
  # rows of 256 values: both Q4_0's blocks and Q4_K's super-blocks hold them (a norm needs neither)
  square = write_gguf(tmp_path / "square.gguf", "llama", {}, [RawTensor("blk.0.ffn_up.weight", T.Q8_0, random_blocks(T.Q8_0, (512, 256), rng)),
                                                             RawTensor("blk.0.ffn_norm.weight", T.F32, np.ones(96, np.float32))])
  assert named.unmet(exps["q4-formats"], str(square), resolve_model, "CPU") is None
  assert named.unmet(exps["moe-isolation"], str(dense), resolve_model, "CPU") == "moe-isolation needs shared experts: " + str(dense) + " has none"
  # the device's needs come first, its model made only where they are met
  made = []
  assert named.unmet(exps["beam"], "x", made.append, "CPU") == "beam needs a GPU: this device is CPU" and not made
  assert named.unmet(exps["row-upcast"], "x", made.append, "CUDA") == "row-upcast needs the CPU: this device is CUDA" and not made
  assert named.unmet(exps["row-upcast"], "x", made.append, "CPU") is None

def test_a_definition_names_its_model_per_device(tmp_path: Path):
  defs = tmp_path / "defs"
  defs.mkdir()
  base = "description: d\nbaseline: {name: b}\nvariants:\n  - {name: v}\n"
  (defs / "both.yaml").write_text(base + "model: {gpu: big, cpu: big-tiny}\n")
  (defs / "one.yaml").write_text(base + "model: m\n")
  both, one = named.find("both", defs), named.find("one", defs)
  assert (both.model_for("CUDA"), both.model_for("CPU"), one.model_for("CUDA"), one.model_for("CPU")) == ("big", "big-tiny", "m", "m")
  assert "model: big (on the CPU: big-tiny)" in named.describe(both, [])
  (defs / "one.yaml").write_text(base + "model: {gpu: big}\n")
  with pytest.raises(named.ExperimentError, match=r"one.yaml: model must be a name or \{gpu: NAME, cpu: NAME\}, got \{'gpu': 'big'\}$"):
    named.load_all(defs)

def test_reproduce_runs_the_seed_experiments_at_one_commit(dense: Path, tmp_path: Path, monkeypatch, capsys):
  """A seed experiment on its model for this device (the other device's does not exist), one refused by its needs, one
  that reproduces no seed left out: two records, one run, one reproduction; a dirty tree is refused before any runs."""
  defs, path = tmp_path / "defs", tmp_path / "journal.jsonl"
  defs.mkdir()
  here, there = ("cpu", "gpu") if named.on_cpu(Device.DEFAULT) else ("gpu", "cpu")
  (defs / "iso.yaml").write_text(f"""description: the tiny model twice
model: {{{here}: {dense}, {there}: {tmp_path / 'absent.gguf'}}}
reproduces: seed 003, "Component Isolation Experiments"
bench: {{depths: 2, tokens: 2, pp: 4, warmup: 0}}
baseline: {{name: full, switches: {{}}}}
variants:
  - {{name: again, switches: {{}}}}
""")
  (defs / "topk.yaml").write_text(f"description: d\nmodel: {dense}\nreproduces: seed 003, top-k\nneeds: [experts]\nbaseline: {{name: b}}\n"
                                  "variants:\n  - {name: v}\n")
  (defs / "own.yaml").write_text(f"description: d\nmodel: {tmp_path / 'absent.gguf'}\nbaseline: {{name: b}}\nvariants:\n  - {{name: v}}\n")
  args = ["exp", "reproduce", "--defs", str(defs), "--no-peer", "-r", "1", "--kept-programs", "--journal", str(path)]
  monkeypatch.setenv("TINYZOO_COMMIT", "c0ffee")
  monkeypatch.setenv("TINYZOO_DIRTY", "1")
  assert "the tree has uncommitted changes beside commit c0ffee" in one_line_error(capsys, *args) and not path.exists()
  monkeypatch.setenv("TINYZOO_DIRTY", "0")
  assert main(args) == 0
  out, err = capsys.readouterr()
  records = journal.read(path)
  assert [(r["experiment"], r["variant"], r["model"], r["commit"]) for r in records] == [("iso", v, dense.stem, "c0ffee") for v in ("full", "again")]
  assert len({r["run"] for r in records}) == 1 and len({r["reproduction"] for r in records}) == 1
  rid = records[0]["reproduction"]
  assert out.strip().splitlines()[-1].startswith(f"reproduction {rid} at c0ffee on ")
  assert out.strip().splitlines()[-1].endswith(f": ran 1 (iso); refused 1 (topk needs experts (MoE blocks): {dense} has none)")
  assert "again" in out and "reproduce [1/2] iso" in err and "reproduce [2/2] topk" in err and "own" not in err
  assert json.loads(path.read_text().splitlines()[0])["reproduction"] == rid
  # an experiment that fails is named, the others run on, and the command ends in one line and a non-zero status
  real_run = named.run
  def failing(exp, *a, **kw):
    if exp.name == "iso": raise RuntimeError("no kernel for you\nsecond line")
    return real_run(exp, *a, **kw)
  monkeypatch.setattr(named, "run", failing)
  (defs / "topk.yaml").unlink()
  (defs / "iso2.yaml").write_text((defs / "iso.yaml").read_text())
  assert main(args) == 1
  out, err = capsys.readouterr()
  assert out.strip().splitlines()[-1].endswith("ran 1 (iso2); refused 0; failed 1 (iso: RuntimeError: no kernel for you)")
  assert "failed: iso: RuntimeError: no kernel for you\n" in err
  assert err.strip().splitlines()[-1] == "tinyzoo: error: 1 of the experiments failed: iso: RuntimeError: no kernel for you"

def test_an_experiment_of_the_mma_gemm_is_refused_off_a_cuda_gpu():
  """gpu-kernels needs a GPU, and its variant the hand-written GEMM, which runs on CUDA GPUs only: another GPU is refused
  before the baseline runs, not halfway."""
  exp = named.find("gpu-kernels")
  assert named.unmet(exp, exp.model, lambda m: None, "CPU").startswith("gpu-kernels needs a GPU")
  assert named.unmet(exp, exp.model, lambda m: None, "METAL") == "gpu-kernels: gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not METAL"
