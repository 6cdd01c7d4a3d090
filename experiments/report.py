"""`tinyzoo report`: the results page of a journal, report.md and its charts, in one folder.

For each named experiment (experiments/defs/), the seed's claim, the latest run on each device and model with every
variant's mean ± sd, and the verdict its definition's rule gives; then the speed matrix beside llama.cpp: per device
and model, the latest bench record of prompt processing (pp512) and of decode at each depth recorded. `summary` is the
short table README.md carries, the same on both pages. The page is written whole or not at all, after its charts."""
import math
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from experiments import journal, named
from experiments.journal import number as _num, record_time as _time
from experiments.named import Expect, Experiment, Verdict
from experiments.plot import cublas_tflops, gemm_kernels, gemm_shape_order, newest_gemms, plot, short_device
from experiments.profile import findings_text
from ops.cache import write_whole

PP = 512                                      # the prompt processing of the matrix: llama-bench's pp512
REPRODUCED, NOT_REPRODUCED, CONTRADICTED, NOT_RUN = "reproduced", "not reproduced", "contradicted", "not run"
NO_RULE = "no rule"                           # the verdict of a run of an experiment whose definition states none
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"   # around the summary table in README.md and report.md
Chart = Callable[[str, str, list[dict], str, str | None], str]   # (file stem, kind, records, caption, experiment) -> Markdown

def _latest(records: list[dict]) -> dict:
  """The newest record; of records of the same time, the last in the journal."""
  return max(enumerate(records), key=lambda ir: (_time(ir[1]), ir[0]))[1]

def value(record: dict, metric: str) -> tuple[float | None, float | None]:
  """The mean and the sd (None where not measured) of `metric` in `record`: metrics.<metric> and metrics.<metric>_sd,
  quality.<key> or profile.<key>."""
  table, key = record.get("metrics"), metric
  for part in ("quality", "profile"):
    if metric.startswith(f"{part}."): table, key = record.get(part), metric.removeprefix(f"{part}.")
  table = table if isinstance(table, dict) else {}
  mean, sd = table.get(key), table.get(f"{key}_sd")
  return (mean if _num(mean) else None), (sd if _num(sd) else None)

def judge(rule: Verdict, base: dict | None, variant: dict | None) -> str:
  """The verdict of `rule` on the baseline's and the variant's records at one depth: the variant's metric moves from what
  it is compared with (the baseline's, or the rule's `against`: a metric of the variant's record or a value) as the
  rule expects by more than its margin of that and by more than twice their combined sd (the sds measured):
  reproduced; the other way by as much: contradicted; neither: not reproduced; `same`: reproduced within that bound,
  contradicted beyond it; a record or its metric missing: not run."""
  (v, v_sd), (b, b_sd) = value(variant or {}, rule.metric), compared(rule, base, variant)
  if b is None or v is None: return NOT_RUN
  bound = max(rule.margin * abs(b), 2 * math.hypot(b_sd or 0.0, v_sd or 0.0))
  if rule.expect is Expect.SAME: return REPRODUCED if abs(v - b) <= bound else CONTRADICTED
  move = v - b if rule.expect is Expect.HIGHER else b - v
  return REPRODUCED if move > bound else CONTRADICTED if -move > bound else NOT_REPRODUCED

def compared(rule: Verdict, base: dict | None, variant: dict | None) -> tuple[float | None, float | None]:
  """What the rule compares the variant's metric with, and its sd: the baseline's metric, or the rule's `against`."""
  if isinstance(rule.against, str): return value(variant or {}, rule.against)
  return (None if variant is None else rule.against, None) if rule.against is not None else value(base or {}, rule.metric)

def fmt(x: float, sd: float | None = None) -> str:
  """A figure to three significant digits or more (thousands apart by commas), its sd beside it at the same decimals."""
  if isinstance(x, int) and sd is None: return f"{x:,}"
  d = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 2
  if d > 6: return f"{x:.2e}" + (f" ± {sd:.2e}" if sd is not None else "")
  return f"{x:,.{d}f}" + (f" ± {sd:,.{d}f}" if sd is not None else "")

