"""The matvec opts (quant/matvec_opts.py), CPU and GPU: which kernels get them, that the results stay right, and bad
settings. Each test compiles under a runtime's kernel settings (`row_upcast`), which compiled programs are cached by."""
import contextlib
from math import prod
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, quants
from tinygrad import Device, Tensor, TinyJit, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from ops import patches
from ops.kernels import jit_programs
from quant.matvec_opts import CPU_GEMM_TILE, GPU_MATVEC_THREADS, VALUE_COLUMNS, builtin_gpu_sizes, kernel_settings
from quant.linear import QuantExperts, QuantLinear
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks

pytestmark = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the opts are for CPU kernels")

@pytest.fixture
def row_upcast(programs):
  """row_upcast(n, **settings): the rest of the test compiles under a runtime's kernel settings with n rows a CPU matvec
  thread (0: tinygrad's heuristic for every kernel), its programs kept in the suite's store; returns the settings."""
  with contextlib.ExitStack() as stack:
    yield lambda n, **kw: stack.enter_context(kernel_settings(n, programs=programs, **kw))

def applied_opts(fn, *inputs: Tensor) -> tuple[list[tuple], np.ndarray]:
  jit = TinyJit(lambda *xs: fn(*xs).realize())
  for _ in range(3): out = jit(*inputs)
  return [prg.src[0].arg.applied_opts for prg in jit_programs(jit)], out.numpy()

@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_matvec_rows_upcast_and_exact(t: T, row_upcast, rng: np.random.Generator):
  rows, cols = {T.Q4_1: (200, 96), T.Q8_0: (104, 160)}[t]
  row_upcast(8)
  raw = random_blocks(t, (rows, cols), rng, scale=0.1)
  lin = QuantLinear(QTensor.from_bytes(raw, t, (rows, cols)))
  x = rng.standard_normal((1, cols)).astype(np.float32)
  [opts], got = applied_opts(lin, Tensor(x))
  assert opts[0] == Opt(OptOps.UPCAST, 0, 8) and Opt(OptOps.UNROLL, 1, 4) in opts
  w = quants.dequantize(raw, t).reshape(rows, cols).astype(np.float64)
  np.testing.assert_array_less(np.abs(got - x @ w.T), 2e-5 * (np.abs(x) @ np.abs(w).T) + 1e-30)

def test_off_leaves_tinygrads_heuristic(row_upcast, rng: np.random.Generator):
  row_upcast(8)
  row_upcast(0)
  raw = random_blocks(T.Q4_0, (136, 64), rng)
  [opts], _ = applied_opts(QuantLinear(QTensor.from_bytes(raw, T.Q4_0, (136, 64))), Tensor.randn(1, 64))
  assert not any(o.op is OptOps.UPCAST and o.arg == 8 for o in opts)

def test_other_reduces_left_alone(row_upcast):
  """A row sum reads no broadcast input and a dot has no row axis: neither is a matvec."""
  row_upcast(8)
  for fn, x in [(lambda a: a.sum(axis=1), Tensor.randn(88, 40)), (lambda a: (a * a).sum(), Tensor.randn(232))]:
    [opts], _ = applied_opts(fn, x)
    assert not any(o.op is OptOps.UPCAST and o.arg == 8 for o in opts)

def test_the_environment_forces_gpu_sizes_unless_a_sweep_does(monkeypatch):
  monkeypatch.setenv("TINYZOO_GPU_MATVEC", "16,4,4")
  assert kernel_settings(8).heuristic.forced == (16, 4, 4) and kernel_settings(8, forced=(8, 8, 1)).heuristic.forced == (8, 8, 1)
  monkeypatch.setenv("TINYZOO_GPU_MATVEC", "16,4")
  with pytest.raises(ValueError, match="GPU matvec sizes are THREADS,ROWS_PER_GROUP,ROWS_PER_THREAD"): kernel_settings(8)

@pytest.mark.parametrize("bad", [-8, 3, 12])
def test_bad_setting(bad: int, row_upcast):
  with pytest.raises(ValueError, match="power of two"): row_upcast(bad)

def cuda_renderer():
  """tinygrad's CUDA renderer without its compiler (no nvrtc here): enough to optimize, linearize and read launch sizes."""
  from tinygrad.codegen.opt import tc
  from tinygrad.helpers import Target
  from tinygrad.renderer.cstyle import CStyleLanguage, CUDARenderer
  r = CUDARenderer.__new__(CUDARenderer)
  CStyleLanguage.__init__(r, Target(device="CUDA", renderer="CUDA", arch="sm_90", interface="CUDA"))
  r.tensor_cores = tc.get_cuda("sm_90")
  return r

def cuda_sink(out: Tensor):
  """The one kernel computing `out`, optimized for the CUDA renderer."""
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.uop.ops import Ops
  (ast,) = [c.src[0] for c in out.schedule_linear().src if c.src[0].op is Ops.SINK]
  return full_rewrite_to_sink(ast, cuda_renderer())

def sink_launch(sink) -> tuple[tuple, tuple]:
  """An optimized kernel's (cuda_sink's) global and local sizes."""
  from tinygrad.uop.ops import ProgramInfo
  info = ProgramInfo.from_sink(sink, cuda_renderer().target)
  return tuple(info.global_size), tuple(info.local_size)

def cuda_launch(out: Tensor) -> tuple[tuple, tuple]: return sink_launch(cuda_sink(out))

def cuda_kernels(out: Tensor, reduces_only: bool = False) -> list[str]:
  """The CUDA source of each kernel computing `out` (its helpers included), variables allowed; with `reduces_only` of
  those that reduce only (no other takes tensor cores), the rest not compiled."""
  from tinygrad.codegen import full_rewrite_to_sink, line_rewrite, pm_linearize_cleanups
  from tinygrad.codegen.late.linearizer import linearize
  from tinygrad.uop.ops import Ops
  linear, _ = out.linear_with_vars()
  asts = [a for c in linear.src if (a := c.src[0]).op is Ops.SINK and (not reduces_only or any(u.op is Ops.REDUCE for u in a.toposort()))]
  return [cuda_renderer().render(line_rewrite(linearize(full_rewrite_to_sink(a, cuda_renderer())), pm_linearize_cleanups)) for a in asts]

def cuda_sources(out: Tensor) -> str: return "\n".join(cuda_kernels(out))


def sink_source(sink) -> str:
  """An optimized kernel's (cuda_sink's) CUDA source."""
  from tinygrad.codegen import line_rewrite, pm_linearize_cleanups
  from tinygrad.codegen.late.linearizer import linearize
  return cuda_renderer().render(line_rewrite(linearize(sink), pm_linearize_cleanups))

def cuda_source(out: Tensor) -> str: return sink_source(cuda_sink(out))

