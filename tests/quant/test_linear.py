"""Matmul strategies and the expert-indexed variant against float64 numpy on the dequantized weights."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, quants
from tinygrad import GlobalCounters, Tensor, TinyJit, dtypes
from quant.formats import FORMATS
from ops.norm import NormedInput
from quant.activations import K_QUANTS, round_activations
from ops.routing import ExpertGroups
from quant.linear import STRATEGIES, QuantExperts, QuantLinear
from quant.matvec_opts import DEFAULT_ROW_UPCAST, kernel_settings
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from ops.kernels import count_kernels

OUT, IN = 48, 512

def reference_weights(raw: np.ndarray, t: T, shape: tuple[int, ...], strategy: str) -> np.ndarray:
  w = quants.dequantize(raw, t).reshape(shape).astype(np.float64)
  # dequant_cache keeps an fp16 copy: its exact answer is the one on fp16-rounded weights
  return w.astype(np.float16).astype(np.float64) if strategy == "dequant_cache" else w

def assert_fp32_close(got: np.ndarray, want: np.ndarray, bound: np.ndarray, msg: str):
  """fp32 accumulation error grows with sum |x*w|, the bound given here."""
  np.testing.assert_array_less(np.abs(got - want), 2e-5 * bound + 1e-30, err_msg=msg)

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("t", FORMATS, ids=lambda t: t.name)
def test_linear(t: T, strategy: str, rng: np.random.Generator):
  raw = random_blocks(t, (OUT, IN), rng, scale=0.1)
  w = reference_weights(raw, t, (OUT, IN), strategy)
  lin = QuantLinear(QTensor.from_bytes(raw, t, (OUT, IN)), bias=Tensor(bias := rng.standard_normal(OUT).astype(np.float32)), strategy=strategy)
  for batch in [(1,), (3,), (2, 3)]:   # matvec, small-batch matmul, batch x sequence
    x = rng.standard_normal((*batch, IN)).astype(np.float32)
    got = lin(Tensor(x)).numpy()
    assert got.shape == (*batch, OUT)
    if lin.int8: x = round_activations(Tensor(x), t, "ggml").numpy()   # x is read in 8 bits, rounded as ggml does
    assert_fp32_close(got, x @ w.T + bias, np.abs(x) @ np.abs(w).T + np.abs(bias), f"{t.name} {strategy} batch {batch}")

@pytest.mark.parametrize("prefill", ["half", "float"])
@pytest.mark.parametrize("t", [T.Q4_0, T.Q8_0, T.Q4_K, T.MXFP4, T.F16, T.F32], ids=lambda t: t.name)
def test_prefill_gemm(t: T, prefill: str, rng: np.random.Generator):
  """Rows of a prompt chunk through the GEMM: the weights dequantized once (a kernel of their own), x and the weights
  in half (F32 weights in float) summed in float32, with a per-index weight [H, out, in] as MLA's; one row stays a matvec."""
  half = prefill == "half" and t != T.F32
  rounded = (lambda a: a.astype(np.float16).astype(np.float64)) if half else (lambda a: a.astype(np.float64))
  for lead in [(), (3,)]:
    raw = random_blocks(t, (*lead, OUT, IN), rng, scale=0.1)
    w = quants.dequantize(raw, t).reshape(*lead, OUT, IN)
    lin = QuantLinear(QTensor.from_bytes(raw, t, (*lead, OUT, IN)), strategy="packed_dot", prefill=prefill)
    x = rng.standard_normal((2, 5, *lead, IN)).astype(np.float32)
    got = lin(Tensor(x)).numpy()
    want = np.einsum("...i,...oi->...o", rounded(x), rounded(w))
    bound = np.einsum("...i,...oi->...o", np.abs(x), np.abs(w))
    assert_fp32_close(got, want, bound, f"{t.name} {prefill} lead {lead}")
  one = TinyJit(lambda x: lin(x).realize())
  for _ in range(3): one(Tensor.randn(1, 1, 3, IN).realize())
  assert count_kernels(one) == 1   # one token: the packed matvec, no dequantized copy

