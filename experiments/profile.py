"""`tinyzoo profile`: one decode step kernel by kernel: its category, the block and module that made it (found from the
labelled weights and caches it reads), and its time where the backend can measure one kernel alone."""
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import statistics
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Callable
from tinygrad import Device
from tinygrad.device import Buffer
from tinygrad.engine.realize import ExecContext, get_call_arg_uops, get_graph_runtime, pm_exec
from tinygrad.uop.ops import Ops, UOp
from ops.kernels import CATEGORIES, Kernel, replay_kernels
from experiments.peer_llamacpp import ncu_us
from models.weights import LabelKind
from ops import patches
from experiments.steady import queued_steps

Labels = dict[Buffer, list[tuple[str, LabelKind]]]   # device buffer -> what it holds

@dataclass(frozen=True)
class KernelRow:
  index: int
  name: str
  category: str
  block: str                # "blk.3", or "embed", "head", "sampler" outside the blocks
  module: str               # what it reads that says what it is: "ffn_down", "attn_q+attn_k+attn_v", "kv_cache"; "-" when nothing
  reads: tuple[str, ...]    # every labelled weight or cache it touches
  us: float | None          # median time, or its batch's average when `batched`
  batched: bool
  weight_bytes: int = 0     # bytes of weights it reads (`weight_bytes`): with a time of its own, its bandwidth

def _buffer(u: UOp) -> Buffer | None:
  while u.op is not Ops.BUFFER and u.src: u = u.src[0]
  return u.buffer if u.op is Ops.BUFFER and isinstance(u.buffer, Buffer) else None

def buffer_labels(labels: list[tuple[str, LabelKind, object]]) -> Labels:
  """Device buffer -> the (name, kind) labels of the tensors it holds; a tied embedding is both a table and a matmul.
  Tensors never realized (the weights of a skipped component) are in no buffer."""
  out: Labels = {}
  for name, kind, t in labels:
    if (base := t.uop.base).op is Ops.BUFFER: out.setdefault(base.buffer, []).append((name, kind))  # type: ignore[attr-defined]
  return out

_PRIORITY: dict[str, int] = {"matmul": 0, "experts": 0, "cache": 1, "table": 2, "vector": 3}

def _elements(u: UOp) -> int:
  return math.prod(u.shape) if u.shape is not None and all(isinstance(d, int) for d in u.shape) else 0

def _nbytes(u: UOp) -> int | None:
  return math.prod(u.shape) * u.dtype.itemsize if u.shape is not None and all(isinstance(d, int) for d in u.shape) else None

def _contracts(k: Kernel) -> bool:
  """Whether a reduce combines two inputs, one of them much larger than its output (a GEMV over weights dequantized into
  a buffer by an earlier kernel, where no labelled weight is read), or two matrices along a long shared axis (a GEMM)."""
  if (prg := k.program) is None: return False
  args = get_call_arg_uops(k.call)
  ins = [n for i in prg.arg.ins if (n := _nbytes(args[prg.arg.globals[i]])) is not None]
  outs = [n for i in prg.arg.outs if (n := _nbytes(args[prg.arg.globals[i]])) is not None]
  if len(ins) < 2 or not outs: return False
  if max(ins) >= 16 * max(outs): return True
  # a GEMM of two matrices [M, K] and [N, K] into [M, N] (a prompt chunk's, over weights dequantized first): K is
  # sqrt(a * b / out) in elements, and the smaller matrix holds many rows of it
  a, b = sorted(_elements(args[prg.arg.globals[i]]) for i in prg.arg.ins)[-2:]
  out = max(_elements(args[prg.arg.globals[i]]) for i in prg.arg.outs)
  k = math.sqrt(a * b / out) if out else 0.0
  return k >= 16 and a >= 16 * k

def category(k: Kernel, kinds: set[str]) -> str:
  if k.is_reduce: return "matmul" if kinds & {"matmul", "experts", "cache"} or _contracts(k) else "reduce"
  return "elementwise" if k.computes else "copy"

def _place(name: str) -> tuple[str, str]:
  if (m := re.match(r"(blk\.\d+)\.(.+)", name)): return m.group(1), m.group(2)
  return ("embed" if name.startswith("token_embd") else "head"), name