@pytest.mark.parametrize("rows,cols,local", [(1024, 2048, (32, 4, 1)), (256, 8192, (128, 1, 1)), (256, 512, (8, 16, 1)), (2048, 1408, (22, 4, 1))])
def test_gpu_int8_dot_matvecs_get_a_row_a_thread_in_workgroups_of_128(rows: int, cols: int, local: tuple, row_upcast, rng: np.random.Generator):
  """An int8_dot matvec (its dp4a a custom op) gets sizes of its own: two blocks of a row a thread, at most 128 threads a
  row, one row a thread, workgroups of at least 128 threads (integer_gpu_sizes), of as many rows as divide the rows (44
  blocks a row: 22 threads, 4 rows, where 5 rows, not a divisor of 2048, had left the kernel to tinygrad's heuristic)."""
  from quant.int8_dot import Int8Rows, int8_dot
  from quant.words import WordBlocks
  row_upcast(8)
  words = WordBlocks.from_blocks(QTensor.from_bytes(random_blocks(T.Q4_0, (rows, cols), rng), T.Q4_0, (rows, cols)))
  xq = Int8Rows.quantize(Tensor(rng.standard_normal((1, cols), dtype=np.float32)))
  xq.blocks.realize()
  assert cuda_launch(int8_dot(words, xq)) == ((rows // local[1], 1, 1), local)

@pytest.mark.parametrize("t,rows,local,rows_per_thread", [(T.Q4_0, 1024, (64, 1, 1), 4), (T.Q8_0, 1024, (64, 1, 1), 1),
                                                           (T.Q4_0, 16384, (16, 4, 1), 4)], ids=["Q4_0", "Q8_0", "Q4_0-tall"])
def test_gpu_matvec_splits_each_row_over_threads(t: T, rows: int, local: tuple, rows_per_thread: int, row_upcast, rng: np.random.Generator):
  """On a GPU a packed-dot row's blocks go to several threads (GROUP: more for fewer rows) and a workgroup holds 64
  threads; without the opts tinygrad gives one thread 4 whole rows, whose loads never coalesce."""
  cols = 2048
  row_upcast(8)
  lin = QuantLinear(QTensor.from_bytes(random_blocks(t, (rows, cols), rng), t, (rows, cols)))
  x = Tensor(rng.standard_normal((1, cols), dtype=np.float32)).realize()
  global_size, local_size = cuda_launch(lin(x))
  assert local_size == local and global_size == (rows // (local[1] * rows_per_thread), 1, 1)
  row_upcast(0)
  assert cuda_launch(lin(x + 0))[1] != local, "tinygrad's own heuristic does not group the rows"

def test_gpu_sizes_tuned_per_kernel_shape_and_forced(row_upcast, rng: np.random.Generator):
  """A tuned table gives its kernel shape its own sizes; forced sizes (a sweep) win over it; other shapes keep the rule."""
  rows, cols = 1024, 2048
  row_upcast(8)
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (rows, cols), rng), T.Q4_0, (rows, cols)))
  x = Tensor(rng.standard_normal((1, cols), dtype=np.float32)).realize()
  shapes = row_upcast(8).heuristic.compiled_shapes
  assert cuda_launch(lin(x))[1] == (64, 1, 1) and len(shapes) == 1
  tuned = row_upcast(8, tuned={shapes[0]: (32, 2, 2)})
  assert cuda_launch(lin(x))[1] == (32, 2, 1) and tuned.heuristic.untuned_shapes() == []
  with kernel_settings(8, tuned={shapes[0]: (32, 2, 2)}, forced=(8, 8, 1)): assert cuda_launch(lin(x))[1] == (8, 8, 1)
  other = row_upcast(8, tuned={"1x2x3": (32, 2, 2)})
  assert cuda_launch(lin(x))[1] == (64, 1, 1) and other.heuristic.untuned_shapes() == shapes

def test_gpu_matvec_span_sets_the_words_each_thread_reads(row_upcast, rng: np.random.Generator):
  """A fourth size (the span) gives each thread that many words of a block: a whole Q4_0 block by default (one 16-byte
  load a row), else the threads of one block's words are neighbours (threadIdx.x) and the rest go to the blocks, the
  threads per row staying the first size (or the threads of a block's words, where those are more)."""
  rows, cols = 512, 2048
  row_upcast(8)
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (rows, cols), rng), T.Q4_0, (rows, cols)), strategy="packed_words")
  x = Tensor(rng.standard_normal((1, cols), dtype=np.float32)).realize()
  for sizes, load, local in (((16, 4, 2), "uint4", (16, 4, 1)), ((16, 4, 2, 4), "uint4", (16, 4, 1)), ((16, 4, 2, 2), "uint2", (2, 8, 4)),
                             ((16, 4, 2, 1), "uint", (4, 4, 4)), ((2, 4, 2, 1), "uint", (4, 4, 1))):
    with kernel_settings(8, forced=sizes):
      sink = cuda_sink(lin(x * sum(sizes)))
      src, (global_size, local_size) = sink_source(sink), sink_launch(sink)
    assert f"{load} val" in src and local_size == local and global_size == (rows // (4 * 2), 1, 1), sizes
    assert all(f"{other} val" not in src for other in ("uint4", "uint2", "uint") if other != load), sizes

def test_gpu_matvec_of_a_row_one_span_long(row_upcast, rng: np.random.Generator):
  """A row of one Q8_0 block is one thread's span: nothing is left to split over threads, and the kernel still compiles
  with the rows split (a failing opt inside tinygrad's compile loop surfaces as a KeyError far from its cause)."""
  row_upcast(8)
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q8_0, (256, 32), rng), T.Q8_0, (256, 32)), strategy="packed_words")
  x = Tensor(rng.standard_normal((1, 32), dtype=np.float32)).realize()
  with kernel_settings(8, forced=(16, 4, 4)): assert cuda_launch(lin(x)) == ((16, 1, 1), (4, 1, 1))

