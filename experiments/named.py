"""Named experiments: YAML files in experiments/defs/, each a model, a baseline and variants, every one a set of switches.
`run` measures baseline and variants in one process, one journal record each, sharing a run id; `reproduce` runs every
experiment that reproduces a seed's finding that the device at hand can run, its records sharing a reproduction id too."""
import dataclasses
import datetime
import enum
import functools
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
import yaml
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES
from tinygrad import Device
from experiments.bench import BenchConfig, bench, pm
from experiments.journal import context, latest_runs, number as _number
from experiments.profile import findings_text
from ops.cuda import hint_refusal
from experiments.quality import DEFAULT_CTX, DEFAULT_TEXT, Probe
from models.catalog import ModelNotFound, model_label
from profiles.hints import HINTS, check
from quant.gguf_file import GGUFFile
from quant.requant import requantizes

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
def _replays(value: Any) -> int:
  if _typed("repeats", int, value) < 1: raise ValueError(f"repeats must be at least 1, got {value}")
  return value

PROFILE_KEYS: dict[str, Callable[[Any], Any]] = {"repeats": _replays}
BENCH_KEYS: dict[str, Callable[[Any], Any]] = {**{k: functools.partial(_typed, k, int) for k in ("tokens", "pp", "warmup", "ctx")}, "depths": _depths}

class Needs(enum.Enum):
  """What a model (or the device) must have for an experiment to show its effect; a run on one without it is refused."""
  EXPERTS = "experts"                # MoE blocks (routing, expert matmuls)
  SHARED_EXPERTS = "shared_experts"  # MoE blocks with shared experts (DeepSeek's)
  MLA = "mla"                        # latent attention (DeepSeek-style)
  Q4K_ROWS = "q4k_rows"              # every matmul's rows hold whole 256-value super-blocks, so that Q4_K can hold each weight
  GPU = "gpu"
  CPU = "cpu"

# a model need: a tensor name part that only a model with it has, and what the need is called in a refusal
HAS_TENSOR = {Needs.EXPERTS: ("_exps.", "experts (MoE blocks)"), Needs.SHARED_EXPERTS: ("_shexp.", "shared experts"),
              Needs.MLA: ("attn_kv_a_mqa.", "latent attention (MLA)")}

class Expect(enum.Enum):
  HIGHER = "higher"
  LOWER = "lower"
  SAME = "same"     # within the margin either way

@dataclass(frozen=True)
class Verdict:
  """The rule that says whether a run reproduced the seed's finding: `variant`'s `metric` (a metrics key, quality.<key> or
  profile.<key>) against the baseline's at the same depth, or, where `against` is given, against another metric of the
  same record (a name) or a value the seed states (a number). It moves as `expect` says (higher, lower) by more than
  `margin` (a fraction of what it is compared with) and by more than twice their spread where it was measured:
  reproduced; the other way: contradicted; neither: not reproduced. `same` is reproduced within the margin, contradicted
  beyond it."""
  metric: str
  variant: str
  expect: Expect
  margin: float = 0.05
  against: str | float | None = None

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
  cpu_model: str | None = None   # the CPU's model where it differs (`model` is then the GPU's): a -tiny one for a seed model too large
  profile: dict[str, int] | None = None   # if given, each variant's decode step profiled kernel by kernel too (its findings in
                                          # the record's `profile`): repeats (replays timed, default PROFILE_REPEATS)

  @property
  def all_variants(self) -> tuple[Variant, ...]: return (self.baseline, *self.variants)

  def model_for(self, device: str) -> str:
    """The model it runs on on `device` (tinygrad's name: CPU, CUDA, ...)."""
    return self.cpu_model if self.cpu_model is not None and on_cpu(device) else self.model

def on_cpu(device: str) -> bool: return device.split(":")[0] == "CPU"

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

