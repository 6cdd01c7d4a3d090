"""ops/cuda's kernels run on the CPU through an emulation of the CUDA they use (tests/ops/cuda_on_cpu.h), against
float64 numpy and gguf.quants: their index, mask, decoding and fragment arithmetic is checked on every run, where the GPU
tests of test_cuda_kernels.py need a lent GPU. The programs are the ones the host functions make (flash_decode,
flash_prefill, gemm_mma, gemm_mma_words), their launch sizes and arguments as tinygrad would pass them."""
import shutil
import subprocess
from pathlib import Path
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import ProgramInfo, UOp
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants
from ops.cuda import flash_decode, flash_latent, flash_prefill, gemm_int8_words, gemm_mma, gemm_mma_blocks, gemm_mma_words
from ops.routing import ExpertGroups
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from quant.words import WordBlocks
from tests.ops.test_cuda_kernels import _programs, _words, q8_0_rows

HEADER = Path(__file__).with_name("cuda_on_cpu.h")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="compiles the emulated kernels with g++")

def emulate(prg: UOp, buffers: list[np.ndarray], ints: tuple[int, ...], tmp: Path) -> np.ndarray:
  """Runs the program on the CPU over these buffers (in its argument order) and ints (its variables'); returns its
  first buffer as written."""
  info = ProgramInfo.from_sink(prg.src[0])
  assert info.globals == tuple(range(len(buffers))) and len(info.vars) == len(ints)
  args = ", ".join([f"Arg{{b[{i}]}}" for i in range(len(buffers))] + [f"v[{i}]" for i in range(len(ints))])
  main = f"int main(int argc, char** argv) {{ return emulate(argc, argv, {{{', '.join(map(str, info.global_size))}}}, {info.local_size[0]}, " \
         f"{len(buffers)}, [](void** b, const int* v) {{ {info.function_name}({args}); }}); }}\n"
  (src := tmp / f"{info.function_name}.cpp").write_text(prg.src[2].arg + main)
  exe = tmp / info.function_name
  r = subprocess.run(["g++", "-std=c++17", "-O1", "-pthread", "-w", "-include", str(HEADER), "-o", str(exe), str(src)],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  files = []
  for i, b in enumerate(buffers):
    (f := tmp / f"{info.function_name}.{i}").write_bytes(np.ascontiguousarray(b).tobytes())
    files.append(str(f))
  r = subprocess.run([str(exe), *files, *map(str, ints)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  return np.frombuffer(Path(files[0]).read_bytes(), dtype=buffers[0].dtype).reshape(buffers[0].shape)

def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, scale: float, window: int | None,
              softcap: float | None, sinks: np.ndarray | None) -> np.ndarray:
  """Attention in float64 of query rows q [Hq, T, D] at `positions` over k [Hkv, L, D] and v [Hkv, L, Dv], causal, query
  head h reading kv head h // (Hq / Hkv) -> [Hq, T, Dv]."""
  hq, t, _ = q.shape
  g, out = hq // k.shape[0], np.zeros((hq, t, v.shape[-1]))
  for h in range(hq):
    for i, p in enumerate(positions):
      x = k[h // g, :p + 1].astype(np.float64) @ q[h, i].astype(np.float64) * scale
      if softcap: x = softcap * np.tanh(x / softcap)
      if window: x[:max(0, p + 1 - window)] = -np.inf
      z = np.append(x, sinks[h]) if sinks is not None else x
      w = np.exp(z - z.max())
      out[h, i] = w[:p + 1] @ v[h // g, :p + 1].astype(np.float64) / w.sum()
  return out

def _cache(rng: np.random.Generator, hkv: int, positions: int, d: int, dv: int) -> tuple[np.ndarray, ...]:
  """Random fp16 keys and values: one [2, Hkv, L, D] buffer where D == Dv (the cache's joined form), else two."""
  if d == dv: return ((rng.standard_normal((2, hkv, positions, d)) * 0.5).astype(np.float16),)
  return tuple((rng.standard_normal((hkv, positions, n)) * 0.5).astype(np.float16) for n in (d, dv))

def _tensors(kv: tuple[np.ndarray, ...]) -> tuple[Tensor, ...]:
  return tuple(Tensor.empty(1, *b.shape, dtype=dtypes.float16) for b in kv) if len(kv) == 2 else \
    (Tensor.empty(kv[0].shape[0], 1, *kv[0].shape[1:], dtype=dtypes.float16),)

@pytest.mark.parametrize("hq, hkv, d, dv, window, softcap, sinks", [(8, 2, 64, 64, None, None, False), (4, 1, 128, 64, 50, 30.0, True)])
def test_flash_decoding_on_the_cpu_against_float64(rng: np.random.Generator, tmp_path: Path, hq, hkv, d, dv, window, softcap, sinks):
  """Both programs (the parts, their combine) at positions that are no multiple of a part or tile, the decode position
  as the variable argument a JIT passes."""
  L = 256
  kv = _cache(rng, hkv, L, d, dv)
  k, v = (kv[0][0], kv[0][1]) if len(kv) == 1 else kv
  sink = rng.standard_normal(hq).astype(np.float32) if sinks else None
  kw = dict(scale=d ** -0.5, window=window, softcap=softcap)
  parts, combine = _programs(flash_decode(Tensor.empty(1, hq, 1, d), _tensors(kv), UOp.variable("decode_pos", 0, L - 1).bind(0), **kw,
                                          sinks=Tensor.empty(hq) if sinks else None))
  n_parts = ProgramInfo.from_sink(parts.src[0]).global_size[0]
  for at in (0, 37, 200):
    q = rng.standard_normal((hq, d)).astype(np.float32)
    p = emulate(parts, [np.zeros((hq, n_parts, dv + 2), np.float32), q, *kv], (at,), tmp_path)
    out = emulate(combine, [np.zeros((hq, dv), np.float32), p] + ([sink] if sinks else []), (), tmp_path)
    want = reference(q.astype(np.float16)[:, None], k, v, np.array([at]), sinks=sink, **kw)[:, 0]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize("h, t, d, dv", [(20, 1, 576, 512), (8, 1, 80, 64), (8, 7, 80, 64), (20, 3, 576, 512)])
def test_flash_attention_of_a_latent_cache_on_the_cpu_against_float64(rng: np.random.Generator, tmp_path: Path, h: int, t: int, d: int, dv: int):
  """DeepSeek's shapes (rows of the latent and its rope key, 512 value columns) with 20 heads (tiles of 16 rows and a
  partial one), a decode step's row and a chunk's (whose tiles hold rows of neighbouring positions, each seeing its own),
  at positions that are no multiple of a part or tile; the weights rounded to fp16 as the kernel's mma.sync takes them."""
  L = 256
  rows = (rng.standard_normal((L, d)) * 0.5).astype(np.float16)
  parts, combine = _programs(flash_latent(Tensor.empty(1, h, t, d), Tensor.empty(1, L, d, dtype=dtypes.float16),
                                          UOp.variable("decode_pos", 0, L - t).bind(0), scale=d ** -0.5, v_dim=dv))
  n_parts = ProgramInfo.from_sink(parts.src[0]).global_size[0]
  for at in (0, 37, 200):
    q = (rng.standard_normal((h, t, d)) * 0.5).astype(np.float16)
    p = emulate(parts, [np.zeros((t * h, n_parts, dv + 2), np.float32), q.transpose(1, 0, 2).reshape(t * h, d), rows], (at,), tmp_path)
    out = emulate(combine, [np.zeros((t * h, dv), np.float32), p], (), tmp_path).reshape(t, h, dv).transpose(1, 0, 2)
    want = reference(q, rows[None], rows[None, :, :dv], at + np.arange(t), d ** -0.5, None, None, None)
    np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3)

@pytest.mark.parametrize("hq, hkv, d, dv, window, softcap, sinks", [(4, 2, 64, 64, None, None, False), (2, 1, 32, 16, 40, 30.0, True)])
def test_flash_attention_on_the_cpu_against_float64(rng: np.random.Generator, tmp_path: Path, hq, hkv, d, dv, window, softcap, sinks):
  """A chunk of 100 rows (a block of 64 and a partial one) at positions that are no multiple of a tile, its position as the
  variable argument; the weights rounded to fp16 as the kernel's mma.sync takes them."""
  L, T = 256, 100
  kv = _cache(rng, hkv, L, d, dv)
  k, v = (kv[0][0], kv[0][1]) if len(kv) == 1 else kv
  sink = rng.standard_normal(hq).astype(np.float32) if sinks else None
  kw = dict(scale=d ** -0.5, window=window, softcap=softcap)
  (prg,) = _programs(flash_prefill(Tensor.empty(1, hq, T, d), _tensors(kv), UOp.variable("prefill_pos", 0, L - T).bind(0), **kw,
                                   sinks=Tensor.empty(hq) if sinks else None))
  for at in (0, 37):
    q = rng.standard_normal((hq, T, d)).astype(np.float16)
    out = emulate(prg, [np.zeros((hq, T, dv), np.float32), q, *kv] + ([sink] if sinks else []), (at,), tmp_path)
    want = reference(q, k, v, at + np.arange(T), sinks=sink, **kw)
    np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3)

def test_gemm_mma_on_the_cpu_against_float64(rng: np.random.Generator, tmp_path: Path):
  """fp16 rows against fp16 weights, sizes no multiple of a tile."""
  m, n, k = 77, 300, 96
  a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, k), (n, k)))
  (prg,) = _programs(gemm_mma(Tensor.empty(m, k, dtype=dtypes.float16), Tensor.empty(n, k, dtype=dtypes.float16)))
  got = emulate(prg, [np.zeros((m, n), np.float32), a, b], (), tmp_path)
  np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0, T.MXFP4])
