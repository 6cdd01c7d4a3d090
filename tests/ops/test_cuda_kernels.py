"""Hand-written CUDA kernels (ops/cuda): on the CPU their host side (launch sizes, what the scheduler is told they read
and write, the shapes they take and refuse, the `gemm` hint refused off a CUDA GPU) and, where nvcc is installed, their
sources compile for sm_90; on a CUDA GPU each one against float64 numpy at sizes that are no multiples of its tile."""
import itertools
import re
import shutil
import subprocess
from pathlib import Path
import numpy as np
import pytest
from tinygrad import Device, Tensor, dtypes
from tinygrad.uop.ops import AddrSpace, Ops, ProgramInfo, UOp
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants
import ops.cuda as ops_cuda
from ops.attention import attention, cache_positions
from ops.cuda import GEMM_BLOCK_TYPES, GEMM_INT8_TYPES, GEMM_WORD_TYPES, KernelRefused, flash_decode, flash_latent, \
  flash_decode_parts, flash_prefill, flash_refusal, gemm_int8_words, gemm_mma, gemm_mma_applies, gemm_mma_blocks, gemm_mma_blocks_applies, \
  gemm_mma_source, gemm_mma_words, gemm_mma_words_applies, gemm_tile_rows, hint_refusal, latent_refusal, multiprocessors, source
from ops.routing import ExpertGroups
from quant.activations import q8_0_blocks
from quant.linear import QuantExperts, QuantLinear, gemm
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from quant.words import WordBlocks

on_gpu = pytest.mark.skipif(Device.DEFAULT != "CUDA" or hint_refusal("gemm", "mma", "CUDA") is not None, reason="runs gemm_mma on a CUDA GPU")
nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiles the CUDA sources with nvcc")

def _program_of(out: Tensor) -> UOp:
  (prg,) = [u for u in out.uop.toposort() if u.op is Ops.PROGRAM]
  return prg

