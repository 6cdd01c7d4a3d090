"""Charts from the journal: every kind renders real PNG and SVG from synthetic records (two experiments, each with an older
run, plain bench records over several commits, older records without categories) and from the real journal; bad
input is one clear line; writing is atomic."""
from pathlib import Path
import numpy as np
import PIL.Image
import pytest
from matplotlib.figure import Figure
from experiments import journal, plot
from tinyzoo.cli import main

DEVICE, SHORT = "CPU: Intel(R) Xeon(R) Processor, 2 cores", "CPU: Intel Xeon, 2 cores"
PNG = b"\x89PNG\r\n\x1a\n"

def rec(time: str, commit: str, model: str = "smollm2-135m", tok_s: float = 5.0, kpt: int = 427, cats: bool = True, **extra) -> dict:
  ms = 1e3 / tok_s
  metrics = {"kernels_per_token": kpt, "tok_s": tok_s, "ms_per_token": {"median": ms, "min": 0.8 * ms, "max": 1.3 * ms}, "floor_ms": 9.3,
             "bytes_per_token": 96436836, "bandwidth_gb_s": 10.3, "pp_tok_s": 13.0, "pp_tokens": 512, "compile_s": 20.0, "capture_s": 5.0,
             "load_s": 4.0, "depth": 32}
  if cats: metrics["kernel_categories"] = {"matmul": kpt // 3, "reduce": kpt // 4, "elementwise": kpt - kpt // 3 - kpt // 4 - 12, "copy": 12}
  peers = [{"engine": "llama.cpp (llama-cpp-python 0.3.36, 2 threads)", "tok_s": 67.5, "ms_per_token": 14.8, "pp_tok_s": 150.0, "pp_tokens": 512,
            "depth": 32},
           {"engine": "tinygrad.llm@a9069c177a", "tok_s": 3.1, "kernels_per_token": 430}]
  return {"time": f"2026-11-{time}+00:00", "commit": commit, "dirty": False, "device": DEVICE, "backend": "CPU", "tinygrad": "0.14.0",
          "model": model, "file": f"{model}.gguf", "switches": {"strategy": "packed_dot"}, "prompt_tokens": 32, "tokens": 64,
          "metrics": metrics, "peer": peers[0], "peers": peers, **extra}

def variant(time: str, experiment: str, run: str, name: str, baseline: bool = False, **kw) -> dict:
  return rec(time, "c0ffee1234ab", experiment=experiment, variant=name, baseline=baseline, run=run, **kw)

@pytest.fixture
def records() -> list[dict]:
  old = [rec("20T10:00:00", "aaaaaaa11111", cats=False), rec("20T11:00:00", "bbbbbbb22222", cats=False, tok_s=4.1),
         rec("20T11:30:00", "bbbbbbb22222", model="gemma3-270m", kpt=367, tok_s=3.3, cats=False)]
  history = [rec(f"21T{h:02d}:00:00", c, tok_s=t, kpt=k) for h, c, t, k in
             [(1, "ccccccc33333", 5.2, 427), (2, "ddddddd44444", 7.8, 400), (3, "ddddddd44444", 5.9, 579), (4, "eeeeeee55555", 8.4, 390)]]
  strategy_old = [variant("22T01:00:00", "strategy", "run-old", "packed_dot", True), variant("22T01:01:00", "strategy", "run-old", "ancient_variant")]
  strategy = [variant("22T02:00:00", "strategy", "run-new", "packed_dot", True, tok_s=7.8),
              variant("22T02:01:00", "strategy", "run-new", "fused", tok_s=4.2, kpt=431),
              variant("22T02:02:00", "strategy", "run-new", "dequant_cache_fp16", tok_s=4.3, kpt=415)]
  rounding = [variant("22T03:00:00", "rounding", "run-r", "exact", True, model="gemma3-270m", kpt=367, tok_s=3.3),
              variant("22T03:01:00", "rounding", "run-r", "ggml", model="gemma3-270m", kpt=519, tok_s=2.9),
              variant("22T03:02:00", "rounding", "run-r", "ggml_no_kv16", model="gemma3-270m", kpt=480, tok_s=3.0, cats=False)]
  for i, r in enumerate(strategy + rounding):   # quality measured beside speed: perplexity, and KL divergence from the baseline
    r["quality"] = {"perplexity": 11.0 + i / 10, "tokens": 255, "windows": 1, "ctx": 512,
                    **({} if r["baseline"] else {"kl_mean": 0.001 * i, "top1": 0.99 - i / 100})}
  return old + history + strategy_old + strategy + rounding + gemm_records()

def gemm(time: str, model: str, kernel: str, n: int, k: int, tflops: float, cublas: float | None = None, correct: bool = True) -> dict:
  return {"time": f"2026-11-{time}+00:00", "commit": "f00dfeed1234", "dirty": False, "device": DEVICE, "kind": "gemm", "model": model,
          "tensor": "blk.0.ffn_up.weight", "ggml_type": "Q4_0", "switches": {"gemm": kernel, "prefill": "half"},
          "metrics": {"rows": 512, "n": n, "k": k, "experts": 0, "kernels": 2, "ms": 0.1, "tflops": tflops, "rel_err": 2e-4,
                      "correct": correct, "iters": 20}, **({"peer": {"engine": "cuBLAS", "tflops": cublas}} if cublas else {})}

def gemm_records() -> list[dict]:
  """`tinyzoo gemm` records of two models, two kernels and two shapes, an older one of a shape measured again."""
  return [gemm("23T01:00:00", "smollm2-135m", "mma", 1536, 576, 9.0), gemm("23T02:00:00", "smollm2-135m", "mma", 1536, 576, 30.0, 90.0),
          gemm("23T02:00:01", "smollm2-135m", "tinygrad", 1536, 576, 12.0, 90.0), gemm("23T02:00:02", "smollm2-135m", "tinygrad", 576, 576, 5.0),
          gemm("23T02:00:03", "gemma3-270m", "tinygrad", 2048, 640, 20.0, 70.0), gemm("23T02:00:04", "gemma3-270m", "mma", 2048, 640, 1.0,
                                                                                      correct=False)]

def check_png(path: Path) -> None:
  assert path.read_bytes()[:8] == PNG
  with PIL.Image.open(path) as png: img = np.asarray(png)   # 8-bit channels (matplotlib.image.imread reads them divided by 255)
  assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500
  ink = ((img[..., 0] < 230) | (img[..., 1] < 230) | (img[..., 2] < 230)).mean()   # share of pixels that are not (near) white: < 0.9
  assert 0.02 < ink < 0.8 and more_colors_than(img, 50)

def more_colors_than(img: np.ndarray, n: int) -> bool:
  """Whether the image holds more than n distinct RGB colors, counted a band of rows at a time until it does."""
  seen: set[int] = set()
  for rows in np.array_split(img[..., :3], 16):
    rgb = rows.astype(np.uint32)
    seen.update(np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]).tolist())
    if len(seen) > n: return True
  return False