def _cell(record: dict, metric: str) -> str:
  mean, sd = value(record, metric)
  return "-" if mean is None else fmt(mean, sd)

def _change(base: dict, record: dict, metric: str) -> str:
  (b, _), (v, _) = value(base, metric), value(record, metric)
  return "-" if b is None or v is None or b == 0 else f"{100 * (v / b - 1):+.1f}%"

def _when(records: list[dict]) -> str:
  r = _latest(records)
  return f"{str(r.get('commit', '?'))[:7]}{'+' if r.get('dirty') else ''}, {str(r.get('time', '?'))[:10]}"

def _table(head: list[str], rows: list[list[str]]) -> list[str]:
  line = lambda cells: "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
  return [line(head), "|" + "---|" * len(head), *map(line, rows)]

def _slug(*parts: str) -> str: return "-".join(re.sub(r"[^a-z0-9.]+", "-", p.lower()).strip("-") for p in parts)

def devices(records: list[dict]) -> list[str]:
  """The devices the journal's bench records ran on, GPUs first."""
  return sorted({str(r.get("device")) for r in records if journal.is_bench(r)}, key=lambda d: (d.startswith("CPU"), d))

# experiments

def latest_runs(exp: Experiment, records: list[dict]) -> dict[tuple[str, str], list[dict]]:
  """The latest run of `exp` on each device and model that its verdict can judge (one with a baseline and the rule's
  variant; any run with a baseline where it has no rule), by (device, model)."""
  judged = lambda run: any(r.get("baseline") for r in run) and (exp.verdict is None or any(r.get("variant") == exp.verdict.variant for r in run))
  return {(device, model): run for (_, device, model), run in journal.latest_runs(records, exp.name, judged).items()}

def at_depths(run: list[dict], variant: str | None = None) -> dict[int, dict]:
  """The baseline's records of a run (or `variant`'s) by depth, the latest at each."""
  out: dict[int, dict] = {}
  for r in sorted(run, key=_time):
    if (r.get("variant") == variant) if variant is not None else r.get("baseline"): out[r["metrics"].get("depth")] = r
  return out

def verdicts(exp: Experiment, run: list[dict]) -> list[tuple[int, dict, dict | None, str]]:
  """(depth, baseline record, variant record, verdict) at each depth of the run's baseline."""
  base, var = at_depths(run), at_depths(run, exp.verdict.variant) if exp.verdict else {}
  return [(d, b, var.get(d), judge(exp.verdict, b, var.get(d)) if exp.verdict else NO_RULE) for d, b in sorted(base.items())]

def rule_text(exp: Experiment) -> str:
  v = exp.verdict
  if v is None: return "Its definition states no verdict rule."
  than = (f"the baseline's (`{exp.baseline.name}`) at the same depth" if v.against is None else
          f"its own `{v.against}`" if isinstance(v.against, str) else f"the seed's figure, {v.against:g},")
  bound = f"{100 * v.margin:g}% of it and twice their combined sd where measured"
  if v.expect is Expect.SAME:
    return f"Rule: `{v.variant}`'s `{v.metric}` the same as {than} within {bound}: reproduced; beyond that: contradicted."
  other = "lower" if v.expect is Expect.HIGHER else "higher"
  return (f"Rule: `{v.variant}`'s `{v.metric}` {v.expect.value} than {than} by more than {bound}: reproduced; {other} by as much: "
          "contradicted; otherwise not reproduced.")

def _chart_kind(exp: Experiment, run: list[dict]) -> str:
  metric = exp.verdict.metric if exp.verdict else "tok_s"
  if metric.startswith("quality.") and all("quality" in r for r in run): return "quality"
  if metric == "tok_s": return "depth" if len({r["metrics"].get("depth") for r in run}) > 1 else "speed"
  return "kernels"

