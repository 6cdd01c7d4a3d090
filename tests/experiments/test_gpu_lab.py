"""The pieces of the GPU measurements that run anywhere: the llama-bench peer, the journal's commit on a copied tree,
the device check's save-and-compare, the gemv-against-copy record and plotting one device's records."""
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
import numpy as np
import pytest
import experiments.matvec
from experiments import device_check, journal, peer_llamacpp
from experiments.bench import copy_bandwidth
from experiments.matvec import MAX_COPIES, copies_at_size, default_copies, gemv_bandwidth
from models.jit_cache import JitStore
from quant.matvec_opts import kernel_settings
from experiments.steady import Steady
from experiments.plot import on_device
from gguf import GGMLQuantizationType

def fake_llama_bench(tmp_path: Path, body: str) -> str:
  exe = tmp_path / "llama-bench"
  exe.write_text(f"#!{sys.executable}\nimport json, sys\n{body}\n")
  exe.chmod(0o755)
  return str(exe)

# llama-bench's tests for its arguments as it runs them: for each depth, a pp test of -p tokens, then a tg test of -n
FAKE_TESTS = """
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
tests = [{"build_commit": "abc123", "backends": "CUDA", "gpu_info": "NVIDIA H100 80GB HBM3", "n_prompt": p, "n_gen": n, "n_depth": d,
          "avg_ts": (40000.0 if p else 900.0) + d, "stddev_ts": 33.7}
         for d in map(int, a["-d"].split(",")) for p, n in ((int(a["-p"]), 0), (0, int(a["-n"]))) if p or n]
print(json.dumps(tests))
"""

def test_llama_bench_peer_runs_pp_and_tg_at_depth_and_reads_its_json(tmp_path: Path):
  exe = fake_llama_bench(tmp_path, f"open({str(tmp_path / 'argv')!r}, 'w').write(' '.join(sys.argv[1:]))" + FAKE_TESTS)
  (peer,) = peer_llamacpp.run_llama_bench(exe, "model.gguf", (32,), 128, 512)
  assert peer is not None and peer["tok_s"] == 932.0 and peer["ms_per_token"] == pytest.approx(1e3 / 932.0, abs=1e-3)
  assert peer["pp_tok_s"] == 40000.0 and peer["pp_tokens"] == 512 and peer["depth"] == 32
  assert "abc123" in peer["engine"] and "H100" in peer["engine"]
  assert peer["tok_s_sd"] == peer["pp_tok_s_sd"] == 33.7 and peer["repeats"] == 3
  assert (tmp_path / "argv").read_text() == "-m model.gguf -p 512 -n 128 -d 0,32 -ngl 99 -r 3 -o json"
  assert peer_llamacpp.run_llama_bench(exe, "model.gguf", (32,), 128, 512, 5)[0]["repeats"] == 5
  assert (tmp_path / "argv").read_text().endswith("-r 5 -o json")
  assert peer_llamacpp.run_llama_bench(exe, "model.gguf", (0,), 16, 64)[0]["tok_s"] == 900.0
  # several depths in one run, in the order asked, each with the pp from an empty context
  peers = peer_llamacpp.run_llama_bench(exe, "model.gguf", (16384, 0, 4096), 128, 512)
  assert [p["depth"] for p in peers] == [16384, 0, 4096] and [p["tok_s"] for p in peers] == [17284.0, 900.0, 4996.0]
  assert {p["pp_tok_s"] for p in peers} == {40000.0}
  assert (tmp_path / "argv").read_text() == "-m model.gguf -p 512 -n 128 -d 0,4096,16384 -ngl 99 -r 3 -o json"