def test_a_programs_launch_sizes_reads_and_writes():
  m, n, k = 77, 300, 96
  a, b = Tensor.empty(m, k, dtype=dtypes.float16), Tensor.empty(n, k, dtype=dtypes.float16)
  prg = _program_of(gemm_mma(a, b))
  info = ProgramInfo.from_sink(prg.src[0])
  bm = gemm_tile_rows(m, n, multiprocessors(Device.DEFAULT))   # 128 off a GPU (no multiprocessors to fill)
  assert (info.name, info.global_size, info.local_size) == ("r_gemm_mma_f16_77x300x96", (3, -(-m // bm), 1), (256, 1, 1))
  assert (info.outs, info.ins) == ((0,), (1, 2)) and prg.src[0].arg.estimates.ops == 2 * m * n * k
  code = prg.src[2].arg
  assert code.startswith("#define NAME r_gemm_mma_f16_77x300x96\n#define M 77\n#define N 300\n#define K 96\n#define WEIGHTS 0\n#define GROUPED 0\n"
                         f"#define BM {bm}\n")
  assert "mma.sync" in code

def test_every_program_passes_tinygrads_tensor_spec(rng: np.random.Generator):
  """What lowering a program checks first (tinygrad's spec_tensor): launch sizes as SPECIALs of weakint, the variables
  after the buffers; a CUDA GPU would refuse the program at its first realize otherwise."""
  from tinygrad.uop.spec import spec_tensor, type_verify
  _, w = _words(T.Q4_0, 300, 96, rng)
  x = Tensor.empty(77, 96, dtype=dtypes.float16)
  kv, pos = Tensor.empty(2, 1, 2, 1024, 64, dtype=dtypes.float16), UOp.variable("decode_pos", 0, 1023).bind(5)
  for out in (gemm_mma(x, Tensor.empty(300, 96, dtype=dtypes.float16)), gemm_mma_words(x, "Q4_0", w.words, w.d),
              flash_decode(Tensor.empty(1, 8, 1, 64), (kv,), pos, scale=0.125, sinks=Tensor.empty(8)),
              flash_prefill(Tensor.empty(1, 8, 100, 64), (kv,), pos, scale=0.125, window=50),
              flash_latent(Tensor.empty(1, 16, 1, 576), Tensor.empty(1, 1024, 576, dtype=dtypes.float16), pos, scale=0.1, v_dim=512),
              gemm_mma_blocks(x.pad(((0, 0), (0, 160))), "Q4_K", Tensor.empty(300, 1, 144, dtype=dtypes.uint8))):
    type_verify(out.uop.sink(), spec_tensor)

def test_every_programs_arguments_are_its_buffers_then_its_variables():
  """The CUDA runtime lays out a program's arguments as its LINEAR's buffers, then its variables (UOp.to_elf): a buffer
  of several axes missing there shifted the decode position past the arguments, and the kernel read 0 or garbage."""
  kv, pos = Tensor.empty(2, 1, 2, 1024, 64, dtype=dtypes.float16), UOp.variable("decode_pos", 0, 1023).bind(5)
  for out, buffers in ((flash_decode(Tensor.empty(1, 8, 1, 64), (kv,), pos, scale=0.125, sinks=Tensor.empty(8)), (3, 3)),
                       (flash_prefill(Tensor.empty(1, 8, 100, 64), (kv[0], kv[1]), pos, scale=0.125, window=50), (4,)),
                       (flash_latent(Tensor.empty(1, 16, 1, 576), Tensor.empty(1, 1024, 576, dtype=dtypes.float16), pos, scale=0.1,
                                     v_dim=512), (3, 2))):
    for prg, n in zip(_programs(out), buffers):
      info = ProgramInfo.from_sink(prg.src[0])
      sig = [u.arg.slot for u in prg.src[1].src if u.op is Ops.PARAM and u.addrspace != AddrSpace.ALU] + [v.arg.slot for v in info.vars]
      assert sig == list(range(n + len(info.vars))) and info.globals == tuple(range(n)), (info.name, sig)

def _words(ggml_type: T, n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, WordBlocks]:
  raw = random_blocks(ggml_type, (n, k), rng)
  return raw, WordBlocks.from_blocks(QTensor.from_bytes(raw, ggml_type, (n, k)))

def q8_0_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """a's rows as Q8_0 blocks, as quant/activations.py q8_0_blocks computes them: int8 quants (to nearest, ties to even)
  and float32 scales of an fp16 [M, K / 32]."""
  blocks = a.astype(np.float32).reshape(a.shape[0], -1, 32)
  amax = np.abs(blocks).max(-1)
  q = np.rint(blocks * np.where(amax > 0, 127 / np.where(amax > 0, amax, 1), 0)[..., None]).astype(np.int8)
  return q.reshape(a.shape), (amax / 127).astype(np.float16).astype(np.float32)

@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0, T.MXFP4])
def test_the_words_gemm_reads_a_weights_words_and_scales(rng: np.random.Generator, ggml_type: T):
  m, n, k = 40, 200, 64
  _, w = _words(ggml_type, n, k, rng)
  prg = _program_of(gemm_mma_words(Tensor.empty(m, k, dtype=dtypes.float16), ggml_type.name, w.words, w.d))
  info = ProgramInfo.from_sink(prg.src[0])
  assert info.name == f"r_gemm_mma_{ggml_type.name.lower()}_40x200x64" and (info.outs, info.ins) == ((0,), (1, 2, 3))
  assert f"#define WEIGHTS {GEMM_WORD_TYPES[ggml_type.name]}\n" in prg.src[2].arg

def test_the_grouped_words_gemm_reads_each_tiles_expert(rng: np.random.Generator):
  """A MoE's experts against a chunk's rows in tiles that share an expert: the tile is the kernel's block of rows, and the
  tiles' experts are read beside the words and scales."""
  _, w = _words(T.Q4_0, 4 * 96, 64, rng)
  words, scales = w.words.reshape(4, 96, 2, 4), w.d.reshape(4, 96, 2)
  prg = _program_of(gemm_mma_words(Tensor.empty(5 * 32, 64, dtype=dtypes.float16), "Q4_0", words, scales, Tensor.empty(5, dtype=dtypes.int32)))
  info = ProgramInfo.from_sink(prg.src[0])
  assert (info.name, info.global_size, info.ins) == ("r_gemm_mma_q4_0_grouped_160x96x64", (1, 5, 1), (1, 2, 3, 4))
  assert "#define GROUPED 1\n" in prg.src[2].arg and "#define BM 32\n" in prg.src[2].arg
  tiles_of_16 = Tensor.empty(10, dtype=dtypes.int32)
  assert not gemm_mma_words_applies(Tensor.empty(160, 64, dtype=dtypes.float16), "Q4_0", words, scales, tiles_of_16)

def test_a_gemm_takes_64_row_tiles_where_128_row_ones_leave_multiprocessors_idle():
  assert gemm_tile_rows(512, 8192, 132) == 128           # 4 x 64 tiles
  assert gemm_tile_rows(512, 2048, 132) == 64            # 4 x 16 tiles: half the GPU idle
  assert gemm_tile_rows(512, 2048, None) == 128          # a count the driver did not give

def test_the_words_gemm_refuses_what_it_does_not_take(rng: np.random.Generator):
  _, w = _words(T.Q4_1, 64, 64, rng)
  x = Tensor.empty(8, 64, dtype=dtypes.float16)
  assert not gemm_mma_words_applies(x, "Q4_1", w.words, w.d)
  with pytest.raises(KernelRefused, match="reads the words of Q4_0, Q8_0, MXFP4"): gemm_mma_words(x, "Q4_1", w.words, w.d)
  _, w = _words(T.Q4_0, 64, 64, rng)
  assert not gemm_mma_words_applies(Tensor.empty(8, 96, dtype=dtypes.float16), "Q4_0", w.words, w.d)   # K differs
  assert not gemm_mma_words_applies(x.float(), "Q4_0", w.words, w.d)

def test_the_sources_use_no_names_of_the_c_headers_nvrtc_lacks():
  # nvcc puts math.h and float.h (and the host compiler's builtins) before every source, NVRTC (which compiles them in
  # tinygrad) does not: a kernel naming their macros compiles here and fails on the GPU
  for cu in sorted(Path(ops_cuda.__file__).parent.glob("*.cu*")):
    code = re.sub(r"//.*", "", cu.read_text())
    assert not (names := set(re.findall(r"\b(INFINITY|NAN|HUGE_VALF?|__builtin_inff|__builtin_huge_valf|FLT_MAX|FLT_MIN|FLT_EPSILON|M_PI|M_LN2|M_LOG2E)\b", code))), f"{cu.name}: {names}"

@nvcc
def test_the_gemm_source_refuses_a_tiling_it_is_not_written_for(tmp_path: Path):
  (cu := tmp_path / "k.cu").write_text(source("gemm_mma.cu", "r_gemm", M=64, N=64, K=64, WEIGHTS=0, GROUPED=0, BM=128, BN=64, BK=32, THREADS=256))
  r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"), str(cu)], capture_output=True, text=True, timeout=300)
  assert r.returncode != 0 and "written for tiles of 128, 64 or 32 x 128" in r.stderr

@pytest.mark.parametrize("a, b, why", [
  ((64, 100), (32, 100), "K a multiple of 32"),                       # K = 100
  ((64, 96), (32, 64), "K a multiple of 32"),                         # K differs
])
def test_gemm_mma_refuses_what_it_does_not_take(a, b, why):
  x, w = Tensor.empty(*a, dtype=dtypes.float16), Tensor.empty(*b, dtype=dtypes.float16)
  assert not gemm_mma_applies(x, w)
  with pytest.raises(KernelRefused, match=why) as e: gemm_mma(x, w)
  assert "\n" not in str(e.value)
  assert not gemm_mma_applies(x.float(), w.float())

def test_gemm_takes_the_mma_kernel_where_it_applies_and_tinygrads_elsewhere():
  """One matrix's GEMM of half inputs summed in float32 takes gemm_mma; several matrices (latent attention's heads), a
  sum rounded to half, or tinygrad's choice do not."""
  w, x = Tensor.empty(256, 64, dtype=dtypes.float32), Tensor.empty(1, 40, 64, dtype=dtypes.float32)
  kernels = lambda y: [u for u in y.uop.toposort() if u.op is Ops.PROGRAM]
  y = gemm(w, x, dtypes.float16, kernel="mma")
  assert y.shape == (1, 40, 256) and y.dtype == dtypes.float32 and len(kernels(y)) == 1
  assert not kernels(gemm(w, x, dtypes.float16)) and not kernels(gemm(w, x, dtypes.float16, upcast=False, kernel="mma"))
  assert not kernels(gemm(Tensor.empty(2, 256, 64), Tensor.empty(40, 2, 64), dtypes.float16, kernel="mma"))

def test_a_chunks_matmul_under_mma_decodes_the_words_where_the_strategy_keeps_them(rng: np.random.Generator):
  """packed_words keeps the words, which the GEMM decodes itself (one kernel of its own, no fp16 copy of the weights);
  packed_dot keeps the blocks alone, which are dequantized for gemm mma's fp16 GEMM."""
  raw = random_blocks(T.Q4_0, (256, 128), rng)
  x = Tensor.empty(1, 40, 128)
  def programs(strategy: str) -> list[str]:
    lin = QuantLinear(QTensor.from_bytes(raw, T.Q4_0, (256, 128)), strategy=strategy, prefill="half", gemm_kernel="mma")
    return [u.src[0].arg.name for u in lin(x).uop.toposort() if u.op is Ops.PROGRAM]
  assert programs("packed_words") == ["r_gemm_mma_q4_0_40x256x128"]
  assert programs("packed_dot") == ["r_gemm_mma_f16_40x256x128"]

def test_a_chunks_matmul_under_mma_int8_takes_the_integer_gemm_where_it_reads_the_words(rng: np.random.Generator):
  """Q4_0's and Q8_0's words in integers; MXFP4's words, the blocks and fp16 weights as under mma."""
  def programs(ggml_type: T, strategy: str) -> list[str]:
    lin = QuantLinear(QTensor.from_bytes(random_blocks(ggml_type, (256, 512), rng), ggml_type, (256, 512)), strategy=strategy, prefill="half",
                      gemm_kernel="mma_int8")
    return [u.src[0].arg.name for u in lin(Tensor.empty(1, 40, 512)).uop.toposort() if u.op is Ops.PROGRAM]
  assert programs(T.Q4_0, "packed_words") == ["r_gemm_int8_q4_0_40x256x512"] and programs(T.Q8_0, "packed_words") == ["r_gemm_int8_q8_0_40x256x512"]
  assert programs(T.MXFP4, "packed_words") == ["r_gemm_mma_mxfp4_40x256x512"] and programs(T.Q4_K, "packed_words") == ["r_gemm_mma_q4_k_40x256x512"]
  assert programs(T.Q4_0, "packed_dot") == ["r_gemm_mma_f16_40x256x512"]   # no words kept: fp16 weights
  for rows, ggml_type in (((Tensor.empty(40, 512, dtype=dtypes.int8), Tensor.empty(40, 16)), "MXFP4"),
                          ((Tensor.empty(40, 512, dtype=dtypes.float16), Tensor.empty(40, 16)), "Q4_0"),
                          ((Tensor.empty(40, 512, dtype=dtypes.int8), Tensor.empty(40, 8)), "Q4_0")):
    with pytest.raises(KernelRefused, match="gemm mma_int8 reads the words of Q4_0, Q8_0 against int8 rows"):
      gemm_int8_words(*rows, ggml_type, Tensor.empty(256, 16, 4, dtype=dtypes.uint32), Tensor.empty(256, 16))

def test_a_chunks_matmul_under_mma_reads_q4_k_q6_k_and_q5_0_blocks_as_stored(rng: np.random.Generator):
  """Q4_K, Q6_K and Q5_0 have no words: under every strategy the GEMM reads their GGUF blocks itself, a weight's and an expert's."""
  for ggml_type, strategy in itertools.product((T.Q4_K, T.Q6_K, T.Q5_0), ("packed_words", "packed_dot")):
    lin = QuantLinear(QTensor.from_bytes(random_blocks(ggml_type, (256, 512), rng), ggml_type, (256, 512)), strategy=strategy, prefill="half",
                      gemm_kernel="mma")
    names = [u.src[0].arg.name for u in lin(Tensor.empty(1, 40, 512)).uop.toposort() if u.op is Ops.PROGRAM]
    assert names == [f"r_gemm_mma_{ggml_type.name.lower()}_40x256x512"], (ggml_type, strategy)
  experts = QuantExperts(QTensor.from_bytes(random_blocks(T.Q4_K, (4, 128, 256), rng), T.Q4_K, (4, 128, 256)), prefill="half", gemm_kernel="mma")
  groups = ExpertGroups.of(Tensor(np.array([[0, 2], [1, 3], [2, 0]], np.int32)), 4, 32)
  (name,) = [u.src[0].arg.name for u in experts.grouped(groups.rows(Tensor.empty(3, 256)), groups).uop.toposort() if u.op is Ops.PROGRAM]
  assert name.startswith("r_gemm_mma_q4_k_grouped_") and name.endswith("x128x256")
  assert not gemm_mma_blocks_applies(Tensor.empty(40, 512, dtype=dtypes.float16), "Q5_K", lin.weight.blocks)

def test_the_gemm_hint_is_refused_off_a_cuda_gpu(capsys):
  from tinyzoo.cli import main
  assert hint_refusal("gemm", "mma", "CPU") == "gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not CPU"
  if Device.DEFAULT == "CUDA": return
  assert main(["bench", "llama3.2-1b-tiny", "--gemm", "mma", "--no-journal", "--no-peer", "-r", "1"]) == 1
  assert capsys.readouterr().err.strip() == "tinyzoo: error: hint gemm: gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not CPU"

@nvcc
@pytest.mark.parametrize("file, weights", [("gemm_mma.cu", w) for w in (0, *GEMM_WORD_TYPES.values(), *GEMM_BLOCK_TYPES.values())]
                         + [("gemm_int8.cu", GEMM_WORD_TYPES[t]) for t in GEMM_INT8_TYPES])
@pytest.mark.parametrize("m, n, k, tile_rows, grouped", [(77, 300, 96, 128, False), (512, 3072, 2048, 128, False), (512, 3072, 2048, 64, False),
                                                         (160, 96, 64, 32, True)])
def test_the_gemm_source_compiles_for_sm_90(tmp_path: Path, m: int, n: int, k: int, tile_rows: int, grouped: bool, file: str, weights: int):
  if file == "gemm_mma.cu" and weights in GEMM_BLOCK_TYPES.values(): k = -(-k // 256) * 256   # whole super-blocks
  (cu := tmp_path / "k.cu").write_text(gemm_mma_source("r_gemm", m, n, k, weights, tile_rows, grouped, file))
  r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(cu)],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  assert " 0 bytes spill stores" in r.stderr   # every sum stays in registers

@on_gpu
@pytest.mark.parametrize("m, n, k", [(77, 300, 96), (128, 128, 32), (512, 3072, 2048), (300, 1000, 4096)])
def test_gemm_mma_against_float64(rng: np.random.Generator, m: int, n: int, k: int):
  """Sizes no multiple of the tile included; fp16 inputs, so the reference multiplies the same fp16 values in float64."""
  a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, k), (n, k)))
  got = gemm_mma(Tensor(a), Tensor(b)).numpy()
  want = a.astype(np.float64) @ b.astype(np.float64).T
  assert got.shape == (m, n)
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.sqrt(k))

