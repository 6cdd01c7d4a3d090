"""Kernel optimizations for matvecs over packed blocks, which tinygrad's heuristic handles badly on CPUs and GPUs;
`MatvecOpts` chooses them per kernel in place of tinygrad's heuristic (ops/patches.py asks it through the kernel
settings a runtime compiles under).

GPUs: tinygrad's matvec rule only knows a plain `sum(w * x)`; a packed-dot reduce (nibbles, scales, two reduce axes) gets
one thread per few rows, each walking its rows' blocks alone: neighbouring threads read bytes a row apart and the loads
never coalesce. `gpu_matvec` splits each row over threads (GROUP: a block's words to neighbouring threads under
packed_words, the blocks otherwise), puts several rows in a workgroup (LOCAL), gives each thread a few rows (UPCAST),
unrolls the bytes of a word and a few of the steps a thread takes along its rows (all their loads in flight at once).
Sizes come from, first to last: forced sizes (one size for every kernel, for sweeps; TINYZOO_GPU_MATVEC="threads,block,
rows[,span]"), the sizes tuned per kernel shape on this device (a device profile's), the built-in rule. Other reduces
that tinygrad leaves to few threads get opts of their own (attention over the chunks of a KV cache, full reductions).

CPUs: tinygrad's heuristic leaves matvecs scalar and serial. It upcasts output rows only when a kernel has at least 1024
outputs, so a 576-row matvec is compiled as one accumulator per row: every multiply-add waits for the one before it.
Upcasting rows gives independent accumulators (and vector loads of the shared activations), unrolling the innermost
reduce keeps the block decode in registers.
"""
import os
from dataclasses import dataclass, field
from math import gcd, prod
from typing import Any
from tinygrad.codegen.opt import Opt, OptOps, KernelOptError
from tinygrad.codegen.opt.postrange import Scheduler
from tinygrad.uop.ops import AxisType, Ops
from ops import dp4a
from ops.patches import KernelSettings, tinygrad_heuristic

DEFAULT_ROW_UPCAST = 8
REDUCE_UNROLL = 4
UNROLL_ELEMENTS = 128
# The built-in GPU rules, fitted to per-shape sweeps on a GPU (the journal's gemv records). packed_words: 64 threads per
# row (or the blocks a row has) in workgroups of 64, each thread reading SPAN_ELEMENTS elements of a row as neighbouring
# words (2 words of a 4-bit block) for 4 rows; for 2048 rows or fewer, half of each. A flat reduce (packed_dot): 4 rows
# per thread (1 where a block unrolls to 32 or more bytes: more registers than that spill), then threads per row doubled
# from 16 up to 128 (and the blocks a row has) until the kernel launches GPU_MATVEC_THREADS threads, and workgroups of
# 64 threads.
GPU_MATVEC_THREADS = 1 << 16
MAX_SHORT_OUTPUTS = 32   # outputs besides the rows: experts used times the halves of joined gate and up rows
SPAN_ELEMENTS = 16
# a MoE's gate and up experts with their activation in the kernel (pairs of rows and an axis of experts): the fastest of
# the sizes swept for Mixtral's and DeepSeek-V2-Lite's Q4_0 experts on an H100 (the journal's gemv records), where the
# rule for a dense matvec's pairs gave a quarter of a dense matvec's bandwidth
EXPERT_PAIR_THREADS = 32
Sizes = tuple[int, ...]   # threads per row, rows per workgroup, rows per thread[, words of a block per thread (span)]
FORCED_ENV = "TINYZOO_GPU_MATVEC"

def parse_gpu_sizes(spec: str) -> Sizes:
  try: sizes = tuple(int(v) for v in spec.split(","))
  except ValueError: sizes = ()
  # a span is a power of two up to 8, so that it divides the 4 or 8 words of any block
  if len(sizes) not in (3, 4) or any(v < 1 for v in sizes[:3]) or (len(sizes) == 4 and sizes[3] not in (0, 1, 2, 4, 8)):
    raise ValueError(f"GPU matvec sizes are THREADS,ROWS_PER_GROUP,ROWS_PER_THREAD[,SPAN] (a span of 0, 1, 2, 4 or 8 words; 0: "
                     f"whole blocks), e.g. 16,4,4 or 64,1,4,1; got {spec!r}")
  return sizes

def forced_from_env(environ: os._Environ | dict = os.environ) -> Sizes | None:
  """The GPU matvec sizes TINYZOO_GPU_MATVEC forces on every kernel, or None."""
  return parse_gpu_sizes(environ[FORCED_ENV]) if environ.get(FORCED_ENV) else None

