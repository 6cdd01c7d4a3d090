"""`tinyzoo gemm MODEL`: every GEMM shape of a prompt chunk of the model (each matmul's type, rows and columns, once,
its weights joined as the model joins them: q, k and v, gate and up), under each GEMM kernel of the `gemm` hint this
device runs, in JIT steady state as prefill runs it, the weights read as the model's strategy keeps them: tinygrad's
GEMM and mma's of fp16 weights take them dequantized first, mma decodes the words of Q4_0, Q8_0 and MXFP4 and the blocks
of Q4_K, Q6_K and Q5_0 itself; TFLOP/s count the dequantization in. A MoE's expert weights are timed in the grouped form a chunk's experts take
(ops/routing.py ExpertGroups: the chunk's choices of a random routing sorted into tiles of one expert each, every tile
reading its expert once); their TFLOP/s count the chosen rows' products, not the tiles' padding. Beside the dense ones
cuBLAS's fp16 GEMM on the same dequantized weights through torch, where torch sees a CUDA GPU, in the same run; and
each kernel's largest error against float64 numpy of the weights gguf.quants dequantizes."""
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Callable
import numpy as np
from gguf import quants as gguf_quants
from tinygrad import Device, Tensor, dtypes
from experiments import journal
from experiments.steady import steady_state
from ops import patches
from ops.cuda import GEMM_BLOCK_TYPES, GEMM_INT8_TYPES, GEMM_K_STEP, GEMM_WORD_TYPES, GEMMS, hint_refusal
from quant.formats import FORMATS
from quant.gguf_file import GGUFFile, TensorInfo
from quant.qtensor import QTensor, concat_rows
from ops.routing import ExpertGroups
from profiles.device import resolve_hints
from quant.linear import QuantExperts, QuantLinear, StrategyPlan
from quant.matvec_opts import runtime_settings

# a GEMM's largest error, relative to its output's largest value, that counts as correct: fp16 weights and inputs summed
# in float32 stay near 1e-3; a kernel that drops or repeats a tile is off by O(1)
GEMM_TOLERANCE = 1e-2

# the weights a model multiplies as one matmul over their joined rows where they share a GGML type: a block's q, k and v
# and its gate and up under the fuse hint (models/weights.py projections), its experts' gate and up always (models/moe.py)
JOINED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"), ("ffn_gate_exps", "ffn_up_exps"))

@dataclass(frozen=True)
class GemmShape:
  tensors: tuple[str, ...]   # the weights of the model's first matmul of this type and shape: one, or those it joins
  ggml_type: str
  n: int           # the matmul's rows (the joined weights' together): the GEMM's output columns
  k: int           # its columns: the sum's length
  experts: int = 0 # a MoE's expert weights: how many experts they hold (0: a dense weight)

  @property
  def label(self) -> str: return f"{self.ggml_type} {self.n}x{self.k}" + (f" x{self.experts} experts" if self.experts else "")

def _matmuls(g: GGUFFile, fuse: bool):
  """The file's weights as the model multiplies them, each matmul's (JOINED's of one type together) yielded at its first."""
  taken: set[str] = set()
  for name, t in g.tensors.items():
    if name in taken: continue
    members = [name]
    if m := re.fullmatch(r"(blk\.\d+\.)(\w+)\.weight", name):
      group = next((grp for grp in JOINED if m[2] in grp and (fuse or grp[0].endswith("_exps"))), ())
      same = [f"{m[1]}{part}.weight" for part in group]
      members = [n for n in same if n in g.tensors and g.tensors[n].ggml_type == t.ggml_type and n not in taken] or members
    taken.update(members)
    yield [g.tensors[n] for n in members]

def gemm_shapes(g: GGUFFile, fuse: bool = True) -> list[GemmShape]:
  """Each type and shape of the file's matmuls (weights of a packed or float type tinyzoo reads: 2-D dense ones, 3-D
  expert ones, joined as `_matmuls` does), once, dense first, largest first; a tied output projection (the embedding
  table read as a matmul) among them."""
  seen: dict[tuple, list[TensorInfo]] = {}
  for infos in _matmuls(g, fuse):
    t = infos[0]
    dense = len(t.shape) == 2 and (t.name != "token_embd.weight" or "output.weight" not in g.tensors)
    if t.ggml_type in FORMATS and (dense or (len(t.shape) == 3 and "_exps" in t.name)):
      seen.setdefault((t.ggml_type, *t.shape[:-2], sum(i.shape[-2] for i in infos), t.shape[-1]), infos)
  shapes = [GemmShape(tuple(i.name for i in infos), infos[0].ggml_type.name, sum(i.shape[-2] for i in infos), infos[0].shape[-1],
                      infos[0].shape[0] if len(infos[0].shape) == 3 else 0) for infos in seen.values()]
  return sorted(shapes, key=lambda s: (s.experts > 0, -s.n * s.k))