def _read(k: Kernel, labels: Labels) -> list[tuple[str, LabelKind]]:
  """The labels of what a kernel touches, most telling first; a buffer that is both table and matmul is a matmul to a
  reduce and a table to a lookup."""
  read = set()
  for s in k.call.src[1:]:
    if (b := _buffer(s)) is None or b not in labels: continue
    kinds = [nk for nk in labels[b] if nk[1] != ("table" if k.is_reduce else "matmul")] or labels[b]
    read.add(kinds[0])
  return sorted(read, key=lambda nk: (_PRIORITY[nk[1]], nk[0]))

def attribute(kernels: list[Kernel], labels: Labels) -> list[tuple[str, str, str, tuple[str, ...]]]:
  """(category, block, module, reads) per kernel. A kernel reading nothing labelled belongs to the block of the ones
  that do around it; between two blocks, a reduce to the next (a norm's first pass, feeding its matmul) and any other
  kernel to the one before (its output added to the residual); before the first or after the last, to the one there is."""
  read = [_read(k, labels) for k in kernels]
  places = [_place(r[0][0]) if r else None for r in read]
  before, after = [p[0] if p else None for p in places], [p[0] if p else None for p in places]
  for i in range(1, len(before)): before[i] = before[i] or before[i - 1]
  for i in reversed(range(len(after) - 1)): after[i] = after[i] or after[i + 1]
  blocks = [(a if k.is_reduce else b) if a and b else a or b for k, a, b in zip(kernels, after, before)]
  return [(category(k, {kind for _, kind in r}), b or "-", p[1] if p else "-", tuple(name for name, _ in r))
          for k, r, p, b in zip(kernels, read, places, blocks)]

def weight_bytes(kernels: list[Kernel], labels: Labels, table_rows: int, experts_read: float = 1.0) -> int:
  """Bytes of weights one replay reads: every matmul weight a reduce touches whole, the share `experts_read` of expert
  weights (the experts a token uses of all), one row of an embedding table it only looks up (a tied one too, where no
  reduce reads it as the output projection)."""
  touched = {b for k in kernels for s in k.call.src[1:] if (b := _buffer(s)) is not None and b in labels}
  as_matmul = {b for k in kernels if k.is_reduce for s in k.call.src[1:] if (b := _buffer(s)) in touched}
  kinds = {b: {kind for _, kind in labels[b]} - ({"matmul"} if b not in as_matmul else set()) for b in touched}
  def read(b: Buffer) -> int:
    if "matmul" in kinds[b]: return b.nbytes
    return round(b.nbytes * experts_read) if "experts" in kinds[b] else b.nbytes // table_rows
  return sum(read(b) for b in touched if kinds[b] & {"matmul", "experts", "table"})

def weights_read(rt, labels: Labels, one_token: bool = True) -> Callable[[list[Kernel]], int]:
  """What gives the bytes of weights some of the runtime's kernels read (`weight_bytes`), a MoE block's experts at the
  share of them one token uses (or, for a prompt chunk, whose tokens between them use nearly all, whole)."""
  from models.moe import MoE
  moe = [b.ffn.cfg for b in rt.model.blocks if isinstance(b.ffn, MoE)]
  share = moe[0].n_used / moe[0].n_experts if moe and one_token else 1.0
  return lambda kernels: weight_bytes(kernels, labels, rt.cfg.vocab_size, share)