@on_gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0, T.MXFP4])
@pytest.mark.parametrize("m, n, k", [(77, 300, 96), (512, 2048, 2048), (300, 1000, 4096), (1, 256, 64)])
def test_the_words_gemm_against_float64(rng: np.random.Generator, ggml_type: T, m: int, n: int, k: int):
  """The blocks gguf.quants dequantizes, in float64, against fp16 rows: the kernel's weights are theirs rounded to fp16 (as
  tinygrad's GEMM takes them), within the rounding of the exact ones, and its sums those of the rounded weights within
  float32's error."""
  raw, w = _words(ggml_type, n, k, rng)
  a = rng.standard_normal((m, k)).astype(np.float16)
  got = gemm_mma_words(Tensor(a), ggml_type.name, w.words, w.d).numpy()
  exact = gguf_quants.dequantize(raw, ggml_type).reshape(n, k).astype(np.float64)
  want, rounded = (a.astype(np.float64) @ wt.T for wt in (exact, exact.astype(np.float16).astype(np.float64)))
  scale = np.abs(want).max()
  assert got.shape == (m, n) and np.abs(got - rounded).max() <= 1e-5 * scale and np.abs(got - want).max() <= 1e-3 * scale

@on_gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0])
@pytest.mark.parametrize("m, n, k", [(77, 300, 96), (512, 2048, 2048), (300, 1000, 4096), (1, 256, 64)])
def test_the_int8_gemm_against_float64(rng: np.random.Generator, ggml_type: T, m: int, n: int, k: int):
  """The rows quantized to 8 bits on the GPU, then their integer products with the words: the rows as quantized (the
  kernel's own inputs) against the blocks gguf.quants dequantizes, in float64, within float32's error; the rows as given
  within the quantization's. The GPU's quants are numpy's, or one step off where its reciprocal rounds a near-tie the
  other way."""
  raw, w = _words(ggml_type, n, k, rng)
  a = rng.standard_normal((m, k)).astype(np.float16)
  q, d = (t.realize() for t in q8_0_blocks(Tensor(a).float()))
  got = gemm_int8_words(q.cast(dtypes.int8).reshape(m, k), d.reshape(m, -1), ggml_type.name, w.words, w.d).numpy()
  aq, ad = q.numpy().reshape(m, k), d.numpy().reshape(m, -1)
  want_q, want_d = q8_0_rows(a)
  assert np.abs(aq - want_q).max() <= 1 and np.array_equal(ad, want_d)
  weights = gguf_quants.dequantize(raw, ggml_type).reshape(n, k).astype(np.float64)
  quantized, exact = (rows @ weights.T for rows in (aq.astype(np.float64) * np.repeat(ad, 32, axis=1), a.astype(np.float64)))
  scale = np.abs(exact).max()
  assert got.shape == (m, n) and np.abs(got - quantized).max() <= 1e-5 * scale and np.abs(got - exact).max() <= 2e-2 * scale