def test_the_words_gemm_on_the_cpu_against_gguf_quants(rng: np.random.Generator, tmp_path: Path, ggml_type: T):
  """The words decoded into shared memory: the blocks gguf.quants dequantizes, rounded to fp16 as the kernel's are."""
  m, n, k = 77, 300, 96
  raw, w = _words(ggml_type, n, k, rng)
  a = rng.standard_normal((m, k)).astype(np.float16)
  (prg,) = _programs(gemm_mma_words(Tensor.empty(m, k, dtype=dtypes.float16), ggml_type.name, w.words, w.d))
  got = emulate(prg, [np.zeros((m, n), np.float32), a, w.words.numpy(), w.d.numpy()], (), tmp_path)
  weights = gguf_quants.dequantize(raw, ggml_type).reshape(n, k).astype(np.float16).astype(np.float64)
  want = a.astype(np.float64) @ weights.T
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()

@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0])
def test_the_int8_gemm_on_the_cpu_against_float64(rng: np.random.Generator, tmp_path: Path, ggml_type: T):
  """Rows quantized to int8 blocks against the words' quants in integers, each block's sums scaled by both scales: the
  quantized rows' values times the blocks gguf.quants dequantizes, in float64."""
  m, n, k = 77, 300, 96
  raw, w = _words(ggml_type, n, k, rng)
  aq, ad = q8_0_rows(rng.standard_normal((m, k)).astype(np.float16))
  (prg,) = _programs(gemm_int8_words(Tensor.empty(m, k, dtype=dtypes.int8), Tensor.empty(m, k // 32), ggml_type.name, w.words, w.d))
  got = emulate(prg, [np.zeros((m, n), np.float32), aq, ad, w.words.numpy(), w.d.numpy()], (), tmp_path)
  rows = aq.astype(np.float64) * np.repeat(ad, 32, axis=1)
  want = rows @ gguf_quants.dequantize(raw, ggml_type).reshape(n, k).astype(np.float64).T
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()

def test_the_grouped_words_gemm_on_the_cpu_reads_each_tiles_expert(rng: np.random.Generator, tmp_path: Path):
  """A chunk's 45 rows, each through 2 of 6 experts, grouped into tiles of 32 (the padding's rows zero): each tile's rows
  against its expert's blocks, dequantized by gguf.quants; the tiles past every run (expert -1) skipped, their sums zeros."""
  n_experts, n, k, tile = 6, 200, 64, 32
  raw = random_blocks(T.Q4_0, (n_experts, n, k), rng)
  w = WordBlocks.from_blocks(QTensor.from_bytes(raw, T.Q4_0, (n_experts, n, k)))
  sel = np.stack([rng.choice(n_experts, 2, replace=False) for _ in range(45)]).astype(np.int32)
  groups = ExpertGroups.of(Tensor(sel), n_experts, tile)
  x = rng.standard_normal((45, k)).astype(np.float16)
  rows, tile_expert = groups.rows(Tensor(x)).cast(dtypes.float16).numpy(), groups.tile_expert.cast(dtypes.int32).numpy()
  (prg,) = _programs(gemm_mma_words(Tensor.empty(*rows.shape, dtype=dtypes.float16), "Q4_0", w.words, w.d, Tensor.empty(len(tile_expert), dtype=dtypes.int32)))
  got = emulate(prg, [np.full((len(rows), n), np.nan, np.float32), rows, w.words.numpy(), w.d.numpy(), tile_expert], (), tmp_path)
  weights = gguf_quants.dequantize(raw, T.Q4_0).reshape(n_experts, n, k).astype(np.float16).astype(np.float64)
  want = np.stack([rows[s].astype(np.float64) @ weights[e].T if (e := tile_expert[s // tile]) >= 0 else np.zeros(n) for s in range(len(rows))])
  assert (tile_expert < 0).any() and np.abs(got - want).max() <= 1e-5 * np.abs(want).max()   # the empty tiles written as zeros

@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.Q6_K, T.Q5_0])
def test_the_blocks_gemm_on_the_cpu_against_gguf_quants(rng: np.random.Generator, tmp_path: Path, ggml_type: T):
  """Blocks read as GGUF stores them (Q4_K's 6-bit scales and mins, Q6_K's and Q5_0's 2-byte aligned quants, Q6_K's int8
  scales) unpacked in the kernel: the blocks gguf.quants dequantizes, rounded to fp16 as the kernel's are."""
  m, n, k = 77, 300, 512
  raw = random_blocks(ggml_type, (n, k), rng)
  blocks = QTensor.from_bytes(raw, ggml_type, (n, k)).blocks
  a = rng.standard_normal((m, k)).astype(np.float16)
  (prg,) = _programs(gemm_mma_blocks(Tensor.empty(m, k, dtype=dtypes.float16), ggml_type.name, blocks))
  got = emulate(prg, [np.zeros((m, n), np.float32), a, blocks.numpy()], (), tmp_path)
  weights = gguf_quants.dequantize(raw, ggml_type).reshape(n, k).astype(np.float16).astype(np.float64)
  want = a.astype(np.float64) @ weights.T
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