@dataclass(frozen=True)
class MatvecOpts:
  """The opts of matvec kernels (and of the reduces tinygrad leaves to few threads) in place of tinygrad's heuristic:
  CPU matvecs get `row_upcast` rows a thread; GPU matvecs the `forced` sizes, else their kernel shape's in `tuned`,
  else the built-in rule. Two are equal where they choose the same opts; `compiled_shapes` records the kernel shape of
  every GPU matvec given sizes, in order (a sweep reads which it timed)."""
  row_upcast: int = DEFAULT_ROW_UPCAST
  tuned: tuple[tuple[str, Sizes], ...] = ()
  forced: Sizes | None = None
  compiled_shapes: list[str] = field(default_factory=list, compare=False, hash=False, repr=False)

  def __post_init__(self):
    if self.row_upcast < 1 or self.row_upcast & (self.row_upcast - 1): raise ValueError(f"row upcast must be a power of two, not {self.row_upcast}")

  @staticmethod
  def of(row_upcast: int, tuned: dict[str, Sizes], forced: Sizes | None = None) -> "MatvecOpts":
    return MatvecOpts(row_upcast, tuple(sorted(tuned.items())), forced)

  def optimize(self, k: Scheduler) -> Scheduler:
    """The kernel with its opts applied: ours where the kernel is one we know, else tinygrad's heuristic's."""
    try:
      if not k.ren.has_local: tuned = cpu_gemm(k) or self._cpu_matvec(k)
      elif matvec_row_axis(k) is not None: tuned = gpu_matvec(k, *self.gpu_sizes(k))
      else:
        # tinygrad's own opts first where they take tensor cores (a prompt chunk's GEMM over half inputs, its rows a
        # symbolic number of cached positions too, which the rules after would take as attention's logits)
        tuned = tinygrad_heuristic(k)
        if not any(o.op is OptOps.TC for o in tuned.applied_opts):
          tuned = gpu_chunked_reduce(k) or gpu_full_reduce(k) or gpu_sums_in_short_reduces(k) or gpu_chunked_logits(k) or tuned
    except KernelOptError: tuned = None
    return tuned if tuned is not None else tinygrad_heuristic(k)

  def _cpu_matvec(self, k: Scheduler) -> Scheduler | None:
    if not (opts := matvec_opts(k, self.row_upcast)): return None
    tuned = k.copy()
    for opt in opts: tuned.apply_opt(opt)
    return tuned

  def gpu_sizes(self, k: Scheduler) -> Sizes:
    self.compiled_shapes.append(shape := kernel_shape(k))
    if self.forced: return self.forced
    if (sizes := dict(self.tuned).get(shape)) is not None: return sizes
    return rule_gpu_sizes(k)

  def untuned_shapes(self) -> list[str]:
    """The kernel shapes of GPU matvecs compiled so far that the tuned sizes did not cover."""
    return sorted(set(self.compiled_shapes) - dict(self.tuned).keys())

# A CPU GEMM's register tile: rows of the shorter output axis (a prompt chunk's rows), rows of the other (the weights'),
# steps of the reduce unrolled; the fastest of the tiles swept for a prompt chunk's matmuls on a 2-core AMD EPYC, over
# float weights and packed Q4_1, Q5_0 and Q8_0 blocks (with 4 steps, a Q8_0 block's 32 bytes took an inner loop of 8).
CPU_GEMM_TILE = (8, 4, 8)

def gemm_axes(k: Scheduler) -> list[int] | None:
  """The output axes of a GEMM to tile, shorter first: one sum whose output axes, besides those every input of it is
  indexed by (heads), fall in two sides that no input is indexed by both of (a prompt chunk's rows, read by x and
  whatever x is computed from; the weights' rows, which a joined gate and up split in several axes; a residual added
  to the sum is no input of it). Of each side the longest axis of constant size (a side of a symbolic number of cached
  positions has none). None for other kernels."""
  if k.reduceop is None or k.reduceop.arg[0] is not Ops.ADD or len(k.reduceops) != 1 or not k.axes_of(AxisType.REDUCE): return None
  outputs = [a for a in k.axes_of(AxisType.GLOBAL, AxisType.WEAK) if not isinstance(n := k.full_shape[a], int) or n > 1]
  reduces = k.ranges_of(AxisType.REDUCE)
  reads = [{a for a in outputs if k.rngs[a] in r} for r in _indices(k, loads=True) if any(red in r for red in reduces)]
  batch = set.intersection(*reads) if reads else set()
  sides: list[set[int]] = []
  for axes in filter(None, (r - batch for r in reads)):
    joined = [side for side in sides if side & axes]
    sides = [side for side in sides if not side & axes] + [axes.union(*joined)]
  if len(sides) != 2 or set().union(batch, *sides) != set(outputs): return None
  tiled = [max(fixed, key=lambda a: k.full_shape[a]) for side in sides if (fixed := [a for a in side if isinstance(k.full_shape[a], int)])]
  return sorted(tiled, key=lambda a: k.full_shape[a])