def _verdict(where: str, raw: Any, variants: set[str], baseline: str) -> Verdict | None:
  if raw is None: return None
  if not isinstance(raw, dict) or set(raw) - {"metric", "variant", "expect", "margin", "against"} or not {"metric", "variant", "expect"} <= set(raw):
    raise ExperimentError(f"{where}: verdict takes metric, variant, expect (higher, lower or same) and optionally margin and against, got {raw!r}")
  against = raw.get("against")
  if against is not None and not (isinstance(against, str) and against or _number(against)):
    raise ExperimentError(f"{where}: verdict against must be a metric's name or a number, got {against!r}")
  if raw["variant"] not in variants | ({baseline} if against is not None else set()):
    raise ExperimentError(f"{where}: verdict names no variant of this experiment: {raw['variant']!r}"
                          + (" (the baseline is judged only against another metric or a value: against)" if raw["variant"] == baseline else ""))
  try: expect = Expect(raw["expect"])
  except ValueError: raise ExperimentError(f"{where}: verdict expect must be higher, lower or same, got {raw['expect']!r}") from None
  margin = raw.get("margin", Verdict.margin)
  if not _number(margin) or not 0 <= margin < 1:
    raise ExperimentError(f"{where}: verdict margin must be a fraction in [0, 1), got {margin!r}")
  return Verdict(str(raw["metric"]), raw["variant"], expect, float(margin), against)

def _needs(where: str, raw: Any) -> tuple[Needs, ...]:
  items = raw if isinstance(raw, list) else [] if raw is None else [raw]
  try: return tuple(Needs(x) for x in items)
  except ValueError: raise ExperimentError(f"{where}: needs takes {', '.join(n.value for n in Needs)}, got {raw!r}") from None

def _models(where: str, raw: Any) -> tuple[str, str | None]:
  """`model`: one name for every device, or {gpu: NAME, cpu: NAME} -> (the GPU's, the CPU's or None)."""
  if isinstance(raw, str) and raw: return raw, None
  if isinstance(raw, dict) and set(raw) == {"gpu", "cpu"} and all(isinstance(v, str) and v for v in raw.values()): return raw["gpu"], raw["cpu"]
  raise ExperimentError(f"{where}: model must be a name or {{gpu: NAME, cpu: NAME}}, got {raw!r}")

def load(path: Path) -> Experiment:
  """An experiment's definition, checked: one line names the first thing wrong. `variants` may be empty only where the
  verdict judges the baseline alone (against another of its metrics or a value)."""
  where = str(path)
  try: raw = yaml.safe_load(path.read_text())
  except yaml.YAMLError as e: raise ExperimentError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
  if not isinstance(raw, dict): raise ExperimentError(f"{where}: expected a mapping at the top")
  for key in ("description", "model", "baseline", "variants"):
    if key not in raw: raise ExperimentError(f"{where}: missing {key!r}")
  if not isinstance(raw["variants"], list): raise ExperimentError(f"{where}: 'variants' must be a list")
  baseline, variants = _variant(where, raw["baseline"]), tuple(_variant(where, v) for v in raw["variants"])
  if len({v.name for v in (baseline, *variants)}) != 1 + len(variants): raise ExperimentError(f"{where}: variant names must be unique")
  if unknown := set(raw) - {"description", "model", "reproduces", "bench", "baseline", "variants", "quality", "verdict", "needs", "profile"}:
    raise ExperimentError(f"{where}: unknown key {sorted(unknown)[0]!r}")
  verdict = _verdict(where, raw.get("verdict"), {v.name for v in variants}, baseline.name)
  if not variants and (verdict is None or verdict.variant != baseline.name):
    raise ExperimentError(f"{where}: 'variants' must be a non-empty list, unless the verdict judges the baseline against another metric or a value")
  model, cpu_model = _models(where, raw["model"])
  return Experiment(path.stem, str(raw["description"]).strip(), model, str(raw.get("reproduces", "")).strip(),
                    _checked(f"{where} bench", raw.get("bench", {}), BENCH_KEYS), baseline, variants,
                    _checked(f"{where} quality", raw.get("quality", {}), QUALITY_KEYS), verdict, _needs(where, raw.get("needs")), cpu_model,
                    _checked(f"{where} profile", {} if raw.get("profile") is None else raw["profile"], PROFILE_KEYS) if "profile" in raw else None)

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

Q4K_ROW = GGML_QUANT_SIZES[T.Q4_K][0]
PROFILE_REPEATS = 5