def test_unknown_prefill_matmul(rng: np.random.Generator):
  with pytest.raises(ValueError, match="unknown prefill matmul 'tc'"):
    QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (OUT, IN), rng), T.Q4_0, (OUT, IN)), prefill="tc")

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("t", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4, T.F16], ids=lambda t: t.name)
def test_matvec_is_one_kernel(t: T, strategy: str, rng: np.random.Generator):
  """The kernel count of each strategy's matvec in JIT steady state: one kernel, the dequantize fused into the reduce;
  split makes the dequantize a kernel of its own, int8_dot the quantization of x one (its quants and scales, each
  block's largest value taken where they are written) or, rounded as Q8_K for a K-quant (the CPU kernel's), three."""
  lin = QuantLinear(QTensor.from_bytes(random_blocks(t, (OUT, IN), rng), t, (OUT, IN)), strategy=strategy)
  jit = TinyJit(lambda x: lin(x).realize())
  for _ in range(3): jit(Tensor.randn(1, IN).realize())
  quantizing = 3 if t in K_QUANTS else 1
  assert count_kernels(jit) == (2 if strategy == "split" else 1 + quantizing if lin.int8 else 1)

@pytest.mark.parametrize("strategy,prefill", [("packed_dot", "packed"), ("packed_words", "packed"), ("packed_dot", "float")])
@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_ggml_rounded_rows_are_rounded_once_for_the_matmul(t: T, strategy: str, prefill: str, rng: np.random.Generator):
  """Under ggml rounding a prompt chunk's packed matmul reads x rounded by kernels of their own, then one matmul kernel:
  the matmul computing the rounding itself would round x again for each group of its rows. A float GEMM rounds x in the
  kernel that realizes its input, beside the weights' dequantize and the GEMM (no copy of a realized rounding). Values
  against float64 on the rounded x."""
  raw = random_blocks(t, (OUT, IN), rng, scale=0.1)
  w = reference_weights(raw, t, (OUT, IN), strategy)
  lin = QuantLinear(QTensor.from_bytes(raw, t, (OUT, IN)), strategy=strategy, rounding="ggml", prefill=prefill)
  matmul, rounding = TinyJit(lambda x: lin(x).realize()), TinyJit(lambda x: round_activations(x, t, "ggml").realize())
  for _ in range(3):
    x = Tensor(rng.standard_normal((1, 16, IN)).astype(np.float32) * 4).realize()
    got, rounded = matmul(x).numpy(), rounding(x).numpy().astype(np.float64)
  assert count_kernels(matmul) == count_kernels(rounding) + (1 if prefill == "packed" else 2)
  assert_fp32_close(got, rounded @ w.T, np.abs(rounded) @ np.abs(w).T, f"{t.name} {strategy} {prefill}")

@pytest.mark.parametrize("strategy", ["packed_words", "packed_dot"])
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q8_0, T.MXFP4, T.Q4_K, T.F32], ids=lambda t: t.name)
def test_normed_matches_the_norm_then_the_matmul(t: T, strategy: str, rng: np.random.Generator):
  """normed(NormedInput(x, g, eps)) is the matmul of rms_norm(x) * g against float64 numpy, whether the squares are
  summed beside the dots (words: Q4_0, Q4_1, Q8_0, MXFP4; float weights) or the norm is read as before
  (tests/models/test_breaks.py counts the kernels the fold saves in a model)."""
  raw = random_blocks(t, (OUT, IN), rng, scale=0.1)
  w = reference_weights(raw, t, (OUT, IN), strategy)
  lin = QuantLinear(QTensor.from_bytes(raw, t, (OUT, IN)), bias=Tensor(bias := rng.standard_normal(OUT).astype(np.float32)), strategy=strategy)
  g, eps = rng.standard_normal(IN).astype(np.float32), 1e-5
  for batch in [(1,), (2, 3)]:
    x = rng.standard_normal((*batch, IN)).astype(np.float32) * 3
    normed = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * g
    got = lin.normed(NormedInput(Tensor(x), Tensor(g), eps)).numpy()
    assert_fp32_close(got, normed @ w.T + bias, np.abs(normed) @ np.abs(w).T + np.abs(bias), f"{t.name} {strategy} batch {batch}")

