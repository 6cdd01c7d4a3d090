"""Named experiments: YAML files in experiments/defs/, each a model, a baseline and variants, every one a set of switches.
`run` measures baseline and variants in one process, one journal record each, sharing a run id."""
import dataclasses
import datetime
import enum
import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
import yaml
from experiments.bench import BenchConfig, bench
from experiments.quality import DEFAULT_CTX, DEFAULT_TEXT, Probe
from models.catalog import model_label
from profiles.hints import HINTS, check

DEFS = Path(__file__).with_name("defs")
class ExperimentError(ValueError): pass

def _typed(key: str, kind: type, value: Any) -> Any:
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)): raise ValueError(f"{key} must be {kind.__name__}, got {value!r}")
  return value

# what a variant's switches and an experiment's bench sizes may set, each read by its parser: every kernel hint
# (profiles/hints.py), and `requant`, which swaps the model for a requantized copy
SWITCHES: dict[str, Callable[[Any], Any]] = {**{n: functools.partial(check, n) for n in HINTS}, "requant": functools.partial(_typed, "requant", str)}
def _depths(value: Any) -> tuple[int, ...]:
  """`depth`: one depth or a list of them, each a whole number >= 0."""
  depths = value if isinstance(value, list) else [value]
  if not depths or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in depths):
    raise ValueError(f"depth must be a whole number >= 0 or a list of them, got {value!r}")
  return tuple(depths)

def _text(value: Any) -> str:
  if not isinstance(value, str) or not value: raise ValueError(f"text must be a file name, got {value!r}")
  return value

QUALITY_KEYS: dict[str, Callable[[Any], Any]] = {"text": _text, **{k: functools.partial(_typed, k, int) for k in ("ctx", "chunks")}}
BENCH_KEYS: dict[str, Callable[[Any], Any]] = {**{k: functools.partial(_typed, k, int) for k in ("tokens", "pp", "warmup", "ctx")}, "depths": _depths}

class Needs(enum.Enum):
  """What a model (or the device) must have for an experiment to show its effect; a run on one without it is refused."""
  EXPERTS = "experts"       # MoE blocks (routing, expert matmuls)
  Q4K_ROWS = "q4k_rows"     # every matmul's rows hold whole 256-value super-blocks, so that Q4_K can hold each weight
  GPU = "gpu"
  CPU = "cpu"

class Expect(enum.Enum):
  HIGHER = "higher"
  LOWER = "lower"

@dataclass(frozen=True)
class Verdict:
  """The rule that says whether a run reproduced the seed's finding: `variant`'s `metric` (a metrics key, or
  quality.<key>) against the baseline's at the same depth moves as `expect` says by more than `margin` (a fraction of the
  baseline's) and by more than twice their spread where it was measured: reproduced; the other way: contradicted;
  neither: not reproduced."""
  metric: str
  variant: str
  expect: Expect
  margin: float = 0.05

@dataclass(frozen=True)
class Variant:
  name: str
  switches: dict[str, Any]

@dataclass(frozen=True)
class Experiment:
  name: str
  description: str
  model: str
  reproduces: str             # which journal entry of seed 003 it re-runs
  bench: dict[str, int]       # BenchConfig fields shared by every variant
  baseline: Variant
  variants: tuple[Variant, ...]
  quality: dict[str, Any] = dataclasses.field(default_factory=dict)   # if asked, each variant's perplexity and KL divergence
                                                                      # from the baseline: text, ctx, chunks
  verdict: Verdict | None = None
  needs: tuple[Needs, ...] = ()

  @property
  def all_variants(self) -> tuple[Variant, ...]: return (self.baseline, *self.variants)

