"""The pieces of the GPU measurements that run anywhere: the llama-bench peer, the journal's commit on a copied tree,
the device check's save-and-compare, the gemv-against-copy record and plotting one device's records."""
import json
import sys
from pathlib import Path
import numpy as np
import pytest
from experiments import device_check, journal, peer_llamacpp
from experiments.matvec import MAX_COPIES, copies_at_size, default_copies, gemv_bandwidth
from experiments.steady import Steady
from experiments.plot import on_device
from gguf import GGMLQuantizationType

def fake_llama_bench(tmp_path: Path, body: str) -> str:
  exe = tmp_path / "llama-bench"
  exe.write_text(f"#!{sys.executable}\nimport json, sys\n{body}\n")
  exe.chmod(0o755)
  return str(exe)

def test_llama_bench_peer_runs_tg_at_depth_and_reads_its_json(tmp_path: Path):
  out = {"build_commit": "abc123", "backends": "CUDA", "gpu_info": "NVIDIA H100 80GB HBM3", "avg_ts": 923.7, "stddev_ts": 33.7,
         "n_depth": 32, "n_gen": 128}
  exe = fake_llama_bench(tmp_path, f"open({str(tmp_path / 'argv')!r}, 'w').write(' '.join(sys.argv[1:]))\nprint(json.dumps([{out!r}]))")
  peer = peer_llamacpp.run_llama_bench(exe, "model.gguf", 32, 128)
  assert peer is not None and peer["tok_s"] == 923.7 and peer["ms_per_token"] == pytest.approx(1e3 / 923.7, abs=1e-3)
  assert "abc123" in peer["engine"] and "H100" in peer["engine"]
  assert (tmp_path / "argv").read_text() == "-m model.gguf -p 0 -n 128 -d 32 -ngl 99 -r 3 -o json"

def test_llama_bench_peer_failures_are_one_line_and_none(tmp_path: Path, capsys):
  exe = fake_llama_bench(tmp_path, "sys.exit('error: failed to load model')")
  assert peer_llamacpp.run_llama_bench(exe, "model.gguf", 32, 128) is None
  assert peer_llamacpp.run_llama_bench(str(tmp_path / "missing"), "model.gguf", 32, 128) is None
  assert "failed to load model" in capsys.readouterr().err

def test_journal_takes_the_commit_a_copied_tree_is_told(monkeypatch):
  monkeypatch.setenv("TINYZOO_COMMIT", "662cd1501f7c")
  monkeypatch.setenv("TINYZOO_DIRTY", "1")
  ctx = journal.context()
  assert ctx["commit"] == "662cd1501f7c" and ctx["dirty"] is True

def test_device_check_compares_against_a_saved_cpu_reference(tmp_path: Path, capsys):
  ref = tmp_path / "ref.json"
  device_check.save(["llama3.2-1b-tiny"], str(ref), prompts=1, prompt_len=5, greedy=4)
  assert device_check.against(str(ref), "CPU")
  data = json.loads(ref.read_text())
  logits = np.array(data["cases"][0]["logits"])
  logits[int(logits.argmax())] += 1.0   # a reference the device cannot match
  data["cases"][0]["logits"] = logits.tolist()
  ref.write_text(json.dumps(data))
  assert not device_check.against(str(ref), "CPU")
  assert "MISMATCH" in capsys.readouterr().out

def test_gemv_record_reads_every_copy_and_names_the_copy_bandwidth():
  (r,) = gemv_bandwidth("Q4_0", 64, 256, copies=3, iters=2)
  m = r["metrics"]
  assert r["kind"] == "gemv" and r["model"] == "gemv Q4_0 64x256" and m["kernels"] == 3
  assert m["bytes"] == 3 * 64 * (256 // 32) * 18
  gb_s = m["bytes"] / m["ms"] / 1e6
  assert gb_s > 0 and m["gb_s"] == pytest.approx(gb_s, abs=0.1) and m["fraction_of_copy"] == pytest.approx(gb_s / m["copy_gb_s"], abs=2e-3)
  assert m["correct"] and m["rel_err"] < 1e-5 and m["copy_at_size_gb_s"] > 0
  with pytest.raises(ValueError, match="unknown GGML type"): gemv_bandwidth("Q3_X", 64, 256)

def test_copies_at_a_weights_size_count_each_copy_read_and_written(monkeypatch):
  import experiments.matvec
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

def test_gemv_flags_an_output_that_misses_numpy(monkeypatch):
  import experiments.matvec
  real = experiments.matvec.gguf_quants.dequantize
  monkeypatch.setattr(experiments.matvec.gguf_quants, "dequantize", lambda raw, t: -real(raw, t))
  (r,) = gemv_bandwidth("Q8_0", 64, 256, copies=1, iters=1)
  assert not r["metrics"]["correct"] and r["metrics"]["rel_err"] == pytest.approx(2, rel=1e-3)

def test_plot_keeps_one_devices_records():
  records = [{"device": "CUDA: NVIDIA H100 80GB HBM3", "n": 1}, {"device": "CPU: Intel Xeon, 2 cores", "n": 2}]
  assert [r["n"] for r in on_device(records, "h100")] == [1]
  with pytest.raises(ValueError, match="no records on a device matching 'ROCm'"): on_device(records, "ROCm")

def test_a_sweep_times_spans_for_packed_words_only(capsys, monkeypatch):
  """The span (a fourth size) splits packed_words blocks: a packed_dot sweep times each (T, B, R) once."""
  from tinyzoo.cli import main
  monkeypatch.setattr("profiles.device.PROFILES", Path("/nonexistent"))   # no device profile, whatever runs the test
  assert main(["matvec", "--shape", "64x256", "--type", "Q4_0", "--strategies", "packed_dot,packed_words", "--copies", "1", "--iters", "1",
               "--gpu-sizes", "16,4,4,1 16,4,4,2", "--no-journal"]) == 0
  lines = [l.split(":")[0] for l in capsys.readouterr().out.splitlines() if "GB/s" in l and "best" not in l]
  assert lines == ["gemv Q4_0 64x256 packed_dot sizes 16,4,4", "gemv Q4_0 64x256 packed_words sizes 16,4,4,1",
                   "gemv Q4_0 64x256 packed_words sizes 16,4,4,2"], lines