@on_gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q5_0])
@pytest.mark.parametrize("m, n, k", [(77, 300, 512), (512, 2048, 2048), (1, 256, 256)])
def test_the_blocks_gemm_against_float64(rng: np.random.Generator, ggml_type: T, m: int, n: int, k: int):
  """Super-blocks as stored against fp16 rows: gguf.quants' dequantization rounded to fp16, as the kernel's."""
  raw = random_blocks(ggml_type, (n, k), rng)
  a = rng.standard_normal((m, k)).astype(np.float16)
  got = gemm_mma_blocks(Tensor(a), ggml_type.name, QTensor.from_bytes(raw, ggml_type, (n, k)).blocks).numpy()
  want = a.astype(np.float64) @ gguf_quants.dequantize(raw, ggml_type).reshape(n, k).astype(np.float16).astype(np.float64).T
  assert got.shape == (m, n) and np.abs(got - want).max() <= 1e-5 * np.abs(want).max()

@on_gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0, T.MXFP4])
@pytest.mark.parametrize("tile", [32, 64])
def test_the_grouped_words_gemm_against_float64(rng: np.random.Generator, ggml_type: T, tile: int):
  """A chunk's 45 rows, each through 2 of 6 experts drawn at random, grouped into tiles (the padding's rows zero): each
  tile's rows against its expert's blocks dequantized by gguf.quants in float64 (rounded to fp16, as the kernel's)."""
  n_experts, n, k = 6, 200, 128
  raw = random_blocks(ggml_type, (n_experts, n, k), rng)
  w = WordBlocks.from_blocks(QTensor.from_bytes(raw, ggml_type, (n_experts, n, k)))
  sel = np.stack([rng.choice(n_experts, 2, replace=False) for _ in range(45)]).astype(np.int32)
  groups = ExpertGroups.of(Tensor(sel), n_experts, tile)
  x = rng.standard_normal((45, k)).astype(np.float16)
  got = gemm_mma_words(groups.rows(Tensor(x)).cast(dtypes.float16), ggml_type.name, w.words, w.d, groups.tile_expert).numpy()
  weights = gguf_quants.dequantize(raw, ggml_type).reshape(n_experts, n, k).astype(np.float16).astype(np.float64)
  row, held, tile_expert = groups.row.numpy(), groups.held.numpy(), groups.tile_expert.numpy()
  want = np.stack([x[row[s]].astype(np.float64) @ weights[tile_expert[s // tile]].T if held[s] else np.zeros(n) for s in range(len(row))])
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()

@on_gpu
@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0, T.MXFP4])
def test_a_chunks_matmul_under_mma_matches_tinygrads(rng: np.random.Generator, ggml_type: T):
  """The prefill GEMM of a packed_words weight: gemm mma decoding its words against tinygrad's GEMM of the dequantized
  weights, a last partial chunk's rows (not a multiple of a tile) included."""
  raw = random_blocks(ggml_type, (384, 256), rng)
  linears = {kernel: QuantLinear(QTensor.from_bytes(raw, ggml_type, (384, 256)), strategy="packed_words", prefill="half", gemm_kernel=kernel)
             for kernel in ("tinygrad", "mma")}
  x = Tensor(rng.standard_normal((1, 37, 256)).astype(np.float32))
  got, want = (linears[k](x).numpy() for k in ("mma", "tinygrad"))
  assert len([u for u in linears["mma"](x).uop.toposort() if u.op is Ops.PROGRAM]) == 1
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())

@on_gpu
def test_a_chunks_experts_under_mma_match_tinygrads(rng: np.random.Generator):
  """QuantExperts.grouped of int8_dot's words (a GPU's experts strategy): gemm mma against tinygrad's grouped GEMM."""
  raw, groups = random_blocks(T.Q4_0, (4, 96, 64), rng), ExpertGroups.of(Tensor(rng.integers(0, 4, (50, 2)).astype(np.int32)), 4, 32)
  x = groups.rows(Tensor(rng.standard_normal((50, 64)).astype(np.float32)))
  experts = {k: QuantExperts(QTensor.from_bytes(raw, T.Q4_0, (4, 96, 64)), strategy="int8_dot", prefill="half", gemm_kernel=k)
             for k in ("mma", "tinygrad")}
  got, want = (experts[k].grouped(x, groups).numpy() for k in ("mma", "tinygrad"))
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())

