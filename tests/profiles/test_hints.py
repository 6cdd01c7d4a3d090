"""Kernel hints: one priority (runtime > device profile > model manifest > default), every value checked, one frozen
object passed whole, and every hint of the registry reaching the flags, run, bench records, experiment switches and
`tinyzoo hints` with its source."""
import json
from pathlib import Path
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from experiments import named
from experiments.bench import BenchConfig
from profiles.device import device_name, profile_path, resolve_hints
from profiles.hints import HINTS, Hint, check, from_env, resolve
from quant.gguf_write import RawTensor, write_gguf
from quant.linear import STRATEGIES
from profiles.hints import given
from tinyzoo.cli import main, parser

def test_each_hint_from_the_first_source_that_sets_it():
  h = resolve(runtime={"norm": "break"}, profile={"norm": "fold", "topk": "sort"}, manifest={"topk": "pairwise", "beam": "2"})
  assert (h.norm, h.sources["norm"]) == ("break", "runtime")
  assert (h.topk, h.sources["topk"]) == ("sort", "profile")
  assert (h.beam, h.sources["beam"]) == (2, "manifest")
  assert all(getattr(h, n) == hint.default_value() and h.sources[n] == "default" for n, hint in HINTS.items() if n not in ("norm", "topk", "beam"))
  assert set(h.as_dict()) == set(HINTS) and h.as_dict()["beam"] == {"value": 2, "source": "manifest"}
  with pytest.raises(AttributeError, match="no hint 'nrom'"): h.nrom

def test_tinygrads_own_settings_are_the_defaults(monkeypatch):
  """BEAM and JIT_BATCH_SIZE keep tinygrad's meaning: unless a source sets the hint, tinygrad's value is the default."""
  from tinygrad.helpers import BEAM, JIT_BATCH_SIZE
  monkeypatch.setattr(BEAM, "value", 3)
  monkeypatch.setattr(JIT_BATCH_SIZE, "value", 8)
  h = resolve()
  assert (h.beam, h.jit_batch_size, h.sources["beam"]) == (3, 8, "default")
  assert resolve({"beam": 0}).beam == 0

@pytest.mark.parametrize("name,value,error", [("beam", "-1", "hint beam: '-1' is not a whole number"),
                                              ("row_upcast", 6, "hint row_upcast: 6 is neither 0 nor a power of two"),
                                              ("topk", "bitonic", "hint topk: 'bitonic' is not one of pairwise, sort"),
                                              ("fuse", "2", "hint fuse: '2' is not true or false"),
                                              ("attention", "flash", "hint attention: 'flash' is not one of chunked, whole"),
                                              ("softmax", "online", "hint softmax: 'online' is not one of max, self"),
                                              ("act_in_matmul", "maybe", "hint act_in_matmul: 'maybe' is not true or false"),
                                              ("pdl", "soon", "hint pdl: 'soon' is not true or false"),
                                              ("rounding", "fp8", "hint rounding: 'fp8' is not one of ggml, exact"),
                                              ("skip", "mlp", "hint skip: cannot skip 'mlp'"),
                                              ("rounds", "ggml", "unknown hint 'rounds'")])
def test_bad_hints_say_which_and_why(name: str, value, error: str):
  with pytest.raises(ValueError, match=error): check(name, value)

def test_run_only_hints_come_from_no_profile_or_manifest():
  for name in ("rounding", "skip"):
    for source in ("profile", "manifest"):
      with pytest.raises(ValueError, match=f"hint {name} is set at run time only, not by a {source}"):
        check(name, HINTS[name].default_value(), source)
  assert resolve({"rounding": "ggml", "skip": "ffn,attention"}).skip == ("ffn", "attention")

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
  h = resolve_hints(model, {"row_upcast": 4}, folder=tmp_path)
  assert h.profile == profile_path(device_name(), tmp_path)
  assert {n: (getattr(h, n), h.sources[n]) for n in ("norm", "topk", "jit_batch_size", "beam", "row_upcast", "fuse")} == {
    "norm": ("break", "manifest"), "topk": ("pairwise", "profile"), "jit_batch_size": (8, "profile"), "beam": (3, "runtime"),
    "row_upcast": (4, "runtime"), "fuse": (True, "default")}
  assert resolve_hints(model, {}, profile=False, folder=tmp_path).sources["topk"] == "manifest"
  with pytest.raises(ValueError, match=r"m2.gguf: metadata tinyzoo.hints.topk: hint topk"):
    resolve_hints(model_with_manifest(tmp_path / "m2.gguf", topk="heap"), {}, folder=tmp_path)