def test_llama_bench_peer_failures_are_one_line_and_none(tmp_path: Path, capsys):
  exe = fake_llama_bench(tmp_path, "sys.exit('error: failed to load model')")
  assert peer_llamacpp.run_llama_bench(exe, "model.gguf", (32,), 128, 512) == [None]
  assert peer_llamacpp.run_llama_bench(str(tmp_path / "missing"), "model.gguf", (32, 64), 128, 512) == [None, None]
  assert "failed to load model" in capsys.readouterr().err
  no_pp = fake_llama_bench(tmp_path, "print(json.dumps([]))")
  assert peer_llamacpp.run_llama_bench(no_pp, "model.gguf", (32,), 128, 512) == [None]
  assert "printed no pp512 at depth 0 or no tg128 at a depth of 32" in capsys.readouterr().err

def test_journal_takes_the_commit_a_copied_tree_is_told(monkeypatch):
  monkeypatch.setenv("TINYZOO_COMMIT", "662cd1501f7c")
  monkeypatch.setenv("TINYZOO_DIRTY", "1")
  ctx = journal.context()
  assert ctx["commit"] == "662cd1501f7c" and ctx["dirty"] is True

def test_device_check_compares_against_a_saved_cpu_reference(tmp_path: Path, capsys):
  ref = tmp_path / "ref.json"
  device_check.save(["llama3.2-1b-tiny"], str(ref), prompts=1, prompt_len=5, greedy=4)
  assert device_check.against(str(ref), "CPU") == (True, 0)   # and no programmatic edge: no graphs on the CPU
  data = json.loads(ref.read_text())
  logits = np.array(data["cases"][0]["logits"])
  logits[int(logits.argmax())] += 1.0   # a reference the device cannot match
  data["cases"][0]["logits"] = logits.tolist()
  ref.write_text(json.dumps(data))
  assert device_check.against(str(ref), "CPU")[0] is False
  assert "MISMATCH" in capsys.readouterr().out

def test_device_checks_decode_fed_the_references_tokens(tmp_path: Path):
  """Decode steps fed the reference's tokens keep to its next tokens; tokens the model puts last after each step do not
  (as a decode reading the wrong cache positions would not, where the prompt's rounding lets its own tokens part)."""
  ref = tmp_path / "ref.json"
  device_check.save(["llama3.2-1b-tiny"], str(ref), prompts=1, prompt_len=5, greedy=4)
  case = json.loads(ref.read_text())["cases"][0]
  rt, _ = device_check.runtime("llama3.2-1b-tiny", 10, "CPU", {})
  ids, tokens = case["ids"], case["greedy"]
  assert device_check.forced(rt, ids, tokens, device_check.LOGITS_RTOL) == 0
  rt.prefill(ids)
  last = [tokens[0]]
  for i in range(3): last.append(int(rt.decode(last[-1], len(ids) + i).numpy()[0].argmin()))
  assert device_check.forced(rt, ids, last, device_check.HALF_PREFILL_RTOL) == 3

@pytest.fixture(scope="module")
def copy_gb_s() -> float:
  """The device's copy bandwidth, measured once for the module's gemv records."""
  return copy_bandwidth()

@pytest.fixture
def kept_gemv(monkeypatch, programs: JitStore, copy_gb_s: float) -> None:
  """gemv_bandwidth's kernels compiled under its settings as ever, their programs kept in the suite's store (and taken from
  there where a run compiled them before), its large copy's bandwidth the module's measurement."""
  monkeypatch.setattr(experiments.matvec, "kernel_settings", functools.partial(kernel_settings, programs=programs))
  monkeypatch.setattr(experiments.matvec, "copy_bandwidth", lambda: copy_gb_s)

