"""Charts from the journal: kernels/token and tok/s per variant of an experiment's latest run, speed against the memory
floor and the peers, the kernel mix, tok/s over commits, prompt processing per model against the peer's, decode tok/s
against the depth of context before it beside the peer's at the same depths, and tok/s against KL divergence per variant.

Drawn on a bare matplotlib Figure (Agg renders the PNG; no pyplot, no display), written whole or not at all: saved to a
temp file beside the target, then renamed over it. The target's suffix picks the format (png, svg, pdf)."""
import datetime
import itertools
import math
import os
import re
import statistics
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from experiments.journal import KINDS, commit_times
from ops.kernels import CATEGORIES   # stacked bottom to top; others follow, sorted

FORMATS = ("png", "svg", "pdf")
DPI = 120
SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "tinyzoo"}   # SVG text stays text (searchable, smaller); ids reproducible
BASELINE_COLOR, VARIANT_COLOR, TOKS_COLOR, FLOOR_COLOR = "#9e9e9e", "#4c72b0", "#dd8452", "#c44e52"
CATEGORY_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")
LABEL_BOX = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
PEER_STYLES = (("#2ca02c", "--"), ("#9467bd", "-."), ("#8c564b", ":"), ("#17becf", "--"))

def short_device(device: str) -> str:
  """'CPU: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz, 2 cores' -> 'CPU: Intel Xeon Platinum 8375C, 2 cores'."""
  backend, sep, hw = (device or "unknown device").partition(": ")
  if not sep: return backend
  name, *rest = hw.split(", ")
  name = re.sub(r"\((R|TM)\)|@.*$|\b(CPU|Processor)\b", " ", name, flags=re.I)
  name = " ".join(name.split()) or hw.split(", ")[0]
  return f"{backend}: {', '.join([name, *rest])}"

def short_engine(peer: dict) -> str:
  engine = str(peer.get("engine", "peer"))
  return "tinygrad app" if engine.startswith("tinygrad") else engine.split(" ")[0]

def _time(r: dict) -> float:
  try: return datetime.datetime.fromisoformat(r["time"]).timestamp()
  except (KeyError, TypeError, ValueError): return -math.inf

def _metrics(r: dict) -> dict: return r.get("metrics") if isinstance(r.get("metrics"), dict) else {}

def _number(x: Any) -> bool: return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

def _plural(n: int, word: str) -> str: return f"{n} {word}{'' if n == 1 else 's'}"

def _check_experiment(experiment: str | None, known: list[str]) -> None:
  if experiment is not None and experiment not in known:
    raise ValueError(f"unknown experiment {experiment!r}; known: {', '.join(known) or 'none (no journal record comes from an experiment run)'}")

@dataclass
class Panel:
  """The variants of one experiment's latest run on one model and device, baseline first."""
  experiment: str
  run: Any
  model: str
  device: str
  records: list[dict]

  @property
  def title(self) -> str: return f"{self.experiment} · {self.model}\n{short_device(self.device)}"

  def labels(self) -> list[str]: return [f"{r['variant']}\n(baseline)" if r.get("baseline") else str(r["variant"]) for r in self.records]