@contextmanager
def timed_replays(per_call: dict[UOp, list[list[tuple[float, bool]]]]):
  """While active, every JIT replay runs its calls one at a time, waiting for each, and appends to `per_call[linear]`
  the seconds of each of its kernels, with whether that is its batch's time split evenly: a graph batch is timed
  kernel by kernel where its graph can (the CPU's), else as a whole."""
  def run_timed(linear: UOp, var_vals=None, input_uops=(), update_stats=True, jit=False, wait=False):  # noqa: ARG001 (run_linear's signature)
    ctx = ExecContext(var_vals or {}, tuple(input_uops), update_stats=False, jit=jit, wait=True)
    times: list[tuple[float, bool]] = []
    for call in linear.src:
      graph = get_graph_runtime(call.src[0], ctx.input_uops) if call.src[0].op is Ops.CUSTOM_FUNCTION and call.src[0].arg == "graph" else None
      if hasattr(graph, "kernel_times"):
        times += [(t, False) for t in graph.kernel_times(ctx.input_uops, ctx.var_vals)]
        continue
      kernels = len(replay_kernels(linear.replace(src=(call,))))
      # a graph batch with no outside inputs has no buffer sources: it runs on the default device
      device = call.src[1].device if len(call.src) > 1 else Device.DEFAULT
      dev = Device[device if isinstance(device, str) else device[0]]
      t0 = time.perf_counter()
      ets = pm_exec.rewrite(call, ctx) or []
      dev.synchronize()
      wall = time.perf_counter() - t0
      seconds = sum(e for e in ets if e is not None) if ets and all(e is not None for e in ets) else wall
      times += [(seconds / kernels, kernels > 1)] * kernels
    per_call.setdefault(linear, []).append(times)
  with patches.replays_through(run_timed): yield

def rows_for(linear: UOp, labels: Labels, replay_times: list[list[tuple[float, bool]]], read: Callable[[list[Kernel]], int],
             block: str | None = None) -> list[KernelRow]:
  """One row per kernel of `linear`, with the bytes of weights `read` says it reads; times are medians over the timed
  replays (`timed_replays`)."""
  kernels = replay_kernels(linear)
  us = [statistics.median(t for t, _ in ts) * 1e6 for ts in zip(*replay_times)] if replay_times else [None] * len(kernels)
  batched = [any(b for _, b in ts) for ts in zip(*replay_times)] if replay_times else [k.batch is not None for k in kernels]
  return [KernelRow(i, k.name, cat, block or blk, module, reads, t, split, read([k]))
          for i, (k, (cat, blk, module, reads), t, split) in enumerate(zip(kernels, attribute(kernels, labels), us, batched))]

def block_summary(rows: list[KernelRow]) -> list[dict]:
  """Per block, in order of first appearance: kernels, kernels per category and total time."""
  blocks: dict[str, dict] = {}
  for r in rows:
    b = blocks.setdefault(r.block, {"block": r.block, "kernels": 0, **{c: 0 for c in CATEGORIES}, "us": 0.0})
    b["kernels"] += 1
    b[r.category] += 1
    b["us"] += r.us or 0.0
  return list(blocks.values())

def pattern(rows: list[KernelRow], block: str) -> tuple:
  return tuple((r.category, r.module) for r in rows if r.block == block)

def report(title: str, rows: list[KernelRow], timing_note: str, show_all: bool = False) -> str:
  total_us = sum(r.us or 0.0 for r in rows)
  lines = [title, f"{len(rows)} kernels, {total_us / 1e3:.2f} ms summed over kernels. {timing_note}", ""]
  summary = block_summary(rows)
  head = f"{'where':<10} {'kernels':>7} " + " ".join(f"{c:>11}" for c in CATEGORIES) + f" {'ms':>8} {'share':>6}"
  lines += [head, "-" * len(head)]
  for b in summary:
    share = 100 * b["us"] / total_us if total_us else 0.0
    lines.append(f"{b['block']:<10} {b['kernels']:>7} " + " ".join(f"{b[c]:>11}" for c in CATEGORIES) + f" {b['us'] / 1e3:>8.3f} {share:>5.1f}%")
  totals = Counter(r.category for r in rows)
  lines.append(f"{'total':<10} {len(rows):>7} " + " ".join(f"{totals[c]:>11}" for c in CATEGORIES) + f" {total_us / 1e3:>8.3f} 100.0%")
  blocks = [b["block"] for b in summary if b["block"].startswith("blk.")]
  groups: dict[tuple, list[str]] = {}
  for b in blocks: groups.setdefault(pattern(rows, b), []).append(b)
  if groups:
    lines += ["", "Per-block kernel map (blocks with the same kernels in the same order share one listing):"]
    for members in groups.values():
      lines += ["", f"{_ranges(members)}: {len(pattern(rows, members[0]))} kernels each"]
      lines += _kernel_table([r for r in rows if r.block == members[0]], with_block=False)
  others = [r for r in rows if not r.block.startswith("blk.")]
  if others: lines += ["", "Outside the blocks:", *_kernel_table(others, with_block=True)]
  if show_all: lines += ["", "Every kernel in replay order:", *_kernel_table(rows, with_block=True)]
  return "\n".join(lines)