def unmet(exp: Experiment, model: str, model_path: Callable[[str], Path], device: str) -> str | None:
  """Why `exp` cannot show its effect on `model` on `device` (tinygrad's name), in one line; None where it can. The
  device's needs are checked first, so that a model (a synthetic preset, written on first use) is made only where the
  device can run the experiment; the model's are read from its file's tensor directory, no weight loaded."""
  for need, wrong, wants in ((Needs.GPU, on_cpu(device), "a GPU"), (Needs.CPU, not on_cpu(device), "the CPU")):
    if need in exp.needs and wrong: return f"{exp.name} needs {wants}: this device is {device}"
  for why in (hint_refusal(hint, value, device) for v in exp.all_variants for hint, value in v.switches.items()):
    if why is not None: return f"{exp.name}: {why}"
  if not (needs := [n for n in exp.needs if n not in (Needs.GPU, Needs.CPU)]): return None
  g = GGUFFile(model_path(model))
  for need in needs:
    if need is Needs.Q4K_ROWS:
      # a weight a Q4_0 copy holds in Q4_0 that a Q4_K copy keeps in its old type: its rows are no whole super-blocks
      held = lambda info, t: info.ggml_type == t or requantizes(info, t)
      if (misfit := next((i for i in g.tensors.values() if held(i, T.Q4_0) and not held(i, T.Q4_K)), None)) is not None:
        return (f"{exp.name} needs weights that Q4_0 and Q4_K can both hold (rows of whole {Q4K_ROW}-value super-blocks): "
                f"{model}'s {misfit.name} has rows of {misfit.shape[-1]}")
    elif not any(HAS_TENSOR[need][0] in name for name in g.tensors): return f"{exp.name} needs {HAS_TENSOR[need][1]}: {model} has none"
  return None

def _stamp() -> str: return f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"

def run(exp: Experiment, model_path: Callable[[str], Path], model: str | None = None,
        base: BenchConfig | Callable[[Path], BenchConfig] | None = None, only: list[str] | None = None, sizes: dict[str, int] | None = None,
        on_record: Callable[[dict], None] = lambda r: None, progress: bool = False, reproduction: str | None = None) -> list[dict]:
  """Benches the baseline and each variant (or the `only` ones, baseline always first) on `model` (default the
  experiment's for this device), at each of its depths; llama.cpp, when installed, is measured once, beside the baseline.
  A model or device that cannot show the experiment's effect (its `needs`) is refused. `base` is the config the
  switches apply over, or what makes it from the model's file (its hints: the device's profile, the file's manifest).
  Where the experiment asks for quality, each variant's records carry its perplexity and, the baseline's excepted, its
  KL divergence from the baseline. Records carry the `reproduction` id where given. Returns the records."""
  chosen, name = chosen_variants(exp, only), model or exp.model_for(Device.DEFAULT)
  if (why := unmet(exp, name, model_path, Device.DEFAULT)) is not None: raise ExperimentError(why)
  path = model_path(name)
  base = base(path) if callable(base) else base or BenchConfig()   # made here: its hints' defaults choose tinygrad's device
  run_id, tags = f"{exp.name}-{_stamp()}", {} if reproduction is None else {"reproduction": reproduction}
  records = []
  with tempfile.TemporaryDirectory(prefix="tinyzoo-quality-") as workdir:
    probe = quality_probe(exp.quality, workdir, progress) if exp.quality else None
    for v in chosen:
      cfg = config(exp, v, dataclasses.replace(base, peer=base.peer and v is exp.baseline), sizes)
      replays = None if exp.profile is None else exp.profile.get("repeats", PROFILE_REPEATS)
      for measured in bench(path, model_label(name), cfg, probe, replays):
        record = {**measured, "experiment": exp.name, "variant": v.name, "baseline": v is exp.baseline, "run": run_id, **tags}
        on_record(record)
        records.append(record)
  return records

SEED = re.compile(r"\bseed \d+")   # how an experiment's `reproduces` names the seed document whose finding it re-runs

def seed_experiments(defs: Path = DEFS, only: list[str] | None = None) -> list[Experiment]:
  """The experiments whose `reproduces` names a seed, or the `only` ones of them."""
  found = {n: e for n, e in load_all(defs).items() if SEED.search(e.reproduces)}
  if only and (unknown := sorted(set(only) - set(found))):
    raise ExperimentError(f"no experiment named {unknown[0]!r} reproduces a seed (those that do: {', '.join(found) or 'none'})")
  return [e for n, e in found.items() if not only or n in only]