def test_gpu_matvec_keeps_a_folded_norms_squares_in_the_thread(row_upcast, rng: np.random.Generator):
  """A folded norm's output axis (dot or squares, which no input is indexed by) is upcast: one workgroup computes both
  for its rows, rather than a second set of workgroups summing only squares."""
  rows, cols = 1024, 2048
  row_upcast(8)
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (rows, cols), rng), T.Q4_0, (rows, cols)), strategy="packed_words")
  x, g = (Tensor(rng.standard_normal(s, dtype=np.float32)).realize() for s in ((1, cols), (cols,)))
  with kernel_settings(8, forced=(64, 1, 4)):
    assert cuda_launch(lin.words.dot_and_squares(x, g)) == cuda_launch(lin(x * 5)) == ((rows // 4, 1, 1), (64, 1, 1))

@pytest.mark.parametrize("rows", [32, 576, 1536, 2048, 3072, 8192, 32768])
@pytest.mark.parametrize("steps", [20, 64, 256, 1024])
@pytest.mark.parametrize("word", [0, 4, 8])
def test_builtin_gpu_sizes_fill_workgroups_and_the_gpu(rows: int, steps: int, word: int):
  """Every rule's sizes make workgroups of 64 threads at most (or a row's threads, where more) and at least one row a
  thread; a flat reduce (word 0)
  doubles the threads a row from 16 until the kernel launches GPU_MATVEC_THREADS of them or they reach a row's steps
  (128 at most: gpu_matvec GROUPs the most of them that divide the steps); a packed_words thread reads SPAN_ELEMENTS
  elements of a row a step, never more threads on a row than it has steps to share, half as many elements at 2048 rows
  or fewer, where it also takes half the rows."""
  for inner in (1, 32):
    threads, block, per_thread, *span = builtin_gpu_sizes(rows, steps, inner, word)
    assert threads * block <= max(64, threads) and per_thread >= 1 and threads <= 128, (threads, block, per_thread)
    if word:
      assert span == [max(1, 16 // (2 if rows <= 2048 else 1) // word)] and threads <= max(1, steps // span[0])
      assert per_thread == (2 if rows <= 2048 else 4)
    else:
      assert rows // per_thread * threads >= GPU_MATVEC_THREADS or threads >= min(128, steps), (threads, per_thread)
      assert threads == 16 or rows // per_thread * threads // 2 < GPU_MATVEC_THREADS and threads // 2 < min(128, steps)

def test_gpu_matvec_groups_a_divisor_of_the_blocks(row_upcast, rng: np.random.Generator):
  """640 columns are 20 Q4_0 blocks: 4 threads for a block's words times 10 for the blocks share a row (16, the rest
  of 64, would not divide 20; halving would stop at 4)."""
  row_upcast(8)
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (1536, 640), rng), T.Q4_0, (1536, 640)), strategy="packed_words")
  assert cuda_launch(lin(Tensor(rng.standard_normal((1, 640), dtype=np.float32)).realize()))[1] == (4, 10, 1)

def test_gpu_matvec_splits_moe_expert_rows(row_upcast, rng: np.random.Generator):
  """A MoE expert matmul has a second output axis (the experts a token uses); its rows still go to threads in groups
  (tinygrad's own rule gave gpt-oss-20b's experts one thread per 12 outputs: 5 tok/s on an H100)."""
  row_upcast(8)
  experts = QuantExperts(QTensor.from_bytes(random_blocks(T.MXFP4, (8, 2880, 2880), rng), T.MXFP4, (8, 2880, 2880)))
  x = Tensor(rng.standard_normal((1, 1, 1, 2880), dtype=np.float32)).realize()
  sel = Tensor([[[1, 5, 7, 2]]], dtype=dtypes.int32).realize()
  assert cuda_launch(experts(x, sel)) == ((720, 4, 1), (90, 1, 1))   # 90 blocks a row, 90 threads; 4 rows a thread; 4 experts

def test_gpu_matvec_unrolls_each_sum_inside_a_word(row_upcast, rng: np.random.Generator):
  """A Q4_0 packed_words matvec has two sums inside a word (its products and x's sum): both are unrolled, so every
  nibble is shifted by a constant (the first one 19 bits up, to the top of a 1.0's mantissa) and no loop walks a
  word's bytes; a mixed MoE matvec keeps its experts a loop (unrolled, gpt-oss's down experts spilled)."""
  row_upcast(8)
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q4_0, (1024, 1536), rng), T.Q4_0, (1024, 1536)), strategy="packed_words")
  with kernel_settings(8, forced=(64, 1, 4, 2)): src = cuda_source(lin(Tensor(rng.standard_normal((1, 1536), dtype=np.float32)).realize()))
  assert "<<19u)&7864320u)|1065353216u" in src and "< 4;" not in src
  experts = QuantExperts(QTensor.from_bytes(random_blocks(T.MXFP4, (8, 1472, 1472), rng), T.MXFP4, (8, 1472, 1472)), strategy="packed_words")
  x = Tensor(rng.standard_normal((1, 1, 4, 1472), dtype=np.float32)).realize()
  sel, mix = Tensor([[[1, 5, 7, 2]]], dtype=dtypes.int32).realize(), Tensor([[[0.1, 0.2, 0.3, 0.4]]]).realize()
  loops = [line for line in cuda_source(experts.mixed(x, sel, mix)).splitlines() if "for (" in line]
  assert "< 4;" in loops[0] and "< 23;" in loops[1]   # the 4 experts around each thread's 23 steps of a row

def test_gpu_matvec_of_a_routers_few_float_rows(row_upcast, rng: np.random.Generator):
  """A MoE router (GPT-OSS: 32 rows of 2880 F32) is a matvec too: a row a workgroup, its columns over 120 threads that
  load whole words four steps at a time. tinygrad's heuristic gave it 16 threads a row, each loading 180 columns byte
  by byte, one after the other (25 us of an H100's decode step a block)."""
  row_upcast(8)
  rows, cols = 32, 2880
  raw = rng.standard_normal((rows, cols), dtype=np.float32)
  lin = QuantLinear(QTensor.from_bytes(raw, T.F32, (rows, cols)), Tensor(rng.standard_normal(rows, dtype=np.float32)).realize())
  x = Tensor(rng.standard_normal((1, cols), dtype=np.float32)).realize()
  sink = cuda_sink(lin(x))
  assert sink_launch(sink) == ((32, 1, 1), (120, 1, 1))
  src = sink_source(sink)
  assert "unsigned char" not in src and [line for line in src.splitlines() if "for (" in line][0].endswith("< 6; Ridx0++) {")
  row_upcast(0)
  assert cuda_launch(lin(x * 2))[1] == (16, 1, 1), "tinygrad's own heuristic"

@pytest.mark.parametrize("n,threads,loop", [(2048, 256, "< 2;"), (8192, 256, "< 8;"), (2880, 240, "< 3;")])
def test_gpu_full_reduce_over_many_threads(n: int, threads: int, loop: str, row_upcast, rng: np.random.Generator):
  """A sum down to one value (a norm's sum of squares; the argmax's last max is one over 8192 keys) is split over up
  to 256 threads, each loading 4 values at a time; tinygrad's heuristic gave it 16 threads walking 1/16 each."""
  row_upcast(8)
  x = Tensor(rng.standard_normal(n, dtype=np.float32)).realize()
  assert cuda_launch((x * x).sum()) == ((1, 1, 1), (threads, 1, 1))
  assert loop in [line for line in cuda_source((x * x).max()).splitlines() if "for (" in line][0]

def test_gpu_matvec_unrolls_a_threads_steps_up_to_a_budget(row_upcast, rng: np.random.Generator):
  """The steps a thread takes along its rows are unrolled, so that all their loads are in flight at once (Llama's down
  matvec 909 -> 1265 GB/s on an H100), while the weights unrolled for all of a thread's rows stay within UNROLL_ELEMENTS:
  a Q4_0 thread of 4 rows and 16 elements a step unrolls both its 2 steps (8 weight loads, no loop before the tail); a
  thread of 2 rows and 8 elements a step unrolls 4 of its 16 (a loop of 4); Q8_0 with 4 rows and 16 elements, 2 of 4."""
  row_upcast(8)
  for t, (rows, cols), sizes, loads, loop in ((T.Q4_0, (8192, 2048), (64, 1, 4, 2), 8, None), (T.Q4_0, (2048, 8192), (64, 1, 2, 1), 8, 4),
                                               (T.Q8_0, (2048, 4096), (64, 1, 4, 4), 8, 2)):
    lin = QuantLinear(QTensor.from_bytes(random_blocks(t, (rows, cols), rng), t, (rows, cols)), strategy="packed_words")
    with kernel_settings(8, forced=sizes): src = cuda_source(lin(Tensor(rng.standard_normal((1, cols), dtype=np.float32)).realize()))
    body = src.split("__syncthreads")[0]
    assert sum(line.count("data1_") for line in body.splitlines() if " val" in line) == loads, (t, sizes)
    loops = [line.split(";")[1].strip() for line in body.splitlines() if "for (" in line]
    assert [bound.split(" < ")[1] for bound in loops] == ([] if loop is None else [str(loop)]), (t, sizes)