def _ranges(blocks: list[str]) -> str:
  """'blk.3', or '46 blocks (blk.1-46)': the ids in order, three or more in a row as first-last."""
  ids, runs = [int(b.split(".")[1]) for b in blocks], []
  for i in ids:
    if runs and i == runs[-1][1] + 1: runs[-1][1] = i
    else: runs.append([i, i])
  spans = [f"{a}-{b}" if b - a >= 2 else ", ".join(map(str, range(a, b + 1))) for a, b in runs]
  return f"blk.{ids[0]}" if len(ids) == 1 else f"{len(ids)} blocks (blk.{', '.join(spans)})"

def _kernel_table(rows: list[KernelRow], with_block: bool) -> list[str]:
  width = max(len(r.name) for r in rows)
  out = []
  for r in rows:
    us = "-" if r.us is None else f"{r.us:.1f}{'*' if r.batched else ''}"
    where = f"{r.block:<8} " if with_block else ""
    reads = ", ".join(x.split(".", 2)[-1] if x.startswith("blk.") else x for x in r.reads) or "-"
    gbps = f"{r.weight_bytes / r.us / 1e3:.0f} GB/s" if r.us and r.weight_bytes and not r.batched else "-"
    out.append(f"  {r.index:>4}  {where}{r.name:<{width}}  {r.category:<11} {r.module:<24} {us:>10} us {gbps:>10}  reads {reads}")
  return out

def as_json(rows: list[KernelRow]) -> list[dict]: return [asdict(r) for r in rows]

TOP = 8   # the slowest kernels a profile's findings list

def _gbps(rows: list[KernelRow]) -> float | None:
  """The bandwidth the rows' weight reads reached over their summed own times (None where a time is a batch's share)."""
  us, nbytes = sum(r.us or 0.0 for r in rows), sum(r.weight_bytes for r in rows)
  return nbytes / us / 1e3 if rows and us > 0 and nbytes and not any(r.batched or r.us is None for r in rows) else None

def findings_text(f: dict, top: int = 3) -> str:
  """A profile's findings (`findings`) in a line: kernels and their time, the spread of their times, the block forms,
  the matmuls' bandwidth and the slowest kernels."""
  num = lambda key, spec, unit="": "-" if f.get(key) is None else f"{f[key]:{spec}}{unit}"
  ids = lambda b: b if isinstance(b, str) else _ranges([f"blk.{i}" for i in b])   # records before ids were kept: the text
  forms = ", ".join(f"{ids(b['blocks'])}: {b['kernels']}" for b in f.get("block_forms", [])) or "none"
  slowest = "; ".join(f"{k['name']} ({k['module']}) {k['us']:.1f} us" + (f" {k['gbps']:.0f} GB/s" if k.get("gbps") else "")
                      for k in f.get("top", [])[:top])
  return (f"{f.get('kernels')} kernels, {num('kernel_ms', '.3f', ' ms')} summed (step {num('step_ms', '.3f', ' ms')}), time spread "
          f"{num('time_cv', '.2f')} ({f.get('batched', 0)} timed as a batch's share); kernels per block: {forms}; MoE block forms "
          f"{f.get('moe_block_forms', 0)}; weight reads: experts {num('experts_gbps', '.0f', ' GB/s')}, dense {num('dense_gbps', '.0f', ' GB/s')}; "
          f"slowest: {'- (times are batch shares)' if f.get('batched') else slowest or '-'}")