# flash decoding (decode_attention.cu)

def _programs(out: Tensor) -> list[UOp]:
  """The programs computing `out`, in the order they run (sorted by name: _combine after _parts)."""
  return sorted((u for u in out.uop.toposort() if u.op is Ops.PROGRAM), key=lambda u: u.src[0].arg.name, reverse=True)

def test_flash_decoding_is_two_programs_reading_the_written_cache_and_the_steps_position():
  """The parts (a block per part and kv head, reading q and the joined cache, the decode position as their argument) and
  their combine (a block per query head, a thread per value column, reading the parts and the sinks)."""
  q, kv = Tensor.empty(1, 8, 1, 64), Tensor.empty(2, 1, 2, 1024, 64, dtype=dtypes.float16)
  pos = UOp.variable("decode_pos", 0, 1023).bind(5)
  parts, combine = _programs(flash_decode(q, (kv,), pos, scale=0.125, sinks=Tensor.empty(8)))
  p, c = ProgramInfo.from_sink(parts.src[0]), ProgramInfo.from_sink(combine.src[0])
  n = flash_decode_parts(2, 1024, multiprocessors(Device.DEFAULT))
  assert (p.name, p.global_size, p.local_size, [v.expr for v in p.vars]) == ("r_flash_decode_8x2x64x64x1024_parts", (n, 2, 1), (128, 1, 1),
                                                                            ["decode_pos"])
  assert (c.name, c.global_size, c.local_size, c.ins, c.vars) == ("r_flash_decode_8x2x64x64x1024_combine", (8, 1, 1), (64, 1, 1), (1, 2), ())
  code = parts.src[2].arg
  assert "#define V_OFFSET 131072\n" in code and "#define SEPARATE_V 0\n" in code and "#define SINKS 1\n" in code and "#define START_POS" not in code
  (parts, _) = _programs(flash_decode(q, (kv[0], kv[1]), 7, scale=0.125))   # separate k and v; a position that is a number
  assert "#define START_POS 7\n" in parts.src[2].arg and "#define SEPARATE_V 1\n" in parts.src[2].arg
  assert not ProgramInfo.from_sink(parts.src[0]).vars