def _gate_up_pairs(rows: int, cols: int, rng: np.random.Generator, device: str | None = None) -> tuple[QuantLinear, np.ndarray, Tensor]:
  raw = random_blocks(T.Q4_0, (2 * rows, cols), rng)
  lin = QuantLinear(QTensor.from_bytes(raw, T.Q4_0, (2 * rows, cols), device), strategy="packed_words")
  x = rng.standard_normal((1, cols), dtype=np.float32)
  return lin, (x.astype(np.float64) @ quants.dequantize(raw, T.Q4_0).reshape(2 * rows, cols).T.astype(np.float64))[0], Tensor(x, device=device)

def test_gpu_matvec_of_gate_and_up_pairs(row_upcast, rng: np.random.Generator):
  """A product over each gate and up row pair (an activation computed by the joined matmul's kernel): the pair is
  unrolled in the thread and the sum inside it split over threads like a matvec's, at half the rows a thread (a row is
  two sums); the activation follows the group sum in the same kernel."""
  from ops.activations import swiglu
  rows, cols = 1024, 2048
  row_upcast(8)
  lin, _, x = _gate_up_pairs(rows, cols, rng)
  threads, block, per_thread, _ = builtin_gpu_sizes(rows, 256, 1, 8, pairs=1)
  assert per_thread == builtin_gpu_sizes(rows, 256, 1, 8)[2] // 2
  sink = cuda_sink(swiglu.of_pairs(lin(x).unflatten(-1, (2, rows))))
  global_size, local_size = sink_launch(sink)
  assert global_size == (rows // (block * per_thread), 1, 1) and prod(local_size) == threads * block
  src = sink_source(sink)
  assert src.count("__global__") == 1 and "__shared__" in src and "exp2" in src and "for (" not in src.split("__syncthreads")[0]

def test_gpu_matvec_of_expert_pairs_takes_a_word_a_thread_and_two_rows(row_upcast, rng: np.random.Generator):
  """A MoE's gate and up experts with their activation in the kernel (act_in_matmul): 32 threads a row, each a word of
  a block (4 lanes a block, 8 blocks), 2 rows a workgroup and 2 pairs of rows a thread, for each expert used. The rule
  for a dense matmul's pairs (64 threads, 2 words each) ran Mixtral's at 564 GB/s on an H100 where these sizes reach
  1,402 (the journal's gemv records)."""
  from ops.activations import swiglu
  from quant.matvec_opts import EXPERT_PAIR_THREADS
  row_upcast(8)
  F, D, K = 256, 1024, 2
  experts = QuantExperts(QTensor.from_bytes(random_blocks(T.Q4_0, (8, 2 * F, D), rng), T.Q4_0, (8, 2 * F, D)), strategy="packed_words")
  x = Tensor(rng.standard_normal((1, 1, 1, D), dtype=np.float32)).realize()
  sel = Tensor([[[3, 6]]], dtype=dtypes.int32).realize()
  assert builtin_gpu_sizes(14336, 512, 1, 8, pairs=1, experts=True) == (EXPERT_PAIR_THREADS, 2, 2, 1)
  assert cuda_launch(swiglu.of_pairs(experts(x, sel).unflatten(-1, (2, F)))) == ((F // 4, K, 1), (4, 8, 2))

def test_gpu_matvec_of_a_prompt_chunks_combine_with_routing_skipped(row_upcast, rng: np.random.Generator):
  """With the routing's choice skipped (first_k: indices from an arange) a prompt chunk's combine (ExpertGroups) computes
  its slots in the kernel, which is taken for a matvec; an earlier opt took one of its short sums whole, and the last
  unroll loop looked for the gone axis (ValueError: not in list, glm-4.7-flash-tiny --skip topk --prefill half)."""
  from ops.routing import ExpertGroups
  from ops.topk import first_k
  row_upcast(8)
  weights, sel = first_k(Tensor(rng.standard_normal((1, 12, 8), dtype=np.float32)).realize(), 2)
  groups = ExpertGroups.of(sel, 8, 32)
  y = Tensor(rng.standard_normal((groups.row.shape[0], 128), dtype=np.float32)).realize()
  assert cuda_launch(groups.combine(y, weights.realize())) == ((2, 12, 1), (2, 32, 1))

def test_gpu_prompt_chunk_moe_with_routing_skipped_compiles():
  """GLM's MoE over a prompt chunk with the routing's choice skipped (first k experts): a kernel's two reduces share a
  short range, which the rule for sums in short reduces unrolled twice (ValueError: not in list, moe-isolation's first k
  experts on the H200)."""
  from models.catalog import resolve_model
  from models.runtime import Runtime
  from profiles.hints import resolve
  hints = resolve({"skip": "topk", "prefill": "half", "prefill_chunk": 64, "expert_tile": 32})
  rt = Runtime(resolve_model("glm-4.7-flash-tiny"), hints, max_context=64)
  with kernel_settings(8): kernels = cuda_kernels(rt.model.blocks[-1].ffn(Tensor.empty(1, 64, rt.cfg.dim).realize()))
  assert sum("mma.sync" in src for src in kernels) >= 2

def test_gpu_matvec_of_pairs_splits_a_split_axis(row_upcast, rng: np.random.Generator):
  """Llama-3.2-1B's gate and up pairs at the H100 profile's 32,2,2,2: the span splits the blocks' axis before GROUP,
  and the sum over its other part is no reduce around the GROUP (a check that took it for one fell back to tinygrad's
  heuristic: 3.18 ms a token on the H100 against 0.81, 2bf9c91)."""
  from ops.activations import swiglu
  rows = 8192
  row_upcast(8)
  lin, _, x = _gate_up_pairs(rows, 2048, rng)
  with kernel_settings(8, forced=(32, 2, 2, 2)):
    opts = cuda_sink(swiglu.of_pairs(lin(x).unflatten(-1, (2, rows)))).arg.applied_opts
  assert [o.arg for o in opts if o.op is OptOps.GROUP] == [2, 16], opts

def test_gpu_matvec_of_pairs_is_right_with_workgroups(row_upcast, rng: np.random.Generator):
  """The pair kernel's GROUP sits inside the unrolled product, a split tinygrad's opts refuse and matvec_opts makes
  directly: run on tinygrad's PYTHON device (an emulator with workgroups and shared memory) against float64, over 8
  rows (a workgroup each), which get the opts 64 do."""
  from ops.activations import swiglu
  rows, cols = 8, 512
  row_upcast(8)
  lin, want, x = _gate_up_pairs(rows, cols, rng, "PYTHON")
  Tensor.realize(*lin.device_tensors)   # the words, which the captured call would run as its own kernels otherwise
  jit = patches.capturing_jit(lambda x: swiglu.of_pairs(lin(x).unflatten(-1, (2, rows))).realize())
  got = jit(x).numpy()[0]
  [opts] = [prg.src[0].arg.applied_opts for prg in jit_programs(jit)]
  assert [o.arg for o in opts if o.op is OptOps.GROUP] and Opt(OptOps.UNROLL, 6, 0) in opts, opts
  g, u = want[:rows], want[rows:]
  np.testing.assert_allclose(got, g / (1 + np.exp(-g)) * u, rtol=1e-4, atol=1e-4 * np.abs(g * u).max())

def _normed_attention(device: str | None, D: int, rng: np.random.Generator):
  """A decode step's attention with q and k normalized where read and softmax self (Gemma 3 with layout rows) over a
  cache of two chunks, as a function of (q, position), and its float64 reference at a position."""
  from ops.attention import CHUNK, fused_attention
  from ops.rope import rope_tables
  from tests.ops.test_attention import ref_normed_attention
  Hq, L = 2, 2 * CHUNK
  q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, Hq, 1, D), (1, 1, L, D), (1, 1, L, D)))
  wq, wk = rng.standard_normal(D).astype(np.float32), rng.standard_normal(D).astype(np.float32)
  cos, sin = rope_tables(D, 10000.0, L)
  kt, vt, wqt, wkt = (Tensor(a, device=device).realize() for a in (k, v, wq, wk))
  ct, st = cos.to(device).realize(), sin.to(device).realize()
  def step(qq: Tensor, pos) -> Tensor:
    return fused_attention(qq, kt, vt, pos, scale=D ** -0.5, q_rope=(ct[pos:pos + 1], st[pos:pos + 1], False), q_norm=(wqt, 1e-6),
                     key_rope=(ct, st), k_norm=(wkt, 1e-6), softmax="self")
  def want(pos: int) -> np.ndarray: return ref_normed_attention(q, k, v, wq, wk, cos, sin, pos)
  return q, step, want

