"""Charts from the journal: kernels/token and tok/s per variant of an experiment's latest run on each model and device,
speed against the memory floor and the peers, the kernel mix, tok/s over commits per device, prompt processing per model
against the peer's, decode tok/s against the depth of context before it beside the peer's at the same depths, tok/s
against KL divergence per variant, and TFLOP/s of each GEMM shape per kernel beside cuBLAS.

Drawn on a bare matplotlib Figure (Agg renders the PNG; no pyplot, no display), no wider than 2,000 px (more panels wrap
into rows), each panel titled with its device and commits; written whole or not at all: saved to a temp file beside the
target, then renamed over it. The target's suffix picks the format (png, svg, pdf)."""
import itertools
import math
import os
import re
import statistics
import tempfile
import textwrap
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from experiments.journal import KINDS, commit_times, latest_runs, number as _number, record_time as _time
from ops.kernels import CATEGORIES   # stacked bottom to top; others follow, sorted

FORMATS = ("png", "svg", "pdf")
DPI = 120
MAX_IN = 2000 / DPI   # the widest a chart is drawn, in inches: 2,000 px, about a screen; more panels wrap into rows
SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "tinyzoo"}   # SVG text stays text (searchable, smaller); ids reproducible
BASELINE_COLOR, VARIANT_COLOR, TOKS_COLOR, FLOOR_COLOR = "#9e9e9e", "#4c72b0", "#dd8452", "#c44e52"
CATEGORY_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")
LABEL_BOX = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
PEER_STYLES = (("#2ca02c", "--"), ("#9467bd", "-."), ("#8c564b", ":"), ("#17becf", "--"))
MARKERS = ("o", "s", "^", "D", "v")
HISTORY_STEP = 0.45   # inches per commit on the history chart
MAX_LINES = 6         # tinyzoo's lines in a depth panel of bench records: the newest switch settings

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

def _metrics(r: dict) -> dict: return r.get("metrics") if isinstance(r.get("metrics"), dict) else {}

def _positive(x: Any) -> bool: return _number(x) and x > 0

def _plural(n: int, word: str) -> str: return f"{n} {word}{'' if n == 1 else 's'}"

def _commit(r: dict) -> str: return str(r.get("commit") or "?")[:7] + ("+" if r.get("dirty") else "")

def _commits(records: list[dict]) -> str:
  """The commits `records` were measured at, for a title (+: with uncommitted changes): up to three named, more as a
  count with the first and the last."""
  seen = list(dict.fromkeys(map(_commit, sorted(records, key=_time))))
  if len(seen) <= 3: return f"commit{'s' if len(seen) > 1 else ''} {', '.join(seen)}"
  return f"{len(seen)} commits, {seen[0]} … {seen[-1]}"

def _check_experiment(experiment: str | None, known: list[str]) -> None:
  if experiment is not None and experiment not in known:
    raise ValueError(f"no record of experiment {experiment!r}; the records' experiments: "
                     f"{', '.join(known) or 'none (no journal record comes from an experiment run)'}")

@dataclass
class Panel:
  """The variants of one experiment's latest run on one model and device, baseline first."""
  experiment: str
  run: Any
  model: str
  device: str
  records: list[dict]

  @property
  def title(self) -> str: return f"{self.experiment} · {self.model}\n{short_device(self.device)} · {_commits(self.records)}"

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
  for (name, dev, mod), run in latest_runs(runs).items():
    variants: dict[str, dict] = {}
    for r in sorted(run, key=_time):
      if r.get("variant") is None: skipped["without a variant name"] += 1
      elif not need(r): skipped[f"without {what}"] += 1
      else: variants[str(r["variant"])] = r   # a variant measured twice: the latest
    if variants: panels.append(Panel(name, run[0].get("run"), mod, dev, sorted(variants.values(), key=lambda r: (not r.get("baseline"), _time(r)))))
  notes.extend(f"skipped {_plural(n, 'record')} {why}" for why, n in skipped.items())
  if not panels:
    scope = f"experiment {experiment!r}" if experiment else "the latest experiment runs"
    if set(skipped) <= {f"without {what}"}: raise ValueError(f"no record of {scope}{f' on {model!r}' if model else ''} has {what}; nothing to plot")
    reasons = [f"{_plural(n, 'record')} {why}" for why, n in skipped.items()]
    raise ValueError(f"nothing to plot from {scope}: skipped {', '.join(reasons) or 'every record'}")
  return panels

