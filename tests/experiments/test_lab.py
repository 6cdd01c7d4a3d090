"""The lab end to end on a synthetic two-block model: a profile accounts for every kernel the bench counts, by block and
module; an experiment run records baseline and variants, one journal record each; isolation and the FFN split move
the kernel count the way their definitions say."""
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
import pytest
from tinygrad.codegen import to_program_cache
from tinygrad.codegen.opt import OptOps
from experiments import journal, named
from experiments.bench import BenchConfig, bench
from ops.kernels import CATEGORIES
from experiments.profile import TOP, block_summary, findings_text as profile_text, profile_model, report
from models.catalog import synthesized
from models.synth import synthesize
from ops import patches
from quant.gguf_file import GGUFFile

@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
  return synthesize("smollm2-135m-tiny", tmp_path_factory.mktemp("synth") / "tiny.gguf", quant="Q4_0")

SMALL = BenchConfig(depths=(4,), tokens=3, pp=6, warmup=1, peer=False, repeats=2)
# programs from the cache directory and a given copy bandwidth: for tests that time no compile and read no memory floor
KEPT = dataclasses.replace(SMALL, kept_programs=True, bandwidth=1.0)

def test_profile_accounts_for_every_kernel(tiny: Path):
  (record,) = bench(tiny, "tiny", SMALL)
  title, rows, note = profile_model(tiny, "tiny", KEPT, repeats=2)   # the same kernels, their programs taken from the cache directory
  assert len(rows) == record["metrics"]["kernels_per_token"] == sum(record["metrics"]["kernel_categories"].values())
  assert {r.category for r in rows} <= set(CATEGORIES) and [r.index for r in rows] == list(range(len(rows)))
  blocks = [b["block"] for b in block_summary(rows)]
  assert {"blk.0", "blk.1", "head", "sampler"} <= set(blocks)
  modules = {r.module for r in rows if r.block == "blk.1" and r.category == "matmul"}
  assert {"attn_q+attn_k+attn_v", "attn_output", "ffn_down", "kv_cache", "ffn_gate+ffn_up"} <= modules
  assert all(r.us is not None and r.us > 0 and not r.batched for r in rows)   # the CPU backend launches kernels one by one
  text = report(title, rows, note)
  assert "tiny: one decode step" in title and "launched alone" in note and "Per-block kernel map" in text
  # the whole step beside the kernels' sum: what the host spends beyond them
  step = re.search(r"The whole step \(decode and sampler replayed back to back\) took ([0-9.]+) ms: (-?[0-9.]+) ms beyond the kernels' sum", note)
  assert step and float(step.group(1)) > 0 and abs(float(step.group(1)) - float(step.group(2)) - sum(r.us for r in rows) / 1e3) < 0.011, note
  # attention's reads of the cache against what the position needs: every layer's keys and values up to it once (float32 here)
  g, pos = GGUFFile(tiny), int(re.search(r"at position (\d+)", title).group(1))
  meta = lambda key: g.get(f"{g.architecture}.{key}")
  want = meta("block_count") * (pos + 1) * meta("attention.head_count_kv") * 2 * meta("embedding_length") // meta("attention.head_count") * 4
  read = re.search(r"Attention: the (\d+) kernels that read the KV cache took ([0-9.]+) us for the ([0-9.e-]+) MB of keys and values", note)
  assert read and int(read.group(1)) == sum(any(x.endswith("_cache") for x in r.reads) for r in rows) >= meta("block_count"), note
  assert float(read.group(3)) == pytest.approx(want / 1e6, rel=1e-2) and "a copy on this device" not in note   # measured on GPUs only
  # the weights read per token: every matmul weight once, one row of the (untied) embedding table at most
  assert record["metrics"]["bytes_per_token"] > 0
  # a run whose JITs all come from the cache starts in a fraction of this one's compile and capture
  m = record["metrics"]
  assert all(m[k] > 0 for k in ("compile_s", "capture_s", "prefill_compile_s", "prefill_capture_s")), m   # compiled apart from the rest of a capture
  assert m["kept_programs"] is False
  assert m["repeats"] == 2 and m["tok_s_sd"] >= 0 and m["pp_tok_s_sd"] >= 0 and m["tok_s"] > 0 and m["pp_tok_s"] > 0   # llama-bench's -r
  assert 0 < m["cached_start_s"] < (m["compile_s"] + m["capture_s"] + m["prefill_compile_s"] + m["prefill_capture_s"]) / 2, m