def test_gpu_normalized_logits_split_over_threads(row_upcast, rng: np.random.Generator):
  """The logits kernel of normalized q and k under softmax self sums over a pair (each key and the query's own) around a
  product (dot and squares) around one sum over the head: on the CUDA renderer the short reduces are unrolled and the
  sum GROUPed over 16 threads, where tinygrad's heuristic left each thread 64 positions' sums in turn (gemma3-270m on
  an H100: 60 us a layer)."""
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.uop.ops import Ops, UOp
  row_upcast(8)
  q, step, _ = _normed_attention(None, 256, rng)
  out = step(Tensor(q), UOp.variable("pos", 0, 126))
  logits = next(c.src[0] for c in out.schedule_linear().src if c.src[0].op is Ops.SINK)   # the first of its kernels
  opts = full_rewrite_to_sink(logits, cuda_renderer()).arg.applied_opts
  assert [o.arg for o in opts if o.op is OptOps.GROUP] == [16] and all(o.op in (OptOps.UNROLL, OptOps.GROUP) for o in opts), opts

def test_gpu_normalized_logits_are_right_with_workgroups(row_upcast, rng: np.random.Generator):
  """Those logits' GROUP sits inside the unrolled reduces (split directly, as tinygrad refuses it): on tinygrad's PYTHON
  device (workgroups and shared memory) the attention matches float64 at positions past a chunk: the first call
  captures the kernels, the second replays them."""
  from tinygrad.uop.ops import UOp
  row_upcast(8)
  q, step, want = _normed_attention("PYTHON", 128, rng)
  jit = patches.capturing_jit(lambda qq, pos: step(qq, pos).realize())
  qt = Tensor(q, device="PYTHON").realize()
  for pos in (66, 67):
    np.testing.assert_allclose(jit(qt, UOp.variable("pos", 0, 126).bind(pos)).numpy(), want(pos), rtol=1e-4, atol=1e-5)
  assert any(o.op is OptOps.GROUP for prg in jit_programs(jit) for o in prg.src[0].arg.applied_opts)

def _rotated_attention(device: str | None, D: int, rng: np.random.Generator):
  """A decode step's attention over a row cache of two chunks (keys rotated as read), two kv heads of four query heads
  of D elements each with a sink, softmax self (GPT-OSS with layout rows), as a function of (q, position), and its
  float64 reference."""
  from ops.attention import CHUNK, fused_attention
  from ops.rope import apply_rope, rope_tables
  from tests.ops.test_attention import ref_attention
  Hkv, G, L = 2, 4, 2 * CHUNK
  q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, Hkv * G, 1, D), (1, Hkv, L, D), (1, Hkv, L, D)))
  sinks = rng.standard_normal(Hkv * G).astype(np.float32)
  cos, sin = rope_tables(D, 10000.0, L)
  kt, vt, skt, ct, st = (t.to(device).realize() for t in (Tensor(k), Tensor(v), Tensor(sinks), cos, sin))
  def step(qq: Tensor, pos) -> Tensor:
    return fused_attention(qq, kt, vt, pos, scale=D ** -0.5, q_rope=(ct[pos:pos + 1], st[pos:pos + 1], False), key_rope=(ct, st),
                     sinks=skt, softmax="self")
  def want(pos: int) -> np.ndarray:
    k_rot = apply_rope(Tensor(k[:, :, :pos + 1]), cos[:pos + 1], sin[:pos + 1], False).numpy()
    q_rot = apply_rope(Tensor(q), cos[pos:pos + 1], sin[pos:pos + 1], False).numpy()
    return ref_attention(q_rot, k_rot, v[:, :, :pos + 1], pos, D ** -0.5, sinks=sinks)
  return q, step, want

def test_gpu_rotated_logits_share_each_key_over_the_query_group(row_upcast, rng: np.random.Generator):
  """The logits over rotated keys (a symbolic number of chunks among the outputs): on the CUDA renderer a thread takes
  one position for the four query heads of its group (each key loaded and rotated once for them), 8 threads a head's
  elements and 16 positions a workgroup (of the chunks' positions, which tinygrad merges into one axis), where
  tinygrad's heuristic ran gpt-oss-20b's as 6 workgroups (27 us a block on an H100); its loads index no division by
  the number of chunks (a flip of q or a key broadcast over it did)."""
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.uop.ops import Ops, UOp
  row_upcast(8)
  q, step, _ = _rotated_attention(None, 64, rng)
  out = step(Tensor(q), UOp.variable("pos", 0, 126))
  logits = next(c.src[0] for c in out.schedule_linear().src if c.src[0].op is Ops.SINK)   # the first of its kernels
  assert not any("//(" in b.src[1].get_idx().render() for b in logits.toposort() if b.op is Ops.INDEX)   # by constants only
  opts = full_rewrite_to_sink(logits, cuda_renderer()).arg.applied_opts
  assert Opt(OptOps.GROUP, 0, 8) in opts and Opt(OptOps.LOCAL, 1, 16) in opts and Opt(OptOps.UPCAST, 1, 4) in opts, opts