@dataclass(frozen=True)
class Reproduction:
  id: str
  commit: str
  device: str
  ran: tuple[str, ...]
  refused: tuple[tuple[str, str], ...]   # (experiment, why)
  failed: tuple[tuple[str, str], ...] = ()   # (experiment, the error that stopped it)

  def summary(self) -> str:
    refused, failed = ("; ".join(why for _, why in whys) for whys in (self.refused, self.failed))
    return (f"reproduction {self.id} at {self.commit} on {self.device}: ran {len(self.ran)} ({', '.join(self.ran) or 'none'}); "
            f"refused {len(self.refused)}" + (f" ({refused})" if refused else "") + (f"; failed {len(self.failed)} ({failed})" if failed else ""))

def reproduce(model_path: Callable[[str], Path], base: Callable[[Path], BenchConfig], defs: Path = DEFS, only: list[str] | None = None,
              sizes: dict[str, int] | None = None, on_record: Callable[[dict], None] = lambda r: None,
              on_results: Callable[[Experiment, list[dict]], None] = lambda e, r: None, progress: bool = False) -> Reproduction:
  """Runs every experiment that reproduces a seed (or the `only` ones) on its model for the device at hand, baseline
  beside variants (`run`), at one commit: a tree with uncommitted changes is refused, unless TINYZOO_COMMIT names the
  commit (a copied tree, journal.context). An experiment the device or its model cannot show is refused with the reason,
  as is one whose model is not installed; `on_results` takes each one's records as it ends. Every record carries the
  reproduction's id beside its run's; a line on stderr says which experiment starts. One that fails is named with its
  error, and the others run on (the records it journaled before it failed stay, each whole)."""
  experiments, code = seed_experiments(defs, only), context()
  if code["dirty"]:
    raise ExperimentError(f"the tree has uncommitted changes beside commit {code['commit']}: commit them, so that every record is of "
                          "one commit (a copied tree gives its commit as TINYZOO_COMMIT)")
  rid, device, ran, refused, failed = f"reproduction-{_stamp()}", Device.DEFAULT, [], [], []
  for i, exp in enumerate(experiments, 1):
    model = exp.model_for(device)
    print(f"reproduce [{i}/{len(experiments)}] {exp.name} on {model}", file=sys.stderr, flush=True)
    try:
      if (why := unmet(exp, model, model_path, device)) is None: model_path(model)   # one not installed is refused too
    except ModelNotFound as e: why = f"{exp.name}: {e}"
    if why is not None:
      print(f"refused: {why}", file=sys.stderr, flush=True)
      refused.append((exp.name, why))
      continue
    try: on_results(exp, run(exp, model_path, model, base, sizes=sizes, on_record=on_record, progress=progress, reproduction=rid))
    except Exception as e:   # noqa: BLE001 -- a kernel that does not compile, a model that does not fit: the next experiment still runs
      why = f"{exp.name}: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
      print(f"failed: {why}", file=sys.stderr, flush=True)
      failed.append((exp.name, why))
      continue
    ran.append(exp.name)
  return Reproduction(rid, code["commit"], code["device"], tuple(ran), tuple(refused), tuple(failed))

def quality_probe(spec: dict[str, Any], workdir: str, progress: bool = False) -> Probe:
  """An experiment's `quality` table as a probe: its text (default the system's, experiments/quality.py), ctx (default
  512) and chunks (default all)."""
  return Probe(spec.get("text", DEFAULT_TEXT), spec.get("ctx", DEFAULT_CTX), spec.get("chunks"), workdir, progress)

def _mean_sd(m: Any, key: str, digits: int) -> str:
  """m[key] as `mean ± sd` where its spread was measured, the mean alone where not, '-' where it was not measured."""
  return pm(m, key, digits) if isinstance(m, dict) and _number(m.get(key)) else "-"

def _change(m: dict, base: dict, key: str) -> str:
  a, b = m.get(key), base.get(key)
  return f"{100 * (a / b - 1):+.1f}%" if _number(a) and _number(b) and b > 0 else "-"