def test_experiment_run_records_each_variant(tiny: Path, tmp_path: Path):
  defs = tmp_path / "defs"
  defs.mkdir()
  (defs / "iso.yaml").write_text("""
description: isolation on the tiny model
model: tiny
bench: {depths: 4, tokens: 3, pp: 6, warmup: 1}
baseline: {name: full, switches: {}}
variants:
  - {name: attention only, switches: {skip: [ffn]}}
  - {name: ffn split, switches: {strategy: "packed_dot,ffn=split"}}
""")
  path = tmp_path / "journal.jsonl"
  records = named.run(named.find("iso", defs), lambda name: tiny, base=BenchConfig(peer=False, kept_programs=True, bandwidth=1.0),
                      on_record=lambda r: journal.append(r, path))
  assert journal.read(path) == json.loads(json.dumps(records, sort_keys=True))
  assert [(r["variant"], r["baseline"], r["experiment"]) for r in records] == [("full", True, "iso"), ("attention only", False, "iso"),
                                                                              ("ffn split", False, "iso")]
  assert len({r["run"] for r in records}) == 1
  full, attn, split = (r["metrics"] for r in records)
  assert records[1]["switches"]["skip"] == ["ffn"] and records[2]["switches"]["strategy"] == "packed_dot,ffn=split"
  # two blocks: no FFN drops their FFN matmuls; the split adds one dequantize kernel per FFN matmul (gate+up joined, down)
  assert attn["kernels_per_token"] < full["kernels_per_token"] and attn["bytes_per_token"] < full["bytes_per_token"]
  assert split["kernels_per_token"] == full["kernels_per_token"] + 2 * 2
  # the added kernels are the dequantizes; the GEMVs over their buffers still count as matmuls
  assert split["kernel_categories"] == {**full["kernel_categories"], "elementwise": full["kernel_categories"]["elementwise"] + 4}
  assert "ffn split" in named.results_table(records)

def test_experiment_quality_is_each_variants_divergence_from_the_baseline(tiny: Path, tmp_path: Path):
  """An experiment with `quality:` records each variant's perplexity on the same windows, and its KL divergence from the
  baseline's distributions: none for a variant that computes the same values, some for one that rounds them otherwise."""
  defs, text = tmp_path / "defs", tmp_path / "text.txt"
  defs.mkdir()
  text.write_text("The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. " * 6)
  (defs / "q.yaml").write_text(f"""
description: rounding's cost in answers
model: tiny
bench: {{depths: 4, tokens: 3, pp: 6, warmup: 1}}
quality: {{text: {text}, ctx: 16, chunks: 3}}
baseline: {{name: exact, switches: {{rounding: exact}}}}
variants:
  - {{name: exact again, switches: {{rounding: exact, row_upcast: 0}}}}
  - {{name: ggml, switches: {{rounding: ggml}}}}
""")
  records = named.run(named.find("q", defs), lambda name: tiny, base=BenchConfig(peer=False, kept_programs=True, bandwidth=1.0))
  base, same, ggml = (r["quality"] for r in records)
  assert base["windows"] == same["windows"] == 3 and base["tokens"] == 3 * 7 and base["text"] == str(text) and "kl_mean" not in base
  assert same["kl_mean"] < 1e-6 and same["top1"] == 1 and same["perplexity"] == pytest.approx(base["perplexity"], rel=1e-4)
  assert ggml["kl_mean"] > 100 * max(same["kl_mean"], 1e-9) and ggml["base_perplexity"] == pytest.approx(base["perplexity"])
  table = named.results_table(records).splitlines()   # a header, a rule, a row per variant, then any flags
  assert "perplexity" in table[0] and f"{ggml['kl_mean']:.6f}" in table[4] and f"{base['perplexity']:.4f}" in table[2]