def _load(g: GGUFFile, shape: GemmShape) -> QTensor:
  """The shape's weights on the device, joined over their rows as the model loads them."""
  if len(shape.tensors) == 1: return g.load(shape.tensors[0])
  return concat_rows([(g.raw(n), g.tensors[n].shape) for n in shape.tensors], g.tensors[shape.tensors[0]].ggml_type)

def kernels_here(asked: list[str] | None) -> tuple[list[str], list[str]]:
  """The GEMM kernels to time and a line for each left out: every one this device runs, or the `asked` ones, of which
  one this device cannot run is refused (ValueError)."""
  refusals = {k: hint_refusal("gemm", k, Device.DEFAULT) for k in GEMMS}
  if asked is not None:
    if bad := [k for k in asked if k not in GEMMS]: raise ValueError(f"unknown GEMM kernel {bad[0]!r} (choose from {', '.join(GEMMS)})")
    if (why := next((refusals[k] for k in asked if refusals[k]), None)) is not None: raise ValueError(why)
    return asked, []
  return [k for k in GEMMS if refusals[k] is None], [f"{k}: {why}" for k, why in refusals.items() if why]

def _float64_weights(g: GGUFFile, shape: GemmShape) -> np.ndarray:
  def one(info: TensorInfo) -> np.ndarray:
    return gguf_quants.dequantize(np.asarray(g.raw(info.name)), info.ggml_type).reshape(*info.shape).astype(np.float64)
  return np.concatenate([one(g.tensors[n]) for n in shape.tensors], axis=-2)

def _cublas_tflops(w: Tensor, x: np.ndarray, iters: int) -> float | None:
  """cuBLAS's fp16 GEMM of x against the dequantized w through torch, TFLOP/s; None without torch or a CUDA GPU there."""
  try: import torch
  except ImportError: return None
  if not torch.cuda.is_available(): return None
  a = torch.from_numpy(x.astype(np.float16)).cuda()
  b = torch.from_numpy(w.cast(dtypes.float16).numpy()).cuda()
  for _ in range(3): a @ b.T
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  start.record()
  for _ in range(iters): a @ b.T
  end.record()
  torch.cuda.synchronize()
  return 2 * a.shape[0] * b.shape[0] * b.shape[1] / (start.elapsed_time(end) / iters * 1e-3) / 1e12

Measured = tuple[Callable[[Tensor], Tensor], Tensor, np.ndarray, int]   # the step, its input, the float64 answer, its products

def _dense(g: GGUFFile, shape: GemmShape, x: np.ndarray, kernel: str, strategy: StrategyPlan) -> Measured:
  """A dense weight's chunk GEMM under `kernel`, the weight read as the model's strategy keeps it (gemm mma decodes the
  words of packed_words itself): the step, its input, the float64 answer and its products."""
  lin = QuantLinear(w := _load(g, shape), strategy=strategy.for_weight(shape.tensors[0], w.ggml_type), prefill="half", gemm_kernel=kernel)
  return lin.gemm_of, Tensor(x).realize(), x.astype(np.float64) @ _float64_weights(g, shape).T, 2 * x.shape[0] * shape.n * shape.k

def _grouped(g: GGUFFile, shape: GemmShape, x: np.ndarray, kernel: str, strategy: str, rng: np.random.Generator, tile: int) -> Measured:
  """An expert weight's grouped GEMM of the chunk's rows under `kernel`, each row through `expert_used_count` experts drawn
  at random: the step (the rows gathered into their slots, then the GEMM), its input, the float64 answer of the held
  slots (0 for the padding) and the chosen rows' products."""
  used = g.require(f"{g.architecture}.expert_used_count")
  sel = np.stack([rng.choice(shape.experts, used, replace=False) for _ in range(x.shape[0])]).astype(np.int32)
  groups = ExpertGroups.of(Tensor(sel).realize(), shape.experts, tile)
  for t in (groups.slot, groups.row, groups.held, groups.tile_expert): t.realize()
  experts = QuantExperts(_load(g, shape), strategy=strategy, prefill="half", gemm_kernel=kernel)
  w, row, held, tile_expert = _float64_weights(g, shape), groups.row.numpy(), groups.held.numpy(), groups.tile_expert.numpy()
  rows64, want = x.astype(np.float64)[row], np.zeros((row.shape[0], shape.n))
  for t, e in enumerate(tile_expert):   # a tile's rows through its one expert (none for an empty tile: zeros)
    tile = slice(t * groups.tile, (t + 1) * groups.tile)
    if e >= 0: want[tile] = rows64[tile] @ w[e].T
  want *= held[:, None]
  step = lambda xt: experts.grouped(xt[groups.row], groups) * groups.held.unsqueeze(-1)
  return step, Tensor(x).realize(), want, 2 * x.shape[0] * used * shape.n * shape.k