def cpu_gemm(k: Scheduler) -> Scheduler | None:
  """A CPU GEMM with CPU_GEMM_TILE's register tile (or the largest divisor of it along each axis): tinygrad's heuristic
  upcasts one output axis only, so each weight it loads serves few of the chunk's rows. None for other kernels."""
  if not (axes := gemm_axes(k)): return None
  tuned, (rows, cols, steps) = k.copy(), CPU_GEMM_TILE
  for axis, n in zip(axes, (rows, cols)):
    if (n := gcd(n, k.full_shape[axis])) > 1: tuned.apply_opt(Opt(OptOps.UPCAST, tuned.rngs.index(k.rngs[axis]), n))
  last = tuned.unrollable_dims[-1] if tuned.unrollable_dims else None
  if last is not None and isinstance(size := tuned.full_shape[last], int) and (n := gcd(steps, size)) > 1:
    tuned.apply_opt(Opt(OptOps.UNROLL, len(tuned.unrollable_dims) - 1, n))
  # the tiles over every core: split the weights' side, else the chunk's
  threads = tuned.ren.global_max[0] if tuned.ren.has_threads and tuned.ren.global_max else 1
  for axis in reversed(axes):
    if threads > 1 and (a := _reduce_axis(tuned, k.rngs[axis].arg)) is not None and tuned.full_shape[a] % threads == 0:
      tuned.apply_opt(Opt(OptOps.THREAD, a, threads))
      break
  return tuned

def kernel_settings(row_upcast: int, tuned: dict[str, Sizes] | None = None, forced: Sizes | None = None, pdl: bool = False,
                    prefetch: bool = False, beam: int | None = None, jit_batch_size: int | None = None,
                    tensor_cores: bool = True, graphs: bool = True, programs: Any = None) -> KernelSettings:
  """The kernel settings of a runtime or a matvec measurement: MatvecOpts of `row_upcast` rows (0: tinygrad's heuristic for
  every kernel, GPU ones too) with GPU sizes `tuned` per kernel shape and `forced` (else TINYZOO_GPU_MATVEC's) on every
  kernel; programmatic launch, its prefetch only with it; tinygrad's BEAM and JIT batch size; tensor cores or none; graph
  batches of a captured step's kernels or none; the store that keeps compiled programs across processes, if any."""
  opts = MatvecOpts.of(row_upcast, tuned or {}, forced or forced_from_env()) if row_upcast else None
  return KernelSettings(opts, pdl, pdl and prefetch, beam, jit_batch_size, tensor_cores, graphs, programs=programs)

def runtime_settings(h, programs: Any = None) -> KernelSettings:
  """The kernel settings a model's runtime compiles with under hints `h` (profiles/hints.py Hints)."""
  return kernel_settings(h.row_upcast, dict(h.matvec_sizes), None, h.pdl, h.pdl_prefetch, h.beam, h.jit_batch_size, h.tensor_cores, h.graphs,
                         programs=programs)

def kernel_shape(k: Scheduler) -> str:
  """A matvec kernel's key in tuned tables: its loop sizes before any opt, e.g. '2048x4x2x64x4' (rows,
  bytes, nibble planes, blocks, words of a Q4_0 packed_words matvec)."""
  return "x".join(str(s) for s in k.full_shape)

def _index_exprs(k: Scheduler, loads: bool = False) -> list:
  """The index of each buffer of the kernel, or with `loads` of each it reads."""
  stored = {u.src[0] for u in k.ast.toposort() if u.op is Ops.STORE} if loads else set()
  return [b.src[1].get_idx() for b in k.bufs if b not in stored]

def _indices(k: Scheduler, loads: bool = False) -> list:
  """What each buffer of the kernel is indexed by (ranges and values), for every buffer or, with `loads`, those it reads."""
  return [idx.backward_slice_with_self for idx in _index_exprs(k, loads)]

def _unit_stride(idx, rng) -> bool:
  """Whether index `idx` steps by one element as range `rng` does (every range at 0, `rng` at 0 and 1)."""
  ranges = [u for u in idx.backward_slice_with_self if u.op is Ops.RANGE]
  if rng not in ranges: return False
  at = {u: u.const_like(0) for u in ranges}
  step = (idx.substitute({**at, rng: rng.const_like(1)}) - idx.substitute(at)).simplify()
  return step.op is Ops.CONST and step.arg == 1