def _grid(n: int, width: float, height: float) -> tuple[Figure, list[Axes]]:
  """A figure of n panels of `width` by `height` inches (no wider than MAX_IN), as many side by side as fit in MAX_IN,
  the rest wrapped into rows."""
  width = min(width, MAX_IN)
  cols = max(1, min(n, int(MAX_IN // width)))
  rows = math.ceil(n / cols)
  fig = Figure(figsize=(width * cols, height * rows), dpi=DPI)
  return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]

def _panel_width(panels: list[Panel]) -> float: return max(5.5, 2.8 + 1.0 * max(len(p.records) for p in panels))

def _variant_ticks(ax: Axes, panel: Panel) -> None:
  labels = panel.labels()
  ax.set_xlabel("variant (baseline first)", fontsize=9)
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
  """Prompt processing per model, a panel per device (wrapped into more where its models are many): the newest record with
  a peer's pp of the same prompt length, tinyzoo's pp tok/s beside the peer's, the ratio over each pair."""
  def measured(r: dict) -> bool:
    m, peer = _metrics(r), r.get("peer") if isinstance(r.get("peer"), dict) else {}
    return _positive(m.get("pp_tok_s")) and _positive(peer.get("pp_tok_s")) and peer.get("pp_tokens") == m.get("pp_tokens") and \
      (experiment is None or r.get("experiment") == experiment) and (model is None or r.get("model") == model)
  newest: dict[tuple, dict] = {}
  for r in sorted(filter(measured, records), key=_time): newest[(short_device(str(r.get("device"))), str(r.get("model")))] = r
  if not newest: raise ValueError("no record has prompt processing beside a peer's of the same length (bench --pp with llama.cpp)")
  per_panel = int((MAX_IN - 2) / 1.5)   # pairs of bars in a panel as wide as a chart may be
  panels: list[tuple[str, list[str]]] = []
  for dev in sorted({d for d, _ in newest}):
    mods = sorted(m for d, m in newest if d == dev)
    panels += [(dev, mods[i:i + per_panel]) for i in range(0, len(mods), per_panel)]
  slots = max(len(mods) for _, mods in panels)   # every panel's pairs of bars as wide as the fullest panel's
  fig, axes = _grid(len(panels), max(6.0, 1.5 * slots + 2), 4.8)
  for ax, (dev, mods) in zip(axes, panels):
    chosen = [newest[(dev, m)] for m in mods]
    ours, theirs = [_metrics(r)["pp_tok_s"] for r in chosen], [r["peer"]["pp_tok_s"] for r in chosen]
    x = range(len(chosen))
    ax.bar([i - 0.2 for i in x], ours, width=0.4, color=VARIANT_COLOR)
    ax.bar([i + 0.2 for i in x], theirs, width=0.4, color=PEER_STYLES[0][0])
    for i, (a, b) in enumerate(zip(ours, theirs)):
      ax.annotate(f"{a / b:.2f}x", (i, max(a, b)), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8, bbox=LABEL_BOX)
    ax.set_yscale("log")
    ax.set_ylim(min(ours + theirs) / 2, max(ours + theirs) * 4)
    ax.set_xticks(list(x), [f"{m}\n{_metrics(r).get('pp_tokens')} tokens" for m, r in zip(mods, chosen)], fontsize=7)
    ax.set_xlim(-0.6, slots - 0.4)
    ax.set_xlabel("model, prompt length", fontsize=9)
    ax.set_ylabel("prompt tok/s (log scale)", fontsize=9)
    ax.set_title(f"prompt processing from an empty context, beside the peer\n{dev} · {_commits(chosen)}", fontsize=10)
  notes.append("the newest record of each model and device, JIT steady state, the peer measured in the same run; over each pair tinyzoo/peer")
  return fig, [Patch(color=VARIANT_COLOR, label="tinyzoo"), Patch(color=PEER_STYLES[0][0], label="llama.cpp (peer)")]

def _depth(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  """Decode tok/s against the tokens of context before it, a panel per model and device: a line for each variant of the
  experiment's latest run there (without one: plain bench records, a line for each value of the switches that differ between
  them, the newest at each depth, the MAX_LINES newest values) and one for each peer, from the peers measured at the same
  depth in the same runs; each panel its own legend."""
  def measured(r: dict) -> bool:
    m = _metrics(r)
    return _number(m.get("tok_s")) and isinstance(m.get("depth"), int) and (model is None or r.get("model") == model) and \
      (r.get("experiment") == experiment if experiment else not r.get("experiment"))
  _check_experiment(experiment, sorted({str(r["experiment"]) for r in records if r.get("experiment")}))
  where = lambda r: (str(r.get("model")), short_device(str(r.get("device"))))
  chosen = sorted(filter(measured, records), key=_time)
  if experiment:
    latest = {where(r): r.get("run") for r in chosen}
    chosen = [r for r in chosen if r.get("run") == latest[where(r)]]
  if not chosen: raise ValueError(f"no {f'record of experiment {experiment!r}' if experiment else 'bench record'}"
                                  f"{f' of {model!r}' if model else ''} has decode tok/s at a depth (metrics.depth)")
  switches = lambda r: r.get("switches") if isinstance(r.get("switches"), dict) else {}
  def differing(recs: list[dict]) -> list[str]:
    """The switches whose values differ between `recs`; one that older records lack (added since) or hold as None is no
    difference."""
    mine = [switches(r) for r in recs]
    return sorted(n for n in {n for sw in mine for n in sw} if len({str(sw[n]) for sw in mine if sw.get(n) is not None}) > 1)
  def label(r: dict, differ: list[str]) -> str:
    if r.get("variant"): return str(r["variant"])
    return ", ".join(f"{n}={switches(r)[n]}" for n in differ if switches(r).get(n) is not None) or "tinyzoo"
  by_panel: dict[tuple, list[dict]] = defaultdict(list)
  for r in chosen: by_panel[where(r)].append(r)
  fig, axes = _grid(len(by_panel), 6.0, 4.4)
  older = 0
  for ax, (key, recs) in zip(axes, sorted(by_panel.items())):
    if not experiment:   # bench records: the newest switch settings, as many as a panel's legend can show
      every = differing(recs)
      newest = list(dict.fromkeys(label(r, every) for r in reversed(recs)))[:MAX_LINES]
      kept = [r for r in recs if label(r, every) in newest]
      older, recs = older + len(recs) - len(kept), kept
    differ = differing(recs)
    lines: dict[str, dict[int, float]] = defaultdict(dict)
    shown: dict[tuple[str, int], dict] = {}   # the record of each point, for the panel's commits
    for r in recs:
      depth = _metrics(r)["depth"]
      lines[label(r, differ)][depth], shown[(label(r, differ), depth)] = _metrics(r)["tok_s"], r
      for peer in _peers(r):
        if peer.get("depth") == depth:
          name = f"{short_engine(peer)} (peer)"
          lines[name][depth], shown[(name, depth)] = peer["tok_s"], r
    # tinyzoo's lines in the category colours that are no peer's (green and cyan are)
    ours, theirs = itertools.cycle(c for c in CATEGORY_COLORS if c not in ("#55a868", "#64b5cd")), itertools.cycle(PEER_STYLES)
    for name, points in sorted(lines.items(), key=lambda kv: (kv[0].endswith("(peer)"), kv[0])):
      xs = sorted(points)
      color, ls = next(theirs) if name.endswith("(peer)") else (next(ours), "-")
      ax.plot(xs, [points[x] for x in xs], ls=ls, marker="o", color=color, lw=1.6, ms=5, label=textwrap.fill(name, 60))
      ax.annotate(f"{points[xs[-1]]:.0f}", (xs[-1], points[xs[-1]]), textcoords="offset points", xytext=(4, 0), fontsize=7, color=color)
    ax.set_ylim(0, max(v for pts in lines.values() for v in pts.values()) * 1.35)   # room for the legend
    ax.legend(fontsize=6, loc="upper right", framealpha=0.85)
    ax.set_xlabel("depth: tokens of context before the timed decode", fontsize=9)
    ax.set_ylabel("tok/s (decode)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_title(f"{experiment or 'bench'} · {key[0]}\n{key[1]} · {_commits(list(shown.values()))}", fontsize=10)
  if older: notes.append(f"{_plural(older, 'bench record')} of older switch settings not shown (the newest {MAX_LINES} of each panel are)")
  return fig, []

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
  order = sorted(first, key=lambda c: (made.get(c[0], first[c]), c[1]))
  # a panel per device, its commits wrapped into rows of as many as a chart's width holds
  by_device: dict[str, list[dict]] = defaultdict(list)
  for r in good: by_device[str(r.get("device"))].append(r)
  per_row = int((MAX_IN - 2.5) / HISTORY_STEP)
  panels: list[tuple[str, list[tuple[str, bool]]]] = []
  for dev, mine in sorted(by_device.items()):
    measured = {commit(r) for r in mine}
    cs = [c for c in order if c in measured]
    panels += [(dev, cs[i:i + per_row]) for i in range(0, len(cs), per_row)]
  models = sorted({str(r.get("model")) for r in good})
  styles = {m: (CATEGORY_COLORS[i % len(CATEGORY_COLORS)], MARKERS[i // len(CATEGORY_COLORS) % len(MARKERS)]) for i, m in enumerate(models)}
  fig, axes = _grid(len(panels), max(7.0, 2.5 + HISTORY_STEP * max(len(row) for _, row in panels)), 4.8)
  extras = False
  for ax, (dev, row) in zip(axes, panels):
    xs = {c: i for i, c in enumerate(row)}
    lines: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in by_device[dev]:
      if commit(r) in xs: lines[str(r.get("model"))][xs[commit(r)]].append(r)
    ax2, kmax = ax.twinx(), 0
    for mod, points in sorted(lines.items()):
      (color, marker), px = styles[mod], sorted(points)
      # several records at one commit (switches compared in one run): the fastest carries the line, the rest are dots
      best = [max(points[x], key=lambda r: _metrics(r)["tok_s"]) for x in px]
      tok = [_metrics(r)["tok_s"] for r in best]
      ax.plot(px, tok, "-", marker=marker, color=color, lw=1.8, ms=6)
      for x, t in zip(px, tok): ax.annotate(f"{t:.2f}", (x, t), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7, color=color)
      for x, top in zip(px, best):
        for r in points[x]:
          if r is top: continue
          ax.plot([x], [_metrics(r)["tok_s"]], marker, ms=5, mfc="none", color=color, alpha=0.6)
          extras = True
      kx = [x for x, r in zip(px, best) if _number(_metrics(r).get("kernels_per_token"))]
      kpt = [_metrics(r)["kernels_per_token"] for r in best if _number(_metrics(r).get("kernels_per_token"))]
      if kpt:
        ax2.plot(kx, kpt, "--", marker=marker, color=color, lw=1.2, ms=4, alpha=0.8)
        kmax = max(kmax, *kpt)
    labels = [c + ("+" if dirty else "") for c, dirty in row]
    ax.set_xticks(range(len(row)), labels, rotation=45, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_xlim(-0.5, len(row) - 0.5)
    ax.set_xlabel("commit, in the order made (+: uncommitted changes)", fontsize=9)
    toks = [_metrics(r)["tok_s"] for r in by_device[dev] if _metrics(r)["tok_s"] > 0]   # one scale for a device's rows
    if toks and max(toks) / min(toks) > 15:   # tiny synthetic models beside real ones
      ax.set_yscale("log")
      ax.set_ylim(min(toks) / 2, max(toks) * 3)
    else: ax.set_ylim(0, max(toks, default=1) * 1.25)
    ax.set_ylabel("tok/s (decode, median" + (", log scale)" if ax.get_yscale() == "log" else ")"), fontsize=9)
    ax2.set_ylim(0, kmax * 1.25 or 1)
    ax2.set_ylabel("kernels / token (dashed)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"tok/s over commits{f' ({experiment} baseline)' if experiment else ''}\n{short_device(dev)} · "
                 f"{_plural(len(row), 'commit')}, {labels[0]}{f' … {labels[-1]}' if len(row) > 1 else ''}", fontsize=10)
  handles = [Line2D([], [], color=c, marker=mk, label=m) for m, (c, mk) in styles.items()]
  handles.append(Line2D([], [], color="dimgray", ls="--", marker="s", ms=4, label="kernels/token (right axis)"))
  if extras: handles.append(Line2D([], [], color="dimgray", ls="", marker="o", mfc="none", label="other records at that commit"))
  return fig, handles

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

GemmKey = tuple[str, str, tuple[str, int, int, int], str]   # (device, model, (type, n, k, experts), kernel)

def newest_gemms(records: list[dict], model: str | None = None) -> dict[GemmKey, dict]:
  """`tinyzoo gemm` records (of `model`, when given): the newest of each device, model, shape and GEMM kernel."""
  def measured(r: dict) -> bool:
    m = _metrics(r)
    return r.get("kind") == "gemm" and _positive(m.get("tflops")) and _number(m.get("n")) and _number(m.get("k")) and \
      isinstance(r.get("switches"), dict) and (model is None or r.get("model") == model)
  newest: dict[GemmKey, dict] = {}
  for r in sorted(filter(measured, records), key=_time):
    m = _metrics(r)
    shape = (str(r.get("ggml_type")), m["n"], m["k"], m.get("experts") or 0)
    newest[(short_device(str(r.get("device"))), str(r.get("model")), shape, str(r["switches"].get("gemm")))] = r
  return newest

def gemm_kernels(newest: dict[GemmKey, dict]) -> list[str]:
  return sorted({k for *_, k in newest}, key=lambda k: (k != "tinygrad", k))   # tinygrad's, the reference, first

def gemm_shape_order(shape: tuple[str, int, int, int]) -> tuple:
  return shape[3] > 0, -shape[1] * shape[2]   # dense first, largest first

def cublas_tflops(newest: dict[GemmKey, dict], where: tuple[str, str, tuple], kernels: list[str]) -> float | None:
  """cuBLAS's TFLOP/s beside the shape at `where` (device, model, shape): the last kernel's record that measured it."""
  got = [r["peer"]["tflops"] for k in kernels if (r := newest.get((*where, k))) and isinstance(r.get("peer"), dict)
         and _positive(r["peer"].get("tflops"))]
  return got[-1] if got else None

def _gemm(records: list[dict], experiment: str | None, model: str | None, notes: list[str]) -> tuple[Figure, list]:
  """TFLOP/s of each GEMM shape of a model's prompt chunk (`tinyzoo gemm` records), a panel per model and device: a bar
  for each kernel's newest record of the shape, beside cuBLAS's measured in the same run; a result off float64 by more
  than the tolerance hatched and marked."""
  if experiment is not None: raise ValueError(f"the gemm chart draws `tinyzoo gemm` records, which belong to no experiment (not {experiment!r})")
  if not (newest := newest_gemms(records, model)):
    raise ValueError(f"no GEMM record{f' of {model!r}' if model else ''} (tinyzoo gemm MODEL); nothing to plot")
  kernels = gemm_kernels(newest)
  colors = {k: c for k, c in zip(kernels, (BASELINE_COLOR, VARIANT_COLOR, TOKS_COLOR, *CATEGORY_COLORS))}
  panels = sorted({(d, mo) for d, mo, _, _ in newest})
  shapes = {p: sorted({sh for d, mo, sh, _ in newest if (d, mo) == p}, key=gemm_shape_order) for p in panels}
  width = 0.8 / (len(kernels) + 1)
  fig, axes = _grid(len(panels), max(6.0, 1.3 * max(map(len, shapes.values())) + 2), 4.8)
  for ax, (dev, mo) in zip(axes, panels):
    chosen, top = [], 0.0
    for i, sh in enumerate(shapes[(dev, mo)]):
      cublas = cublas_tflops(newest, (dev, mo, sh), kernels)
      for j, k in enumerate(kernels):
        if (r := newest.get((dev, mo, sh, k))) is None: continue
        chosen.append(r)
        wrong = _metrics(r).get("correct") is False
        ax.bar(i - 0.4 + (j + 0.5) * width, (t := _metrics(r)["tflops"]), width=width, color=colors[k], edgecolor="black",
               hatch="xx" if wrong else None)
        if wrong: ax.annotate("wrong", (i - 0.4 + (j + 0.5) * width, t), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6)
        top = max(top, t)
      if cublas is not None:
        ax.bar(i - 0.4 + (len(kernels) + 0.5) * width, cublas, width=width, color=PEER_STYLES[0][0], edgecolor="black")
        top = max(top, cublas)
    labels = [f"{t}\n{n}x{k}" + (f"\nx{e} experts" if e else "") for t, n, k, e in shapes[(dev, mo)]]
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(0, top * 1.15)
    ax.set_xlabel("weight type, N x K (rows x columns)", fontsize=9)
    ax.set_ylabel("TFLOP/s", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    rows = sorted({_metrics(r).get("rows") for r in chosen if _number(_metrics(r).get("rows"))})
    ax.set_title(f"GEMMs of a {'/'.join(map(str, rows)) or '?'}-row prompt chunk · {mo}\n{dev} · {_commits(chosen)}", fontsize=10)
  notes.append("each kernel's newest record of a shape, JIT steady state, dequantization counted in; cuBLAS (fp16, weights dequantized "
               "before) measured in the same run")
  return fig, [Patch(color=colors[k], label=f"{k} (gemm={k})") for k in kernels] + [Patch(color=PEER_STYLES[0][0], label="cuBLAS")]

DRAW = {"kernels": _kernels, "speed": _speed, "breakdown": _breakdown, "history": _history, "pp": _pp, "depth": _depth, "quality": _quality,
        "gemm": _gemm}

def figure(records: list[dict], kind: str, experiment: str | None = None, model: str | None = None) -> Figure:
  """The chart as a matplotlib Figure (not saved); ValueError, one line, when there is nothing to draw."""
  if kind not in KINDS: raise ValueError(f"unknown plot kind {kind!r}; kinds: {', '.join(KINDS)}")
  if not records: raise ValueError("the journal is empty: nothing to plot")
  notes: list[str] = []
  fig, legend = DRAW[kind]([r for r in records if isinstance(r, dict)], experiment, model, notes)
  bottom, top = 0.0, 1.0
  if notes:   # wrapped to the figure's width (about 16 characters of 7 pt an inch)
    text = textwrap.fill("note: " + "; ".join(notes), width=int(16 * fig.get_figwidth()))
    fig.text(0.005, 0.005, text, fontsize=7, color="dimgray", ha="left", va="bottom")
    bottom = min(0.3, (0.1 + 0.12 * (1 + text.count("\n"))) / fig.get_figheight())
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
  with matplotlib.rc_context({"hatch.linewidth": 0.6}):   # read as the bars are made
    try: fig = figure(records, kind, experiment, model)
    except ValueError as e:
      if device is None: raise
      raise ValueError(f"{e} (among the records on a device matching {device!r})") from None
    return save(fig, out)
