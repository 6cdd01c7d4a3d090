"""Named experiments as data: every committed definition loads and turns into valid bench configs; bad definitions are
named in one line; sizes from the command line win over the experiment's, which win over the defaults."""
import re
from pathlib import Path
import pytest
from gguf import GGMLQuantizationType
from experiments import journal, named
from experiments.bench import BenchConfig
from profiles.hints import SKIPPABLE, resolve
from quant.linear import StrategyPlan
from tinyzoo.cli import main

def test_committed_experiments_load_and_configure():
  experiments = named.load_all()
  assert {"matmul-strategies", "q4-formats", "ffn-split", "isolation", "row-upcast"} <= set(experiments)
  for exp in experiments.values():
    assert exp.description and re.match(r"seed 00\d\b", exp.reproduces)   # the seed document whose finding it reproduces
    for v in exp.all_variants:
      cfg = named.config(exp, v, BenchConfig())
      StrategyPlan.parse(cfg.hints.strategy)
      assert set(cfg.hints.skip) <= set(SKIPPABLE)
      assert cfg.requant is None or cfg.requant in GGMLQuantizationType.__members__
      assert cfg.tokens == exp.bench.get("tokens", BenchConfig.tokens)

def write(tmp_path: Path, text: str) -> Path:
  (tmp_path / "defs").mkdir(exist_ok=True)
  (tmp_path / "defs" / "x.yaml").write_text(text)
  return tmp_path / "defs"

GOOD = """
description: d
model: m
bench: {tokens: 8}
baseline: {name: base, switches: {strategy: packed_dot}}
variants:
  - {name: split ffn, switches: {strategy: "packed_dot,ffn=split", skip: [attention], row_upcast: 0}}
"""

@pytest.mark.parametrize("text, message", [
  ("a: [", "not valid YAML"),
  ("- 1", "expected a mapping at the top"),
  (GOOD.replace("model: m\n", ""), "missing 'model'"),
  (GOOD.replace("row_upcast: 0", "row_upcast: eight"), "hint row_upcast: 'eight' is not a whole number >= 0"),
  (GOOD.replace("row_upcast: 0", "rounding: fp8"), "hint rounding: 'fp8' is not one of ggml, exact"),
  (GOOD.replace("skip:", "skipp:"), "unknown key 'skipp'"),
  (GOOD.replace("tokens: 8", "tokens: true"), "tokens must be int, got True"),
  (GOOD.replace("split ffn", "base"), "variant names must be unique"),
  (GOOD.split("variants:")[0] + "variants: []\n", "'variants' must be a non-empty list, unless the verdict judges the baseline"),
  (GOOD + "verdict: {metric: tok_s, variant: base, expect: higher}\n", "verdict names no variant .*'base' \\(the baseline is judged only against"),
  (GOOD + "verdict: {metric: tok_s, variant: base, expect: same, against: [1]}\n", "against must be a metric's name or a number"),
  (GOOD + "verdict: {metric: tok_s, variant: base, expect: equal, against: 1}\n", "expect must be higher, lower or same"),
  (GOOD + "profile: {replays: 3}\n", "profile: unknown key 'replays' \\(known: repeats\\)"),
  (GOOD + "profile: {repeats: 0}\n", "profile: repeats must be at least 1, got 0"),
  (GOOD + "profile: false\n", "profile: expected a mapping, got bool"),
])
def test_bad_definitions_are_named(tmp_path: Path, text: str, message: str):
  defs = write(tmp_path, text)
  with pytest.raises(named.ExperimentError, match=message) as e: named.load_all(defs)
  assert str(defs / "x.yaml") in str(e.value) and "\n" not in str(e.value)

def test_a_profile_experiment_may_judge_its_baseline_alone(tmp_path: Path):
  text = (GOOD.split("variants:")[0] + "variants: []\nprofile: {repeats: 2}\n"
          "verdict: {metric: profile.moe_block_forms, variant: base, expect: same, against: 1}\n")
  exp = named.find("x", write(tmp_path, text))
  assert (exp.variants, exp.profile, exp.verdict.against, exp.verdict.expect) == ((), {"repeats": 2}, 1, named.Expect.SAME)
  assert named.find("x", write(tmp_path, GOOD)).profile is None

def test_unknown_experiment_lists_known(tmp_path: Path):
  with pytest.raises(named.ExperimentError, match=r"no experiment named 'y' \(known: x\)"): named.find("y", write(tmp_path, GOOD))

def test_config_precedence(tmp_path: Path):
  exp = named.find("x", write(tmp_path, GOOD))
  variant = exp.variants[0]
  cfg = named.config(exp, variant, BenchConfig(resolve({"norm": "break"}), warmup=7, peer=False))
  assert (cfg.tokens, cfg.warmup, cfg.peer) == (8, 7, False)
  assert (cfg.hints.strategy, cfg.hints.skip, cfg.hints.row_upcast, cfg.hints.norm) == ("packed_dot,ffn=split", ("attention",), 0, "break")
  assert named.config(exp, variant, BenchConfig(), {"tokens": 3}).tokens == 3
  assert named.config(exp, exp.baseline, BenchConfig()).hints.skip == ()