def _checked(where: str, table: Any, allowed: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
  """The table's entries, each key known and its value as `allowed` reads it."""
  if not isinstance(table, dict): raise ExperimentError(f"{where}: expected a mapping, got {type(table).__name__}")
  out = {}
  for key, value in table.items():
    if key not in allowed: raise ExperimentError(f"{where}: unknown key {key!r} (known: {', '.join(allowed)})")
    try: out[key] = allowed[key](value)
    except ValueError as e: raise ExperimentError(f"{where}: {e}") from None
  return out

def _variant(where: str, raw: Any) -> Variant:
  if not isinstance(raw, dict) or not isinstance(raw.get("name"), str): raise ExperimentError(f"{where}: a variant needs a name")
  return Variant(raw["name"], _checked(f"{where} {raw['name']!r}", raw.get("switches", {}), SWITCHES))

def _verdict(where: str, raw: Any, variants: set[str]) -> Verdict | None:
  if raw is None: return None
  if not isinstance(raw, dict) or set(raw) - {"metric", "variant", "expect", "margin"} or not {"metric", "variant", "expect"} <= set(raw):
    raise ExperimentError(f"{where}: verdict takes metric, variant, expect (higher or lower) and optionally margin, got {raw!r}")
  if raw["variant"] not in variants: raise ExperimentError(f"{where}: verdict names no variant of this experiment: {raw['variant']!r}")
  try: expect = Expect(raw["expect"])
  except ValueError: raise ExperimentError(f"{where}: verdict expect must be higher or lower, got {raw['expect']!r}") from None
  margin = raw.get("margin", Verdict.margin)
  if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 <= margin < 1:
    raise ExperimentError(f"{where}: verdict margin must be a fraction in [0, 1), got {margin!r}")
  return Verdict(str(raw["metric"]), raw["variant"], expect, float(margin))

def _needs(where: str, raw: Any) -> tuple[Needs, ...]:
  items = raw if isinstance(raw, list) else [] if raw is None else [raw]
  try: return tuple(Needs(x) for x in items)
  except ValueError: raise ExperimentError(f"{where}: needs takes {', '.join(n.value for n in Needs)}, got {raw!r}") from None

def load(path: Path) -> Experiment:
  where = str(path)
  try: raw = yaml.safe_load(path.read_text())
  except yaml.YAMLError as e: raise ExperimentError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
  if not isinstance(raw, dict): raise ExperimentError(f"{where}: expected a mapping at the top")
  for key in ("description", "model", "baseline", "variants"):
    if key not in raw: raise ExperimentError(f"{where}: missing {key!r}")
  if not isinstance(raw["variants"], list) or not raw["variants"]: raise ExperimentError(f"{where}: 'variants' must be a non-empty list")
  baseline, variants = _variant(where, raw["baseline"]), tuple(_variant(where, v) for v in raw["variants"])
  if len({v.name for v in (baseline, *variants)}) != 1 + len(variants): raise ExperimentError(f"{where}: variant names must be unique")
  if unknown := set(raw) - {"description", "model", "reproduces", "bench", "baseline", "variants", "quality", "verdict", "needs"}:
    raise ExperimentError(f"{where}: unknown key {sorted(unknown)[0]!r}")
  return Experiment(path.stem, str(raw["description"]).strip(), str(raw["model"]), str(raw.get("reproduces", "")).strip(),
                    _checked(f"{where} bench", raw.get("bench", {}), BENCH_KEYS), baseline, variants,
                    _checked(f"{where} quality", raw.get("quality", {}), QUALITY_KEYS),
                    _verdict(where, raw.get("verdict"), {v.name for v in variants}), _needs(where, raw.get("needs")))

def load_all(defs: Path = DEFS) -> dict[str, Experiment]:
  return {p.stem: load(p) for p in sorted(defs.glob("*.yaml"))}

def find(name: str, defs: Path = DEFS) -> Experiment:
  known = load_all(defs)
  if name not in known: raise ExperimentError(f"no experiment named {name!r} (known: {', '.join(known) or 'none'})")
  return known[name]

def config(exp: Experiment, variant: Variant, base: BenchConfig, sizes: dict[str, int] | None = None) -> BenchConfig:
  """The variant's switches (runtime hints) over the experiment's bench sizes over `base`; `sizes` (from the command line)
  win over the experiment's."""
  return dataclasses.replace(base, **{**exp.bench, **(sizes or {})}).with_switches(**variant.switches)

def chosen_variants(exp: Experiment, only: list[str] | None) -> list[Variant]:
  """The baseline, then every variant or the `only` ones; an unknown name is an error."""
  if only and (unknown := set(only) - {v.name for v in exp.all_variants}):
    raise ExperimentError(f"{exp.name} has no variant {sorted(unknown)[0]!r} (variants: {', '.join(v.name for v in exp.all_variants)})")
  return [v for v in exp.all_variants if only is None or v.name in only or v is exp.baseline]

def run(exp: Experiment, model_path: Callable[[str], Path], model: str | None = None, base: BenchConfig | None = None,
        only: list[str] | None = None, sizes: dict[str, int] | None = None, on_record: Callable[[dict], None] = lambda r: None,
        progress: bool = False) -> list[dict]:
  """Benches the baseline and each variant (or the `only` ones, baseline always first) on `model` (default the
  experiment's), at each of its depths; llama.cpp, when installed, is measured once, beside the baseline. Where the
  experiment asks for quality, each variant's records carry its perplexity and, the baseline's excepted, its KL
  divergence from the baseline. Returns the records."""
  chosen, base = chosen_variants(exp, only), base or BenchConfig()   # made here: its hints' defaults choose tinygrad's device
  name = model or exp.model
  path = model_path(name)
  run_id = f"{exp.name}-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
  records = []
  with tempfile.TemporaryDirectory(prefix="tinyzoo-quality-") as workdir:
    probe = quality_probe(exp.quality, workdir, progress) if exp.quality else None
    for v in chosen:
      cfg = config(exp, v, dataclasses.replace(base, peer=base.peer and v is exp.baseline), sizes)
      for measured in bench(path, model_label(name), cfg, probe):
        record = {**measured, "experiment": exp.name, "variant": v.name, "baseline": v is exp.baseline, "run": run_id}
        on_record(record)
        records.append(record)
  return records

def quality_probe(spec: dict[str, Any], workdir: str, progress: bool = False) -> Probe:
  """An experiment's `quality` table as a probe: its text (default the system's, experiments/quality.py), ctx (default
  512) and chunks (default all)."""
  return Probe(spec.get("text", DEFAULT_TEXT), spec.get("ctx", DEFAULT_CTX), spec.get("chunks"), workdir, progress)

def results_table(records: list[dict]) -> str:
  """Variants beside their baseline at the same depth: kernels/token, tok/s and prompt processing tok/s with the changes
  from the baseline, and llama.cpp's tok/s where it was measured."""
  bases = {r["metrics"]["depth"]: r["metrics"] for r in records if r["baseline"]}
  head = (f"{'variant':<24} {'depth':>6} {'kernels/tok':>11} {'Δ kernels':>9} {'tok/s':>8} {'Δ tok/s':>8} {'ms/tok':>8} {'MB/tok':>8} "
          f"{'pp tok/s':>9} {'Δ pp':>8} {'llama.cpp':>9}")
  with_quality = any("quality" in r for r in records)
  if with_quality: head += f" {'perplexity':>10} {'KL':>9} {'top-1':>7}"
  lines = [head, "-" * len(head)]
  for r in records:
    m = r["metrics"]
    if (base := bases.get(m["depth"])) is None: continue
    dk, ds = m["kernels_per_token"] - base["kernels_per_token"], 100 * (m["tok_s"] / base["tok_s"] - 1)
    dp = 100 * (m["pp_tok_s"] / base["pp_tok_s"] - 1)
    peer = f"{r['peer']['tok_s']:>9.2f}" if "peer" in r else f"{'-':>9}"
    lines.append(f"{r['variant'] + (' (baseline)' if r['baseline'] else ''):<24} {m['depth']:>6} {m['kernels_per_token']:>11} {dk:>+9} "
                 f"{m['tok_s']:>8.2f} {ds:>+7.1f}% {m['ms_per_token']['median']:>8.2f} {m['bytes_per_token'] / 1e6:>8.1f} {m['pp_tok_s']:>9.1f} "
                 f"{dp:>+7.1f}% {peer}" + (quality_columns(r.get("quality")) if with_quality else ""))
  return "\n".join(lines)

def quality_columns(q: dict | None) -> str:
  if q is None: return f" {'-':>10} {'-':>9} {'-':>7}"
  kl, top1 = (f"{q['kl_mean']:>9.6f}", f"{100 * q['top1']:>6.2f}%") if "kl_mean" in q else (f"{'base':>9}", f"{'':>7}")
  return f" {q['perplexity']:>10.4f} {kl} {top1}"

def describe(exp: Experiment, journal_records: list[dict]) -> str:
  lines = [f"{exp.name}: {exp.description}", f"model: {exp.model}"]
  if exp.reproduces: lines.append(f"reproduces: {exp.reproduces}")
  if exp.bench: lines.append("bench: " + ", ".join(f"{k}={v}" for k, v in exp.bench.items()))
  if exp.quality: lines.append("quality: " + ", ".join(f"{k}={v}" for k, v in exp.quality.items()) + " (perplexity; KL divergence from the baseline)")
  for v in exp.all_variants:
    switches = ", ".join(f"{k}={v}" for k, v in v.switches.items()) or "defaults"
    lines.append(f"  {'baseline' if v is exp.baseline else 'variant '} {v.name:<22} {switches}")
  runs = [r for r in journal_records if r.get("experiment") == exp.name]
  if runs:
    latest = runs[-1]["run"]
    chosen = [r for r in runs if r["run"] == latest]
    lines += ["", f"latest run {latest} ({chosen[0]['device']}, commit {chosen[0]['commit']}{'+' if chosen[0]['dirty'] else ''}):",
              results_table(chosen) if any(r["baseline"] for r in chosen) else "(no baseline in that run)"]
  else: lines += ["", "not run yet: tinyzoo exp run " + exp.name]
  return "\n".join(lines)