def results_table(records: list[dict]) -> str:
  """Variants beside their baseline at the same depth: kernels/token, tok/s and prompt processing tok/s (mean ± sd where
  the spread was measured) with the changes from the baseline, and the peer's (llama.cpp's) where it was measured. Under
  the table: each flagged record's flags (the record marked ! in its row), the records that cannot be compared and why,
  what an old record's pp means, and the findings of each profiled record."""
  bases = {r["metrics"].get("depth"): r["metrics"] for r in records if r.get("baseline")}
  head = ["variant", "depth", "kernels/tok", "Δ kernels", "tok/s", "Δ tok/s", "ms/tok", "MB/tok", "pp tok/s", "Δ pp", "llama.cpp",
          "llama.cpp pp"]
  with_quality = any("quality" in r for r in records)
  if with_quality: head += ["perplexity", "KL", "top-1"]
  rows, flags, notes, profiled, prefill = [], [], [], [], set()
  for r in records:
    m = r["metrics"]
    name = f"{r.get('variant')}{' (baseline)' if r.get('baseline') else ''}"
    at = f"{name} @d{m.get('depth')}"
    if (base := bases.get(m.get("depth"))) is None:
      notes.append(f"not comparable: {at}: the run has no baseline at that depth")
      continue
    if not _number(m.get("pp_tok_s")): notes.append(f"pp not comparable: {at}: no pp measured")
    if "pp_tok_s" in r.get("upgraded", ()): prefill.add(m.get("pp_tokens"))
    kpt, ms, nbytes = m.get("kernels_per_token"), (m.get("ms_per_token") or {}).get("median"), m.get("bytes_per_token")
    rows.append([name + (" !" if r.get("flags") else ""), str(m.get("depth", "-")), str(kpt) if _number(kpt) else "-",
                 f"{kpt - base['kernels_per_token']:+}" if _number(kpt) and _number(base.get("kernels_per_token")) else "-",
                 _mean_sd(m, "tok_s", 2), _change(m, base, "tok_s"), f"{ms:.2f}" if _number(ms) else "-",
                 f"{nbytes / 1e6:.1f}" if _number(nbytes) else "-", _mean_sd(m, "pp_tok_s", 1), _change(m, base, "pp_tok_s"),
                 _mean_sd(r.get("peer"), "tok_s", 2), _mean_sd(r.get("peer"), "pp_tok_s", 1),
                 *(quality_cells(r.get("quality")) if with_quality else [])])
    flags += [f"! {at}: {flag}" for flag in r.get("flags") or ()]
    if isinstance(r.get("profile"), dict): profiled.append(f"profile {at}: {findings_text(r['profile'])}")
  if prefill: notes.append(f"pp of records from before --pp: the prefill of their prompt ({', '.join(map(str, sorted(prefill, key=str)))} tokens)")
  widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
  line = lambda cells: " ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
  return "\n".join([line(head), "-" * len(line(head)), *map(line, rows), *flags, *notes, *profiled])

def quality_cells(q: dict | None) -> list[str]:
  if not isinstance(q, dict) or not _number(q.get("perplexity")): return ["-", "-", "-"]
  kl, top1 = (f"{q['kl_mean']:.6f}", f"{100 * q['top1']:.2f}%") if _number(q.get("kl_mean")) and _number(q.get("top1")) else ("base", "")
  return [f"{q['perplexity']:.4f}", kl, top1]

def describe(exp: Experiment, journal_records: list[dict]) -> str:
  """The experiment, and the latest run of it on each model and device the journal has it on, each beside its baseline."""
  lines = [f"{exp.name}: {exp.description}", f"model: {exp.model}" + (f" (on the CPU: {exp.cpu_model})" if exp.cpu_model else "")]
  if exp.reproduces: lines.append(f"reproduces: {exp.reproduces}")
  if exp.bench: lines.append("bench: " + ", ".join(f"{k}={v}" for k, v in exp.bench.items()))
  if exp.quality: lines.append("quality: " + ", ".join(f"{k}={v}" for k, v in exp.quality.items()) + " (perplexity; KL divergence from the baseline)")
  for v in exp.all_variants:
    switches = ", ".join(f"{k}={v}" for k, v in v.switches.items()) or "defaults"
    lines.append(f"  {'baseline' if v is exp.baseline else 'variant '} {v.name:<22} {switches}")
  runs = latest_runs(journal_records, exp.name)
  for (_, device, model), chosen in runs.items():
    commits = list(dict.fromkeys(f"{r.get('commit')}{'+' if r.get('dirty') else ''}" for r in chosen))
    lines += ["", f"latest run on {model}, {device}: {chosen[0].get('run')} (commit{'s' if len(commits) > 1 else ''} {', '.join(commits)})",
              results_table(chosen) if any(r.get("baseline") for r in chosen) else "(no baseline in that run)"]
  if not runs: lines += ["", "not run yet: tinyzoo exp run " + exp.name]
  return "\n".join(lines)