@pytest.mark.parametrize("softmax", ["max", "self"])
def test_gpu_row_cache_logits_share_each_key_over_the_query_group(softmax: str, row_upcast, rng: np.random.Generator):
  """The logits over a row cache (layout rows: each position's q, k and v projections, keys rotated as read) of several
  kv heads, split in parts: one key read for the query group, which takes the four query heads to a thread as over a
  cache per head (llama3.2-1b on an H100 had read each key four times, 445 tok/s at depth 16,384), and their loads
  index no division by the number of parts (the parts split from a symbolic count of chunks by a reshape named the
  query head in the kv head's index, (query head + 4 * kv head) // 4, a load for each query head)."""
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.uop.ops import Ops, UOp
  from ops.attention import CHUNK, KVCache, fused_attention
  from ops.rope import rope_tables
  row_upcast(8)
  Hkv, G, D, L = 8, 4, 64, 4 * CHUNK
  cache = KVCache(1, Hkv, L, D, q_width=Hkv * G * D, per_part=2)
  cos, sin = rope_tables(D, 10000.0, L)
  pos = UOp.variable("pos", 0, L - 1)
  q, k, v = cache.write_rows(Tensor(rng.standard_normal((1, 1, 2 * Hkv * G * D)).astype(np.float32)[..., :(G + 2) * Hkv * D]), pos)
  out = fused_attention(q.reshape(1, 1, Hkv * G, D).transpose(1, 2), k, v, pos, scale=D ** -0.5, q_rope=(cos[pos:pos + 1], sin[pos:pos + 1], False),
                        key_rope=(cos, sin), softmax=softmax, split=2)
  sinks = [c.src[0] for c in out.schedule_linear().src if c.src[0].op is Ops.SINK]
  logits = next(a for a in sinks if any(u.op is Ops.REDUCE for u in a.toposort()))   # the first with a sum, after the row's write
  assert not any("//(" in b.src[1].get_idx().render() for b in logits.toposort() if b.op is Ops.INDEX)   # by constants only
  opts = full_rewrite_to_sink(logits, cuda_renderer()).arg.applied_opts
  assert Opt(OptOps.UPCAST, 1, G) in opts, opts

def _lane_strides(sink, dtype) -> set[tuple]:
  """Of each load from a buffer of `dtype`: the step of its first element as the first thread index (threadIdx.x: a
  warp's neighbours) steps by one, every other index at 0, and the elements it loads (a vector's)."""
  from tinygrad.uop.ops import Ops
  lane = next(u for u in sink.toposort() if u.op is Ops.SPECIAL and u.arg == "lidx0")
  steps = set()
  for load in (u for u in sink.toposort() if u.op is Ops.LOAD):
    at = load.src[0]   # INDEX(buffer, index) for one element, SHRINK(buffer, first, end) for a vector
    if at.op not in (Ops.INDEX, Ops.SHRINK) or at.src[0].dtype != dtype: continue
    zero = {u: u.const_like(0) for u in at.src[1].toposort() if u.op in (Ops.SPECIAL, Ops.RANGE) or (u.op is Ops.PARAM and dtypes.is_int(u.dtype))}
    step = (at.src[1].substitute({**zero, lane: lane.const_like(1)}).simplify() - at.src[1].substitute(zero).simplify()).simplify()
    steps.add((step.arg if step.op is Ops.CONST else step.render(), load.shape[0] if load.shape else 1))
  return steps

@pytest.mark.parametrize("layout", ["heads", "rows"])
def test_gpu_split_attention_gives_a_warps_neighbours_neighbouring_elements(layout: str, row_upcast, rng: np.random.Generator):
  """A decode step's split attention over an fp16 cache (per head, and in rows beside q): in its logits and in its
  value sums the threads CUDA numbers first read neighbouring elements of the cache: a key's elements in the logits,
  a position's value columns in the value sums, two a thread, where the lanes that split a part's positions had come
  first and a warp's loads of the values had touched 8 positions of 8 bytes each (llama3.2-1b at depth 16,384)."""
  from tinygrad.codegen import full_rewrite_to_sink
  from tinygrad.uop.ops import Ops, UOp
  from ops.attention import CHUNK, KVCache, fused_attention
  from ops.rope import rope_tables
  row_upcast(8)
  Hkv, G, D, L = 8, 4, 64, 4 * CHUNK
  cos, sin = rope_tables(D, 10000.0, L)
  pos = UOp.variable("pos", 0, L - 1)
  x = lambda *s: Tensor(rng.standard_normal(s).astype(np.float32))
  if layout == "rows":
    cache = KVCache(1, Hkv, L, D, dtype=dtypes.float16, q_width=Hkv * G * D, per_part=2)
    q, k, v = cache.write_rows(x(1, 1, (G + 2) * Hkv * D), pos)
    q, key_rope = q.reshape(1, 1, Hkv * G, D).transpose(1, 2), (cos, sin)
  else:
    cache = KVCache(1, Hkv, L, D, dtype=dtypes.float16, per_part=2)
    (k, v), q, key_rope = cache.update(x(1, Hkv, 1, D), x(1, Hkv, 1, D), pos), x(1, Hkv * G, 1, D), None
  out = fused_attention(q, k, v, pos, scale=D ** -0.5, q_rope=(cos[pos:pos + 1], sin[pos:pos + 1], False), key_rope=key_rope,
                        softmax="self", split=2)
  sums = [s for c in out.schedule_linear().src if (s := c.src[0]).op is Ops.SINK and any(u.op is Ops.REDUCE for u in s.toposort())]
  logits, values = [r for s in sums if (r := _lane_strides(full_rewrite_to_sink(s, cuda_renderer()), dtypes.float16))]
  assert all(step == width for step, width in logits | values), (logits, values)   # one load apart
  assert values == {(2, 2)}, values   # two columns a thread

def test_gpu_rotated_logits_are_right_with_workgroups(row_upcast, rng: np.random.Generator):
  """That attention, sinks met at the query's own logit, on tinygrad's PYTHON device (workgroups and shared memory)
  against float64 at positions past a chunk: the first call captures the kernels, the second replays them."""
  from tinygrad.uop.ops import UOp
  row_upcast(8)
  q, step, want = _rotated_attention("PYTHON", 32, rng)   # the emulator runs each thread in Python: a narrower head, the same opts
  jit = patches.capturing_jit(lambda qq, pos: step(qq, pos).realize())
  qt = Tensor(q, device="PYTHON").realize()
  for pos in (66, 67):
    np.testing.assert_allclose(jit(qt, UOp.variable("pos", 0, 126).bind(pos)).numpy(), want(pos), rtol=1e-4, atol=1e-5)
  assert any(o.op is OptOps.LOCAL for prg in jit_programs(jit) for o in prg.src[0].arg.applied_opts)

def _split_latent_attention(H: int, rank: int, rope: int, split: int, device: str | None, rng: np.random.Generator):
  """A decode step's latent attention (DeepSeek-style: one kv head of rank + rope columns, H query heads) split in parts
  of `split` chunks over a cache of two parts, as a function of the position, and its float64 reference."""
  from ops.attention import CHUNK
  from ops.mla import mla_attention
  from tests.ops.test_attention import ref_attention
  L = 2 * split * CHUNK
  q, rows = rng.standard_normal((1, H, 1, rank + rope)).astype(np.float32), rng.standard_normal((1, L, rank + rope)).astype(np.float32)
  qt, rt = (Tensor(a, device=device).realize() for a in (q, rows))
  def step(pos) -> Tensor: return mla_attention(qt[..., :rank], qt[..., rank:], rt, rt[..., :rank], pos, scale=0.1, split=split)
  def want(pos: int) -> np.ndarray:
    kv = rows[:, None, :pos + 1]
    return ref_attention(q, kv, kv[..., :rank], pos, 0.1)
  return step, want