def findings(rows: list[KernelRow], step_ms: float | None) -> dict:
  """What an experiment with `profile:` records of a profiled step, the seed's profile-reading findings in numbers:
  the kernels and their summed time; `time_cv`, the spread of the kernels' times over their mean (near a graph's, every
  kernel of a batch timed at its share: uniform); the per-block kernel map as its forms (blocks with the same kernels in
  the same order share one) and those of the MoE blocks (the ones reading experts); the bandwidth of the expert and the
  dense matmuls' weight reads (each kernel timed alone); the whole step's time; and the slowest kernels with theirs."""
  timed = [r.us for r in rows if r.us is not None]
  blocks = [b["block"] for b in block_summary(rows) if b["block"].startswith("blk.")]
  forms: dict[tuple, list[str]] = {}
  for b in blocks: forms.setdefault(pattern(rows, b), []).append(b)
  experts = lambda r: any("_exps" in x for x in r.reads)
  moe = {b for b in blocks if any(experts(r) for r in rows if r.block == b)}
  moe_forms = [members for members in forms.values() if members[0] in moe]
  matmuls = [r for r in rows if r.category == "matmul" and r.weight_bytes]
  # the slowest kernels, where each kernel has a time of its own (a batch's share says nothing of one kernel)
  top = [] if any(r.batched for r in rows) else sorted((r for r in rows if r.us is not None), key=lambda r: -r.us)[:TOP]   # type: ignore[operator]
  return {"kernels": len(rows), "kernel_ms": sum(timed) / 1e3 if timed else None, "step_ms": step_ms,
          "time_cv": statistics.pstdev(timed) / statistics.mean(timed) if len(timed) > 1 and statistics.mean(timed) > 0 else None,
          "batched": sum(r.batched for r in rows),
          "block_forms": [{"blocks": [int(b.split(".")[1]) for b in members], "kernels": len(form)} for form, members in forms.items()],
          "moe_block_forms": len(moe_forms), "moe_block_kernels": sorted(len(pattern(rows, m[0])) for m in moe_forms),
          "experts_gbps": _gbps([r for r in matmuls if experts(r)]), "dense_gbps": _gbps([r for r in matmuls if not experts(r)]),
          "top": [{"name": r.name, "block": r.block, "module": r.module, "us": r.us, "mb": r.weight_bytes / 1e6, "gbps": _gbps([r])}
                  for r in top]}

def profile_model(path, name: str, cfg, repeats: int = 5, prefill: bool = False) -> tuple[str, list[KernelRow], str]:
  """Captures decode (and the greedy sampler) after cfg.depth tokens of context, then times `repeats` replays
  kernel by kernel. Returns the title, the rows of the decode step and the sampler, and a note on what the times mean.
  Under `ncu_kernel_times` (NCU_RANGE set) it replays one step as captured, inside the profiler's range, untimed.
  With `prefill`, the same of one prompt chunk (cfg.pp tokens, at most a chunk), and the rate its GEMMs reached."""
  if repeats < 1: raise ValueError(f"--repeats must be at least 1, got {repeats}")
  return (_profile_prefill if prefill else _profile)(cfg.model_file(path), name, cfg, repeats)

def dense_block_weights(rt) -> int:
  """Elements of the blocks' dense matmul weights: a prompt token costs twice that in FLOPs there (experts apart)."""
  from quant.linear import QuantLinear
  in_blocks = {id(t) for name, kind, t in rt.weights.labels if kind == "matmul" and name.startswith("blk.")}
  return sum(math.prod(lin.weight.shape) for lin in rt.weights.linears
             if type(lin) is QuantLinear and any(id(t) in in_blocks for t in lin.device_tensors))

def _profile_prefill(path, name: str, cfg, repeats: int) -> tuple[str, list[KernelRow], str]:
  from experiments.bench import prompt_ids
  from experiments.journal import device_name
  from models.deepseek2 import prefill_form
  rt = cfg.runtime(path, cfg.pp)
  ids = prompt_ids(rt, min(cfg.pp, rt.chunk))
  times: dict[UOp, list[list[tuple[float, bool]]]] = {}
  rt.prefill_chunks(ids).realize()   # compiles and captures
  with timed_replays(times):
    for _ in range(repeats): rt.prefill_chunks(ids).realize()
  linear = rt._prefill.captured.linear
  labels = buffer_labels(rt.weights.labels)
  rows = rows_for(linear, labels, times.get(linear, []), weights_read(rt, labels, one_token=False))
  # the weights' matmuls: attention's read a cache
  gemm_us = sum(r.us or 0.0 for r in rows if r.category == "matmul" and not r.module.endswith("cache"))
  flops = 2 * rt.chunk * dense_block_weights(rt)
  form = prefill_form(rt.model, rt.chunk)
  title = (f"{name}: one prompt chunk of {len(ids)} tokens ({rt.chunk} computed) on {device_name()}, {cfg.describe()}"
           f"{'' if form is None else f', latent attention {form}'}; "
           f"the blocks' dense matmuls are {flops / 1e9:.1f} GFLOP, {flops / gemm_us / 1e6 if gemm_us else 0:.2f} TFLOP/s over the time "
           f"of the matmul kernels that read no cache ({gemm_us / 1e3:.2f} ms)")
  return title, rows, timing_note(rows, repeats)

