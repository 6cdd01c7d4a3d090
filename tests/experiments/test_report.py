"""`tinyzoo report`: the verdict rule on small records (each outcome, with and without a measured spread), a page of
synthetic runs, the project's page from the committed journal (its charts there and under 2,000 px wide), README's
table equal to the one `report` makes, README's length, and bad input in one line."""
import re
from pathlib import Path
import PIL.Image
import pytest
from experiments import journal, report
from experiments.named import Expect, Verdict
from experiments.report import CONTRADICTED, NOT_REPRODUCED, NOT_RUN, REPRODUCED, judge

README = Path(__file__).resolve().parents[2] / "README.md"
GPU, CPU = "CUDA: NVIDIA H200", "CPU: AMD EPYC, 2 cores"

def rec(tok_s: float | None, sd: float | None = None, **extra) -> dict:
  metrics = {"tok_s": tok_s, "kernels_per_token": 100, "depth": 32, "pp_tok_s": 50.0, "pp_tokens": 512}
  if sd is not None: metrics["tok_s_sd"] = sd
  return {"time": "2026-11-28T10:00:00+00:00", "commit": "abc1234", "dirty": False, "device": CPU, "model": "m", "metrics": metrics, **extra}

HIGHER, LOWER = Verdict("tok_s", "v", Expect.HIGHER), Verdict("tok_s", "v", Expect.LOWER)

@pytest.mark.parametrize("rule, base, variant, verdict", [
  (HIGHER, rec(100), rec(110), REPRODUCED),                  # no sd: the margin (5%) alone decides
  (HIGHER, rec(100), rec(104), NOT_REPRODUCED),
  (HIGHER, rec(100), rec(90), CONTRADICTED),
  (LOWER, rec(100), rec(90), REPRODUCED),
  (LOWER, rec(100), rec(110), CONTRADICTED),
  (HIGHER, rec(100, 4), rec(110, 4), NOT_REPRODUCED),        # 10 over the margin but not over twice the combined sd (11.3)
  (HIGHER, rec(100, 4), rec(90, 4), NOT_REPRODUCED),
  (HIGHER, rec(100, 4), rec(115, 1), REPRODUCED),            # over both: 15 > 2 * hypot(4, 1)
  (HIGHER, rec(100, 1), rec(80, 1), CONTRADICTED),
  (HIGHER, rec(100, 3), rec(108), REPRODUCED),               # only the baseline's sd measured: 8 > 6
  (HIGHER, rec(100), None, NOT_RUN),
  (HIGHER, rec(100), rec(None), NOT_RUN),
  (Verdict("kernels_per_token", "v", Expect.HIGHER), rec(1), {**rec(1), "metrics": {"kernels_per_token": 120}}, REPRODUCED),
  (Verdict("quality.perplexity", "v", Expect.HIGHER, 0.002), rec(1, quality={"perplexity": 18.199}), rec(1, quality={"perplexity": 18.289}),
   REPRODUCED),
  # against a value the seed states, or another metric of the same record; same: within the margin
  (Verdict("profile.moe_block_forms", "v", Expect.SAME, 0.0, 1), None, rec(1, profile={"moe_block_forms": 1}), REPRODUCED),
  (Verdict("profile.moe_block_forms", "v", Expect.SAME, 0.0, 1), None, rec(1, profile={"moe_block_forms": 2}), CONTRADICTED),
  (Verdict("profile.moe_block_forms", "v", Expect.SAME, 0.0, 1), None, rec(1), NOT_RUN),
  (Verdict("profile.experts_gbps", "v", Expect.LOWER, 0.1, "profile.dense_gbps"), None, rec(1, profile={"experts_gbps": 80, "dense_gbps": 100}),
   REPRODUCED),
  (Verdict("profile.experts_gbps", "v", Expect.LOWER, 0.1, "profile.dense_gbps"), None, rec(1, profile={"experts_gbps": 95, "dense_gbps": 100}),
   NOT_REPRODUCED),
  (Verdict("profile.experts_gbps", "v", Expect.LOWER, 0.1, "profile.dense_gbps"), None, rec(1, profile={"experts_gbps": 120, "dense_gbps": 100}),
   CONTRADICTED),
  (Verdict("tok_s", "v", Expect.SAME, 0.05), rec(100), rec(104), REPRODUCED),
])
def test_the_verdict_rule(rule: Verdict, base: dict, variant: dict | None, verdict: str):
  assert judge(rule, base, variant) == verdict