def run_table(run: list[dict]) -> list[str]:
  """Every variant of a run at each depth: kernels/token, tok/s and pp tok/s (mean ± sd) with their change from the
  baseline, llama.cpp's tok/s where measured beside it, and perplexity and KL divergence where the run measured quality."""
  base = at_depths(run)
  quality = any("quality" in r for r in run)
  head = ["variant", "depth", "kernels/token", "tok/s", "Δ tok/s", "pp tok/s", "Δ pp", "llama.cpp tok/s"] + (["perplexity", "KL"] if quality else [])
  rows = []
  latest = {(r.get("variant"), r["metrics"].get("depth")): r for r in sorted(run, key=_time)}
  for (name, depth), r in sorted(latest.items(), key=lambda kv: (kv[0][1], not kv[1].get("baseline"))):   # else as first run
    b = base.get(depth, r)
    peer = r.get("peer") if isinstance(r.get("peer"), dict) else {}
    change = (lambda metric: "") if r is b else lambda metric: _change(b, r, metric)
    row = [f"{name}{' (baseline)' if r is b else ''}", str(depth), _cell(r, "kernels_per_token"), _cell(r, "tok_s"), change("tok_s"),
           _cell(r, "pp_tok_s"), change("pp_tok_s"), fmt(peer["tok_s"], peer.get("tok_s_sd")) if _num(peer.get("tok_s")) else "-"]
    if quality:
      ppl, kl = value(r, "quality.perplexity")[0], value(r, "quality.kl_mean")[0]
      row += ["-" if ppl is None else f"{ppl:.3f}", "-" if kl is None or r is b else fmt(kl)]
    rows.append(row)
  return _table(head, rows)

def _flags(records: list[dict], label: Callable[[dict], str]) -> list[str]:
  """The flags of the records shown, each once, with the records that carry it."""
  flags: dict[str, list[str]] = defaultdict(list)
  for r in records:
    for f in r.get("flags", []): flags[f].append(label(r))
  return ["", "Flags:", *(f"- {', '.join(dict.fromkeys(who))}: {f}" for f, who in flags.items())] if flags else []

def experiment_section(exp: Experiment, records: list[dict], all_devices: list[str], chart: Chart) -> list[str]:
  runs = latest_runs(exp, records)
  lines = [f"### {exp.name}", "", exp.description, "", f"Seed's claim: {exp.reproduces or 'none stated'}", "", rule_text(exp), ""]
  rows, metric, variant = [], exp.verdict.metric if exp.verdict else "tok_s", exp.verdict.variant if exp.verdict else "variant"
  against = exp.verdict.against if exp.verdict else None
  compared_with = f"{exp.baseline.name} (baseline)" if against is None else f"`{against}`" if isinstance(against, str) else "seed's figure"
  head = ["device", "model", "run", "depth", compared_with, variant, "change", "verdict"]
  for device in all_devices:
    mine = [(model, run) for (d, model), run in sorted(runs.items()) if d == device]
    if not mine: rows.append([short_device(device), "-", "-", "-", "-", "-", "-", NOT_RUN])
    for model, run in mine:
      for depth, b, v, verdict in verdicts(exp, run):
        (c, c_sd), (x, _) = compared(exp.verdict, b, v) if exp.verdict else value(b, metric), value(v or {}, metric)
        rows.append([short_device(device), model, _when(run), str(depth), "-" if c is None else fmt(c, c_sd), "-" if v is None else _cell(v, metric),
                     "-" if c is None or x is None or c == 0 else f"{100 * (x / c - 1):+.1f}%",
                     verdict if verdict in (NOT_RUN, NO_RULE) else f"**{verdict}**"])
  lines += _table(head, rows)
  for (device, model), run in sorted(runs.items(), key=lambda kv: (all_devices.index(kv[0][0]), kv[0][1])):
    lines += ["", f"#### {short_device(device)} · {model} · {_when(run)}", "", *run_table(run)]
    lines += _flags(run, lambda r: f"{r.get('variant')} at depth {r['metrics'].get('depth')}")
    profiled = [f"- profile of {r.get('variant')} at depth {r['metrics'].get('depth')}: {findings_text(r['profile'])}" for r in run
                if isinstance(r.get("profile"), dict)]
    lines += ["", *profiled] if profiled else []
    kind = _chart_kind(exp, run)
    lines += ["", chart(_slug("exp", exp.name, short_device(device), model), kind, run,
                        f"{exp.name} on {model}, {short_device(device)}: {kind} per variant", exp.name)]
  return lines