NCU_RANGE = "TINYZOO_NCU_RANGE"   # set in the process Nsight Compute profiles: one step inside cuProfilerStart/Stop

@contextmanager
def cuda_profiler_range():
  """What runs inside is all a profiler started with --profile-from-start off sees."""
  import ctypes
  if Device.DEFAULT != "CUDA": raise RuntimeError(f"--ncu profiles tinygrad's CUDA backend (DEV=CUDA), not {Device.DEFAULT}")
  cuda = ctypes.CDLL("libcuda.so.1")
  Device[Device.DEFAULT].synchronize()
  cuda.cuProfilerStart()
  try: yield
  finally:
    Device[Device.DEFAULT].synchronize()
    cuda.cuProfilerStop()

def _profile(path, name: str, cfg, repeats: int) -> tuple[str, list[KernelRow], str]:
  from experiments.bench import prompt_length
  from experiments.journal import device_name
  rt = cfg.runtime(path, prompt_length(cfg.depth) + cfg.warmup + repeats + 8)
  rows, pos, note, _ = decode_rows(rt, cfg.depth, cfg.warmup, repeats)
  return f"{name}: one decode step at position {pos} on {device_name()}, {cfg.describe()}", rows, note + attention_reads(rt, rows, pos)

def cache_bytes(rt, pos: int) -> int:
  """The bytes of keys and values a decode step at `pos` reads at the least: each layer's positions it attends to (up to
  pos, or its window's), every kv head's key and value (or a latent row and its rope key) once, at the cache's type."""
  from models.blocks import kv_cache_dtype
  from profiles.machine import Shapes
  shapes = Shapes.of(rt.gguf)
  windows = [getattr(getattr(b.attn, "spec", None), "window", None) for b in rt.model.blocks if hasattr(b.attn, "cache")]
  return sum(min(pos + 1, w or pos + 1) for w in windows) * (shapes.kv_width if shapes else 0) * kv_cache_dtype(rt.hints).itemsize

def attention_reads(rt, rows: list[KernelRow], pos: int) -> str:
  """A note on attention's reads of the KV cache: the summed own times of the kernels that read it against the bytes
  `cache_bytes` says the step needs, and on a GPU a copy's bandwidth beside it (measured now: on a CPU it costs seconds
  and attention there is bound by its arithmetic); nothing where a reader's time is a batch's share."""
  from experiments.bench import copy_bandwidth
  readers = [r for r in rows if any(x.endswith("_cache") for x in r.reads)]
  if not readers or any(r.us is None or r.batched for r in readers) or not (nbytes := cache_bytes(rt, pos)): return ""
  us = sum(r.us for r in readers)   # type: ignore[misc]
  copy = "" if Device.canonicalize(rt.device).split(":")[0] == "CPU" else f", a copy on this device {copy_bandwidth(rt.device):.0f} GB/s"
  return (f" Attention: the {len(readers)} kernels that read the KV cache took {us:.1f} us for the {nbytes / 1e6:.3g} MB of keys and "
          f"values this position needs (each layer's positions once): {nbytes / us / 1e3:.0f} GB/s{copy}.")