@pytest.mark.parametrize("heads, per_thread", [(16, 4), (20, 4)])
def test_gpu_split_latent_attention_keeps_few_sums_a_thread(heads: int, per_thread: int, row_upcast, rng: np.random.Generator):
  """DeepSeek-V2-Lite's (16 heads) and GLM-4.7-Flash's (20) latent attention split in parts, at the real width (512 +
  64): a thread's logits and value sums take the query heads of a position, up to 4 that divide them (the value sums
  for each of their columns; one each read each key 20 times; 10 or 16 left a thread summing them in turn, the
  kernel's time at depth 0: on an H100, a 4-block GLM-4.7-Flash took 0.87 ms a token at 10, 0.55 at 4), and a part's
  chunks stay a loop where unrolling them beside the heads would sum more than 128 terms a step: a thread's value sums
  take at most 128 exps (8 chunks of 4 steps for 4 heads; for 16 heads they had unrolled to 512, 112 us a block at
  depth 4,096 on an H100, at the profile's parts of 8 chunks)."""
  from tinygrad.uop.ops import UOp
  row_upcast(8)
  step, _ = _split_latent_attention(heads, 512, 64, 8, None, rng)
  sources = cuda_kernels(step(UOp.variable("pos", 0, 1023)))
  assert max(src.count("exp2(") for src in sources) <= 128
  for name in ("logits", "values"):
    src = next(s for s in sources if "buf0[" in s and ("exp2(" in s) == (name == "values"))
    assert f"buf0[{per_thread * (VALUE_COLUMNS if name == 'values' else 1)}]" in src, (name, src[:400])

def test_gpu_split_latent_attention_is_right_with_workgroups(row_upcast, rng: np.random.Generator):
  """That attention in parts of 4 chunks (each a loop of the value sums) on tinygrad's PYTHON device (workgroups and
  shared memory) against float64 at a position in the first part, where the kernels are captured, and two past it, their
  replays over two parts; for 12 heads (three threads of 4, where GLM-4.7-Flash's 20 are five), which get every kernel the
  opts 20 do (the emulator runs each thread in Python)."""
  from tinygrad.uop.ops import UOp
  row_upcast(8)
  step, want = _split_latent_attention(12, 16, 4, 4, "PYTHON", rng)
  jit = patches.capturing_jit(lambda pos: step(pos).realize())
  for pos in (3, 258, 259):
    np.testing.assert_allclose(jit(UOp.variable("pos", 0, 511).bind(pos)).numpy(), want(pos), rtol=1e-4, atol=1e-5, err_msg=f"pos {pos}")
  assert any(o.op is OptOps.UPCAST and o.arg == 4 for prg in jit_programs(jit) for o in prg.src[0].arg.applied_opts)

@pytest.mark.parametrize("rows, per_thread", [(5120, 4), (1536, 1)])
def test_gpu_folded_norm_halves_rows_only_for_small_kernels(rows: int, per_thread: int, row_upcast, rng: np.random.Generator):
  """A folded norm's pair (the dot and x's squares) is no pair of weight rows: a thread keeps the rows of the unfolded
  matvec above 2048 rows (gpt-oss-20b's folded q/k/v at 4 rows 336.7 tok/s on an H100, against 310.2 at 2) and takes
  half of them up to 2048 (gemma3-270m's 1536 at 1 row 1673.8, against 1388.3 at 2)."""
  from ops.norm import NormedInput
  row_upcast(8)
  cols = 512
  lin = QuantLinear(QTensor.from_bytes(random_blocks(T.Q8_0, (rows, cols), rng), T.Q8_0, (rows, cols)), strategy="packed_words")
  x, g = (Tensor(rng.standard_normal(s, dtype=np.float32)).realize() for s in ((1, cols), (cols,)))
  opts = cuda_sink(lin.normed(NormedInput(x, g, 1e-5))).arg.applied_opts
  upcasts = [o.arg for o in opts if o.op is OptOps.UPCAST and o.axis == 0]
  assert upcasts == ([per_thread] if per_thread > 1 else []), opts
  assert builtin_gpu_sizes(rows, 128, 1, 4)[2] == (per_thread if rows > 2048 else 2 * per_thread)

@pytest.mark.parametrize("tensor_cores", [True, False])
def test_gpu_prefill_gemm_uses_tensor_cores_unless_told_not_to(tensor_cores: bool, rng: np.random.Generator):
  """A prompt chunk's GEMM over half inputs (quant.linear.gemm) is left to tinygrad's heuristic, which puts it on
  Hopper's tensor cores (mma instructions); the `tensor_cores` setting off, it gets none."""
  from quant.linear import gemm
  x = Tensor(rng.standard_normal((512, 2048)).astype(np.float16)).realize()
  w = Tensor(rng.standard_normal((1024, 2048)).astype(np.float16)).realize()
  with kernel_settings(8, tensor_cores=tensor_cores): src = cuda_source(gemm(w, x, dtypes.float16))
  assert ("mma.sync" in src) == tensor_cores

def test_gpu_prompt_chunk_attention_values_on_tensor_cores(rng: np.random.Generator):
  """A prompt chunk's attention value sum in half (ops.attention.gemm_values) is a GEMM over a symbolic number of cached
  positions that tinygrad's heuristic still puts on tensor cores."""
  from tinygrad.uop.ops import UOp
  from ops.attention import CHUNK, gemm_values
  n = UOp.variable("n", 1, 16).bind(8)
  e = Tensor.empty(1, 8, 4, 512, 16, CHUNK).realize().shrink_to((1, 8, 4, 512, n, CHUNK))
  values = Tensor.empty(1, 8, 1, 1, 16, CHUNK, 64).realize().shrink_to((1, 8, 1, 1, n, CHUNK, 64))
  with kernel_settings(8): src = cuda_sources(gemm_values(e, values, None, dtypes.float16))
  assert "mma.sync" in src

@pytest.mark.parametrize("layout", ["heads", "rows"])
def test_gpu_prompt_chunk_fused_attention_logits_on_tensor_cores(layout: str):
  """A prompt chunk through fused_attention (q rotated where read; with the rows layout the cached keys too, and both
  normalized) at a symbolic start: its logits [kv heads, query rows, positions] are written by a tensor-core GEMM."""
  from tinygrad.uop.ops import UOp
  from ops.attention import fused_attention
  from ops.rope import rope_tables
  T, L, D, Hkv, G = 128, 512, 64, 2, 4
  start = UOp.variable("start_pos", 0, L - T).bind(64)
  cos, sin = rope_tables(D, 10000.0, L)
  q, k, v = Tensor.empty(1, Hkv * G, T, D).realize(), Tensor.empty(1, Hkv, L, D).realize(), Tensor.empty(1, Hkv, L, D).realize()
  rows = layout == "rows"
  norm = (Tensor.empty(D).realize(), 1e-6) if rows else None
  out = fused_attention(q, k, v, start, scale=D ** -0.5, q_rope=(cos[start:start + T], sin[start:start + T], False),
                        key_rope=(cos, sin) if rows else None, q_norm=norm, k_norm=norm, chunk_dtype=dtypes.float16)
  with kernel_settings(8): kernels = cuda_kernels(out)
  assert any("mma.sync" in src and f"float* data0_{Hkv * G * T * L}," in src for src in kernels)