def verdict_cell(exp: Experiment, records: list[dict], device: str) -> str:
  """The verdicts of the latest runs on `device`, counted where they differ."""
  counts = Counter(v for (d, _), run in latest_runs(exp, records).items() if d == device for _, _, _, v in verdicts(exp, run))
  if not counts: return NOT_RUN
  return next(iter(counts)) if len(counts) == 1 else ", ".join(f"{n} {v}" for v, n in counts.most_common())

# the speed matrix

@dataclass
class Row:
  """One model on one device: its latest pp512 record, its latest decode record at each depth, and its latest record."""
  model: str
  pp: dict | None
  tg: dict[int, dict]
  latest: dict

def matrix(records: list[dict]) -> dict[str, list[Row]]:
  """The speed matrix by device, GPUs first, then by model: plain bench records only (an experiment's variants and tune's
  trials set switches of their own)."""
  plain = [r for r in records if journal.is_bench(r) and not r.get("experiment")]
  groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
  for r in plain: groups[(str(r.get("device")), str(r.get("model")))].append(r)
  out: dict[str, list[Row]] = {d: [] for d in devices(plain)}
  for (device, model), rs in sorted(groups.items()):
    pp = [r for r in rs if r["metrics"].get("pp_tokens") == PP and _num(r["metrics"].get("pp_tok_s"))]
    depths: dict[int, list[dict]] = defaultdict(list)
    for r in rs:
      if isinstance(r["metrics"].get("depth"), int) and _num(r["metrics"].get("tok_s")): depths[r["metrics"]["depth"]].append(r)
    out[device].append(Row(model, _latest(pp) if pp else None, {d: _latest(v) for d, v in sorted(depths.items())}, _latest(rs)))
  return out

def _peer(r: dict, depth: int | None = None) -> dict:
  """The record's llama.cpp figures, where it measured them beside it (at the record's depth, for decode)."""
  peer = r.get("peer") if isinstance(r.get("peer"), dict) else {}
  if not str(peer.get("engine", "")).startswith("llama.cpp"): return {}
  return peer if depth is None or peer.get("depth", depth) == depth else {}

def speed_cell(r: dict | None, key: str) -> str:
  """llama.cpp / tinyzoo tok/s (tinyzoo ÷ llama.cpp) for `key` (tok_s, pp_tok_s) of one record; '-' for what was not measured."""
  if r is None: return "-"
  peer = _peer(r, None if key == "pp_tok_s" else r["metrics"].get("depth"))
  if key == "pp_tok_s" and peer.get("pp_tokens", PP) != PP: peer = {}
  ours, theirs = value(r, key), (peer.get(key), peer.get(f"{key}_sd"))
  cell = f"{fmt(theirs[0], theirs[1]) if _num(theirs[0]) else '-'} / {fmt(*ours)}"
  return cell + (f" ({ours[0] / theirs[0]:.2f})" if _num(theirs[0]) and theirs[0] > 0 else "")