def test_kept_programs_are_compiled_once(tiny: Path, tmp_path: Path, monkeypatch):
  """With kept programs a bench takes every kernel an earlier bench compiled from the cache directory, and compiles
  none; its records say so (test_profile_accounts_for_every_kernel: without, every kernel compiles)."""
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path))
  compiled, compile = [], patches._originals["do_to_program"]
  monkeypatch.setitem(patches._originals, "do_to_program", lambda *a: compiled.append(a[0]) or compile(*a))
  runs = []
  for _ in range(2):
    compiled.clear()
    (record,) = bench(tiny, "tiny", KEPT)
    runs.append((len(compiled), record["metrics"]["kept_programs"]))
  assert runs[0][0] > 0 and runs[0][1] and runs[1] == (0, True), runs

def test_codegen_switches_apply_to_each_run(tiny: Path):
  """Two runs in one process differing only in how kernels are optimized: the second compiles its own kernels."""
  def row_upcast_kernels() -> int:
    return sum(any(o.op is OptOps.UPCAST and o.arg == 8 for o in opts) and any(o.op is OptOps.UNROLL and o.arg == 4 for o in opts)
               for prg in to_program_cache.values() if (opts := prg.src[0].arg.applied_opts))
  bench(tiny, "tiny", KEPT.with_switches(row_upcast=8))
  assert row_upcast_kernels() > 0
  bench(tiny, "tiny", KEPT.with_switches(row_upcast=0))
  assert row_upcast_kernels() == 0