def kernels_of(shape: GemmShape, kernels: list[str]) -> list[str]:
  """The kernels that take a shape's GEMM: tinygrad's alone for F32 weights (a GEMM of float32 inputs: MoE routers), sums
  not a whole number of mma's K steps and expert weights of a type whose words or blocks mma does not read; mma_int8
  only for the types whose words it reads."""
  if shape.ggml_type == "F32" or shape.k % GEMM_K_STEP or (shape.experts and shape.ggml_type not in {**GEMM_WORD_TYPES, **GEMM_BLOCK_TYPES}):
    return [k for k in kernels if k == "tinygrad"]
  return [k for k in kernels if k != "mma_int8" or shape.ggml_type in GEMM_INT8_TYPES]   # mma_int8 is mma's GEMM for the rest

def bench_gemms(path: os.PathLike, name: str, rows: int, kernels: list[str], iters: int, seed: int | None = None):
  """Yields a journal record for each GEMM shape of the model and each kernel that takes it (`gemm_shapes`,
  `kernels_of`), as each is measured, under the kernel settings the model's runtime compiles with on this device."""
  g, rng, hints = GGUFFile(path), np.random.default_rng(seed), resolve_hints(path, {})
  patches.install()
  with runtime_settings(hints):
    yield from _bench(g, path, name, rows, kernels, iters, rng, hints.expert_tile, StrategyPlan.parse(hints.strategy), hints.fuse)

def _bench(g: GGUFFile, path: os.PathLike, name: str, rows: int, kernels: list[str], iters: int, rng: np.random.Generator, tile: int,
           strategy: StrategyPlan, fuse: bool):
  for shape in gemm_shapes(g, fuse):
    # inputs that fp16 holds exactly: the error is the kernel's and the weights' fp16 rounding, not the input's
    x = rng.standard_normal((rows, shape.k)).astype(np.float16).astype(np.float32)
    cublas = None if shape.experts else _cublas_tflops(_load(g, shape).dequantize(), x, iters)
    read_as = strategy.for_weight(shape.tensors[0], g.tensors[shape.tensors[0]].ggml_type)
    for kernel in kernels_of(shape, kernels):
      step, xt, want, flops = _grouped(g, shape, x, kernel, read_as, rng, tile) if shape.experts else _dense(g, shape, x, kernel, strategy)
      err = float(np.abs(step(xt).numpy() - want).max() / max(np.abs(want).max(), 1e-30))
      m = steady_state(step, xt, iters=iters)
      yield {**journal.context(), "kind": "gemm", "model": name, "file": os.path.basename(path), "tensor": shape.tensors[0],
             **({"joined": list(shape.tensors)} if len(shape.tensors) > 1 else {}),
             "ggml_type": shape.ggml_type, "switches": {"gemm": kernel, "prefill": "half", "strategy": read_as},
             "metrics": {"rows": rows, "n": shape.n, "k": shape.k, "experts": shape.experts, "kernels": m.kernels, "ms": round(m.median_ms, 4),
                         "tflops": float(f"{flops / (m.median_ms * 1e-3) / 1e12:.4g}"), "rel_err": err, "correct": err <= GEMM_TOLERANCE,
                         "iters": iters},
             **({"peer": {"engine": "cuBLAS (torch, fp16 on the dequantized weights)", "tflops": round(cublas, 1)}} if cublas else {})}

def table_row(r: dict) -> str:
  m, peer = r["metrics"], r.get("peer", {}).get("tflops")
  shape = f"{m['n']}x{m['k']}" + (f" x{m['experts']}e" if m.get("experts") else "")
  return (f"{r['ggml_type']:<6} {shape:>18} {r['switches']['gemm']:<9} {m['kernels']:>7} {m['ms']:>9.3f} "
          f"{m['tflops']:>8.3g} {peer if peer is not None else '-':>8} {m['rel_err']:>9.1e}" + ("" if m["correct"] else "  WRONG"))

HEAD = f"{'type':<6} {'shape (N x K)':>18} {'kernel':<9} {'kernels':>7} {'ms':>9} {'TFLOP/s':>8} {'cuBLAS':>8} {'rel err':>9}"

def run(path: os.PathLike, name: str, rows: int, asked: list[str] | None, iters: int, on_record, out=print) -> None:
  """The command: the kernels this device runs (or the asked ones), a line for each left out, then a row a shape and
  kernel as measured."""
  if rows < 1 or iters < 1: raise ValueError(f"--rows and --iters must be at least 1, got {rows} and {iters}")
  kernels, left_out = kernels_here(asked)
  for line in left_out: out(f"left out: {line}")
  out(f"{name}: each GEMM of a {rows}-row prompt chunk on {journal.device_name()}, any dequantization in the timed "
      f"step (cuBLAS's: the GEMM alone, of weights dequantized before), median of {iters} JIT replays; rel err: the "
      "largest error over the output's largest value against float64")
  out(HEAD)
  t0 = time.perf_counter()
  for record in bench_gemms(path, name, rows, kernels, iters):
    on_record(record)
    out(table_row(record))
  out(f"({math.ceil(time.perf_counter() - t0)} s)")