def _panels(records: list[dict], experiment: str | None, model: str | None, need: Callable[[dict], bool], what: str,
            notes: list[str]) -> list[Panel]:
  runs = [r for r in records if r.get("experiment")]
  known = sorted({str(r["experiment"]) for r in runs})
  _check_experiment(experiment, known)
  if not runs:
    raise ValueError("no experiment records in the journal (only `exp run` records carry experiment, variant, run); kind 'history' plots every bench")
  if len(runs) < len(records): notes.append(f"{_plural(len(records) - len(runs), 'record')} outside experiments not shown")
  runs = [r for r in runs if experiment is None or r["experiment"] == experiment]
  if model is not None:
    models = sorted({str(r.get("model")) for r in runs})
    runs = [r for r in runs if r.get("model") == model]
    if not runs: raise ValueError(f"no experiment records for model {model!r}; models: {', '.join(models)}")
  panels, skipped = [], Counter()
  for name in sorted({str(r["experiment"]) for r in runs}):
    by_run = defaultdict(list)
    for r in runs:
      if r["experiment"] == name: by_run[r.get("run")].append(r)
    run_id = max(by_run, key=lambda k: max(map(_time, by_run[k])))
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in sorted(by_run[run_id], key=_time):
      if r.get("variant") is None: skipped["without a variant name"] += 1
      elif not need(r): skipped[f"without {what}"] += 1
      else: groups[(str(r.get("model")), str(r.get("device")))][str(r["variant"])] = r   # a variant measured twice: the latest
    for (mod, dev), variants in groups.items():
      ordered = sorted(variants.values(), key=lambda r: (not r.get("baseline"), _time(r)))
      panels.append(Panel(name, run_id, mod, dev, ordered))
  notes.extend(f"skipped {_plural(n, 'record')} {why}" for why, n in skipped.items())
  if not panels:
    scope = f"experiment {experiment!r}" if experiment else "the latest experiment runs"
    if set(skipped) <= {f"without {what}"}: raise ValueError(f"no record of {scope}{f' on {model!r}' if model else ''} has {what}; nothing to plot")
    reasons = [f"{_plural(n, 'record')} {why}" for why, n in skipped.items()]
    raise ValueError(f"nothing to plot from {scope}: skipped {', '.join(reasons) or 'every record'}")
  return panels

def _grid(n: int, width: float, height: float) -> tuple[Figure, list[Axes]]:
  cols = 1 if n == 1 else 2
  rows = math.ceil(n / cols)
  fig = Figure(figsize=(width * cols, height * rows), dpi=DPI)
  return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]

def _panel_width(panels: list[Panel]) -> float: return max(5.5, 2.8 + 1.0 * max(len(p.records) for p in panels))

def _variant_ticks(ax: Axes, panel: Panel) -> None:
  labels = panel.labels()
  long = max(len(s) for l in labels for s in l.split("\n")) > 10 or len(labels) > 5
  ax.set_xticks(range(len(labels)), labels, rotation=30 if long else 0, ha="right" if long else "center", fontsize=8,
                rotation_mode="anchor" if long else "default")
  for tick, r in zip(ax.get_xticklabels(), panel.records):
    if r.get("baseline"): tick.set_fontweight("bold")

def _bar_style(r: dict) -> dict:
  return {"facecolor": BASELINE_COLOR, "hatch": "//", "edgecolor": "black"} if r.get("baseline") else \
    {"facecolor": VARIANT_COLOR, "edgecolor": "black"}