def test_cli_profile_and_exp_errors(tiny: Path, capsys):
  """`tinyzoo profile --json` run as a command prints every kernel's row (its programs taken from the cache directory);
  a bad experiment, variant or strategy is one line of error and exit status 1 (main's, run here: tests/test_cli.py
  checks a process's)."""
  from tinyzoo.cli import main
  r = subprocess.run([sys.executable, "-m", "tinyzoo", "profile", str(tiny), "--prompt-tokens", "4", "--warmup", "1", "--repeats", "1",
                      "--kept-programs", "--json"], capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  assert out["kernels"] and {"name", "category", "block", "module", "us"} <= set(out["kernels"][0])
  for args, message in [(("exp", "show", "nope"), "no experiment named 'nope'"), (("exp", "run", "isolation", "--variant", "x", "--no-journal"),
                                                                                    "isolation has no variant 'x'"),
                        (("profile", str(tiny), "--strategy", "Q4_0=wrong"), "unknown matmul strategy 'wrong'")]:
    code, err = main(list(args)), capsys.readouterr().err
    assert code == 1 and err.startswith("tinyzoo: error:") and message in err and len(err.strip().splitlines()) == 1, err

FAKE_NCU = '''#!/usr/bin/env python3
"""Stands in for Nsight Compute: runs the profiled command (on the CPU, so outside a profiler range) and writes one
CSV row per kernel the command reports, sorted by name (kernels of one name stay in order), each timed at 1000 + its
index nanoseconds."""
import json, os, subprocess, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
cmd = args[args.index("-m") - 1:]
env = {k: v for k, v in os.environ.items() if k != "TINYZOO_NCU_RANGE"}
out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
sys.stdout.write(out)
kernels = json.loads(out[out.index("{"):])["kernels"]
with open(log, "w") as f:
  f.write('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\\n')
  for k in sorted(kernels, key=lambda k: k["name"]): f.write(f'"{k["index"]}","{k["name"]}","gpu__time_duration.sum","ns","{1000 + k["index"]:,}"\\n')
'''

def test_profile_ncu_reads_device_times(tiny: Path, tmp_path: Path):
  """--ncu runs the profile under Nsight Compute and takes each kernel's time from its CSV, whatever order the graph
  ran independent ones in (here a stand-in that runs the step on the CPU and reports the kernels sorted by name)."""
  from experiments.profile import ncu_kernel_times
  fake = tmp_path / "ncu"
  fake.write_text(FAKE_NCU)
  fake.chmod(0o755)
  title, rows, note = ncu_kernel_times([str(tiny), "--prompt-tokens", "4", "--warmup", "1", "--kept-programs"], ncu=str(fake))
  assert rows and [r.us for r in rows] == [pytest.approx(1.0 + r.index * 1e-3) for r in rows]
  assert "Nsight Compute" in note and "one decode step" in title
  with pytest.raises(RuntimeError, match="needs Nsight Compute"): ncu_kernel_times([str(tiny)], ncu=str(tmp_path / "missing"))

def test_bytes_per_token_count_only_the_experts_a_token_uses(tmp_path: Path):
  """A MoE token reads every dense matmul weight, k of the n experts and one embedding row (packed_dot reads the GGUF
  blocks as they are, so the file's tensor sizes are what it reads)."""
  path = synthesize("mixtral-8x7b-tiny", tmp_path / "moe.gguf", quant="Q8_0")
  g = GGUFFile(path)
  used, n = g.require("llama.expert_used_count"), g.require("llama.expert_count")
  sizes = {name: t.nbytes for name, t in g.tensors.items()}
  experts = sum(v for k, v in sizes.items() if "_exps" in k)
  dense = sum(v for k, v in sizes.items() if k.startswith("blk.") and k.endswith(".weight") and "_exps" not in k and "norm" not in k
              and "ffn_gate_inp" not in k)
  router = sum(v for k, v in sizes.items() if "ffn_gate_inp" in k)
  head = sizes["output.weight"] + sizes["token_embd.weight"] // g.require("llama.vocab_size")
  (record,) = bench(path, "moe", KEPT)
  assert record["metrics"]["bytes_per_token"] == dense + router + head + round(experts * used / n)

def test_a_profile_experiment_records_its_findings(tmp_path: Path):
  """An experiment with `profile:` profiles each variant's decode step on its bench's runtime: the findings count the
  kernels the bench counted, find the MoE blocks' one form, and time the weight reads of experts and dense matmuls; the
  kernel-map rule (one form) judges the run reproduced, and one comparing two metrics of the record reads both."""
  from experiments import report
  defs = tmp_path / "defs"
  defs.mkdir()
  (defs / "p.yaml").write_text("""
description: profiled
model: deepseek-v2-lite-tiny
bench: {depths: 4, tokens: 3, pp: 6, warmup: 1}
profile: {repeats: 2}
baseline: {name: graphs, switches: {}}
variants:
  - {name: alone, switches: {graphs: false}}
verdict: {metric: profile.moe_block_forms, variant: graphs, expect: same, against: 1, margin: 0}
""")
  exp = named.find("p", defs)
  records = named.run(exp, synthesized, base=BenchConfig(peer=False, kept_programs=True, bandwidth=1.0))
  for r in records:
    f = r["profile"]
    assert f["kernels"] == r["metrics"]["kernels_per_token"] and f["moe_block_forms"] == 1 and len(f["moe_block_kernels"]) == 1
    assert f["experts_gbps"] > 0 and f["dense_gbps"] > 0 and 0 < f["kernel_ms"] and f["step_ms"] > 0 and len(f["top"]) == TOP
    assert [b["blocks"] for b in f["block_forms"]] == [[0], [1, 2]]   # the dense block, then the two MoE blocks
    assert "kernels per block: blk.0: " in profile_text(f) and ", 2 blocks (blk.1, 2): " in profile_text(f)
  assert [v for *_, v in report.verdicts(exp, records)] == [report.REPRODUCED]
  cross = named.Verdict("profile.experts_gbps", "alone", named.Expect.LOWER, 0.0, "profile.experts_gbps")
  assert report.judge(cross, None, records[1]) == report.NOT_REPRODUCED   # a metric against itself moves nowhere
  assert "profile graphs (baseline) @d4: " in named.results_table(records)