@pytest.mark.parametrize("spec, plan", [
  ("fused", StrategyPlan("fused")),
  ("packed_dot,Q6_K=split", StrategyPlan("packed_dot", {GGMLQuantizationType.Q6_K: "split"})),
  ("Q4_K=fused,ffn=dequant_cache,split", StrategyPlan("split", {GGMLQuantizationType.Q4_K: "fused"}, "dequant_cache")),
  ("packed_words,experts=int8_dot", StrategyPlan("packed_words", experts="int8_dot")),
  ("experts=int8_dot,ffn=split,Q4_K=fused", StrategyPlan("packed_dot", {GGMLQuantizationType.Q4_K: "fused"}, "split", "int8_dot")),
])
def test_strategy_specs(spec: str, plan: StrategyPlan):
  assert StrategyPlan.parse(spec) == plan
  assert StrategyPlan.parse(plan.spec()) == plan
  assert plan.for_weight("blk.0.ffn_up", GGMLQuantizationType.Q4_K) == (plan.ffn or plan.by_type.get(GGMLQuantizationType.Q4_K, plan.default))
  assert plan.for_weight("blk.0.attn_q", GGMLQuantizationType.Q6_K) == plan.by_type.get(GGMLQuantizationType.Q6_K, plan.default)
  # a MoE's experts take `experts` first, then as any feed-forward weight; its router and shared experts are no experts
  by_type = plan.by_type.get(GGMLQuantizationType.Q4_K, plan.default)
  assert plan.for_weight("blk.0.ffn_down_exps", GGMLQuantizationType.Q4_K) == (plan.experts or plan.ffn or by_type)
  for name in ("blk.0.ffn_gate_inp", "blk.0.ffn_up_shexp"): assert plan.for_weight(name, GGMLQuantizationType.Q4_K) == (plan.ffn or by_type)

@pytest.mark.parametrize("spec, message", [("nope", "unknown matmul strategy 'nope'"), ("Q9_K=fused", "'Q9_K' is neither a GGML type"),
                                           ("ffn=nope", "unknown matmul strategy 'nope'"),
                                           ("experts=nope", "unknown matmul strategy 'nope'"), ("attn=split", "nor 'ffn' nor 'experts'")])
def test_bad_strategy_specs(spec: str, message: str):
  with pytest.raises(ValueError, match=message): StrategyPlan.parse(spec)

def result(variant: str, depth: int, tok_s: float, baseline: bool = False, run: str = "r1", device: str = "CPU: test", commit: str = "abc1234",
           dirty: bool = False, **metrics) -> dict:
  return {"experiment": "x", "run": run, "variant": variant, "baseline": baseline, "model": "m", "device": device, "commit": commit,
          "dirty": dirty, "metrics": {"depth": depth, "kernels_per_token": 100, "tok_s": tok_s, "ms_per_token": {"median": 1e3 / tok_s},
                                      "bytes_per_token": 2e6, **metrics}}

def test_results_table_spread_flags_and_what_cannot_be_compared():
  """tok/s and pp tok/s as mean ± sd where the record has the spread (the peer's likewise), the mean alone where not; a
  flagged record marked ! and its flags under the table; a record with no pp, or none of its baseline's depth, said so."""
  base = {**result("base", 0, 10.0, True, tok_s_sd=0.5, pp_tok_s=100.0, pp_tok_s_sd=2.0),
          "peer": {"tok_s": 20.0, "tok_s_sd": 1.0, "pp_tok_s": 300.0}, "flags": ["noisy: tinyzoo tok_s 10.0 ± 0.5"]}
  old = result("old", 0, 12.0, pp_tok_s=110.0)
  table = named.results_table([base, old, result("no pp", 0, 9.0), result("deep", 4096, 5.0, pp_tok_s=100.0)]).splitlines()
  head, _, b, o, n, *under = table
  assert head.split()[:5] == ["variant", "depth", "kernels/tok", "Δ", "kernels"]
  assert b.startswith("base (baseline) !") and "10.00 ± 0.50" in b and "100.0 ± 2.0" in b and "20.00 ± 1.00" in b and b.endswith(" 300.0")
  assert "±" not in o and "12.00  +20.0%" in o and "110.0 +10.0%" in o
  assert n.split()[-4:] == ["-", "-", "-", "-"]   # no pp, so no change in it; no peer
  assert under == ["! base (baseline) @d0: noisy: tinyzoo tok_s 10.0 ± 0.5", "pp not comparable: no pp @d0: no pp measured",
                   "not comparable: deep @d4096: the run has no baseline at that depth"]

def test_show_takes_the_latest_run_on_each_device(tmp_path: Path):
  """`exp show`: the latest run on each model and device, each with its device and commit (+ where dirty)."""
  exp = named.find("x", write(tmp_path, GOOD))
  records = [result("base", 32, 5.0, True, run="cpu-old"), result("base", 32, 6.0, True, run="cpu-new", dirty=True),
             result("split ffn", 32, 3.0, run="cpu-new", dirty=True),
             result("base", 32, 900.0, True, run="gpu", device="CUDA: H100", commit="def5678")]
  out = named.describe(exp, records)
  assert "latest run on m, CPU: test: cpu-new (commit abc1234+)" in out and "latest run on m, CUDA: H100: gpu (commit def5678)" in out
  assert "cpu-old" not in out and "6.00" in out and "900.00" in out and "5.00" not in out

@pytest.mark.parametrize("name", sorted(named.load_all()))
def test_show_every_experiment_over_the_projects_journal(name: str, capsys: pytest.CaptureFixture):
  """`tinyzoo exp show` over the project's committed journal, whose records are of every generation: each experiment's
  latest run on each model and device beside its baseline, or that it has not run."""
  assert main(["exp", "show", name, "--journal", str(journal.PROJECT_JOURNAL)]) == 0
  out, err = capsys.readouterr()
  assert not err and ("latest run on " in out or "not run yet" in out)
  if name == "moe-topk": assert out.count("latest run on ") >= 5   # one run on each of its models