DEF = """description: two variants
model: m
reproduces: seed 003, a claim
verdict: {variant: fast, metric: tok_s, expect: higher}
baseline: {name: base, switches: {}}
variants:
  - {name: fast, switches: {norm: break}}
  - {name: other, switches: {fuse: false}}
"""

def run(run_id: str, time: str, base: float, fast: float | None, device: str = CPU, sd: float | None = None) -> list[dict]:
  out = [rec(base, sd, time=time, device=device, experiment="x", variant="base", baseline=True, run=run_id)]
  if fast is not None: out.append(rec(fast, sd, time=time, device=device, experiment="x", variant="fast", baseline=False, run=run_id))
  return out

def test_a_page_of_synthetic_runs(tmp_path: Path):
  """The latest run per device and model that the rule can judge; 'not run' on a device without one; sd beside means."""
  (defs := tmp_path / "defs").mkdir()
  (defs / "x.yaml").write_text(DEF)
  records = [*run("old", "2026-11-27T10:00:00+00:00", 10.0, 20.0), *run("new", "2026-11-28T10:00:00+00:00", 10.0, 8.0, sd=0.1),
             *run("no-variant", "2026-11-29T10:00:00+00:00", 10.0, None), rec(5.0, device=GPU, peer={"engine": "llama.cpp", "tok_s": 4.0})]
  drawn = []
  def chart(stem: str, kind: str, rs: list[dict], caption: str, experiment: str | None) -> str:
    drawn.append((stem, kind, len(rs)))
    return f"![{caption}](charts/{stem}.png)"
  text = report.page(records, "j.jsonl", chart, defs)
  assert "| CPU: AMD EPYC, 2 cores | m | abc1234, 2026-11-28 | 32 | 10.0 ± 0.1 | 8.00 ± 0.10 | -20.0% | **contradicted** |" in text
  assert "| CUDA: NVIDIA H200 | - | - | - | - | - | - | not run |" in text
  assert "| [x](#x) | not run | contradicted |" in text
  assert drawn[0] == ("exp-x-cpu-amd-epyc-2-cores-m", "speed", 2)
  assert f"### {CPU}" not in text.splitlines()   # experiment records stay out of the speed matrix
  assert "| m | - / 50.0 | 4.00 / 5.00 (1.25) | 100 | - | abc1234, 2026-11-28 |" in text

@pytest.fixture(scope="module")
def project_records() -> list[dict]: return journal.read(journal.PROJECT_JOURNAL)

def test_readme_holds_the_table_report_makes(project_records: list[dict]):
  text = README.read_text()
  assert len(text.splitlines()) <= 200
  table = text.split(report.BEGIN, 1)[1].split(report.END, 1)[0].strip()
  assert table == report.summary(project_records), f"README.md's table differs from the report's; between the markers put:\n" \
                                                   f"{report.summary(project_records)}"

def test_the_project_page(tmp_path: Path):
  page = report.report(journal.PROJECT_JOURNAL, tmp_path / "out").read_text()
  assert page.startswith("# tinyzoo results") and "## Speed beside llama.cpp" in page and "(no chart of" not in page
  charts = re.findall(r"\]\((charts/[^)]+\.png)\)", page)
  assert len(charts) > 10 and len(set(charts)) == len(charts)
  for c in charts:
    with PIL.Image.open(tmp_path / "out" / c) as png: assert 300 < png.width <= 2000, (c, png.size)
  assert sorted(p.name for p in (tmp_path / "out" / "charts").iterdir()) == sorted(Path(c).name for c in charts)

def test_bad_input_is_one_line(tmp_path: Path, capsys):
  from tinyzoo.cli import main
  (empty := tmp_path / "empty.jsonl").write_text("\n")
  (afile := tmp_path / "afile").write_text("")
  for args, message in [((str(tmp_path / "none.jsonl"),), "none.jsonl: no such journal"), ((str(empty),), "empty.jsonl: no journal records"),
                        ((str(journal.PROJECT_JOURNAL), "-o", str(afile)), "afile: not a folder")]:
    code, err = main(["report", *args, *(() if "-o" in args else ("-o", str(tmp_path / "out")))]), capsys.readouterr().err
    assert code == 1 and err.startswith("tinyzoo: error:") and message in err and len(err.strip().splitlines()) == 1, err
  assert not (tmp_path / "out" / "report.md").exists()