VARIANTS = {"kernels": ["packed_dot", "fused", "dequant_cache_fp16", "exact", "ggml"], "speed": ["packed_dot", "fused", "exact", "ggml"],
            "breakdown": ["packed_dot", "fused", "exact", "ggml"], "history": ["ccccccc", "ddddddd", "eeeeeee"], "pp": ["0.09x", "llama.cpp"],
            "depth": ["tinyzoo", "llama.cpp", "depth: tokens of context"], "quality": ["packed_dot", "fused", "exact", "ggml", "mean KL divergence"],
            "gemm": ["tinygrad", "mma", "cuBLAS", "1536x576", "wrong"]}

@pytest.mark.parametrize("kind", plot.KINDS)
def test_each_kind_renders_png_and_svg(kind: str, records: list[dict], tmp_path: Path):
  check_png(plot.plot(records, kind, tmp_path / f"{kind}.png"))
  svg = plot.plot(records, kind, tmp_path / f"{kind}.svg").read_text()
  assert svg.lstrip().startswith("<?xml") and "<svg" in svg
  for text in ["smollm2-135m", "gemma3-270m", SHORT, *VARIANTS[kind]]: assert text in svg, text
  assert "ancient_variant" not in svg   # only each experiment's latest run
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{kind}.png", f"{kind}.svg"])