def matrix_section(device: str, rows: list[Row], chart: Chart) -> list[str]:
  depths = sorted({d for row in rows for d in row.tg})
  head = ["model", f"pp{PP}", *(f"tg d{d}" for d in depths), "kernels/token", "floor ms", "latest"]
  body = []
  for row in rows:
    body.append([row.model, speed_cell(row.pp, "pp_tok_s"), *(speed_cell(row.tg.get(d), "tok_s") for d in depths),
                 _cell(row.latest, "kernels_per_token"), _cell(row.latest, "floor_ms"),
                 _when([r for r in (row.pp, *row.tg.values()) if r])])
  lines = [f"### {short_device(device)}", "", *_table(head, body)]
  shown = list({id(r): r for row in rows for r in (row.pp, *row.tg.values()) if r}.values())
  lines += _flags(shown, lambda r: f"{r.get('model')} at depth {r['metrics'].get('depth')}")
  pp = [row.pp for row in rows if row.pp and _num(_peer(row.pp).get("pp_tok_s"))]
  if pp: lines += ["", chart(_slug("pp", short_device(device)), "pp", pp, f"pp{PP} per model beside llama.cpp, {short_device(device)}", None)]
  if tg := [r for row in rows if len(row.tg) > 1 for r in row.tg.values()]:   # the models measured at several depths
    lines += ["", chart(_slug("depth", short_device(device)), "depth", tg, f"decode tok/s by depth beside llama.cpp, {short_device(device)}", None)]
  return lines

def newest_devices(records: list[dict]) -> list[str]:
  """Of each backend (the part of a device's name before its colon), the device of the newest bench record."""
  newest: dict[str, dict] = {}
  for r in sorted((r for r in records if journal.is_bench(r)), key=_time): newest[str(r.get("device")).split(":")[0]] = r
  return [d for d in devices(records) if d in {str(r.get("device")) for r in newest.values()}]

def summary(records: list[dict]) -> str:
  """The short table README.md carries: on the newest device of each backend, per model, the latest pp512 and the
  latest decode at the shallowest and the deepest depth measured beside llama.cpp, each tinyzoo's tok/s with its ratio
  to llama.cpp's; the models whose pp512 was measured beside llama.cpp's."""
  def ratio(r: dict, key: str, peer: dict) -> str: return f"{fmt(r['metrics'][key])} ({r['metrics'][key] / peer[key]:.2f}x)"
  rows, table = [], matrix(records)
  for device in newest_devices(records):
    for row in table.get(device, []):
      beside = [(d, r, p) for d, r in row.tg.items() if _num((p := _peer(r, d)).get("tok_s")) and p["tok_s"] > 0 and _num(r["metrics"].get("tok_s"))]
      pp = _peer(row.pp) if row.pp else {}
      if not beside or not _num(pp.get("pp_tok_s")) or pp.get("pp_tokens", PP) != PP or pp["pp_tok_s"] <= 0: continue
      (d0, r0, p0), (d1, r1, p1) = beside[0], beside[-1]
      rows.append([short_device(device), row.model, ratio(row.pp, "pp_tok_s", pp), f"{ratio(r0, 'tok_s', p0)} at d{d0}",
                   f"{ratio(r1, 'tok_s', p1)} at d{d1}" if d1 != d0 else "-", _cell(row.latest, "kernels_per_token")])
  head = ["device", "model", f"pp{PP} tok/s (× llama.cpp)", "decode tok/s (× llama.cpp), shallowest", "deepest", "kernels/token"]
  return "\n".join(_table(head, rows))

def gemm_section(records: list[dict], chart: Chart) -> list[str]:
  """The GEMM kernels: per device, model and shape, each kernel's newest `tinyzoo gemm` record's TFLOP/s beside cuBLAS's of
  the same run, and the chart of them; nothing without such records."""
  if not (newest := newest_gemms(records)): return []
  kernels = gemm_kernels(newest)
  rows = []
  for dev, model, sh in sorted({key[:3] for key in newest}, key=lambda w: (w[0], w[1], gemm_shape_order(w[2]))):
    got = [newest.get((dev, model, sh, k)) for k in kernels]
    cells = [f"{r['metrics']['tflops']:.3g}" + ("" if r["metrics"].get("correct", True) else " (wrong)") if r else "-" for r in got]
    cublas = cublas_tflops(newest, (dev, model, sh), kernels)
    shape = f"{sh[0]} {sh[1]}x{sh[2]}" + (f" x{sh[3]} experts" if sh[3] else "")
    commits = sorted({str(r.get("commit", "?"))[:7] for r in got if r})
    rows.append([dev, model, shape, *cells, f"{cublas:.3g}" if cublas else "-", ", ".join(commits)])
  return ["## GEMM kernels", "", "TFLOP/s of each GEMM shape of a prompt chunk (`tinyzoo gemm`: JIT steady state, any dequantization "
          "counted in), each kernel's newest record, beside cuBLAS's fp16 GEMM of the dequantized weights in the same run.", "",
          *_table(["device", "model", "weight, N x K", *(f"{k} TFLOP/s" for k in kernels), "cuBLAS TFLOP/s", "commits"], rows), "",
          chart("gemm", "gemm", list(newest.values()), "TFLOP/s of each GEMM shape per kernel", None), ""]