def test_gemv_record_reads_every_copy_and_names_the_copy_bandwidth(kept_gemv: None):
  (r,) = gemv_bandwidth("Q4_0", 64, 256, copies=3, iters=2)
  m = r["metrics"]
  assert r["kind"] == "gemv" and r["model"] == "gemv Q4_0 64x256" and m["kernels"] == 3
  assert m["bytes"] == 3 * 64 * (256 // 32) * 18
  gb_s = m["bytes"] / m["ms"] / 1e6
  assert gb_s > 0 and m["gb_s"] == pytest.approx(gb_s, abs=0.1) and m["fraction_of_copy"] == pytest.approx(gb_s / m["copy_gb_s"], abs=2e-3)
  assert m["correct"] and m["rel_err"] < 1e-5 and m["copy_at_size_gb_s"] > 0
  with pytest.raises(ValueError, match="unknown GGML type"): gemv_bandwidth("Q3_X", 64, 256)

@pytest.mark.parametrize("strategy", ["packed_words", "int8_dot"])
@pytest.mark.parametrize("mixed,act", [(False, False), (False, True), (True, False)], ids=["gate-up", "gate-up-swiglu", "down-mixed"])
def test_expert_gemv_reads_the_chosen_experts_and_checks_them_against_numpy(mixed: bool, act: bool, strategy: str, kept_gemv: None):
  """An expert gemv reads K of each weight's N experts as a MoE does (QuantExperts, one kernel per weight, the SwiGLU of
  joined gate and up rows in it; under int8_dot x quantized once a replay, one kernel) and counts only their bytes;
  its output, every chosen expert's rows (or their activations, or their weighted sum) against float64 numpy on x as
  the kernels read it, is right."""
  (r,) = gemv_bandwidth("Q8_0", 64, 256, strategy, copies=3, iters=2, experts=(8, 3), mixed=mixed, act=act)
  m = r["metrics"]
  assert r["model"] == "gemv Q8_0 64x256 experts 3 of 8" + " mixed" * mixed + " swiglu" * act
  assert m["kernels"] == 3 + (strategy == "int8_dot")
  assert m["bytes"] == 3 * 3 * 64 * (256 // 32) * 34 and m["correct"] and m["rel_err"] < 1e-5
  with pytest.raises(ValueError, match="1 <= K <= N"): gemv_bandwidth("Q8_0", 64, 256, experts=(2, 3))
  with pytest.raises(ValueError, match="give experts N,K"): gemv_bandwidth("Q8_0", 64, 256, mixed=True)
  with pytest.raises(ValueError, match="not mixed experts"): gemv_bandwidth("Q8_0", 64, 256, experts=(8, 2), mixed=True, act=True)

def test_int8_dot_gemv_quantizes_x_once_for_every_weight_and_checks_against_x_rounded(kept_gemv: None):
  """Under int8_dot x is quantized once a replay (one kernel) for all the weights, and the output is checked against
  the matmul of x rounded as ggml rounds it (against exact x its error would be ~1e-2 and flagged)."""
  (r,) = gemv_bandwidth("Q4_0", 64, 256, "int8_dot", copies=3, iters=2)
  m = r["metrics"]
  assert m["kernels"] == 3 + 1 and m["correct"] and m["rel_err"] < 1e-5 and r["switches"] == {"strategy": "int8_dot"}

def test_copies_at_a_weights_size_count_each_copy_read_and_written(monkeypatch):
  replays = []
  def fake_steady(step, *inputs, iters):
    replays.append(step(*inputs).realize().numpy())
    return Steady(kernels=3, times_ms=[1.0], pipelined_ms=0.002)
  monkeypatch.setattr(experiments.matvec, "steady_state", fake_steady)
  gb_s, us = copies_at_size(5 * 16384 + 100, 3, iters=2)
  assert gb_s == pytest.approx(2 * 5 * 16384 * 3 / 0.002 / 1e6) and us == pytest.approx(0.002 * 1e3 / 3)   # whole 16 KiB
  assert replays[0].shape == (5 * 4096,) and (replays[0] == 1).all()   # a real copy of the bytes (zeros plus one)
  copies_at_size(6 * 16384, 1, iters=2)   # 5 chunks, not 6: tinygrad would copy 3 words a thread, one load each
  assert replays[1].shape == (5 * 4096,)

def test_gemv_reads_a_gigabyte_by_default_so_that_a_replay_outlasts_the_host():
  # 29 Q4_0 8192x2048 weights (256 MiB) let the host's issue time bound some runs on an H100
  assert default_copies(GGMLQuantizationType.Q4_0, 8192, 2048) * 8192 * 2048 // 32 * 18 >= 1 << 30
  assert default_copies(GGMLQuantizationType.Q4_0, 64, 256) == MAX_COPIES
  assert default_copies(GGMLQuantizationType.F32, 1 << 16, 1 << 14) == 2
  # Mixtral's gate and up experts (8 of 28672x4096, 2 read): 2 GiB of experts made, a replay reads a quarter of them
  assert default_copies(GGMLQuantizationType.Q4_0, 28672, 4096, (8, 2)) == 4

def test_gemv_flags_an_output_that_misses_numpy(monkeypatch, kept_gemv: None):
  real = experiments.matvec.gguf_quants.dequantize
  monkeypatch.setattr(experiments.matvec.gguf_quants, "dequantize", lambda raw, t: -real(raw, t))
  (r,) = gemv_bandwidth("Q8_0", 64, 256, copies=1, iters=1)
  assert not r["metrics"]["correct"] and r["metrics"]["rel_err"] == pytest.approx(2, rel=1e-3)

def test_plot_keeps_one_devices_records():
  records = [{"device": "CUDA: NVIDIA H100 80GB HBM3", "n": 1}, {"device": "CPU: Intel Xeon, 2 cores", "n": 2}]
  assert [r["n"] for r in on_device(records, "h100")] == [1]
  with pytest.raises(ValueError, match="no records on a device matching 'ROCm'"): on_device(records, "ROCm")

def test_a_sweep_times_spans_for_packed_words_only(capsys, monkeypatch, copy_gb_s: float):
  """The span (a fourth size) splits packed_words blocks: a packed_dot sweep times each (T, B, R) once."""
  from tinyzoo.cli import main
  monkeypatch.setattr("profiles.device.PROFILES", Path("/nonexistent"))   # no device profile, whatever runs the test
  monkeypatch.setattr(experiments.matvec, "copy_bandwidth", lambda: copy_gb_s)
  assert main(["matvec", "--shape", "64x256", "--type", "Q4_0", "--strategies", "packed_dot,packed_words", "--copies", "1", "--iters", "1",
               "--gpu-sizes", "16,4,4,1 16,4,4,2", "--no-journal"]) == 0
  lines = [l.split(":")[0] for l in capsys.readouterr().out.splitlines() if "GB/s" in l and "best" not in l]
  assert lines == ["gemv Q4_0 64x256 packed_dot sizes 16,4,4", "gemv Q4_0 64x256 packed_words sizes 16,4,4,1",
                   "gemv Q4_0 64x256 packed_words sizes 16,4,4,2"], lines

FAKE_NCU_LLAMA = '''
args = sys.argv[1:]
open(args[args.index("--log-file") + 1], "w").write("""==PROF== Connected to process
"ID","Kernel Name","Grid Size","Block Size","Metric Name","Metric Unit","Metric Value"
"0","void mul_mat_vec_q<(ggml_type)2, 1, true>(const void *, float *)","(2048, 1, 1)","(32, 4, 1)","gpu__time_duration.sum","usecond","8.50"
"1","void mul_mat_vec_q<(ggml_type)2, 1, true>(const void *, float *)","(2048, 1, 1)","(32, 4, 1)","gpu__time_duration.sum","nsecond","4,900"
"2","void mul_mat_vec_q<(ggml_type)2, 1, true>(const void *, float *)","(2048, 1, 1)","(32, 4, 1)","gpu__time_duration.sum","usecond","8.60"
"3","rms_norm_f32(const float *, float *)","(1, 1, 1)","(1024, 1, 1)","gpu__time_duration.sum","usecond","4.40"
""")
'''

def test_ncu_of_llama_bench_groups_kernels_by_launch_size_and_mode(tmp_path: Path):
  """llama-bench runs under Nsight Compute like tinyzoo's profile; one kernel and launch size serving weights of two
  sizes (Llama's attention output and FFN down) is split into its two modes."""
  ncu = fake_llama_bench(tmp_path, FAKE_NCU_LLAMA)
  rows = peer_llamacpp.ncu_llama_bench("llama-bench", "model.gguf", 32, 16, ncu=ncu)
  assert [(r["kernel"], r["launches"], r["median_us"]) for r in rows] == [
    ("mul_mat_vec_q<(ggml_type)2, 1, true>", 2, 8.55), ("mul_mat_vec_q<(ggml_type)2, 1, true>", 1, 4.9), ("rms_norm_f32", 1, 4.4)]
  assert rows[0]["grid"] == "(2048, 1, 1)" and rows[0]["total_us"] == 17.1
  with pytest.raises(RuntimeError, match="needs Nsight Compute"):
    peer_llamacpp.ncu_llama_bench("llama-bench", "model.gguf", 32, 16, ncu=str(tmp_path / "missing"))
  with pytest.raises(RuntimeError, match="ncu failed: no llama"):
    peer_llamacpp.ncu_llama_bench("llama-bench", "model.gguf", 32, 16, ncu=fake_llama_bench(tmp_path, "sys.exit('no llama')"))

def test_kernel_names_keep_template_arguments_and_drop_parameters():
  assert peer_llamacpp.kernel_name("void k_bin_bcast<&op_add, float>(const float *, int)") == "k_bin_bcast<&op_add, float>"
  assert peer_llamacpp.kernel_name("void mul_mat_vec_q<(ggml_type)8, 1>(const void *)") == "mul_mat_vec_q<(ggml_type)8, 1>"
  assert peer_llamacpp.kernel_name("quantize_q8_1") == "quantize_q8_1"
  assert peer_llamacpp.modes([5.0, 8.5, 4.9, 8.6]) == [[4.9, 5.0], [8.5, 8.6]] and peer_llamacpp.modes([3.0]) == [[3.0]]

def fake_read_floor(monkeypatch, lines: list[dict], nvcc: bool = True) -> list[list[str]]:
  """read_floor's nvcc and binary replaced: the binary prints `lines`; returns the commands run."""
  from experiments import read_floor
  calls = []
  def run(cmd, **kw):
    calls.append(cmd)
    if cmd[0] == "nvcc" and not nvcc: raise FileNotFoundError(cmd[0])
    return subprocess.CompletedProcess(cmd, 0, "" if cmd[0] == "nvcc" else "".join(json.dumps(l) + "\n" for l in lines), "")
  monkeypatch.setattr(read_floor.subprocess, "run", run)
  return calls

def test_read_floor_records_the_fastest_read_and_each_matvec_designs_fastest(monkeypatch):
  from experiments.read_floor import read_floor
  reads = [{"kind": "read", "blocks": b, "threads": 128, "unroll": 2, "us": us, "gb_s": 9437184 / us / 1e3}
           for b, us in ((4224, 4.5), (132, 9.0))]
  matvecs = [{"kind": "matvec", "rows_per_warp": r, "words_per_thread": 1, "threads": 256, "rel_err": 1e-6, "us": us}
             for r, us in ((2, 7.5), (4, 8.0))]
  without_x = {"kind": "matvec_without_x", "rows_per_warp": 2, "words_per_thread": 2, "threads": 64, "rel_err": 0.9, "us": 6.2}
  chained = [{"kind": "read_overlapped", "blocks": 2112, "threads": 256, "unroll": 1, "us": 3.9, "gb_s": 9437184 / 3.9 / 1e3},
             {"kind": "matvec_prefetched", "rows_per_warp": 4, "words_per_thread": 2, "threads": 128, "rel_err": 1e-6, "us": 5.6}]
  copy = {"kind": "copy", "bytes": 1 << 30, "gb_s": 2800.0}
  calls = fake_read_floor(monkeypatch, reads + matvecs + [without_x, *chained, copy])
  record, runs = read_floor("Q4_0", 8192, 2048)
  m = record["metrics"]
  assert record["kind"] == "read_floor" and record["switches"]["launch"] == "4224x128 unroll 2" and len(runs) == 8
  assert m["bytes"] == 8192 * 64 * 18 and m["us"] == 4.5 and m["fraction_of_copy"] == round(9437184 / 4.5 / 1e3 / 2800, 3)
  assert m["matvec_us"] == 7.5 and m["matvec_without_x_us"] == 6.2 and "matvec_dp4a_us" not in m   # without x is no matvec: unchecked
  assert record["switches"]["matvec"] == "rows_per_warp 2, words_per_thread 1, threads 256"
  # each chaining's fastest read and matvec beside the plain chain's; none timed a chained read by prefetch here
  assert m["read_overlapped_us"] == 3.9 and m["read_overlapped_fraction_of_copy"] == round(9437184 / 3.9 / 1e3 / 2800, 3)
  assert record["switches"]["launch_overlapped"] == "2112x256 unroll 1" and "read_prefetched_us" not in m
  assert m["matvec_prefetched_us"] == 5.6 and "matvec_overlapped_us" not in m
  assert calls[1][-2:] == ["8192", "2048"]

def test_read_floor_refuses_a_wrong_matvec_and_a_missing_nvcc(monkeypatch):
  from experiments.read_floor import read_floor
  lines = [{"kind": "read", "blocks": 132, "threads": 128, "unroll": 1, "us": 5.0, "gb_s": 1000.0},
           {"kind": "matvec_dp4a", "rows_per_warp": 1, "threads": 128, "rel_err": 1.0, "us": 6.4}, {"kind": "copy", "bytes": 1, "gb_s": 2800.0}]
  fake_read_floor(monkeypatch, lines)
  with pytest.raises(RuntimeError, match="matvec is wrong"): read_floor("Q4_0", 8192, 2048)
  fake_read_floor(monkeypatch, [lines[0], {**lines[1], "kind": "matvec_dp4a_overlapped"}, lines[2]])   # chained ones are checked too
  with pytest.raises(RuntimeError, match="matvec is wrong"): read_floor("Q4_0", 8192, 2048)
  calls = fake_read_floor(monkeypatch, lines[:1] + lines[2:])
  assert read_floor("Q8_0", 4096, 2048)[0]["metrics"]["bytes"] == 4096 * 64 * 34 and len(calls[1]) == 4   # no matvec for Q8_0
  fake_read_floor(monkeypatch, lines, nvcc=False)
  with pytest.raises(RuntimeError, match="needs CUDA's nvcc"): read_floor("Q4_0", 8192, 2048)
  with pytest.raises(ValueError, match="unknown GGML type"): read_floor("Q9_9", 8192, 2048)

NVCC_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CPATH", "CPLUS_INCLUDE_PATH")   # what else changes nvcc's input

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="CUDA's nvcc is not installed")
def test_read_floor_source_compiles_for_hopper(tmp_path: Path):
  """nvcc compiles experiments/read_floor.cu for sm_90, device and host code. A compile that succeeded is remembered in
  the cache directory (as ccache would) under the sha256 of the source, the command, the environment nvcc reads and the
  versions of nvcc and its host compiler: an unchanged source on an unchanged toolchain is not built again."""
  from experiments.read_floor import SOURCE
  from ops.cache import cache_dir, write_whole
  flags = ["nvcc", "-O3", "-arch=sm_90", "-c"]
  tools = [(shutil.which(t), subprocess.run([t, "--version"], capture_output=True, text=True).stdout) for t in ("nvcc", "gcc", "g++")]
  key = hashlib.sha256(repr((SOURCE.read_bytes(), flags, tools, [os.environ.get(v) for v in NVCC_ENV])).encode()).hexdigest()
  compiled = cache_dir() / "nvcc" / f"read_floor-{key}.ok"
  if compiled.exists(): return
  built = subprocess.run([*flags, "-o", str(tmp_path / "read_floor.o"), str(SOURCE)], capture_output=True, text=True)
  assert built.returncode == 0, built.stderr
  write_whole(compiled, " ".join(built.args) + "\n")