E, K = 6, 2
EXPERT_ROWS = 64   # as few as a model's experts have: the CPU's matvec opts take such rows (kernel_settings below)

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("t", [T.Q4_0, T.Q5_K, T.MXFP4, T.BF16], ids=lambda t: t.name)
def test_experts_match_per_expert_loop(t: T, strategy: str, rng: np.random.Generator, programs):
  """Under the kernel settings of a runtime on this CPU, as a model's experts run."""
  raw = random_blocks(t, (E, EXPERT_ROWS, IN), rng, scale=0.1)
  w = reference_weights(raw, t, (E, EXPERT_ROWS, IN), strategy)
  experts = QuantExperts(QTensor.from_bytes(raw, t, (E, EXPERT_ROWS, IN)), strategy=strategy)
  sel = np.stack([rng.choice(E, size=K, replace=False) for _ in range(3)]).astype(np.int32)   # 3 tokens, k experts each
  for x in [rng.standard_normal((3, 1, IN)), rng.standard_normal((3, K, IN))]:   # one input for all k, or one per expert
    x = x.astype(np.float32)
    with kernel_settings(DEFAULT_ROW_UPCAST, programs=programs): got = experts(Tensor(x), Tensor(sel)).numpy()
    if experts.int8: x = round_activations(Tensor(x), t, "ggml").numpy()   # x is read in 8 bits, rounded as ggml does
    want = np.stack([np.stack([w[e] @ x[i, min(j, x.shape[1] - 1)] for j, e in enumerate(row)]) for i, row in enumerate(sel)])
    bound = np.stack([np.stack([np.abs(w[e]) @ np.abs(x[i, min(j, x.shape[1] - 1)]) for j, e in enumerate(row)]) for i, row in enumerate(sel)])
    assert got.shape == (3, K, EXPERT_ROWS)
    assert_fp32_close(got, want, bound, f"{t.name} {strategy} x {x.shape}")

@pytest.mark.parametrize("strategy", ["packed_words", "packed_dot"])
@pytest.mark.parametrize("t", [T.MXFP4, T.Q8_0, T.F32, T.Q5_K], ids=lambda t: t.name)
def test_experts_normed_match_the_norm_then_the_experts(t: T, strategy: str, rng: np.random.Generator):
  """experts.normed(NormedInput(x, g, eps), sel) for one token: each selected expert's matmul of rms_norm(x) * g plus
  its bias, the norm folded in (words, float weights) or read as before (Q5_K), against float64 numpy."""
  raw = random_blocks(t, (E, OUT, IN), rng, scale=0.1)
  w = reference_weights(raw, t, (E, OUT, IN), strategy)
  bias = rng.standard_normal((E, OUT)).astype(np.float32)
  experts = QuantExperts(QTensor.from_bytes(raw, t, (E, OUT, IN)), bias=Tensor(bias), strategy=strategy)
  sel, g, eps = rng.choice(E, size=(1, K), replace=False).astype(np.int32), rng.standard_normal(IN).astype(np.float32), 1e-5
  x = rng.standard_normal((1, 1, IN)).astype(np.float32) * 3
  normed = (x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * g)[0, 0]
  got = experts.normed(NormedInput(Tensor(x), Tensor(g), eps), Tensor(sel)).numpy()
  assert got.shape == (1, K, OUT)
  assert_fp32_close(got[0], np.stack([w[e] @ normed + bias[e] for e in sel[0]]),
                    np.stack([np.abs(w[e]) @ np.abs(normed) + np.abs(bias[e]) for e in sel[0]]), f"{t.name} {strategy}")

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q8_0, T.MXFP4, T.Q5_K], ids=lambda t: t.name)
def test_experts_mixed(t: T, strategy: str, rng: np.random.Generator):
  """The selected experts' outputs summed with routing weights, as one expression (one reduce over experts and blocks)."""
  raw = random_blocks(t, (E, OUT, IN), rng, scale=0.1)
  w = reference_weights(raw, t, (E, OUT, IN), strategy)
  bias = rng.standard_normal((E, OUT)).astype(np.float32)
  experts = QuantExperts(QTensor.from_bytes(raw, t, (E, OUT, IN)), bias=Tensor(bias), strategy=strategy)
  sel = np.stack([rng.choice(E, size=K, replace=False) for _ in range(3)]).astype(np.int32)
  mix = rng.random((3, K)).astype(np.float32)
  x = rng.standard_normal((3, K, IN)).astype(np.float32)
  got = experts.mixed(Tensor(x), Tensor(sel), Tensor(mix)).numpy()
  if experts.int8: x = round_activations(Tensor(x), t, "ggml").numpy()
  want = np.stack([sum(m * (w[e] @ x[i, j] + bias[e]) for j, (e, m) in enumerate(zip(sel[i], mix[i]))) for i in range(3)])
  bound = np.stack([sum(m * (np.abs(w[e]) @ np.abs(x[i, j]) + np.abs(bias[e])) for j, (e, m) in enumerate(zip(sel[i], mix[i]))) for i in range(3)])
  assert got.shape == (3, OUT)
  assert_fp32_close(got, want, bound, f"{t.name} {strategy}")