def test_gpu_prompt_chunk_moe_gemms_on_tensor_cores():
  """A prompt chunk's MoE grouped by expert (ExpertGroups, QuantExperts.grouped) runs its two expert GEMMs on tensor cores,
  each reading its tiles' experts' weights where it loads them (no copy of them per tile), the gate and up GEMM too
  where the activation reads its two halves."""
  from gguf import GGMLQuantizationType
  from ops.routing import ExpertGroups
  from quant.qtensor import QTensor
  E, O, F, rows, k = 8, 512, 256, 128, 2
  def experts(out: int, inp: int) -> QuantExperts:
    blocks = Tensor.empty(E, out, inp // 32, 18, dtype=dtypes.uint8).realize()
    return QuantExperts(QTensor(blocks, GGMLQuantizationType.Q4_0, (E, out, inp)), strategy="packed_words", prefill="half")
  x, mix = Tensor.empty(1, rows, O).realize(), Tensor.empty(1, rows, k).realize()
  groups = ExpertGroups.of(Tensor.empty(1, rows, k, dtype=dtypes.int32).realize(), E, 32)
  gate_up = experts(2 * F, O).grouped(groups.rows(x), groups)
  h = (gate_up[..., :F].silu() * gate_up[..., F:]).contiguous()
  with kernel_settings(8): kernels = cuda_kernels(groups.combine(experts(O, F).grouped(h, groups), mix))
  assert sum("mma.sync" in src for src in kernels) == 2
  # the groups' own kernels, the gathered rows, two weight dequantizations, two GEMMs, the activation, the weighted sum
  assert len(kernels) < 15

def gemm_tiles(opts: list) -> list[tuple]:
  return [(o.op.name, o.arg) for o in opts if o.op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.THREAD)]

# the opts CPU_GEMM_TILE gives a GEMM whose sides and reduce its sizes divide
GEMM_TILE = [("UPCAST", CPU_GEMM_TILE[0]), ("UPCAST", CPU_GEMM_TILE[1]), ("UNROLL", CPU_GEMM_TILE[2])]

@pytest.mark.parametrize("t", [T.Q4_0, T.Q6_K], ids=lambda t: t.name)
def test_cpu_prompt_chunk_gemm_tiled_and_split_over_threads(t: T, row_upcast, rng: np.random.Generator):
  """A prompt chunk's float GEMM (quant.linear.gemm) gets CPU_GEMM_TILE's register tile (chunk rows by weight rows, steps
  of the sum unrolled), its weight rows split over the cores; tinygrad's heuristic upcast one side only."""
  from tinygrad.helpers import Context
  rows, cols = 96, 256
  row_upcast(8)
  raw = random_blocks(t, (rows, cols), rng, scale=0.1)
  lin = QuantLinear(QTensor.from_bytes(raw, t, (rows, cols)), prefill="float")
  x = rng.standard_normal((1, 16, cols)).astype(np.float32)
  with Context(NUM_CPU_THREADS=2): programs, got = applied_opts(lin, Tensor(x))
  assert [*GEMM_TILE, ("THREAD", 2)] in [gemm_tiles(o) for o in programs], programs
  w = quants.dequantize(raw, t).reshape(rows, cols).astype(np.float64)
  np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4 * np.abs(x).sum(-1, keepdims=True).max())

def test_cpu_gemm_tiled_around_what_it_reads(row_upcast, rng: np.random.Generator):
  """The tile finds a GEMM's two sides whatever surrounds it: x computed from two inputs (a gated activation), a
  residual added to the sum, heads every input is indexed by (attention per kv head), a side of a symbolic length."""
  from tinygrad import UOp
  row_upcast(8)
  a, b, r = (Tensor(rng.standard_normal((16, 64)).astype(np.float32)).realize() for _ in range(3))
  w = Tensor(rng.standard_normal((64, 64)).astype(np.float32)).realize()
  [opts], got = applied_opts(lambda a, b, r, w: r + (a.silu() * b) @ w.T, a, b, r, w)
  assert gemm_tiles(opts)[:3] == GEMM_TILE, opts
  an, bn, rn, wn = (t.numpy().astype(np.float64) for t in (a, b, r, w))
  np.testing.assert_allclose(got, rn + (an / (1 + np.exp(-an)) * bn) @ wn.T, rtol=1e-4, atol=1e-4)
  q, k = (Tensor(rng.standard_normal((2, 24, 32)).astype(np.float32)).realize() for _ in range(2))
  [opts], got = applied_opts(lambda q, k: q @ k.transpose(-1, -2), q, k)
  assert gemm_tiles(opts)[:3] == GEMM_TILE, opts
  np.testing.assert_allclose(got, q.numpy() @ k.numpy().transpose(0, 2, 1), rtol=1e-4, atol=1e-4)
  n = UOp.variable("n", 1, 4)
  e, v = (Tensor(rng.standard_normal(s).astype(np.float32)).realize() for s in ((16, 32), (32, 32)))
  [opts], got = applied_opts(lambda e, m: e.shrink(((0, 16), (0, m * 8))) @ v.shrink(((0, m * 8), (0, 32))), e, n.bind(3))
  assert gemm_tiles(opts) == GEMM_TILE[:2] + [o for o in gemm_tiles(opts)[2:] if o[0] == "THREAD"], opts
  np.testing.assert_allclose(got, e.numpy()[:, :24] @ v.numpy()[:24], rtol=1e-4, atol=1e-4)

def test_gpu_prompt_chunk_moe_with_shared_experts_keeps_every_gemm_on_tensor_cores():
  """DeepSeek's MoE over a prompt chunk: the shared experts' GEMMs (gate and up, down) run on tensor cores beside the
  chosen experts' two, the shared down GEMM too, which the weighted sum over the chosen experts had taken into its
  kernel (two sums in one, no tensor cores)."""
  from models.catalog import resolve_model
  from models.runtime import Runtime
  from profiles.hints import resolve
  hints = resolve({"prefill": "half", "prefill_chunk": 64, "expert_tile": 32})   # a GPU's tile
  rt = Runtime(resolve_model("deepseek-v2-lite-tiny"), hints, max_context=64)
  moe = rt.model.blocks[-1].ffn
  assert moe.shared is not None
  with kernel_settings(8): kernels = cuda_kernels(moe(Tensor.empty(1, 64, rt.cfg.dim).realize()), reduces_only=True)
  assert sum("mma.sync" in src for src in kernels) == 4

def test_gpu_prompt_chunk_latent_expansion_on_tensor_cores():
  """DeepSeek's expanded latent attention over a prompt chunk at a symbolic start: the expansion of each cached position
  to every head's keys and values is a GEMM a head over a symbolic number of rows, on tensor cores like the chunk's
  logits, value sums and projections (six GEMMs). It had taken none: its reader split its rows by chunk, and the rule for
  decode's logits over a symbolic number of positions took it from tinygrad's tensor-core opts."""
  from tinygrad.uop.ops import UOp
  from models.catalog import resolve_model
  from models.runtime import Runtime
  from profiles.hints import resolve
  hints = resolve({"prefill": "half", "prefill_chunk": 64, "mla_prefill": "expanded"})
  rt = Runtime(resolve_model("deepseek-v2-lite-tiny"), hints, max_context=256)
  start = UOp.variable("start_pos", 0, 128).bind(64)
  with kernel_settings(8): kernels = cuda_kernels(rt.model.blocks[-1].attn(Tensor.empty(1, 64, rt.cfg.dim).realize(), start), reduces_only=True)
  assert sum("mma.sync" in src for src in kernels) == 6
