"""Kernel hints: one priority (runtime > device profile > model manifest > default), every value checked, and the
source of each kept where bench, run, exp and `tinyzoo hints` report it."""
import json
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from experiments import named
from experiments.bench import BenchConfig
from profiles.device import device_name, profile_path, resolve_hints
from profiles.hints import HINTS, check, from_env, resolve
from quant.gguf_write import RawTensor, write_gguf
from tinyzoo.cli import main

def test_each_hint_from_the_first_source_that_sets_it():
  h = resolve(runtime={"norm": "break"}, profile={"norm": "fold", "topk": "sort"}, manifest={"topk": "pairwise", "beam": "2"})
  assert (h["norm"], h.sources["norm"]) == ("break", "runtime")
  assert (h["topk"], h.sources["topk"]) == ("sort", "profile")
  assert (h["beam"], h.sources["beam"]) == (2, "manifest")
  assert all(h[n] == hint.default and h.sources[n] == "default" for n, hint in HINTS.items() if n not in ("norm", "topk", "beam"))
  assert set(h.as_dict()) == set(HINTS) and h.as_dict()["beam"] == {"value": 2, "source": "manifest"}

@pytest.mark.parametrize("name,value,error", [("beam", "-1", "hint beam: '-1' is not a whole number"),
                                              ("row_upcast", 6, "hint row_upcast: 6 is neither 0 nor a power of two"),
                                              ("topk", "bitonic", "hint topk: 'bitonic' is not one of pairwise, sort"),
                                              ("fuse", "2", "hint fuse: '2' is not true or false"),
                                              ("attention", "flash", "hint attention: 'flash' is not one of chunked, whole"),
                                              ("softmax", "online", "hint softmax: 'online' is not one of max, self"),
                                              ("act_in_matmul", "maybe", "hint act_in_matmul: 'maybe' is not true or false"),
                                              ("pdl", "soon", "hint pdl: 'soon' is not true or false"),
                                              ("rounding", "ggml", "unknown hint 'rounding'")])
def test_bad_hints_say_which_and_why(name: str, value, error: str):
  with pytest.raises(ValueError, match=error): check(name, value)

def test_environment_form():
  assert from_env({"TINYZOO_HINTS": " norm=break; strategy=packed_dot,Q6_K=split;row_upcast=4; fuse=no;"}) == {
    "norm": "break", "strategy": "packed_dot,Q6_K=split", "row_upcast": 4, "fuse": False}
  with pytest.raises(ValueError, match="TINYZOO_HINTS: 'beam' is not name=value"): from_env({"TINYZOO_HINTS": "norm=break;beam"})
  with pytest.raises(ValueError, match="TINYZOO_HINTS: hint beam"): from_env({"TINYZOO_HINTS": "beam=x"})

def model_with_manifest(path: Path, **hints) -> Path:
  """A GGUF holding only metadata: the architecture and `tinyzoo.hints.*`."""
  tensor = RawTensor("token_embd.weight", T.F32, np.zeros((2, 4), np.float32))
  return write_gguf(path, "llama", {f"tinyzoo.hints.{k}": v for k, v in hints.items()}, [tensor])

def test_resolved_for_a_model_on_this_device(tmp_path: Path, monkeypatch):
  model = model_with_manifest(tmp_path / "m.gguf", norm="break", topk="sort", beam=1)
  profile_path(device_name(), tmp_path).write_text("hints:\n  topk: pairwise\n  jit_batch_size: 8\n")
  monkeypatch.setenv("TINYZOO_HINTS", "beam=3;row_upcast=2")
  h, where = resolve_hints(model, {"row_upcast": 4}, folder=tmp_path)
  assert where == profile_path(device_name(), tmp_path)
  assert {n: (h[n], h.sources[n]) for n in ("norm", "topk", "jit_batch_size", "beam", "row_upcast", "fuse")} == {
    "norm": ("break", "manifest"), "topk": ("pairwise", "profile"), "jit_batch_size": (8, "profile"), "beam": (3, "runtime"),
    "row_upcast": (4, "runtime"), "fuse": (True, "default")}
  assert resolve_hints(model, {}, profile=False, folder=tmp_path)[0].sources["topk"] == "manifest"
  with pytest.raises(ValueError, match=r"m2.gguf: metadata tinyzoo.hints.topk: hint topk"):
    resolve_hints(model_with_manifest(tmp_path / "m2.gguf", topk="heap"), {}, folder=tmp_path)