def decode_rows(rt, depth: int, warmup: int, repeats: int) -> tuple[list[KernelRow], int, str, float | None]:
  """Captures decode (and the greedy sampler) on `rt` after `depth` tokens of context and `warmup` steps, then times
  `repeats` replays kernel by kernel. Returns the rows of the decode step and the sampler, the last position timed, a
  note on what the times mean, and the whole step's time (ms) as the generation loop replays it."""
  from experiments.bench import prompt_ids, prompt_length
  from ops.sampling import Sampler, SamplerParams
  sampler = Sampler(SamplerParams(temperature=0))
  times: dict[UOp, list[list[tuple[float, bool]]]] = {}
  with rt.kernels:   # the sampler's kernels too, as the runtime's generation loop compiles them
    token, pos = sampler(rt.prefill(prompt_ids(rt, prompt := prompt_length(depth)))), prompt
    for _ in range(1 + warmup): token, pos = sampler(rt.decode(token, pos)), pos + 1   # the first compiles and captures
    if os.environ.get(NCU_RANGE):
      with cuda_profiler_range(): token, pos = sampler(rt.decode(token, pos)), pos + 1
    else:
      with timed_replays(times):
        for _ in range(repeats): token, pos = sampler(rt.decode(token, pos)), pos + 1
  labels = buffer_labels(rt.weights.labels)
  decode, sample = rt._decode.captured.linear, sampler.jit.captured.linear
  read = weights_read(rt, labels)
  rows = rows_for(decode, labels, times.get(decode, []), read) + rows_for(sample, labels, times.get(sample, []), read, block="sampler")
  rows = [replace(r, index=i) for i, r in enumerate(rows)]
  note, step_ms = timing_note(rows, repeats), None
  if times:   # the whole step too, as the generation loop runs it: what the kernels' times leave is the host's
    step_ms = queued_steps(rt, sampler, token, pos, repeats)[1]
    beyond = step_ms - sum(r.us or 0.0 for r in rows) / 1e3
    note += f" The whole step (decode and sampler replayed back to back) took {step_ms:.2f} ms: {beyond:.2f} ms beyond the kernels' sum."
  return rows, pos - 1, note, step_ms

def timing_note(rows: list[KernelRow], repeats: int) -> str:
  """What the times of timed replays' rows mean: each kernel's own, or its graph batch's split evenly."""
  if any(r.batched for r in rows):
    return ("Times marked * belong to a graph batch timed as a whole and split evenly: averages, not per-kernel truths "
            "(--no-graphs launches kernels one by one; --ncu measures each inside its graph).")
  return f"Each kernel was launched alone and waited for; times are medians of {repeats} replays (host launch cost included)."

def ncu_kernel_times(argv: list[str], ncu: str = "ncu") -> tuple[str, list[KernelRow], str]:
  """Runs `tinyzoo profile ARGV --json` under Nsight Compute, which times each kernel of one replayed step, graph nodes
  included, on its own (no launch cost, clocks and caches left as they are), and puts those times in the rows."""
  with tempfile.TemporaryDirectory() as tmp:
    log = os.path.join(tmp, "ncu.csv")
    cmd = [ncu, "--profile-from-start", "off", "--graph-profiling", "node", "--metrics", "gpu__time_duration.sum", "--clock-control", "none",
           "--cache-control", "none", "--csv", "--log-file", log, sys.executable, "-m", "tinyzoo", "profile", *argv, "--json"]
    try: r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, NCU_RANGE: "1"}, timeout=3600)
    except FileNotFoundError: raise RuntimeError(f"--ncu needs Nsight Compute's {ncu!r} on the PATH") from None
    if r.returncode != 0: raise RuntimeError(f"ncu failed: {(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    profiled = json.loads(r.stdout[r.stdout.index("{"):])
    with open(log) as f: lines = [l for l in f if l.startswith('"')]
  measured = [(row["Kernel Name"], ncu_us(row))
              for row in csv.DictReader(lines) if row["Metric Name"] == "gpu__time_duration.sum"]
  rows = [KernelRow(**{**k, "reads": tuple(k["reads"])}) for k in profiled["kernels"]]
  # a graph runs independent nodes in any order: the i-th time of a name goes to the i-th kernel of that name
  by_name: dict[str, list[float]] = {}
  for n, us in measured: by_name.setdefault(n, []).append(us)
  if sorted(n for n, _ in measured) != sorted(r.name for r in rows):
    raise RuntimeError(f"ncu timed {len(measured)} kernels, not the {len(rows)} of the step: {sorted(set(by_name) ^ {r.name for r in rows})[:5]}")
  note = "Times are each kernel's own device time as Nsight Compute measured it inside its graph, launch gaps excluded."
  return profiled["title"], [replace(r, us=by_name[r.name].pop(0), batched=False) for r in rows], note