@pytest.mark.parametrize("kind", plot.KINDS)
def test_titles_name_model_device_and_commit(kind: str, records: list[dict]):
  """Every panel's title names its device and the commits it was measured at; a panel of one model names the model,
  the history chart's models are its legend."""
  fig = plot.figure(records, kind)
  titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
  assert titles and all(SHORT in t and "commit" in t for t in titles)
  if kind == "pp": assert len(titles) == 1   # one device: a pair of bars per model
  elif kind == "gemm":
    assert sorted(titles) == [f"GEMMs of a 512-row prompt chunk · {m}\n{SHORT} · commit f00dfee" for m in ("gemma3-270m", "smollm2-135m")]
  elif kind == "depth":   # plain benches, each panel's newest at each depth
    assert sorted(titles) == [f"bench · gemma3-270m\n{SHORT} · commit bbbbbbb", f"bench · smollm2-135m\n{SHORT} · commit eeeeeee"]
  elif kind != "history":
    assert sorted(t.split(" · ")[0] for t in titles) == ["rounding", "strategy"]   # one subplot per experiment
    assert f"strategy · smollm2-135m\n{SHORT} · commit c0ffee1" in titles and f"rounding · gemma3-270m\n{SHORT} · commit c0ffee1" in titles
  else:
    assert titles == [f"tok/s over commits\n{SHORT} · 6 commits, aaaaaaa … c0ffee1"]
    assert {"smollm2-135m", "gemma3-270m"} <= {t.get_text() for t in fig.legends[0].get_texts()}

def test_baseline_first_and_marked(records: list[dict]):
  fig = plot.figure(records, "kernels", experiment="strategy")
  ax = next(ax for ax in fig.axes if ax.get_title())
  labels = [t.get_text() for t in ax.get_xticklabels()]
  assert labels == ["packed_dot\n(baseline)", "fused", "dequant_cache_fp16"]
  assert ax.patches[0].get_hatch() == "//" and not ax.patches[1].get_hatch()

