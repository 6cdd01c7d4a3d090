"""`tinyzoo tune`: kernel hints searched for one model on this device, each trial a bench in JIT steady state.

The search starts from the hints resolved now (flags, profile, manifest, the hints' rules, defaults) and goes one hint at a time, in the
order of SEARCH: every other value of the hint is benched with the best values found so far for the rest, and the
fastest is kept (coordinate descent: a few trials per hint rather than the product of all). It stops when the budget is
spent, after the trial running then. Every trial is a journal record of experiment `tune`.
"""
import datetime
import os
import time
from pathlib import Path
from typing import Callable
from tinygrad import Device
from experiments.bench import BenchConfig, bench, changed_switches
from ops.attention import LAYOUTS, SOFTMAXES
from ops.norm import NORMS
from quant.int8_cpu import simd_path

# hint -> the values tried; row_upcast only shapes CPU kernels, the JIT batch size only GPU graphs. On a CPU whose integer
# kernel runs (quant/int8_cpu.py) int8_dot is tried too: it rounds x to 8 bits, as llama.cpp's CPU matmuls do
SEARCH = {"norm": NORMS, "act_break": (True, False), "strategy": ("packed_dot", "packed_words"), "fuse": (True, False),
          "kv_layout": LAYOUTS, "act_in_matmul": (False, True), "softmax": SOFTMAXES, "weights_break": (True, False)}
CPU_SEARCH = {"row_upcast": (8, 4, 16)}
GPU_SEARCH = {"jit_batch_size": (32, 64, 16)}

def search_space(device: str) -> dict[str, tuple]:
  if device.split(":")[0] != "CPU": return {**SEARCH, **GPU_SEARCH}
  space = {**SEARCH, **CPU_SEARCH}
  if "strategy" in space and simd_path(): space["strategy"] = (*space["strategy"], "int8_dot")
  return space

def tune(path: Path, name: str, start: BenchConfig, budget_s: float, on_record: Callable[[dict], None] = lambda r: None) -> list[dict]:
  """The records of every trial, fastest first; the first trial benches `start` itself."""
  run = f"tune-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
  t0, records = time.perf_counter(), []
  def trial(cfg: BenchConfig) -> dict:
    (measured,) = bench(path, name, cfg)
    record = {**measured, "experiment": "tune", "run": run, "variant": changed_switches(cfg.switches()),
              "baseline": not records}
    on_record(record)
    records.append(record)
    return record
  best_cfg, best = start, trial(start)["metrics"]["tok_s"]
  for hint, values in search_space(Device.DEFAULT).items():
    for value in values:
      if value == getattr(best_cfg.hints, hint): continue
      if time.perf_counter() - t0 > budget_s: return ranked(records)
      cfg = best_cfg.with_switches(**{hint: value})
      if (tok_s := trial(cfg)["metrics"]["tok_s"]) > best: best_cfg, best = cfg, tok_s
  return ranked(records)

def ranked(records: list[dict]) -> list[dict]: return sorted(records, key=lambda r: -r["metrics"]["tok_s"])

def winner_hints(record: dict) -> dict:
  """The hints of a trial a profile pins (save_hints keeps those a profile may set): those the search tried and those
  set by other than their default or their rule. One left to them stays unpinned, so that the default still applies
  where it depends on the run (an unset prompt chunk sized to its prompts) and the rule where it depends on the model
  (a split chosen from one model's shapes)."""
  searched = search_space(record["device"])
  return {n: h["value"] for n, h in record["hints"].items() if n in searched or h["source"] not in ("default", "heuristic")}