def test_flash_decoding_parts_fill_the_gpu_in_powers_of_two():
  assert flash_decode_parts(8, 16384, 132) == 64    # 33 a kv head for two blocks an SM, rounded up
  assert flash_decode_parts(1, 16384, 132) == 128   # no more parts than spans of 128 positions
  assert flash_decode_parts(8, 1024, 132) == 8
  assert flash_decode_parts(8, 100, 132) == 1
  assert flash_decode_parts(8, 16384, None) == 8

@pytest.mark.parametrize("q, k, v, why", [
  ((1, 8, 2, 64), (1, 2, 64, 64), (1, 2, 64, 64), "one query row"),
  ((1, 8, 1, 64), (1, 2, 64, 64), None, "fp16 cache"),
  ((1, 8, 1, 60), (1, 2, 64, 60), (1, 2, 64, 60), "whole 16-byte rows"),
  ((1, 8, 1, 64), (1, 2, 64, 64), (1, 2, 64, 512), "value heads of 32 to 256"),
  ((1, 64, 1, 64), (1, 2, 64, 64), (1, 2, 64, 64), "up to 16 query heads"),
])
def test_flash_decoding_refuses_what_it_does_not_take(q, k, v, why):
  half = dtypes.float16 if v is not None else dtypes.float32
  kv = (Tensor.empty(*k, dtype=half), Tensor.empty(*(v or k), dtype=half))
  assert why in (flash_refusal(Tensor.empty(*q), kv, 3, decode=True) or "")
  with pytest.raises(KernelRefused, match=why): flash_decode(Tensor.empty(*q), kv, 3, scale=1.0)

def test_the_decode_attention_hint_is_refused_off_a_cuda_gpu_and_off_an_fp16_cache_of_heads(capsys):
  from tinyzoo.cli import main
  if Device.DEFAULT == "CUDA": return
  assert main(["bench", "llama3.2-1b-tiny", "--decode-attention", "flash", "--no-journal", "--no-peer", "-r", "1"]) == 1
  assert capsys.readouterr().err.strip() == "tinyzoo: error: hint decode_attention: decode_attention flash runs on CUDA GPUs (tinygrad's CUDA " \
                                            "backend), not CPU"

def test_a_flash_kernel_asked_for_over_a_cache_it_does_not_read_is_refused(monkeypatch: pytest.MonkeyPatch, capsys):
  """Asked for by the user (or a profile), not left to tinygrad's as a rule's choice would be: each source named."""
  from models import runtime
  from tinyzoo.cli import main
  monkeypatch.setattr(runtime, "hint_refusal", lambda hint, value, device: None)   # as on a GPU that runs it
  assert main(["bench", "llama3.2-1b-tiny", "--decode-attention", "flash", "--kv-layout", "rows", "--no-journal", "--no-peer", "-r", "1"]) == 1
  assert capsys.readouterr().err.strip() == "tinyzoo: error: hint decode_attention: flash reads an fp16 cache of heads (kv_cache half, " \
                                            "kv_layout heads), not kv_cache float (default), kv_layout rows (runtime)"

@nvcc
@pytest.mark.parametrize("hkv, g, d, dv, window, softcap, sinks, joined, start", [
  (8, 2, 128, 128, 0, 0.0, 0, 1, None), (8, 8, 64, 64, 128, 30.0, 1, 1, None), (1, 4, 256, 256, 512, 0.0, 0, 1, 5),
  (2, 4, 64, 32, 0, 0.0, 0, 0, None)])
def test_the_flash_decoding_source_compiles_for_sm_90(tmp_path: Path, hkv, g, d, dv, window, softcap, sinks, joined, start):
  q = Tensor.empty(1, hkv * g, 1, d)
  kv = (Tensor.empty(2, 1, hkv, 1024, d, dtype=dtypes.float16),) if joined else \
    (Tensor.empty(1, hkv, 1024, d, dtype=dtypes.float16), Tensor.empty(1, hkv, 1024, dv, dtype=dtypes.float16))
  pos = start if start is not None else UOp.variable("decode_pos", 0, 1023).bind(3)
  out = flash_decode(q, kv, pos, scale=0.1, window=window or None, softcap=softcap or None, sinks=Tensor.empty(hkv * g) if sinks else None)
  (cu := tmp_path / "k.cu").write_text(_programs(out)[0].src[2].arg)
  r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "k.cubin"), str(cu)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr

@on_gpu
@pytest.mark.parametrize("hq, hkv, d, window, softcap, sinks", [(16, 8, 128, None, None, False), (8, 2, 64, 100, 30.0, True),
                                                                 (4, 1, 256, None, None, True)])
def test_flash_decoding_against_tinygrads_attention(rng: np.random.Generator, hq, hkv, d, window, softcap, sinks):
  """Decode steps of a TinyJit at positions that are no multiple of a part or tile, the cache written before each: flash
  decoding against ops/attention.py's plain attention of the same cache, q rounded to fp16 by both."""
  from tinygrad import TinyJit
  L = cache_positions(700)
  kv = Tensor((rng.standard_normal((2, 1, hkv, L, d)) * 0.5).astype(np.float16)).realize()
  sink = Tensor(rng.standard_normal(hq).astype(np.float32)).realize() if sinks else None
  pos = UOp.variable("decode_pos", 0, L - 1)
  kw = dict(scale=d ** -0.5, window=window, sinks=sink, softcap=softcap)
  @TinyJit
  def step(q: Tensor, new: Tensor, p: UOp) -> Tensor:   # this step's key and value written first, as a decode step does
    kv[:, :, :, p:p + 1, :].assign(new)
    return flash_decode(q, (kv,), p, **kw).realize()
  for at in (0, 5, 63, 200, 699):
    q = Tensor(rng.standard_normal((1, hq, 1, d)).astype(np.float32)).realize()
    got = step(q, Tensor((rng.standard_normal((2, 1, hkv, 1, d)) * 0.5).astype(np.float16)).realize(), pos.bind(at)).numpy()
    want = attention(q, kv[0], kv[1], at, **kw).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)

# flash attention of a prompt chunk (prefill_attention.cu)

def test_flash_attention_is_one_program_a_block_for_64_rows_of_a_head():
  q, kv = Tensor.empty(1, 8, 100, 64), Tensor.empty(2, 1, 2, 1024, 64, dtype=dtypes.float16)
  (prg,) = _programs(flash_prefill(q, (kv,), UOp.variable("prefill_pos", 0, 1023).bind(64), scale=0.125, sinks=Tensor.empty(8)))
  info = ProgramInfo.from_sink(prg.src[0])
  assert (info.name, info.global_size, info.local_size, info.ins, [v.expr for v in info.vars]) == \
    ("r_flash_prefill_8x2x100x64x64x1024", (2, 8, 1), (128, 1, 1), (1, 2, 3), ["prefill_pos"])
  assert "#define T 100\n" in prg.src[2].arg and "#define SINKS 1\n" in prg.src[2].arg
  # heads past what the kernel holds in registers stay with tinygrad's
  wide = (Tensor.empty(1, 2, 1024, 256, dtype=dtypes.float16), Tensor.empty(1, 2, 1024, 256, dtype=dtypes.float16))
  assert "16 to 128" in flash_refusal(Tensor.empty(1, 8, 100, 256), wide, 0) and flash_refusal(Tensor.empty(1, 8, 1, 256), wide, 0, decode=True) is None

@nvcc
@pytest.mark.parametrize("hkv, g, d, dv, window, softcap, sinks, joined, start", [
  (8, 2, 128, 128, 0, 0.0, 0, 1, None), (8, 8, 64, 64, 128, 30.0, 1, 1, None), (2, 4, 64, 32, 0, 0.0, 0, 0, 5)])
def test_the_flash_attention_source_compiles_for_sm_90(tmp_path: Path, hkv, g, d, dv, window, softcap, sinks, joined, start):
  kv = (Tensor.empty(2, 1, hkv, 1024, d, dtype=dtypes.float16),) if joined else \
    (Tensor.empty(1, hkv, 1024, d, dtype=dtypes.float16), Tensor.empty(1, hkv, 1024, dv, dtype=dtypes.float16))
  pos = start if start is not None else UOp.variable("prefill_pos", 0, 1023).bind(3)
  out = flash_prefill(Tensor.empty(1, hkv * g, 200, d), kv, pos, scale=0.1, window=window or None, softcap=softcap or None,
                      sinks=Tensor.empty(hkv * g) if sinks else None)
  (cu := tmp_path / "k.cu").write_text(_programs(out)[0].src[2].arg)
  r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(cu)],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and " 0 bytes spill stores" in r.stderr, r.stderr

@on_gpu
@pytest.mark.parametrize("hq, hkv, d, window, softcap, sinks", [(16, 8, 128, None, None, False), (8, 2, 64, 100, 30.0, True)])
def test_flash_attention_against_tinygrads_attention(rng: np.random.Generator, hq, hkv, d, window, softcap, sinks):
  """Chunks of 100 rows (no multiple of a block's 64) of a TinyJit at positions that are no multiple of a tile, each chunk's
  keys and values written first: flash attention against ops/attention.py's plain attention of the same cache."""
  from tinygrad import TinyJit
  L, T = cache_positions(700), 100
  kv = Tensor((rng.standard_normal((2, 1, hkv, L, d)) * 0.5).astype(np.float16)).realize()
  sink = Tensor(rng.standard_normal(hq).astype(np.float32)).realize() if sinks else None
  pos = UOp.variable("prefill_pos", 0, L - T)
  kw = dict(scale=d ** -0.5, window=window, sinks=sink, softcap=softcap)
  @TinyJit
  def chunk(q: Tensor, new: Tensor, p: UOp) -> Tensor:
    kv[:, :, :, p:p + T, :].assign(new)
    return flash_prefill(q, (kv,), p, **kw).realize()
  for at in (0, 100, 333, 600):
    q = Tensor(rng.standard_normal((1, hq, T, d)).astype(np.float32)).realize()
    got = chunk(q, Tensor((rng.standard_normal((2, 1, hkv, T, d)) * 0.5).astype(np.float16)).realize(), pos.bind(at)).numpy()
    want = attention(q, kv[0], kv[1], at, **kw).numpy()
    np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3)