def test_a_panel_per_model_and_device_each_its_latest_run(records: list[dict]):
  """An experiment run on several models and devices: the latest run on each is a panel of its own, so that the newest
  run (here on a model that may not show the effect) never hides the others."""
  gemma = [variant("26T01:00:00", "strategy", "run-gemma", "packed_dot", True, model="gemma3-270m"),
           variant("26T01:01:00", "strategy", "run-gemma", "fused", model="gemma3-270m")]
  gpu = [{**variant(f"26T02:0{i}:00", "strategy", "run-gpu", name, i == 0), "device": "CUDA: NVIDIA H100 80GB HBM3", "commit": "5ca1ab1e0000"}
         for i, name in enumerate(("packed_dot", "fused"))]
  fig = plot.figure(records + gemma + gpu, "kernels", experiment="strategy")
  panels = {ax.get_title(): [t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes if ax.get_title()}
  assert panels == {f"strategy · gemma3-270m\n{SHORT} · commit c0ffee1": ["packed_dot\n(baseline)", "fused"],
                    f"strategy · smollm2-135m\n{SHORT} · commit c0ffee1": ["packed_dot\n(baseline)", "fused", "dequant_cache_fp16"],
                    "strategy · smollm2-135m\nCUDA: NVIDIA H100 80GB HBM3 · commit 5ca1ab1": ["packed_dot\n(baseline)", "fused"]}

def test_experiment_and_model_filter(records: list[dict]):
  assert [ax.get_title().split(" · ")[0] for ax in plot.figure(records, "speed", experiment="rounding").axes if ax.get_title()] == ["rounding"]
  assert [ax.get_title().split(" · ")[0] for ax in plot.figure(records, "kernels", model="smollm2-135m").axes if ax.get_title()] == ["strategy"]
  legend = [t.get_text() for t in plot.figure(records, "history", model="gemma3-270m").legends[0].get_texts()]
  assert "gemma3-270m" in legend and not any("smollm2" in t for t in legend)

def test_speed_marks_floor_and_peers(records: list[dict]):
  fig = plot.figure(records, "speed", experiment="strategy")
  legend = [t.get_text() for t in fig.legends[0].get_texts()]
  assert any(t.startswith("memory floor") for t in legend) and "llama.cpp (peer)" in legend and "tinygrad app (peer)" in legend
  texts = [t.get_text() for t in fig.axes[0].texts]
  assert "llama.cpp 67.5 tok/s" in texts and "tinygrad app 3.1 tok/s" in texts and "108" in texts   # peers' lines, floor 1000/9.3 ms

def test_breakdown_skips_records_without_categories(records: list[dict]):
  fig = plot.figure(records, "breakdown", experiment="rounding")
  ax = fig.axes[0]
  assert [t.get_text() for t in ax.get_xticklabels()] == ["exact\n(baseline)", "ggml"]
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["matmul", "reduce", "elementwise", "copy", "baseline"]
  assert any("skipped 1 record without metrics.kernel_categories" in " ".join(t.get_text().split()) for t in fig.texts)

def test_history_line_takes_each_commits_fastest_record(records: list[dict]):
  """ddddddd has 7.8 tok/s (400 kernels) then 5.9 (579): the line and the kernel count follow the faster, the other is a dot."""
  ax = plot.figure(records, "history", model="smollm2-135m").axes[0]
  line = next(l for l in ax.get_lines() if l.get_linestyle() == "-")
  labels = [t.get_text() for t in ax.get_xticklabels()]
  assert line.get_ydata()[list(line.get_xdata()).index(labels.index("ddddddd"))] == 7.8
  assert any(list(l.get_ydata()) == [5.9] for l in ax.get_lines() if l.get_linestyle() in ("None", ""))
  kernels = next(l for l in ax.figure.axes[1].get_lines() if l.get_linestyle() == "--")
  assert kernels.get_ydata()[list(kernels.get_xdata()).index(labels.index("ddddddd"))] == 400

def test_history_orders_commits_as_made(records: list[dict], monkeypatch: pytest.MonkeyPatch):
  """Commits git knows stand in the order they were made, whenever their records were taken (an older commit benched
  again later, in an A/B, keeps its place); the others by their first record."""
  labels = lambda: [t.get_text() for t in plot.figure(records, "history", model="smollm2-135m").axes[0].get_xticklabels()]
  assert labels() == ["aaaaaaa", "bbbbbbb", "ccccccc", "ddddddd", "eeeeeee", "c0ffee1"]
  monkeypatch.setattr(plot, "commit_times", lambda: {"ddddddd": 0, "eeeeeee": 1})
  assert labels() == ["ddddddd", "eeeeeee", "aaaaaaa", "bbbbbbb", "ccccccc", "c0ffee1"]

def test_older_records_only_history(records: list[dict], tmp_path: Path):
  old = [r for r in records if "experiment" not in r and "kernel_categories" not in r["metrics"]]
  check_png(plot.plot(old, "history", tmp_path / "h.png"))
  for kind in ("kernels", "speed", "breakdown"):
    with pytest.raises(ValueError, match="no experiment records"): plot.plot(old, kind, tmp_path / "x.png")

@pytest.mark.parametrize("kind,kw,match", [
  ("bars", {}, r"unknown plot kind 'bars'; kinds: kernels, speed, breakdown, history, pp, depth"),
  ("kernels", {"experiment": "nope"}, r"no record of experiment 'nope'; the records' experiments: rounding, strategy"),
  ("history", {"experiment": "nope"}, r"no record of experiment 'nope'; the records' experiments: rounding, strategy"),
  ("speed", {"model": "llama-70b"}, r"no experiment records for model 'llama-70b'; models: gemma3-270m, smollm2-135m"),
  ("history", {"model": "llama-70b"}, r"no bench or baseline records for model 'llama-70b'"),
  ("pp", {"model": "llama-70b"}, r"no record has prompt processing beside a peer's of the same length"),
  ("depth", {"experiment": "nope"}, r"no record of experiment 'nope'; the records' experiments: rounding, strategy"),
  ("depth", {"model": "llama-70b"}, r"no bench record of 'llama-70b' has decode tok/s at a depth"),
  ("kernels", {"experiment": "rounding", "device": "CUDA"}, r"no records on a device matching 'CUDA'; devices: CPU: Intel"),
  ("pp", {"model": "llama-70b", "device": "Xeon"}, r"no record has prompt processing .*\(among the records on a device matching 'Xeon'\)"),
])
def test_bad_input_is_one_clear_line(kind: str, kw: dict, match: str, records: list[dict], tmp_path: Path):
  with pytest.raises(ValueError, match=match) as e: plot.plot(records, kind, tmp_path / "x.png", **kw)
  assert "\n" not in str(e.value) and not list(tmp_path.iterdir())

def test_no_categories_empty_journal_bad_suffix(records: list[dict], tmp_path: Path):
  no_cats = [{**r, "metrics": {k: v for k, v in r["metrics"].items() if k != "kernel_categories"}} for r in records]
  with pytest.raises(ValueError, match=r"no record of the latest experiment runs has metrics.kernel_categories"):
    plot.plot(no_cats, "breakdown", tmp_path / "b.png")
  with pytest.raises(ValueError, match=r"the journal is empty"): plot.plot([], "history", tmp_path / "h.png")
  with pytest.raises(ValueError, match=r"suffix picks the format, one of \.png, \.svg, \.pdf"): plot.plot(records, "history", tmp_path / "h.jpg")
  assert not list(tmp_path.iterdir())

def test_atomic_write(records: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  out = tmp_path / "deep" / "er" / "chart.pdf"
  assert plot.plot(records, "kernels", out) == out and out.read_bytes()[:5] == b"%PDF-"
  assert [p.name for p in out.parent.iterdir()] == ["chart.pdf"]
  before = out.read_bytes()
  def broken(self, f, **kw):
    f.write(b"half a chart")
    raise RuntimeError("disk full")
  monkeypatch.setattr(Figure, "savefig", broken)
  with pytest.raises(RuntimeError, match="disk full"): plot.plot(records, "speed", out)
  assert out.read_bytes() == before and [p.name for p in out.parent.iterdir()] == ["chart.pdf"]

def test_short_device():
  assert plot.short_device(DEVICE) == SHORT
  assert plot.short_device("CPU: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz, 16 cores") == "CPU: Intel Xeon Platinum 8375C, 16 cores"
  assert plot.short_device("CUDA: NVIDIA H100 80GB HBM3") == "CUDA: NVIDIA H100 80GB HBM3" and plot.short_device("CPU") == "CPU"

@pytest.mark.parametrize("kind", plot.KINDS)
def test_the_projects_journal(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture):
  """`tinyzoo plot` over the project's committed journal (results/journal.jsonl: records of every generation, experiment
  runs and benches over many commits and devices): every kind draws, a chart no wider than 2,000 px."""
  out = tmp_path / f"{kind}.png"
  assert main(["plot", str(journal.PROJECT_JOURNAL), "--kind", kind, "-o", str(out)]) == 0, capsys.readouterr().err
  check_png(out)
  with PIL.Image.open(out) as png: assert png.width <= 2000, png.size

FIELDS = ["time", "commit", "dirty", "device", "model", "metrics", "peer", "peers", "run", "variant", "baseline", "experiment",
          "metrics.tok_s", "metrics.kernels_per_token", "metrics.ms_per_token", "metrics.floor_ms", "metrics.kernel_categories"]

def drop(r: dict, field: str) -> dict:
  if "." not in field: return {k: v for k, v in r.items() if k != field}
  return {**r, "metrics": {k: v for k, v in r["metrics"].items() if k != field.split(".")[1]}}

@pytest.mark.parametrize("kind", plot.KINDS)
def test_missing_fields_never_crash(kind: str, records: list[dict]):
  """Fields gone from some records (each record misses another one), or from all: each kind draws, or says in one line why not."""
  for shift in (0, 7):
    mixed = [drop(r, FIELDS[(i + shift) % len(FIELDS)]) for i, r in enumerate(records)]
    assert plot.figure(mixed, kind).axes
  # a field gone from every record: the charts that need it say so in one line, the others draw
  needs = {"metrics": "prompt processing" if kind == "pp" else "metrics.depth" if kind == "depth" else
           "metrics.tok_s and quality" if kind == "quality" else "no GEMM record" if kind == "gemm" else
           f"metrics.{'tok_s' if kind in ('speed', 'history') else 'kernel_categories' if kind == 'breakdown' else 'kernels_per_token'}",
           "variant": "without a variant name" if kind not in ("history", "pp", "depth", "gemm") else None}
  for field in ("metrics", "time", "run", "variant"):
    if needs.get(field) is None: assert plot.figure([drop(r, field) for r in records], kind).axes, field
    else:
      with pytest.raises(ValueError, match=needs[field]) as e: plot.figure([drop(r, field) for r in records], kind)
      assert "\n" not in str(e.value)

def test_depth_draws_each_variant_and_the_peer_against_depth(records: list[dict]):
  """The decode-depth chart: a line per variant of the experiment's latest run and one for llama.cpp, each point the
  tok/s at a depth, the peer's from the same record's peer at that depth (an older run and other peers' depths left out)."""
  def at(depth: int, name: str, tok_s: float, run: str = "run-d", peer: float | None = None) -> dict:
    r = variant(f"23T0{len(depths)}:00:00", "decode-depth", run, name, name == "one sum", model="llama3.2-1b", tok_s=tok_s)
    r["metrics"]["depth"] = depth
    r["peer"] = r["peers"][0] = {**r["peer"], "depth": depth if peer else depth + 1, "tok_s": peer or 1.0}
    depths.append(r)
    return r
  depths: list[dict] = []
  at(0, "one sum", 999.0, run="run-old", peer=1.0)
  for d, one, split, peer in ((0, 1200.0, 1150.0, 950.0), (4096, 500.0, 900.0, 860.0), (16384, 190.0, 640.0, 700.0)):
    at(d, "one sum", one, peer=peer)
    at(d, "split", split, peer=None)
  fig = plot.figure(records + depths, "depth", experiment="decode-depth")
  (ax,) = [a for a in fig.axes if a.get_title()]
  series = sorted((list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines())
  assert series == sorted([([0, 4096, 16384], [1200.0, 500.0, 190.0]), ([0, 4096, 16384], [1150.0, 900.0, 640.0]),
                           ([0, 4096, 16384], [950.0, 860.0, 700.0])])
  assert ax.get_title() == f"decode-depth · llama3.2-1b\n{SHORT} · commit c0ffee1"

def test_depth_lines_of_bench_records_are_the_switches_that_differ(records: list[dict]):
  """Without an experiment, a panel's bench records at depths make a line for each value of the switches that differ
  between them (the newest at each depth), beside the peer's."""
  def at(depth: int, split: int, tok_s: float, hour: int) -> dict:
    r = rec(f"24T{hour:02d}:00:00", "f00dfeed0001", model="gemma3-270m", tok_s=tok_s)
    r["switches"] = {"strategy": "packed_words", "split_kv": split}
    r["metrics"]["depth"] = r["peer"]["depth"] = depth
    return r
  bench = [at(0, 0, 1400.0, 1), at(4096, 0, 1100.0, 1), at(0, 8, 1300.0, 2), at(4096, 8, 1250.0, 2), at(4096, 8, 1290.0, 3)]
  for r in bench[:2]: r["switches"]["expert_tile"] = 32   # a switch the others lack (older records): no difference
  fig = plot.figure(records + bench, "depth", model="gemma3-270m")
  (ax,) = [a for a in fig.axes if a.get_title()]
  series = sorted((list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines())
  assert ([0, 4096], [1400.0, 1100.0]) in series and ([0, 4096], [1300.0, 1290.0]) in series
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert {"split_kv=0, strategy=packed_words", "split_kv=8, strategy=packed_words"} <= set(legend)   # the fixture's gemma3 records differ in strategy
  assert not any("expert_tile" in name for name in legend)

def test_quality_draws_each_variant_at_its_divergence_and_speed(records: list[dict]):
  """The speed/quality frontier: each variant of the latest run a point at (mean KL divergence from the baseline, tok/s),
  the baseline at 0, each labelled with its perplexity; a run without quality is named as the reason for no chart."""
  def q(name: str, tok_s: float, ppl: float, kl: float | None, run: str = "run-q") -> dict:
    r = variant(f"25T0{len(runs)}:00:00", "q4-formats", run, name, kl is None, tok_s=tok_s)
    r["quality"] = {"perplexity": ppl, "tokens": 255, "windows": 1, "ctx": 512, **({} if kl is None else {"kl_mean": kl, "top1": 0.97})}
    runs.append(r)
    return r
  runs: list[dict] = []
  q("Q4_0 copy", 9.0, 9.1, None, run="run-old")
  q("Q4_0 copy", 10.0, 11.5, None)
  q("Q4_K copy", 8.0, 11.2, 0.012)
  q("Q8_0 copy", 6.0, 11.0, 0.002)
  fig = plot.figure(records + runs, "quality", experiment="q4-formats")
  (ax,) = [a for a in fig.axes if a.get_title()]
  points = sorted(tuple(map(float, c.get_offsets()[0])) for c in ax.collections)
  assert points == [(0.0, 10.0), (0.002, 6.0), (0.012, 8.0)]
  labels = sorted(t.get_text() for t in ax.texts)
  assert [l for l in labels if "ppl" in l] == ["Q4_0 copy\nppl 11.500", "Q4_K copy\nppl 11.200", "Q8_0 copy\nppl 11.000"]
  assert "llama.cpp 67.5 tok/s" in labels   # the peer measured in the run
  speed_only = [{k: v for k, v in r.items() if k != "quality"} for r in records]
  with pytest.raises(ValueError, match="has metrics.tok_s and quality"): plot.figure(speed_only, "quality", experiment="strategy")

def test_the_gemm_chart_draws_each_kernels_newest_record_of_a_shape_beside_cublas(records: list[dict]):
  fig = plot.figure(records, "gemm", model="smollm2-135m")
  (ax,) = [ax for ax in fig.axes if ax.get_title()]
  heights = [round(b.get_height(), 1) for b in ax.patches]
  assert heights == [12.0, 30.0, 90.0, 5.0]   # 1536x576 (the larger first): tinygrad, mma's newest, cuBLAS; 576x576: tinygrad alone
  with pytest.raises(ValueError, match="belong to no experiment"): plot.figure(records, "gemm", experiment="strategy")