def test_an_architectures_hints_over_the_devices(tmp_path: Path):
  """A profile's hints for one architecture apply to its models over the device's; other architectures keep the
  device's, and saving the profile's hints keeps them."""
  from profiles.device import load, save_hints
  model = model_with_manifest(tmp_path / "m.gguf")   # a llama
  path = profile_path(device_name(), tmp_path)
  path.write_text("hints:\n  norm: single\n  topk: sort\narchitectures:\n  llama: {norm: fold}\n  gemma3: {norm: break}\n")
  h = resolve_hints(model, {}, folder=tmp_path)
  assert {n: (getattr(h, n), h.sources[n]) for n in ("norm", "topk")} == {"norm": ("fold", "profile"), "topk": ("sort", "profile")}
  assert resolve_hints(model, {"norm": "break"}, folder=tmp_path).norm == "break"
  save_hints(path, device_name(), {"topk": "pairwise"}, {"model": "m", "tok_s": 1.0})
  assert load(path)["architectures"] == {"llama": {"norm": "fold"}, "gemma3": {"norm": "break"}}
  assert resolve_hints(model, {}, folder=tmp_path).norm == "fold"

def test_hints_command(tmp_path: Path, monkeypatch, capsys):
  from profiles.machine import Machine
  monkeypatch.setattr("profiles.device.PROFILES", tmp_path)   # no profile for this device, whatever runs the test
  for where in ("profiles.device.this_machine", "profiles.machine.this_machine"):   # a CPU without int8 dot products
    monkeypatch.setattr(where, lambda device=None: Machine("CPU"))
  model = model_with_manifest(tmp_path / "m.gguf", act_break=False)
  monkeypatch.setenv("TINYZOO_HINTS", "norm=fold")
  assert main(["hints", str(model), "--json"]) == 0
  got = json.loads(capsys.readouterr().out)["hints"]
  assert got["act_break"] == {"value": False, "source": "manifest"} and got["norm"] == {"value": "fold", "source": "runtime"}
  assert got["strategy"] == {"value": "packed_dot", "source": "default"}
  assert main(["hints", str(model)]) == 0
  out = capsys.readouterr().out
  assert "act_break       False                  manifest" in out and "on CPU, int8 dot products: none:" in out
  monkeypatch.setattr("profiles.device.this_machine", lambda device=None: Machine("CPU", cpu_simd="avx_vnni"))
  assert main(["hints", str(model)]) == 0
  assert "strategy        int8_dot               heuristic the CPU has avx_vnni int8 dot products (quant/int8_cpu.py). " in capsys.readouterr().out
  monkeypatch.setenv("TINYZOO_HINTS", "act_break=perhaps")
  assert main(["hints", str(model)]) == 1
  assert capsys.readouterr().err.strip() == "tinyzoo: error: TINYZOO_HINTS: hint act_break: 'perhaps' is not true or false"

def test_bench_records_hints_and_experiment_switches_are_runtime():
  """A bench config keeps each hint's source for its journal record; an experiment variant's switch is a runtime hint."""
  base = BenchConfig(resolve(profile={"norm": "break", "beam": 1}), peer=False)
  assert base.hints.norm == "break" and base.hints.as_dict()["norm"] == {"value": "break", "source": "profile"}
  exp = named.Experiment("x", "d", "m", "", {}, named.Variant("b", {}), (named.Variant("v", {"beam": 0, "skip": ("ffn",)}),))
  cfg = named.config(exp, exp.variants[0], base)
  assert cfg.hints.as_dict()["beam"] == {"value": 0, "source": "runtime"} and cfg.hints.sources["norm"] == "profile"
  assert named.config(exp, exp.baseline, base).hints.as_dict()["beam"] == {"value": 1, "source": "profile"}