@pytest.mark.parametrize("prefill", ["half", "float"])
@pytest.mark.parametrize("t", [T.Q4_0, T.MXFP4, T.Q8_0], ids=lambda t: t.name)
def test_prefill_experts_grouped_by_expert(t: T, prefill: str, rng: np.random.Generator):
  """A prompt chunk's MoE: the rows sorted by the experts they chose (ExpertGroups), each tile of them through its
  expert's GEMM, then each row's outputs summed with its routing weights, against float64 on the inputs the GEMMs read
  (half-rounded under half)."""
  rounded = (lambda a: a.astype(np.float16).astype(np.float64)) if prefill == "half" else (lambda a: a.astype(np.float64))
  k, tile = 3, 4
  raw = random_blocks(t, (E, OUT, IN), rng, scale=0.1)
  w = quants.dequantize(raw, t).reshape(E, OUT, IN)
  bias = rng.standard_normal((E, OUT)).astype(np.float32)
  experts = QuantExperts(QTensor.from_bytes(raw, t, (E, OUT, IN)), bias=Tensor(bias), strategy="packed_words", prefill=prefill)
  x = rng.standard_normal((2, 5, IN)).astype(np.float32)
  assert experts.gemm_rows(Tensor(x)) and not experts.gemm_rows(Tensor(x[:1, :1]))
  sel = np.stack([rng.choice(E, k, replace=False) for _ in range(10)]).reshape(2, 5, k).astype(np.int32)
  mix = rng.random((2, 5, k)).astype(np.float32)
  groups = ExpertGroups.of(Tensor(sel), E, tile)
  got = groups.combine(experts.grouped(groups.rows(Tensor(x)), groups), Tensor(mix)).numpy()
  chosen = np.einsum("tsi,tskoi->tsko", rounded(x), rounded(w)[sel]) + bias[sel]
  bound = np.einsum("tsk,tsi,tskoi->tso", mix, np.abs(x), np.abs(w)[sel]) + np.einsum("tsk,tsko->tso", mix, np.abs(bias)[sel])
  assert got.shape == (2, 5, OUT)
  assert_fp32_close(got, np.einsum("tsk,tsko->tso", mix, chosen), bound, f"{t.name} {prefill} grouped")

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_experts_read_only_selected(strategy: str, rng: np.random.Generator):
  """Every strategy reads only the k selected experts (packed, or from the fp16 cache), in a single kernel; split writes
  and reads back only theirs in fp32, in a second; int8_dot quantizes x first, in one."""
  experts = QuantExperts(QTensor.from_bytes(random_blocks(T.Q4_0, (16, OUT, IN), rng), T.Q4_0, (16, OUT, IN)), strategy=strategy)
  jit = TinyJit(lambda x, sel: experts(x, sel).realize())
  x, sel = Tensor.randn(1, 1, IN).realize(), Tensor([[3, 11]], dtype=dtypes.int32).realize()
  for _ in range(3): jit(x, sel)
  GlobalCounters.reset()
  jit(x, sel)
  one_expert = OUT * IN * 2 if strategy == "dequant_cache" else OUT * IN // 32 * 18
  dequantized = 2 * 2 * OUT * IN * 4 if strategy == "split" else 0   # two experts' fp32 weights, written and read back
  assert GlobalCounters.global_mem < 2.5 * one_expert + dequantized, f"moved {GlobalCounters.global_mem} bytes, one expert is {one_expert}"
  assert count_kernels(jit) == (2 if strategy == "split" or experts.int8 else 1)

def test_unknown_strategy(rng: np.random.Generator):
  with pytest.raises(ValueError, match="unknown matmul strategy 'nope'"):
    QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (OUT, IN), rng), T.Q4_0, (OUT, IN)), strategy="nope")
  with pytest.raises(ValueError, match="unknown activation rounding 'fp8'"):
    QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (OUT, IN), rng), T.Q4_0, (OUT, IN)), rounding="fp8")