def test_an_architectures_hints_over_the_devices(tmp_path: Path):
  """A profile's hints for one architecture apply to its models over the device's; other architectures keep the
  device's, and saving the profile's hints keeps them."""
  from profiles.device import load, save_hints
  model = model_with_manifest(tmp_path / "m.gguf")   # a llama
  path = profile_path(device_name(), tmp_path)
  path.write_text("hints:\n  norm: single\n  topk: sort\narchitectures:\n  llama: {norm: fold}\n  gemma3: {norm: break}\n")
  h = resolve_hints(model, {}, folder=tmp_path)[0]
  assert {n: (h[n], h.sources[n]) for n in ("norm", "topk")} == {"norm": ("fold", "profile"), "topk": ("sort", "profile")}
  assert resolve_hints(model, {"norm": "break"}, folder=tmp_path)[0]["norm"] == "break"
  save_hints(path, device_name(), {"topk": "pairwise"}, {"model": "m", "tok_s": 1.0})
  assert load(path)["architectures"] == {"llama": {"norm": "fold"}, "gemma3": {"norm": "break"}}
  assert resolve_hints(model, {}, folder=tmp_path)[0]["norm"] == "fold"

def test_hints_command(tmp_path: Path, monkeypatch, capsys):
  monkeypatch.setattr("profiles.device.PROFILES", tmp_path)   # no profile for this device, whatever runs the test
  model = model_with_manifest(tmp_path / "m.gguf", act_break=False)
  monkeypatch.setenv("TINYZOO_HINTS", "norm=fold")
  assert main(["hints", str(model), "--json"]) == 0
  got = json.loads(capsys.readouterr().out)["hints"]
  assert got["act_break"] == {"value": False, "source": "manifest"} and got["norm"] == {"value": "fold", "source": "runtime"}
  assert got["strategy"] == {"value": "packed_dot", "source": "default"}
  assert main(["hints", str(model)]) == 0
  assert "act_break       False                  manifest" in capsys.readouterr().out
  monkeypatch.setenv("TINYZOO_HINTS", "act_break=perhaps")
  assert main(["hints", str(model)]) == 1
  assert capsys.readouterr().err.strip() == "tinyzoo: error: TINYZOO_HINTS: hint act_break: 'perhaps' is not true or false"

def test_bench_records_hints_and_experiment_switches_are_runtime():
  """A bench config keeps each hint's source for its journal record; an experiment variant's switch is a runtime hint."""
  base = BenchConfig.from_hints(resolve(profile={"norm": "break", "beam": 1}), peer=False)
  assert base.norm == "break" and base.hints()["norm"] == {"value": "break", "source": "profile"}
  exp = named.Experiment("x", "d", "m", "", {}, named.Variant("b", {}), (named.Variant("v", {"beam": 0, "skip": ["ffn"]}),))
  cfg = named.config(exp, exp.variants[0], base)
  assert cfg.hints()["beam"] == {"value": 0, "source": "runtime"} and cfg.hints()["norm"]["source"] == "profile"
  assert named.config(exp, exp.baseline, base).hints()["beam"] == {"value": 1, "source": "profile"}

def test_run_builds_the_model_from_the_resolved_hints(tmp_path: Path, monkeypatch, capsys):
  """`tinyzoo run` (and logits) give the Runtime each hint from its source: here the manifest's and the environment's."""
  monkeypatch.setattr("profiles.device.PROFILES", tmp_path)   # no profile for this device, whatever runs the test
  model = model_with_manifest(tmp_path / "m.gguf", norm="break", act_break=False)
  monkeypatch.setenv("TINYZOO_HINTS", "attention=whole;topk=sort")
  built = {}
  def fake_runtime(path, **kwargs):
    built.update(kwargs)
    raise ValueError("built")
  monkeypatch.setattr("tinyzoo.run.Runtime", fake_runtime)
  assert main(["run", str(model), "-p", "hi"]) == 1 and "built" in capsys.readouterr().err
  assert {k: built[k] for k in ("norm", "act_break", "attention", "topk", "strategy")} == {
    "norm": "break", "act_break": False, "attention": "whole", "topk": "sort", "strategy": "packed_dot"}