def _kernels(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  panels = _panels(records, experiment, model, lambda r: _number(_metrics(r).get("kernels_per_token")), "metrics.kernels_per_token", notes)
  fig, axes = _grid(len(panels), _panel_width(panels), 4.4)
  for ax, p in zip(axes, panels):
    x = list(range(len(p.records)))
    kpt = [_metrics(r)["kernels_per_token"] for r in p.records]
    tok = [_metrics(r).get("tok_s") if _number(_metrics(r).get("tok_s")) else math.nan for r in p.records]
    bars = ax.bar(x, kpt, width=0.6, linewidth=0.8)
    for bar, r in zip(bars, p.records): bar.set(**_bar_style(r))
    for xi, k in zip(x, kpt):   # at the foot of the bar, clear of the tok/s line above
      ax.annotate(f"{k:g}", (xi, 0), textcoords="offset points", xytext=(0, 4), ha="center", va="bottom", fontsize=8, bbox=LABEL_BOX)
    ax.set_ylim(0, max(kpt) * 1.1 or 1)
    ax.set_ylabel("kernels / token")
    ax2 = ax.twinx()
    ax2.plot(x, tok, "-o", color=TOKS_COLOR, lw=1.5, ms=6, label="tok/s")
    for xi, t in zip(x, tok):
      if not math.isnan(t):
        ax2.annotate(f"{t:.2f}", (xi, t), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8, color=TOKS_COLOR, bbox=LABEL_BOX)
    finite = [t for t in tok if not math.isnan(t)]
    ax2.set_ylim(0, max(finite) * 1.2 if finite else 1)
    ax2.set_ylabel("tok/s (decode, median)", color=TOKS_COLOR)
    ax2.tick_params(axis="y", colors=TOKS_COLOR)
    _variant_ticks(ax, p)
    ax.set_title(p.title, fontsize=10)
  return fig, [Patch(**_bar_style({}), label="kernels/token (bars)"), Patch(**_bar_style({"baseline": True}), label="baseline"),
               Line2D([], [], color=TOKS_COLOR, marker="o", label="tok/s (right axis)")]

def _peers(r: dict) -> list[dict]:
  peers = r.get("peers") if isinstance(r.get("peers"), list) else [r["peer"]] if isinstance(r.get("peer"), dict) else []
  return [p for p in peers if isinstance(p, dict) and _number(p.get("tok_s"))]

def _speed(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  panels = _panels(records, experiment, model, lambda r: _number(_metrics(r).get("tok_s")), "metrics.tok_s", notes)
  styles = dict(zip(sorted({short_engine(peer) for p in panels for r in p.records for peer in _peers(r)}), itertools.cycle(PEER_STYLES)))
  fig, axes = _grid(len(panels), _panel_width(panels), 4.6)
  for ax, p in zip(axes, panels):
    x = list(range(len(p.records)))
    tok = [_metrics(r)["tok_s"] for r in p.records]
    ms = [_metrics(r).get("ms_per_token") if isinstance(_metrics(r).get("ms_per_token"), dict) else {} for r in p.records]
    lo = [1e3 / m["max"] if _number(m.get("max")) and m["max"] > 0 else t for m, t in zip(ms, tok)]
    hi = [1e3 / m["min"] if _number(m.get("min")) and m["min"] > 0 else t for m, t in zip(ms, tok)]
    yerr = [[max(t - l, 0) for t, l in zip(tok, lo)], [max(h - t, 0) for t, h in zip(tok, hi)]]
    bars = ax.bar(x, tok, width=0.6, linewidth=0.8, yerr=yerr, capsize=4, error_kw={"elinewidth": 1, "ecolor": "black"})
    for bar, r in zip(bars, p.records): bar.set(**_bar_style(r))
    for xi, t in zip(x, tok):   # beside the error bar, over the bar's left corner
      ax.annotate(f"{t:.2f}", (xi - 0.28, t), textcoords="offset points", xytext=(0, 2), ha="left", va="bottom", fontsize=8, bbox=LABEL_BOX)
    floors = [1e3 / _metrics(r)["floor_ms"] if _number(_metrics(r).get("floor_ms")) and _metrics(r)["floor_ms"] > 0 else math.nan for r in p.records]
    values = tok + hi + [f for f in floors if not math.isnan(f)]
    if any(not math.isnan(f) for f in floors):
      ax.scatter(x, floors, marker="_", s=900, linewidths=2.5, color=FLOOR_COLOR, zorder=3)
      for xi, f in zip(x, floors):
        if not math.isnan(f): ax.annotate(f"{f:.0f}", (xi, f), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7, color=FLOOR_COLOR)
    engines = defaultdict(list)
    for r in p.records:
      for peer in _peers(r): engines[short_engine(peer)].append(peer["tok_s"])
    for engine, vals in sorted(engines.items()):
      v, (color, ls) = statistics.median(vals), styles[engine]
      values.append(v)
      ax.axhline(v, color=color, ls=ls, lw=1.5, zorder=1)
      ax.text(0.995, v, f"{engine} {v:.1f} tok/s", transform=ax.get_yaxis_transform(), ha="right", va="bottom", fontsize=7, color=color,
              bbox=LABEL_BOX)
    positive = [v for v in values if v > 0]
    if max(positive) / min(positive) > 15:
      ax.set_yscale("log")
      ax.set_ylim(min(positive) / 2, max(positive) * 3)
    else: ax.set_ylim(0, max(positive) * 1.25)
    ax.set_ylabel("tok/s (decode)" + (", log scale" if ax.get_yscale() == "log" else "") + "\nfloor: bytes/token at copy bandwidth", fontsize=9)
    _variant_ticks(ax, p)
    ax.set_title(p.title, fontsize=10)
  handles = [Patch(**_bar_style({}), label="tok/s: median, min-max"), Patch(**_bar_style({"baseline": True}), label="baseline"),
             Line2D([], [], color=FLOOR_COLOR, marker="_", ms=14, mew=2.5, ls="", label="memory floor")]
  return fig, handles + [Line2D([], [], color=c, ls=ls, label=f"{engine} (peer)") for engine, (c, ls) in styles.items()]

def _pp(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  """Prompt processing per model and device: the newest record with a peer's pp of the same prompt length, tinyzoo's
  pp tok/s beside the peer's, the ratio over each pair."""
  def measured(r: dict) -> bool:
    m, peer = _metrics(r), r.get("peer") if isinstance(r.get("peer"), dict) else {}
    return _number(m.get("pp_tok_s")) and _number(peer.get("pp_tok_s")) and peer.get("pp_tokens") == m.get("pp_tokens") and \
      (experiment is None or r.get("experiment") == experiment) and (model is None or r.get("model") == model)
  newest: dict[tuple, dict] = {}
  for r in sorted(filter(measured, records), key=_time): newest[(str(r.get("model")), short_device(str(r.get("device"))))] = r
  if not newest: raise ValueError("no record has prompt processing beside a peer's of the same length (bench --pp with llama.cpp)")
  keys = sorted(newest)
  fig = Figure(figsize=(max(6.0, 1.5 * len(keys) + 2), 4.8))
  ax = fig.add_subplot()
  ours, theirs = [_metrics(newest[k])["pp_tok_s"] for k in keys], [newest[k]["peer"]["pp_tok_s"] for k in keys]
  x = range(len(keys))
  ax.bar([i - 0.2 for i in x], ours, width=0.4, color=VARIANT_COLOR)
  ax.bar([i + 0.2 for i in x], theirs, width=0.4, color=PEER_STYLES[0][0])
  for i, (a, b) in enumerate(zip(ours, theirs)):
    ax.annotate(f"{a / b:.2f}x", (i, max(a, b)), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8, bbox=LABEL_BOX)
  ax.set_yscale("log")
  ax.set_ylim(min(ours + theirs) / 2, max(ours + theirs) * 4)
  ax.set_xticks(list(x), [f"{m}\n{d}\n{_metrics(newest[(m, d)]).get('pp_tokens')} tokens" for m, d in keys], fontsize=7)
  ax.set_ylabel("prompt tok/s (log scale)", fontsize=9)
  devices = ", ".join(dict.fromkeys(d for _, d in keys))
  ax.set_title(f"prompt processing from an empty context, JIT steady state,\nbeside llama.cpp in the same run · {devices}", fontsize=10)
  commits = ", ".join(sorted({str(newest[k].get("commit")) for k in keys}))
  notes.append(f"newest record per model and device; commits {commits}")
  return fig, [Patch(color=VARIANT_COLOR, label="tinyzoo"), Patch(color=PEER_STYLES[0][0], label="llama.cpp (peer)")]

def _depth(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  """Decode tok/s against the tokens of context before it, a panel per model and device: a line for each variant of the
  experiment's latest run (without one: plain bench records, a line for each value of the switches that differ between
  them, the newest at each depth) and one for each peer, from the peers measured at the same depth in the same runs."""
  def measured(r: dict) -> bool:
    m = _metrics(r)
    return _number(m.get("tok_s")) and isinstance(m.get("depth"), int) and (model is None or r.get("model") == model) and \
      (r.get("experiment") == experiment if experiment else not r.get("experiment"))
  _check_experiment(experiment, sorted({str(r["experiment"]) for r in records if r.get("experiment")}))
  chosen = sorted(filter(measured, records), key=_time)
  if experiment and chosen: chosen = [r for r in chosen if r.get("run") == chosen[-1].get("run")]
  if not chosen: raise ValueError(f"no {f'record of experiment {experiment!r}' if experiment else 'bench record'}"
                                  f"{f' of {model!r}' if model else ''} has decode tok/s at a depth (metrics.depth)")
  where = lambda r: (str(r.get("model")), short_device(str(r.get("device"))))
  switches = lambda r: r.get("switches") if isinstance(r.get("switches"), dict) else {}
  # the switches whose values differ between a panel's bench records; one that older records lack (added since) or hold
  # as None is no difference
  differ: dict[tuple, list[str]] = defaultdict(list)
  for key in {where(r) for r in chosen}:
    mine = [switches(r) for r in chosen if where(r) == key]
    differ[key] = sorted(n for n in {n for sw in mine for n in sw} if len({str(sw[n]) for sw in mine if sw.get(n) is not None}) > 1)
  def label(r: dict) -> str:
    if r.get("variant"): return str(r["variant"])
    return ", ".join(f"{n}={switches(r)[n]}" for n in differ[where(r)] if switches(r).get(n) is not None) or "tinyzoo"
  lines: dict[tuple, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
  for r in chosen:
    depth, panel = _metrics(r)["depth"], lines[where(r)]
    panel[label(r)][depth] = _metrics(r)["tok_s"]
    for peer in _peers(r):
      if peer.get("depth") == depth: panel[f"{short_engine(peer)} (peer)"][depth] = peer["tok_s"]
  keys = sorted(lines)
  fig, axes = _grid(len(keys), 6.0, 4.4)
  # tinyzoo's lines in the category colours that are no peer's (green and cyan are)
  colors = dict(zip(sorted({n for k in keys for n in lines[k] if not n.endswith("(peer)")}),
                    itertools.cycle(c for c in CATEGORY_COLORS if c not in ("#55a868", "#64b5cd"))))
  peers = dict(zip(sorted({n for k in keys for n in lines[k] if n.endswith("(peer)")}), itertools.cycle(PEER_STYLES)))
  for ax, key in zip(axes, keys):
    for name, points in sorted(lines[key].items(), key=lambda kv: (kv[0].endswith("(peer)"), kv[0])):
      xs = sorted(points)
      color, ls = peers[name] if name in peers else (colors[name], "-")
      ax.plot(xs, [points[x] for x in xs], ls=ls, marker="o", color=color, lw=1.6, ms=5)
      ax.annotate(f"{points[xs[-1]]:.0f}", (xs[-1], points[xs[-1]]), textcoords="offset points", xytext=(4, 0), fontsize=7, color=color)
    ax.set_ylim(0, max(v for pts in lines[key].values() for v in pts.values()) * 1.2)
    ax.set_xlabel("depth: tokens of context before the timed decode", fontsize=9)
    ax.set_ylabel("tok/s (decode)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_title(f"{experiment or 'bench'} · {key[0]}\n{key[1]}", fontsize=10)
  notes.append(f"commits {', '.join(sorted({str(r.get('commit')) for r in chosen}))}")
  return fig, [Line2D([], [], color=c, marker="o", label=n) for n, c in colors.items()] + \
    [Line2D([], [], color=c, ls=ls, marker="o", label=n) for n, (c, ls) in peers.items()]

def _categories(r: dict) -> dict | None:
  cats = _metrics(r).get("kernel_categories")
  return cats if isinstance(cats, dict) and cats and all(_number(v) for v in cats.values()) else None

def _breakdown(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  panels = _panels(records, experiment, model, lambda r: _categories(r) is not None, "metrics.kernel_categories", notes)
  extra = sorted({c for p in panels for r in p.records for c in _categories(r)} - set(CATEGORIES))
  order = CATEGORIES + tuple(extra)
  fig, axes = _grid(len(panels), _panel_width(panels), 4.4)
  for ax, p in zip(axes, panels):
    x = list(range(len(p.records)))
    bottom = [0.0] * len(x)
    for i, cat in enumerate(order):
      vals = [_categories(r).get(cat, 0) for r in p.records]
      bars = ax.bar(x, vals, bottom=bottom, width=0.6, color=CATEGORY_COLORS[i % len(CATEGORY_COLORS)], edgecolor="black", linewidth=0.6, label=cat)
      for bar, r in zip(bars, p.records):
        if r.get("baseline"): bar.set_hatch("//")
      ax.bar_label(bars, labels=[f"{v:g}" if v else "" for v in vals], label_type="center", fontsize=7)
      bottom = [b + v for b, v in zip(bottom, vals)]
    for xi, total in zip(x, bottom): ax.annotate(f"{total:g}", (xi, total), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_ylim(0, max(bottom) * 1.1 or 1)
    ax.set_ylabel("kernels / token")
    _variant_ticks(ax, p)
    ax.set_title(p.title, fontsize=10)
  handles = [Patch(facecolor=CATEGORY_COLORS[i % len(CATEGORY_COLORS)], edgecolor="black", label=cat) for i, cat in enumerate(order)]
  return fig, handles + [Patch(facecolor="white", edgecolor="black", hatch="//", label="baseline")]

def _history(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  known = sorted({str(r["experiment"]) for r in records if r.get("experiment")})
  _check_experiment(experiment, known)
  sel = [r for r in records if (not r.get("experiment") and experiment is None) or (r.get("baseline") and experiment in (None, r.get("experiment")))]
  variants = sum(1 for r in records if r.get("experiment") and not r.get("baseline") and experiment in (None, r["experiment"]))
  if variants: notes.append(f"{_plural(variants, 'experiment variant record')} not shown (baselines only)")
  if model is not None:
    models = sorted({str(r.get("model")) for r in sel})
    sel = [r for r in sel if r.get("model") == model]
    if not sel: raise ValueError(f"no bench or baseline records for model {model!r}; models: {', '.join(models) or 'none'}")
  good = [r for r in sel if _number(_metrics(r).get("tok_s"))]
  if len(good) < len(sel): notes.append(f"skipped {_plural(len(sel) - len(good), 'record')} without metrics.tok_s")
  if not good: raise ValueError("no bench or baseline record with metrics.tok_s to plot over commits")
  good.sort(key=_time)
  commit = lambda r: (str(r.get("commit") or "?")[:7], bool(r.get("dirty")))
  # commits in the order they were made where git knows them, else by their first record: an older commit measured
  # again later (an A/B in one run) keeps its place
  made, first = commit_times(), {}
  for r in good: first.setdefault(commit(r), _time(r))
  xs = {c: i for i, c in enumerate(sorted(first, key=lambda c: (made.get(c[0], first[c]), c[1])))}
  lines: dict[tuple[str, str], dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
  for r in good: lines[(str(r.get("model")), str(r.get("device")))][xs[commit(r)]].append(r)
  fig = Figure(figsize=(max(7.0, 2.5 + 0.75 * len(xs)), 4.8), dpi=DPI)
  ax = fig.add_subplot(1, 1, 1)
  ax2 = ax.twinx()
  handles, extras, kmax = [], False, 0
  for i, ((mod, dev), points) in enumerate(sorted(lines.items())):
    color = CATEGORY_COLORS[i % len(CATEGORY_COLORS)]
    px = sorted(points)
    # several records at one commit (switches compared in one run): the fastest carries the line, the rest are dots
    best = [max(points[x], key=lambda r: _metrics(r)["tok_s"]) for x in px]
    tok = [_metrics(r)["tok_s"] for r in best]
    handles += ax.plot(px, tok, "-o", color=color, lw=1.8, ms=6, label=f"{mod} · {short_device(dev)}")
    for x, t in zip(px, tok): ax.annotate(f"{t:.2f}", (x, t), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7, color=color)
    for x, top in zip(px, best):
      for r in points[x]:
        if r is top: continue
        ax.plot([x], [_metrics(r)["tok_s"]], "o", ms=5, mfc="none", color=color, alpha=0.6)
        extras = True
    kx = [x for x, r in zip(px, best) if _number(_metrics(r).get("kernels_per_token"))]
    kpt = [_metrics(r)["kernels_per_token"] for r in best if _number(_metrics(r).get("kernels_per_token"))]
    if kpt:
      ax2.plot(kx, kpt, "--s", color=color, lw=1.2, ms=4, alpha=0.8)
      kmax = max(kmax, *kpt)
  ax.set_xticks(range(len(xs)), [c + ("+" if dirty else "") for c, dirty in xs], rotation=45, ha="right", rotation_mode="anchor", fontsize=8)
  ax.set_xlim(-0.5, len(xs) - 0.5)
  ax.set_xlabel("commit, in the order made (+: uncommitted changes)")
  ax.set_ylabel("tok/s (decode, median)")
  ax.set_ylim(0, max(_metrics(r)["tok_s"] for r in good) * 1.25)
  ax2.set_ylim(0, kmax * 1.25 or 1)
  ax2.set_ylabel("kernels / token (dashed)")
  handles.append(Line2D([], [], color="dimgray", ls="--", marker="s", ms=4, label="kernels/token (right axis)"))
  if extras: handles.append(Line2D([], [], color="dimgray", ls="", marker="o", mfc="none", label="other records at that commit"))
  ax.legend(handles=handles, fontsize=7, loc="upper left", framealpha=0.85)
  ax.grid(axis="y", alpha=0.3)
  models = ", ".join(dict.fromkeys(m for m, _ in sorted(lines)))
  devices = ", ".join(dict.fromkeys(short_device(d) for _, d in sorted(lines))) if len({d for _, d in lines}) == 1 else \
    "; ".join(dict.fromkeys(short_device(d) for _, d in sorted(lines)))
  ax.set_title(f"tok/s over commits{f' ({experiment} baseline)' if experiment else ''} · {models}\n{devices}", fontsize=10)
  return fig, []

def _quality(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  """The speed/quality frontier of an experiment's latest run, a panel per model and device: each variant's decode
  tok/s against its mean KL divergence from the baseline (the baseline at 0), labelled with its perplexity, and the peers'
  tok/s measured in the run."""
  def measured(r: dict) -> bool:
    q = r.get("quality")
    return _number(_metrics(r).get("tok_s")) and isinstance(q, dict) and _number(q.get("perplexity")) and \
      (r.get("baseline") or _number(q.get("kl_mean")))
  panels = _panels(records, experiment, model, measured, "metrics.tok_s and quality (an experiment with `quality:`)", notes)
  fig, axes = _grid(len(panels), 6.0, 4.4)
  for ax, p in zip(axes, panels):
    # labels of neighbouring speeds alternate above and below their points
    for i, r in enumerate(sorted(p.records, key=lambda r: _metrics(r)["tok_s"])):
      q, tok = r["quality"], _metrics(r)["tok_s"]
      kl = 0.0 if r.get("baseline") else q["kl_mean"]
      ax.scatter([kl], [tok], s=60, zorder=3, **({"color": BASELINE_COLOR, "marker": "s", "edgecolor": "black"} if r.get("baseline")
                                                 else {"color": VARIANT_COLOR, "edgecolor": "black"}))
      ax.annotate(f"{r['variant']}\nppl {q['perplexity']:.3f}", (kl, tok), textcoords="offset points", xytext=(6, 4 if i % 2 else -22),
                  fontsize=7, bbox=LABEL_BOX)
    for peer in (peer for r in p.records for peer in _peers(r)):
      ax.axhline(peer["tok_s"], color=PEER_STYLES[0][0], ls=PEER_STYLES[0][1], lw=1.5, zorder=1)
      ax.text(0.995, peer["tok_s"], f"{short_engine(peer)} {peer['tok_s']:.1f} tok/s", transform=ax.get_yaxis_transform(), ha="right",
              va="bottom", fontsize=7, color=PEER_STYLES[0][0], bbox=LABEL_BOX)
    toks = [_metrics(r)["tok_s"] for r in p.records] + [peer["tok_s"] for r in p.records for peer in _peers(r)]
    kls = [0.0 if r.get("baseline") else r["quality"]["kl_mean"] for r in p.records]
    ax.set_xlim(-0.05 * (max(kls) or 1e-3), 1.35 * (max(kls) or 1e-3))
    ax.set_ylim(0, max(toks) * 1.25)
    q0 = p.records[0]["quality"]
    ax.set_xlabel(f"mean KL divergence from the baseline ({q0.get('tokens')} tokens, ctx {q0.get('ctx')})", fontsize=9)
    ax.set_ylabel("tok/s (decode)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_title(p.title, fontsize=10)
  handles = [Line2D([], [], color=BASELINE_COLOR, marker="s", mec="black", ls="", label="baseline"),
             Line2D([], [], color=VARIANT_COLOR, marker="o", mec="black", ls="", label="variant")]
  return fig, handles

DRAW = {"kernels": _kernels, "speed": _speed, "breakdown": _breakdown, "history": _history, "pp": _pp, "depth": _depth, "quality": _quality}

def figure(records: list[dict], kind: str, experiment: str | None = None, model: str | None = None) -> Figure:
  """The chart as a matplotlib Figure (not saved); ValueError, one line, when there is nothing to draw."""
  if kind not in KINDS: raise ValueError(f"unknown plot kind {kind!r}; kinds: {', '.join(KINDS)}")
  if not records: raise ValueError("the journal is empty: nothing to plot")
  notes: list[str] = []
  fig, legend = DRAW[kind]([r for r in records if isinstance(r, dict)], experiment, model, notes)
  bottom, top = 0.0, 1.0
  if notes:
    fig.text(0.005, 0.005, "note: " + "; ".join(notes), fontsize=7, color="dimgray", ha="left", va="bottom")
    bottom = min(0.1, 0.22 / fig.get_figheight())
  if legend:   # one legend for all subplots, above them, in as many rows as the width needs
    ncol = max(1, min(len(legend), int(0.95 * fig.get_figwidth() / (0.5 + 0.065 * max(len(h.get_label()) for h in legend)))))
    fig.legend(handles=legend, loc="upper center", ncol=ncol, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    top = 1 - min(0.25, (0.12 + 0.2 * math.ceil(len(legend) / ncol)) / fig.get_figheight())
  fig.tight_layout(rect=(0, bottom, 1, top))
  return fig

def save(fig: Figure, out: os.PathLike | str) -> Path:
  """Writes `fig` to `out` (format from the suffix) through a temp file beside it, so `out` is whole or untouched."""
  out = Path(out)
  fmt = out.suffix[1:].lower()
  if fmt not in FORMATS: raise ValueError(f"cannot write {out.name!r}: the suffix picks the format, one of {', '.join('.' + f for f in FORMATS)}")
  out.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
  try:
    with os.fdopen(fd, "wb") as f, matplotlib.rc_context(SVG_RC): fig.savefig(f, format=fmt, dpi=DPI)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  return out

def on_device(records: list[dict], device: str) -> list[dict]:
  """The records whose device names `device` (a case-insensitive part of it: "CUDA", "H100")."""
  chosen = [r for r in records if isinstance(r, dict) and device.lower() in str(r.get("device", "")).lower()]
  if not chosen:
    known = ", ".join(sorted({str(r.get("device")) for r in records if isinstance(r, dict)}))
    raise ValueError(f"no records on a device matching {device!r}; devices: {known}")
  return chosen

def plot(records: list[dict], kind: str, out: os.PathLike | str, experiment: str | None = None, model: str | None = None,
         device: str | None = None) -> Path:
  """Draws `kind` (one of KINDS) from journal records (those on `device`, when given) and writes it to `out`; returns `out`.
  SVG text stays text (searchable)."""
  if Path(out).suffix[1:].lower() not in FORMATS:
    raise ValueError(f"cannot write {Path(out).name!r}: the suffix picks the format, one of {', '.join('.' + f for f in FORMATS)}")
  if device is not None: records = on_device(records, device)
  with matplotlib.rc_context({"hatch.linewidth": 0.6}):
    return save(figure(records, kind, experiment, model), out)