def matvec_row_axis(k: Scheduler) -> int | None:
  """The axis of output rows if the kernel is a matvec: a sum over constant reduce axes with one output axis of constant
  size that one input is indexed by (the weights) and another is broadcast along (the activations); besides it only
  short output axes (the experts a MoE token uses, each reading its own expert's rows; gate and up of joined rows).
  A lone output axis is the rows whatever its size: a MoE router has as many rows as experts, which tinygrad's
  heuristic gave 16 threads a row, each walking its columns in turn."""
  if k.reduceop is None or k.reduceop.arg[0] is not Ops.ADD or not k.axes_of(AxisType.REDUCE): return None
  if not all(isinstance(s, int) for s in k.full_shape): return None
  outputs = [a for a in k.axes_of(AxisType.GLOBAL, AxisType.WEAK) if k.full_shape[a] > 1]
  rows = outputs if len(outputs) == 1 else [a for a in outputs if k.full_shape[a] >= 64]
  if len(rows) != 1 or prod(k.full_shape[a] for a in outputs if a != rows[0]) > MAX_SHORT_OUTPUTS: return None
  row, reduces = k.rngs[rows[0]], k.ranges_of(AxisType.REDUCE)
  reads = _indices(k)
  weights = any(row in r for r in reads)
  broadcast = any(row not in r and any(red in r for red in reduces) for r in reads)
  return rows[0] if weights and broadcast else None

def matvec_opts(k: Scheduler, rows: int) -> list[Opt]:
  """The opts for a matvec kernel: upcast rows, unroll the innermost reduce, then split rows over the CPU threads."""
  axis = matvec_row_axis(k)
  if axis is None or k.full_shape[axis] % rows: return []
  opts = [Opt(OptOps.UPCAST, axis, rows)]
  if k.unrollable_dims and k.full_shape[k.unrollable_dims[-1]] % REDUCE_UNROLL == 0:
    opts.append(Opt(OptOps.UNROLL, len(k.unrollable_dims) - 1, REDUCE_UNROLL))
  left = k.full_shape[axis] // rows
  threads = next((t for t in range(k.ren.global_max[0], 1, -1) if left % t == 0), 1) if k.ren.has_threads and k.ren.global_max else 1
  if threads > 1: opts.append(Opt(OptOps.THREAD, axis, threads))
  return opts

def _outermost(k: Scheduler):
  return next((red for red in k.reduceops if not any(u.arg[-1] is AxisType.REDUCE for u in red.ranges)), k.reduceop)

def _enclosing(red) -> set:
  return {u for u in red.ranges if u.arg[-1] is AxisType.REDUCE}

def _pair_products(k: Scheduler) -> list:
  """The ranges of the products over pairs of the matvec's sums around its sum, outermost first: a gated activation over
  joined gate and up rows (ops/activations.py), a folded norm's dot and 1/rms (QuantLinear.normed), or both."""
  pairs, red = [], _outermost(k)
  while red.arg[0] is Ops.MUL and len(red.src) == 2:
    pairs.append(red.src[1])
    red = next((r for r in k.reduceops if _enclosing(r) == set(pairs)), red)
  return pairs

def _outer_reduce(k: Scheduler):
  """The matvec's sum over a row's blocks: the outermost reduce, or the sum inside the outermost pair products."""
  if not (pairs := _pair_products(k)): return _outermost(k)
  return next(red for red in k.reduceops if red.arg[0] is Ops.ADD and _enclosing(red) == set(pairs))

def reduce_axes(k: Scheduler) -> tuple[int, int | None, list[int]]:
  """A matvec's reduce axes: over a row's blocks, over a block's words (a packed_words matvec sums each word before
  scaling it: a reduce inside the outer one; None for a flat reduce), and the rest. The blocks are the longest axis of
  the outer reduce and the words its last (the innermost in memory; the same axis where tinygrad merged the two)."""
  pairs, outer = _pair_products(k), set(_outer_reduce(k).src[1:])
  reduces = [a for a in k.axes_of(AxisType.REDUCE) if k.rngs[a] not in pairs]
  outers = [a for a in reduces if k.rngs[a] in outer]
  blocks = max(outers, key=lambda a: k.full_shape[a])
  words = outers[-1] if len(outers) < len(reduces) else None
  return blocks, words, [a for a in reduces if a not in (blocks, words)]

def word_elements(k: Scheduler) -> int:
  """The elements summed inside one word of a packed_words matvec (the largest of its inner sums: a folded norm has
  two, its dots and its squares); 0 for a flat reduce."""
  outer = _outer_reduce(k)
  return max((prod(k.full_shape[k.rngs.index(r)] for r in red.src[1:]) for red in k.reduceops
              if red is not outer and red.arg[0] is Ops.ADD), default=0)