# flash attention of a latent cache (latent_attention.cu)

def test_flash_attention_of_a_latent_cache_is_parts_of_16_rows_and_their_combine():
  """A decode step's 20 heads make two tiles of 16 rows, split into parts over the positions; a chunk's 100 rows of 20
  heads make 125 tiles, enough blocks that its positions are not split."""
  q, rows = Tensor.empty(1, 20, 1, 576), Tensor.empty(1, 1024, 576, dtype=dtypes.float16)
  parts, combine = _programs(flash_latent(q, rows, UOp.variable("decode_pos", 0, 1023).bind(5), scale=0.1, v_dim=512))
  p, c = ProgramInfo.from_sink(parts.src[0]), ProgramInfo.from_sink(combine.src[0])
  n = flash_decode_parts(2, 1024, multiprocessors(Device.DEFAULT))
  assert (p.name, p.global_size, p.local_size, [v.expr for v in p.vars]) == ("r_flash_latent_20x1x576x512x1024_parts", (n, 2, 1), (128, 1, 1), ["decode_pos"])
  assert (c.global_size, c.local_size, c.ins) == ((20, 1, 1), (512, 1, 1), (1,))
  chunk = flash_latent(Tensor.empty(1, 20, 100, 576), rows, UOp.variable("prefill_pos", 0, 924).bind(0), scale=0.1, v_dim=512)
  parts, combine = _programs(chunk)
  chunk_parts = flash_decode_parts(125, 1024, multiprocessors(Device.DEFAULT))
  assert chunk.shape == (1, 20, 100, 512) and ProgramInfo.from_sink(parts.src[0]).global_size == (chunk_parts, 125, 1)
  assert ProgramInfo.from_sink(combine.src[0]).global_size == (2000, 1, 1)

@pytest.mark.parametrize("q, rows, v_dim, why", [
  ((2, 16, 1, 576), (1, 64, 576), 512, "query rows of one sequence"),
  ((1, 16, 1, 576), (1, 64, 512), 512, "rows [1, L, D] of q's D"),
  ((1, 16, 1, 584), (1, 64, 584), 512, "rows of 16 to 640 in steps of 16"),
  ((1, 16, 1, 576), (1, 64, 576), 520, "up to 512 value columns in steps of 64"),
])
def test_flash_attention_of_a_latent_cache_refuses_what_it_does_not_take(q, rows, v_dim, why):
  assert why in (latent_refusal(Tensor.empty(*q), Tensor.empty(*rows, dtype=dtypes.float16), 3, v_dim) or "")
  assert "fp16 cache" in latent_refusal(Tensor.empty(1, 16, 1, 576), Tensor.empty(1, 64, 576), 3, 512)
  with pytest.raises(KernelRefused, match=re.escape(why)): flash_latent(Tensor.empty(*q), Tensor.empty(*rows, dtype=dtypes.float16), 3, scale=1.0, v_dim=v_dim)

@nvcc
@pytest.mark.parametrize("h, t, d, dv, start", [(16, 1, 576, 512, None), (20, 1, 576, 512, 7), (128, 1, 576, 512, None), (20, 512, 576, 512, None)])
def test_the_latent_flash_attention_source_compiles_for_sm_90(tmp_path: Path, h, t, d, dv, start):
  pos = start if start is not None else UOp.variable("decode_pos", 0, 4096 - t).bind(3)
  (parts, _) = _programs(flash_latent(Tensor.empty(1, h, t, d), Tensor.empty(1, 4096, d, dtype=dtypes.float16), pos, scale=0.1, v_dim=dv))
  (cu := tmp_path / "k.cu").write_text(parts.src[2].arg)
  r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(cu)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and " 0 bytes spill stores" in r.stderr, r.stderr

@on_gpu
@pytest.mark.parametrize("h, d, dv", [(16, 576, 512), (20, 576, 512)])
@pytest.mark.parametrize("t, positions", [(1, (0, 5, 63, 200, 699)), (100, (0, 37, 300, 600))])
def test_latent_flash_attention_against_tinygrads_mla_attention(rng: np.random.Generator, h, d, dv, t, positions):
  """Decode steps, and prompt chunks of 100 rows (tiles of neighbouring positions' heads, the last partial), of a TinyJit
  at positions that are no multiple of a part or tile, the step's cache rows written before: flash attention of the
  latent cache against ops/mla.py's mla_attention of the same cache, q rounded to fp16 as both read it."""
  from tinygrad import TinyJit
  from ops.mla import mla_attention
  L = cache_positions(700)
  rows = Tensor((rng.standard_normal((1, L, d)) * 0.5).astype(np.float16)).realize()
  pos = UOp.variable("pos", 0, L - t)
  @TinyJit
  def step(q: Tensor, new: Tensor, p: UOp) -> Tensor:
    rows[:, p:p + t, :].assign(new)
    return flash_latent(q, rows, p, scale=d ** -0.5, v_dim=dv).realize()
  for at in positions:
    q = Tensor((rng.standard_normal((1, h, t, d)) * 0.5).astype(np.float16).astype(np.float32)).realize()
    got = step(q, Tensor((rng.standard_normal((1, t, d)) * 0.5).astype(np.float16)).realize(), pos.bind(at)).numpy()
    want = mla_attention(q[..., :dv], q[..., dv:], rows, rows[..., :dv], at, scale=d ** -0.5).numpy()
    np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3)