def other_value(name: str, hint: Hint):
  """A value of the hint other than its default, as a flag writes it, and as the hint holds it."""
  default = hint.default_value()
  if isinstance(default, bool): return None, not default
  if isinstance(default, tuple): return hint.choices[-1], (hint.choices[-1],)
  if hint.choices: return (v := next(c for c in hint.choices if c != default)), v
  if name == "strategy": return (v := next(s for s in STRATEGIES if s != default)), v
  if isinstance(default, int): return str(v := 2 * default or 1), v
  raise AssertionError(f"hint {name}: this test does not know its kind of value: teach other_value")

def flag(name: str, written, value) -> list[str]:
  option = name.replace("_", "-")
  return [f"--{option}" if value is True else f"--no-{option}" if value is False else f"--{option}", *([] if written is None else [written])]

@pytest.mark.parametrize("name", list(HINTS))
def test_every_hint_reaches_the_flags_run_bench_exp_and_the_hints_command(name: str, tmp_path: Path, monkeypatch, capsys):
  """Adding a hint is its registry entry and the code that reads it: the flag, the Runtime `run` builds, the bench
  record, an experiment's switch and `tinyzoo hints` all follow the registry."""
  monkeypatch.setattr("profiles.device.PROFILES", tmp_path)   # no profile for this device, whatever runs the test
  hint, model = HINTS[name], model_with_manifest(tmp_path / "m.gguf")
  written, value = other_value(name, hint)
  assert value != hint.default_value()
  for command in ("run", "logits", "bench", "profile"):
    args = parser().parse_args([command, str(model), *(["-p", "hi"] if command in ("run", "logits") else []), *flag(name, written, value)])
    got = given(args)
    assert got.pop(name) == ([written] if isinstance(value, tuple) else written if written is not None else value), command
    assert got == ({"rounding": "ggml"} if command == "logits" and name != "rounding" else {}), command   # logits rounds as llama.cpp
  built = {}
  def fake_runtime(path, hints, *rest, **kwargs):
    built["hints"] = hints
    raise ValueError("built")
  monkeypatch.setattr("tinyzoo.run.Runtime", fake_runtime)
  assert main(["run", str(model), "-p", "hi", *flag(name, written, value)]) == 1 and "built" in capsys.readouterr().err
  assert getattr(built["hints"], name) == value and built["hints"].sources[name] == "runtime"
  cfg = BenchConfig(resolve(), peer=False).with_switches(**{name: value})
  assert cfg.switches()[name] == (list(value) if isinstance(value, tuple) else value)
  assert cfg.hints.as_dict()[name] == {"value": cfg.switches()[name], "source": "runtime"}
  switches = named._checked("x.yaml v", {name: list(value) if isinstance(value, tuple) else value}, named.SWITCHES)
  exp = named.Experiment("x", "d", "m", "", {}, named.Variant("b", {}), (named.Variant("v", switches),))
  assert getattr(named.config(exp, exp.variants[0], BenchConfig(resolve())).hints, name) == value
  env = ",".join(value) if isinstance(value, tuple) else str(value)
  monkeypatch.setenv("TINYZOO_HINTS", f"{name}={env}")
  assert main(["hints", str(model), "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["hints"][name] == {"value": cfg.switches()[name], "source": "runtime"}

def test_the_runtime_and_the_weights_take_the_hints_whole():
  """Runtime and Weights are built from the one Hints object, not a keyword argument per hint (their other parameters:
  the file, context, device, progress bar and cache stores)."""
  import inspect
  from models.runtime import Runtime
  from models.weights import Weights
  for cls in (Runtime, Weights):
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    assert "hints" in params and len(params) <= 7 and not set(params) & set(HINTS), (cls.__name__, params)