# the page

def page(records: list[dict], source: str, chart: Chart, defs: Path = named.DEFS) -> str:
  """report.md from the journal's records, `chart` drawing each chart and giving the Markdown that shows it."""
  exps, all_devices = named.load_all(defs), devices(records)
  bench = [r for r in records if journal.is_bench(r)]
  lines = ["# tinyzoo results", "", f"Made by `tinyzoo report {source} -o DIR` from its {len(records):,} records ({len(bench):,} of decode "
           f"benchmarks), the newest of {str(_latest(bench).get('time', '?'))[:10] if bench else 'none'}. Figures are tok/s, mean ± sd where "
           "repeats measured the spread.", "", "## Summary", "", BEGIN, summary(records), END, "",
           "Verdicts of each experiment's latest runs, per device (counted where its models or depths differ):", ""]
  lines += _table(["experiment", *map(short_device, all_devices)], [[f"[{e.name}](#{e.name})", *(verdict_cell(e, records, d) for d in all_devices)]
                                                                  for e in exps.values()])
  lines += ["", "## Experiments", "", "Each experiment's latest run on each device and model that its rule can judge, the rule's metric "
            "of the baseline and of the variant at each depth, then every variant of that run.", ""]
  for exp in exps.values(): lines += [*experiment_section(exp, records, all_devices, chart), ""]
  lines += gemm_section(records, chart)
  lines += ["## Speed beside llama.cpp", "", f"Per device and model, the latest plain bench record (no experiment's) of prompt processing "
            f"of {PP} tokens from an empty context (pp{PP}) and of decode after each depth of context recorded (tg dD): llama.cpp / "
            "tinyzoo tok/s (tinyzoo ÷ llama.cpp), llama.cpp measured in the same run; kernels per token and the memory floor (ms to "
            "read a token's weights at the copy bandwidth) from the model's latest record; the commit and date of the newest shown.", ""]
  for device, rows in matrix(records).items(): lines += [*matrix_section(device, rows, chart), ""]
  return "\n".join(lines)

def report(journal_path: os.PathLike | str, out: os.PathLike | str, defs: Path = named.DEFS) -> Path:
  """Writes out/report.md and its charts (out/charts/) from the journal at `journal_path`; returns the page's path."""
  journal_path, out = Path(journal_path), Path(out)
  if not journal_path.is_file(): raise ValueError(f"{journal_path}: no such journal (the project's is {journal.PROJECT_JOURNAL})")
  if out.exists() and not out.is_dir(): raise ValueError(f"{out}: not a folder")
  if not (records := journal.read(journal_path)): raise ValueError(f"{journal_path}: no journal records")
  (out / "charts").mkdir(parents=True, exist_ok=True)
  def chart(stem: str, kind: str, rs: list[dict], caption: str, experiment: str | None) -> str:
    try: plot(rs, kind, out / "charts" / f"{stem}.png", experiment=experiment)
    except ValueError as e: return f"(no chart of {caption}: {e})"
    return f"![{caption}](charts/{stem}.png)"
  write_whole(path := out / "report.md", page(records, str(journal_path), chart, defs))
  path.chmod(0o644)
  return path
