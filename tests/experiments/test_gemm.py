"""`tinyzoo gemm`: each dense weight shape of a model once, each GEMM kernel this device runs timed and checked against
float64 (a kernel that drops its work is marked wrong), one journal record each that is no decode bench; a kernel this
device cannot run is left out with the reason, or refused in one line where asked for."""
from pathlib import Path
from tinygrad import Device
from experiments import gemm, journal
from models.catalog import synthesized
from profiles.device import resolve_hints
from quant.gguf_file import GGUFFile
from quant.linear import QuantLinear
from tinyzoo.cli import main

def test_each_dense_matmul_shape_once_joined_as_the_model_joins_them_the_tied_output_among_them():
  g = GGUFFile(synthesized("llama3.2-1b-tiny"))
  shapes = gemm.gemm_shapes(g)
  assert len({(s.ggml_type, s.n, s.k) for s in shapes}) == len(shapes) and shapes[0].tensors == ("token_embd.weight",)   # tied: the largest
  rows = lambda *names: sum(g.tensors[f"blk.0.{n}.weight"].shape[0] for n in names)
  joined = {s.tensors: s.n for s in shapes if len(s.tensors) > 1}
  assert joined == {("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"): rows("attn_q", "attn_k", "attn_v"),
                    ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"): rows("ffn_gate", "ffn_up")}
  # without the fuse hint each weight is a matmul of its own
  assert {(s.n, s.k) for s in gemm.gemm_shapes(g, fuse=False)} == {t.shape for t in g.tensors.values() if len(t.shape) == 2}

def test_expert_weights_in_the_grouped_form_a_chunk_takes():
  """A MoE's expert weights come after the dense ones, each type and shape once, timed as a chunk's grouped GEMM over a
  random routing and checked against float64 slot by slot (the padding's zeros included)."""
  path = synthesized("deepseek-v2-lite-tiny")
  shapes = gemm.gemm_shapes(GGUFFile(path))
  experts = [s for s in shapes if s.experts]
  assert experts and shapes[-len(experts):] == experts and all(s.experts == 8 for s in experts)
  assert {s.tensors for s in experts} == {("blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight"), ("blk.1.ffn_down_exps.weight",)}
  records = list(gemm.bench_gemms(path, "t", 24, ["tinygrad"], 2, seed=3))
  grouped = [r for r in records if r["metrics"]["experts"]]
  assert len(grouped) == len(experts) and all(r["metrics"]["correct"] and r["metrics"]["rel_err"] < 1e-3 for r in grouped)
  assert all(" x8e " in gemm.table_row(r) for r in grouped)

def test_records_of_each_shape_checked_against_float64(tmp_path: Path, capsys):
  path = tmp_path / "journal.jsonl"
  assert main(["gemm", "llama3.2-1b-tiny", "--rows", "40", "--iters", "2", "--journal", str(path)]) == 0
  out = capsys.readouterr().out
  records = journal.read(path)
  model = synthesized("llama3.2-1b-tiny")
  assert len(records) == len(gemm.gemm_shapes(GGUFFile(model), resolve_hints(model, {}).fuse))   # one kernel here: tinygrad's
  assert all(r["kind"] == "gemm" and not journal.is_bench(r) and r["metrics"]["correct"] and r["metrics"]["rel_err"] < 1e-3
             and r["metrics"]["tflops"] > 0 and r["metrics"]["rows"] == 40 for r in records)
  assert "left out: mma: gemm mma runs on CUDA GPUs" in out and "mma_int8: gemm mma_int8 runs on CUDA GPUs" in out
  assert gemm.HEAD in out and "WRONG" not in out

def test_a_kernel_that_drops_its_work_is_wrong(monkeypatch):
  monkeypatch.setattr(QuantLinear, "gemm_of", lambda self, x: (x[..., :1] * 0).expand(*x.shape[:-1], self.weight.shape[0]).contiguous())
  (record, *_) = gemm.bench_gemms(synthesized("llama3.2-1b-tiny"), "t", 8, ["tinygrad"], 2, seed=1)
  assert record["metrics"]["rel_err"] == 1.0 and not record["metrics"]["correct"] and gemm.table_row(record).endswith("WRONG")

def test_bad_requests_get_one_line(capsys):
  off_cuda = [(["--kernels", k], f"gemm {k} runs on CUDA GPUs (tinygrad's CUDA backend), not CPU") for k in ("mma", "mma_int8")] \
    if Device.DEFAULT != "CUDA" else []
  for argv, message in [*off_cuda, (["--kernels", "cublas"], "unknown GEMM kernel 'cublas' (choose from tinygrad, mma, mma_int8)"),
                        (["--rows", "0"], "--rows and --iters must be at least 1, got 0 and 20")]:
    assert main(["gemm", "llama3.2-1b-tiny", "--no-journal", *argv]) == 1
    assert capsys.readouterr().err.strip() == f"tinyzoo: error: {message}"
