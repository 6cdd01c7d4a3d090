"""`tinyzoo tune`: one hint at a time from the resolved start, every trial journaled, ranked, and the fastest hints
written into the device profile with what they reached (its matvec sizes kept)."""
from pathlib import Path
import yaml
from experiments import named, tune as tuning
from experiments.bench import BenchConfig
from models.catalog import resolve_model
from profiles.device import device_name, load, profile_path, save_matvec_sizes
from profiles.hints import resolve
from tinyzoo.cli import main

# a given copy bandwidth: tuning ranks tok/s, not the memory floor
SMALL = {"depths": (4,), "tokens": 2, "pp": 6, "warmup": 1, "peer": False, "kept_programs": True, "bandwidth": 1.0}

def test_one_hint_at_a_time_from_the_start(monkeypatch):
  monkeypatch.setattr(tuning, "SEARCH", {"norm": ("fused", "break", "fold")})
  monkeypatch.setattr(tuning, "CPU_SEARCH", {})
  seen: list[dict] = []
  start = BenchConfig(resolve(), **SMALL)
  records = tuning.tune(resolve_model("smollm2-135m-tiny"), "smollm2-135m-tiny", start, 600, seen.append)
  assert len(records) == len(seen) == 3 and seen[0]["baseline"] and not any(r["baseline"] for r in seen[1:])
  assert [r["hints"]["norm"]["value"] for r in seen] == ["fused", "break", "fold"]
  assert [r["hints"]["norm"]["source"] for r in seen] == ["default", "runtime", "runtime"]
  assert {r["experiment"] for r in seen} == {"tune"} and len({r["run"] for r in seen}) == 1
  assert [r["metrics"]["tok_s"] for r in records] == sorted((r["metrics"]["tok_s"] for r in seen), reverse=True)
  table = named.results_table(records)   # the trials as an experiment's variants: the start is the baseline
  rows = [line for line in table.splitlines()[2:] if not line.startswith("!")]   # the trials' rows, flags under them left out
  assert "(baseline)" in table and len(rows) == 3

def test_writes_the_fastest_into_the_profile(tmp_path: Path, monkeypatch, capsys):
  monkeypatch.setattr("profiles.device.PROFILES", tmp_path)
  monkeypatch.setattr("experiments.bench.copy_bandwidth", lambda device=None: 1.0)   # as SMALL's: `tune` takes no --bandwidth
  here = profile_path(device_name())
  assert here.parent == tmp_path
  save_matvec_sizes(here, device_name(), {"64x8x4": ((16, 4, 4), 100.0)})
  assert main(["tune", "smollm2-135m-tiny", "--budget", "0.001", "--tokens", "2", "--kept-programs", "--no-journal"]) == 0
  out = capsys.readouterr().out
  assert "saved the fastest hints" in out and "(baseline)" in out
  profile = load(here)
  assert profile["hints"]["norm"] == "fused" and profile["tuned"]["model"] == "smollm2-135m-tiny" and profile["tuned"]["tok_s"] > 0
  assert "prefill_chunk" not in profile["hints"], "a hint the search left at its default stays unpinned"
  assert profile["matvec_sizes"] == {"64x8x4": {"sizes": (16, 4, 4), "gb_s": 100.0}} and profile["device"] == device_name()
  assert yaml.safe_load(here.read_text())["tuned"]["model"] == "smollm2-135m-tiny" and [p.name for p in tmp_path.iterdir()] == [here.name]

def test_int8_dot_is_tried_on_a_cpu_whose_integer_kernel_runs(monkeypatch):
  for path, strategies in (("avx2", ("packed_dot", "packed_words", "int8_dot")), (None, ("packed_dot", "packed_words"))):
    monkeypatch.setattr(tuning, "simd_path", lambda: path)
    cpu = tuning.search_space("CPU: a CPU, 2 cores")
    assert cpu["strategy"] == strategies and list(cpu) == [*tuning.SEARCH, *tuning.CPU_SEARCH]
  assert tuning.search_space("CUDA: a GPU")["strategy"] == ("packed_dot", "packed_words")