def gpu_matvec(k: Scheduler, threads: int, block: int, rows: int, span: int = 0) -> Scheduler | None:
  """Split each row over up to `threads` threads (GROUP), LOCAL `block` rows, UPCAST `rows` rows per thread, then
  unroll the reduce axes left inside a thread, innermost first, up to 32 elements; None if the kernel is no matvec.
  Raises KernelOptError where tinygrad refuses an opt.

  A packed_words row is split by words: each thread takes `span` neighbouring words of a block (unrolled); the threads
  of a block's other words are the fastest-varying (all of them, even beyond `threads`), then the blocks. The span
  sets which activations a warp reads at once: a thread per 4-word Q4_0 block loads 128 bytes of x, its 32 lanes 128
  bytes apart (a cache line each); a word a thread, 4 lanes read one 64-byte run. A flat reduce (packed_dot) is split
  by blocks."""
  axis = matvec_row_axis(k)
  if axis is None or k.full_shape[axis] % rows: return None
  # the most rows a workgroup, up to `block`, that divide the rows (int8_dot's 128 // 22 threads: 5 of 2048 rows had
  # left a Q8_0 down-experts kernel to tinygrad's heuristic, a thread walking its rows alone)
  block = max(b for b in range(1, block + 1) if k.full_shape[axis] % (b * rows) == 0)
  blocks, words, inside = reduce_axes(k)
  inner = [k.rngs[a] for a in inside]
  # a span of 0 (or sizes tuned before there was one) gives a thread whole 32-element blocks
  tuned, span = k.copy(), (span or max(1, 32 // word_elements(k))) if words is not None else 1
  for pair in _pair_products(k): tuned.apply_opt(Opt(OptOps.UNROLL, tuned.unrollable_dims.index(tuned.rngs.index(pair)), 0))
  if words is not None:
    if (span := gcd(span, k.full_shape[words])) > 1:
      tuned.apply_opt(Opt(OptOps.UNROLL, tuned.unrollable_dims.index(_reduce_axis(tuned, k.rngs[words].arg)), span))
    if words != blocks and (lanes := k.full_shape[words] // span) > 1:
      _group(tuned, k.rngs[words].arg, lanes)
      threads = max(1, threads // lanes)
  if _reduce_axis(tuned, k.rngs[blocks].arg) is not None:   # none where the span took a whole short row
    _group_divisor(tuned, k.rngs[blocks].arg, threads)
  # the steps a thread walks over a row unrolled, their loads in flight together: one element a step (float weights), or
  # a span of words (packed_words) up to UNROLL_ELEMENTS weights for all the thread's rows (more took a Q8_0 kernel to
  # 254 registers); whole blocks (packed_dot) unroll the elements inside a block below instead
  if words is None and not inside: _unroll_steps(tuned, k.rngs[blocks].arg)
  elif words is not None: _unroll_steps(tuned, k.rngs[blocks].arg, min(REDUCE_UNROLL, UNROLL_ELEMENTS // (span * word_elements(k) * rows)))
  for op, n in ((OptOps.LOCAL, block), (OptOps.UPCAST, rows)):
    if n > 1: tuned.apply_opt(Opt(op, axis, n))
  # an output axis that no input is indexed by (a folded norm's dots and squares) goes to the thread's registers: the
  # thread reads its inputs once for all of them
  for a in reversed(tuned.axes_of(AxisType.GLOBAL)):
    if a != axis and isinstance(n := tuned.full_shape[a], int) and 1 < n <= MAX_SHORT_OUTPUTS and \
       sum(tuned.rngs[a] in idx for idx in _indices(tuned)) == 1:
      tuned.apply_opt(Opt(OptOps.UPCAST, a, n))
  # each sum inside a thread's words on its own (a packed_words matvec has two over the same elements, its products and
  # x's sum): a budget shared by both would leave a loop of the first. Axes of the outer sum left inside a thread (the
  # experts of a mixed MoE matvec) stay loops: unrolled, a down-experts kernel spilled (255 registers)
  outer = _outer_reduce(k)
  sums = [[r for r in inner if r in red.src[1:]] for red in k.reduceops if red is not outer] if words is not None else [inner]
  for axes in sums:
    unrolled = span
    for r in reversed(axes):
      if r not in tuned.rngs: continue   # an earlier opt took the axis whole (a sum of a few elements, say of the first k experts' weights)
      a = tuned.rngs.index(r)
      if not isinstance(n := tuned.full_shape[a], int) or unrolled * n > 32: break
      tuned.apply_opt(Opt(OptOps.UNROLL, tuned.unrollable_dims.index(a), 0))
      unrolled *= n
  return tuned

def _reduce_axis(k: Scheduler, arg: tuple) -> int | None:
  """Where the loop left of an axis (a reduce or an output axis) is after opts split it (they keep its range's arg); None
  if none is left."""
  return next((a for a, r in enumerate(k.rngs) if r.arg == arg), None)

def _group_divisor(k: Scheduler, arg: tuple, limit: int) -> None:
  """GROUPs the loop left of reduce axis `arg` over the most threads, up to `limit`, that divide it (20 blocks a row:
  20 threads, not 4)."""
  a = _reduce_axis(k, arg)
  if (threads := max(d for d in range(1, limit + 1) if k.full_shape[a] % d == 0)) > 1: _group(k, arg, threads)

def _group(k: Scheduler, arg: tuple, threads: int) -> None:
  """GROUPs the loop left of reduce axis `arg` over `threads` threads. tinygrad refuses a GROUP inside another reduce
  (its if-contexts around a loop); inside reduces that are all unrolled (a product over a pair) there is no loop, and
  the split is made directly."""
  a = _reduce_axis(k, arg)
  opt = Opt(OptOps.GROUP, k.axes_of(AxisType.REDUCE).index(a), threads)
  try: k.apply_opt(opt)
  except KernelOptError:
    rng = k.rngs[a]
    # the reduces around it use its range, do not sit inside it (the sums inside a word do) and do not sum over any part
    # of its axis (opts split an axis into ranges of one first number)
    def owns(red) -> bool: return any(u is not None and u.op is Ops.RANGE and u.arg[0] == rng.arg[0] for u in red.src[1:])
    around = [red for red in k.reduceops if not owns(red) and rng not in red.ranges and rng in red.src[0].backward_slice_with_self]
    if not around or any(u in k.rngs and u.arg[-1] is AxisType.REDUCE for red in around for u in red.src[1:]): raise
    k.shift_to(k.rngs[a], threads, AxisType.GROUP_REDUCE)
    k.applied_opts.append(opt)

def _unroll_steps(k: Scheduler, arg: tuple, steps: int = REDUCE_UNROLL) -> None:
  """Unrolls `steps` steps (or fewer that divide them) of the loop left of reduce axis `arg` to a thread, so that their
  loads are in flight together."""
  if (a := _reduce_axis(k, arg)) is not None and (n := gcd(steps, k.full_shape[a])) > 1:
    k.apply_opt(Opt(OptOps.UNROLL, k.unrollable_dims.index(a), n))

def rule_gpu_sizes(k: Scheduler) -> Sizes:
  """The built-in rule's sizes for a GPU matvec kernel."""
  blocks, words, inside = reduce_axes(k)
  steps = k.full_shape[blocks] * (k.full_shape[words] if words not in (None, blocks) else 1)
  if any(u.op is Ops.CUSTOMI and u.arg.startswith(dp4a.NAME) for u in k.ast.toposort()): return integer_gpu_sizes(steps)
  # pairs of weight rows (gate and up) index the weights; a folded norm's pair is a dot and x's squares
  pairs, indices, row = _pair_products(k), _indices(k), matvec_row_axis(k)
  row_pairs = sum(any(pair in idx for idx in indices) for pair in pairs)
  experts = any(a != row and k.full_shape[a] > 1 for a in k.axes_of(AxisType.GLOBAL, AxisType.WEAK))
  return builtin_gpu_sizes(k.full_shape[row], steps, k.full_shape[inside[-1]] if inside else 1, word_elements(k),   # type: ignore[index]
                           row_pairs, squares=len(pairs) > row_pairs, experts=experts)

def integer_gpu_sizes(steps: int) -> Sizes:
  """An int8_dot matvec (its dp4a a custom op): a row of `steps` blocks over half as many threads (two blocks a thread),
  at most 128, one row a thread, workgroups of at least 128 threads: the fastest of the sizes swept on a GPU for short
  and for long rows (the journal's int8_dot gemv records)."""
  threads = min(128, max(1, steps // 2))
  return threads, max(1, 128 // threads), 1

def builtin_gpu_sizes(rows: int, steps: int, inner: int, word: int = 0, pairs: int = 0, squares: bool = False, experts: bool = False) -> Sizes:
  """Threads per row, rows per workgroup, rows per thread (and the span, for `word` elements a word; 0 for a flat
  reduce) for `rows` rows of `steps` blocks (words, for packed_words) whose innermost loop is `inner`. A row of a pair
  product of weight rows is two sums: half the rows a thread for each of its `pairs` (a thread of as many rows as a
  plain matvec's spilled its registers). A folded norm's `squares` (of x, shared by a thread's rows) halve them only up
  to 2048 rows, whose kernels need the workgroups; larger ones keep a plain matvec's rows (each faster so in models on a
  GPU: results/gpu_notes.md). The pairs of the `experts` a token uses (gate and up experts with their activation) take
  EXPERT_PAIR_THREADS threads a row, a word each, 2 rows a thread."""
  if word and pairs and experts:
    threads = min(EXPERT_PAIR_THREADS, steps)
    return threads, max(1, 64 // threads), 2, 1
  if word:
    half = 2 if rows <= 2048 else 1
    span = max(1, SPAN_ELEMENTS // half // word)
    threads = min(64, steps // span)
    return threads, max(1, 64 // threads), max(1, 4 // half >> (pairs + (squares and half == 2))), span
  # a thread's rows share its activation loads, but few rows (a MoE router's) need one a thread to fill the GPU
  per_thread, threads = (1 if inner >= 32 or rows < 1024 else 4), 16
  while threads < min(128, steps) and rows // per_thread * threads < GPU_MATVEC_THREADS: threads *= 2
  return threads, max(1, 64 // threads), per_thread

CHUNK_THREADS = 16

def gpu_chunked_reduce(k: Scheduler) -> Scheduler | None:
  """A sum or max over a symbolic number of chunks of static length (attention over the valid part of a KV cache):
  tinygrad's heuristic leaves the positions to one thread each, which walks them all in turn; this GROUPs the chunk
  axis over CHUNK_THREADS threads first, then lets the heuristic do the rest. None for other kernels."""
  reduces = k.axes_of(AxisType.REDUCE)
  if k.reduceop is None or all(isinstance(k.full_shape[a], int) for a in reduces): return None
  static = [a for a in reduces if isinstance(n := k.full_shape[a], int) and n % CHUNK_THREADS == 0]
  if not static: return None
  tuned = k.copy()
  tuned.apply_opt(Opt(OptOps.GROUP, reduces.index(max(static, key=lambda a: k.full_shape[a])), CHUNK_THREADS))
  return tinygrad_heuristic(tuned)

def gpu_sums_in_short_reduces(k: Scheduler) -> Scheduler | None:
  """A kernel whose outermost reduce runs over short constant axes around sums of their own (the attention logits with
  a key norm, ops/attention.py: a product over a dot and squares summed in one, and under softmax self a sum over each
  key and the query's own): tinygrad's heuristic splits no sum inside another over threads, and gave each thread a
  chunk's positions' sums over the whole head in turn. This unrolls the
  short reduces, GROUPs each long sum's longest axis over CHUNK_THREADS threads, then lets the heuristic do the rest.
  None for other kernels."""
  if k.reduceop is None: return None
  def size(r) -> int | None: return n if r in k.rngs and isinstance(n := k.full_shape[k.rngs.index(r)], int) else None
  # a range two reduces share (the routing's first-k weights summed beside the values) is unrolled once
  short = list(dict.fromkeys(r for red in k.reduceops for r in red.src[1:] if (n := size(r)) is not None and n <= MAX_SHORT_OUTPUTS))
  sums = list(dict.fromkeys(max(static, key=size) for red in k.reduceops if red.arg[0] is Ops.ADD
                            if (static := [r for r in red.src[1:] if (size(r) or 0) > MAX_SHORT_OUTPUTS])))
  if not sums or not all(r in short for r in _outermost(k).src[1:]): return None
  tuned = k.copy()
  for r in short: tuned.apply_opt(Opt(OptOps.UNROLL, tuned.unrollable_dims.index(tuned.rngs.index(r)), 0))
  for r in sums: _group_divisor(tuned, r.arg, CHUNK_THREADS)
  return tinygrad_heuristic(tuned)

LOGIT_LANES, LOGIT_POSITIONS = 8, 16
# query heads a thread takes at most: more (10 of GLM-4.7-Flash's 20 latent heads, 16 of DeepSeek-V2-Lite's) leave a
# thread summing them in turn over 576-wide keys, the kernel's time where few positions give few workgroups
LOGIT_HEADS = 4
LOGIT_UNROLLED = 128  # at most these terms a thread sums in one step: unrolled reduces, query heads and the unrolled steps
LOGIT_STEPS = 16      # and at most these steps of the longest axis
VALUE_COLUMNS = 2    # a value sum's columns a thread (one load), of LOGIT_POSITIONS a workgroup

def gpu_chunked_logits(k: Scheduler) -> Scheduler | None:
  """Sums over a head's elements with a symbolic number of chunks of positions among the outputs (attention logits
  over the valid part of a KV cache, ops/attention.py). tinygrad's heuristic merged the chunks into one launch axis
  with the kv heads: gpt-oss-20b's logits ran as a few workgroups, each thread rotating a key again for each query
  head that reads it. This gives a thread one position's logits for the query heads of its group, up to LOGIT_HEADS
  that divide them (UPCAST: a key is loaded and rotated once for them), LOGIT_LANES neighbouring threads the elements
  of a head (their loads of a key coalesce) and LOGIT_POSITIONS positions a workgroup, and unrolls the rest of the sum
  (a rotation's pair axis, then up to LOGIT_STEPS steps of the longest axis, as many as keep a step's terms within
  LOGIT_UNROLLED, where at least 4 fit). Split attention's value sums take the same form over a part's positions (8
  chunks unrolled for the 16 heads of a latent attention spilled a thread's registers; with the chunks merged into one
  axis by tinygrad, 4 steps left a llama3.2-1b value sum a loop of 8), their columns in place of the positions: the
  cache's contiguous axis, so that a workgroup's columns go to its first threads, VALUE_COLUMNS a thread, and the lanes
  split the positions (lanes first, a warp's loads of the values touched 8 positions of 8 bytes). None for other
  kernels."""
  if k.reduceop is None: return None
  outputs, reduces = k.axes_of(AxisType.GLOBAL, AxisType.WEAK), k.axes_of(AxisType.REDUCE)
  chunks = [a for a in outputs if not isinstance(k.full_shape[a], int)]
  if len(chunks) != 1 or not reduces or not all(isinstance(k.full_shape[a], int) for a in reduces): return None
  # the positions of a chunk; where tinygrad merged them with the chunks (split attention's parts, read from the cache's
  # static shape), the merged axis
  positions = next((a for a in outputs if a > chunks[0]), None)
  if positions is None and k.full_shape[chunks[0]].divides(LOGIT_POSITIONS) is not None: positions = chunks[0]
  if positions is None or (isinstance(n := k.full_shape[positions], int) and n % LOGIT_POSITIONS): return None
  loads = _index_exprs(k, loads=True)
  keyed = [parts for idx in loads if k.rngs[positions] in (parts := idx.backward_slice_with_self)]
  # the query heads a thread takes of each group axis: the most, up to LOGIT_HEADS, that divide it
  group = {k.rngs[a]: max(d for d in range(1, LOGIT_HEADS + 1) if n % d == 0) for a in outputs if a not in (chunks[0], positions)
           and isinstance(n := k.full_shape[a], int) and n > 1 and not any(k.rngs[a] in idx for idx in keyed)}
  longest = max(reduces, key=lambda a: k.full_shape[a])
  tuned, arg = k.copy(), k.rngs[longest].arg
  others = [k.rngs[a] for a in reduces if a != longest]
  terms = prod(group.values())
  # neighbouring threads take neighbouring elements of the cache: the positions' LOCAL first (its threads the fastest)
  # where they are its contiguous axis (a value sum's columns), else the lanes of a head's elements (a key's)
  columns = any(_unit_stride(idx, k.rngs[positions]) for idx in loads)
  if columns:
    tuned.apply_opt(Opt(OptOps.UPCAST, positions, VALUE_COLUMNS))
    tuned.apply_opt(Opt(OptOps.LOCAL, _reduce_axis(tuned, k.rngs[positions].arg), LOGIT_POSITIONS // VALUE_COLUMNS))
  if prod(r.vmax + 1 for r in others) * terms * REDUCE_UNROLL <= LOGIT_UNROLLED:
    for r in others: tuned.apply_opt(Opt(OptOps.UNROLL, tuned.unrollable_dims.index(tuned.rngs.index(r)), 0))
    terms *= prod(r.vmax + 1 for r in others)
  _group_divisor(tuned, arg, LOGIT_LANES)
  _unroll_steps(tuned, arg, min(LOGIT_STEPS, LOGIT_UNROLLED // terms))
  for r, heads in group.items(): tuned.apply_opt(Opt(OptOps.UPCAST, tuned.rngs.index(r), heads))
  if not columns: tuned.apply_opt(Opt(OptOps.LOCAL, tuned.rngs.index(k.rngs[positions]), LOGIT_POSITIONS))
  return tuned

FULL_REDUCE_THREADS = 256

def gpu_full_reduce(k: Scheduler) -> Scheduler | None:
  """A sum or max of constant size down to one value (a norm's sum of squares, the argmax's last max): tinygrad's
  heuristic GROUPs it over 16 threads, each walking 1/16 of it (8192 values: 512 loads in turn); this takes up to
  FULL_REDUCE_THREADS threads and unrolls what each walks by REDUCE_UNROLL, so that its loads are in flight together.
  None for other kernels."""
  reduces = k.axes_of(AxisType.REDUCE)
  if k.reduceop is None or len(reduces) != 1 or not all(isinstance(s, int) for s in k.full_shape) or \
     prod(k.full_shape[a] for a in k.axes_of(AxisType.GLOBAL, AxisType.WEAK)) != 1: return None
  tuned, arg = k.copy(), k.rngs[reduces[0]].arg
  _group_divisor(tuned, arg, FULL_REDUCE_THREADS)
  _unroll_steps(tuned, arg)
  return tuned
