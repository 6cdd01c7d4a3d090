"""`tinyzoo matvec`: one real weight per GGML type of a model, its matvec under each strategy, in JIT steady state; or one
random weight of a given shape and type against the device's copy bandwidth."""
import math
import os
import numpy as np
from gguf import quants as gguf_quants
from gguf import GGMLQuantizationType
from tinygrad import Device, Tensor, dtypes
from experiments import journal
from experiments.bench import copy_bandwidth
from quant.gguf_file import GGUFFile
from quant.activations import round_activations
from quant.int8_dot import Int8Rows
from quant.linear import STRATEGIES, QuantExperts, QuantLinear
from quant.formats import FORMATS
from quant.qtensor import QTensor
from quant.random_blocks import random_blocks
from quant.matvec_opts import Sizes, kernel_settings
from experiments.steady import steady_state
from ops.activations import swiglu
from ops import patches

def bench_model(path: os.PathLike, strategies: str, iters: int, batch: int, row_upcast: int) -> None:
  chosen = [s.strip() for s in strategies.split(",") if s.strip()]
  if (bad := [s for s in chosen if s not in STRATEGIES]): raise ValueError(f"unknown strategy {bad[0]!r} (choose from {', '.join(STRATEGIES)})")
  patches.install()
  with kernel_settings(row_upcast): _bench_model(path, chosen, iters, batch, row_upcast)

def _bench_model(path: os.PathLike, chosen: list[str], iters: int, batch: int, row_upcast: int) -> None:
  g = GGUFFile(path)
  largest: dict = {}
  for t in g.tensors.values():
    if len(t.shape) == 2 and t.ggml_type in FORMATS and t.nbytes > getattr(largest.get(t.ggml_type), "nbytes", -1): largest[t.ggml_type] = t
  print(f"model {os.path.basename(g.path)} on {Device.DEFAULT}, batch {batch}, row upcast {row_upcast}, median of {iters} JIT replays")
  print(f"{'type':<6} {'tensor':<22} {'shape':>13} {'strategy':<14} {'kernels':>7} {'ms':>9} {'GB/s':>7}")
  for info in sorted(largest.values(), key=lambda t: t.ggml_type.name):
    w = g.load(info.name)
    x = Tensor.randn(batch, info.shape[1], dtype=dtypes.float32).realize()
    for s in chosen:
      lin = QuantLinear(w, strategy=s)
      m = steady_state(lin, x, iters=iters)
      read = sum(t.nbytes() for t in lin.device_tensors)
      print(f"{info.ggml_type.name:<6} {info.name:<22} {'x'.join(map(str, info.shape)):>13} {s:<14} {m.kernels:>7} {m.median_ms:>9.3f} "
            f"{read / m.median_ms / 1e6:>7.2f}", flush=True)

# the largest error of the first weight's output against float64 numpy, relative to its largest value, that counts as
# correct: float32 sums (and the fp16 weights of dequant_cache) stay near 1e-4, a kernel that drops or repeats work is off by O(1)
GEMV_TOLERANCE = 1e-3
# weights a gemv reads in turn by default: many times a GPU's L2, as a model's weights outgrow it, and a replay long enough
# to hide the host's time to issue it (with a quarter of it, the same kernel's time moved from one run to the next,
# host-bound at times). At most MAX_COPIES weights, each a kernel to schedule: weights under about 100 KB then stay in L2
CACHE_BEATING_BYTES = 1 << 30
MAX_COPIES = 512
# an expert gemv's weights hold every expert of which it reads a few: at most this many bytes of them in all (made on the
# host, then copied to the device)
EXPERT_BYTES_LIMIT = 2 << 30
COPY_GRAIN = 1 << 14
# threads per row, rows per workgroup, rows per thread, span (words a thread reads; 0: a whole block): workgroups of 32
# to 128 threads
SIZE_GRID = [(t, b, r, s) for t in (16, 32, 64, 128) for b in (1, 2, 4) for r in (2, 4, 8) for s in (1, 2, 0) if 32 <= t * b <= 128]

def default_copies(t: GGMLQuantizationType, rows: int, cols: int, experts: tuple[int, int] | None = None) -> int:
  """Weights enough for CACHE_BEATING_BYTES of reads, at most MAX_COPIES; of experts (N, K: K of N read), at most
  EXPERT_BYTES_LIMIT of them in all."""
  weight_bytes = math.prod(gguf_quants.quant_shape_to_byte_shape((rows, cols), t))
  n, k = experts or (1, 1)
  return min(MAX_COPIES, max(2, math.ceil(CACHE_BEATING_BYTES / (k * weight_bytes))), max(2, EXPERT_BYTES_LIMIT // (n * weight_bytes)))

def copies_at_size(nbytes: int, copies: int, iters: int) -> tuple[float, float]:
  """GB/s (read plus written) and us per copy of `copies` device copies of about nbytes each, back to back in one replay
  as the gemv's weights are: what a kernel moving one weight's bytes reaches here with its launch, ramp and drain, which
  a large copy hides."""
  # whole 16 KiB chunks, not a multiple of 3 of them: tinygrad's heuristic upcasts an elementwise kernel by 3 where it
  # can, and a Q4_0 weight's 2^18 x 9 words were copied a word a load, far below a large copy's rate
  chunks = max(1, nbytes // COPY_GRAIN)
  words = (chunks - (chunks > 1 and chunks % 3 == 0)) * COPY_GRAIN // 4
  srcs = [Tensor.zeros(words, dtype=dtypes.uint32).contiguous().realize() for _ in range(copies)]
  m = steady_state(lambda v: [(s + v).realize() for s in srcs][-1], Tensor([1], dtype=dtypes.uint32).realize(), iters=iters)
  return 2 * 4 * srcs[0].numel() * copies / m.pipelined_ms / 1e6, m.pipelined_ms * 1e3 / copies

def gemv_bandwidth(ggml_type: str, rows: int, cols: int, strategy: str = "packed_dot", copies: int | None = None, iters: int = 50,
                   sweep: list[Sizes | None] | None = None, pdl: bool = False, prefetch: bool = False, row_upcast: int = 8,
                   tuned: dict[str, Sizes] | None = None, experts: tuple[int, int] | None = None, mixed: bool = False,
                   act: bool = False) -> list[dict]:
  """One matvec over `copies` random weights of [rows, cols] in turn (by default enough to outgrow the caches, so the
  replays read memory), in JIT steady state with replays back to back, against a device copy measured in the same run
  (a large one, and one a weight's size per kernel as many times):
  one journal record per GPU matvec size in `sweep` (None: the sizes the kernels get by default: `tuned` per kernel
  shape, else the built-in rule), each naming the kernel shape it timed and whether its output matched numpy. `pdl`: the
  matvecs chained by programmatic dependent launch (ops/cuda_graph.py), with `prefetch` each asking the L2 for its
  weight before it waits. Under int8_dot, x is quantized
  once a replay for all the weights (a kernel of its own, as a model's matmuls reading one x share it) and the output is
  checked against x rounded as ggml rounds it.

  With `experts` (N, K) each weight is N experts of [rows, cols] and a MoE's expert matmul (QuantExperts) reads K of them,
  drawn at random per weight: one x for all K ([K, rows] out: gate and up), or with `mixed` an x per expert and their
  outputs summed with random weights ([rows] out: down); the bytes counted are the K experts'. With `act` the rows are
  joined gate and up halves and the kernel computes SwiGLU of each pair of rows, as a model's act_in_matmul does."""
  if ggml_type not in GGMLQuantizationType.__members__: raise ValueError(f"unknown GGML type {ggml_type!r}")
  if experts is not None and not 1 <= experts[1] <= experts[0]: raise ValueError(f"experts N,K need 1 <= K <= N, got {experts[0]},{experts[1]}")
  if mixed and experts is None: raise ValueError("a mixed gemv sums the chosen experts' outputs: give experts N,K")
  if act and (mixed or rows % 2): raise ValueError("an activation's gemv reads joined gate and up rows (an even number), not mixed experts")
  patches.install()
  t, rng = GGMLQuantizationType[ggml_type], np.random.default_rng()
  n, k = experts or (1, 1)
  copies = copies or default_copies(t, rows, cols, experts)
  shape = (n, rows, cols) if experts else (rows, cols)
  raws = [random_blocks(t, shape, rng) for _ in range(copies)]
  kind = QuantExperts if experts else QuantLinear
  lins = [kind(QTensor.from_bytes(raw, t, shape), strategy=strategy) for raw in raws]
  x_np = rng.standard_normal((k if mixed else 1, cols), dtype=np.float32)
  x = Tensor(x_np).realize()
  int8 = lins[0].int8
  x_seen = round_activations(x, t, "ggml").numpy() if int8 else x_np
  chosen = [rng.choice(n, k, replace=False) for _ in lins]   # a dense weight is its one expert
  sels = [Tensor(c.astype(np.int32)).realize() for c in chosen] if experts else [None] * copies
  mix_np = rng.random(k, dtype=np.float32)
  mix = Tensor(mix_np).realize()

  def given(v: Tensor) -> Tensor | Int8Rows:
    """x as the matmuls read it: [1, cols] (dense) or [1, 1 or K, cols] (experts), quantized where int8 (for them all)."""
    v = v if experts is None else v.unsqueeze(0)
    return Int8Rows.quantize(v) if int8 else v
  def matvec(lin, v: Tensor | Int8Rows, sel: Tensor | None) -> Tensor:
    if mixed: return lin.mixed(v, sel.unsqueeze(0), mix.unsqueeze(0))[0]
    y = lin(v)[0] if sel is None else lin(v, sel.unsqueeze(0))[0]   # [rows] or [K, rows]
    return swiglu.of_pairs(y.unflatten(-1, (2, -1))) if act else y
  # the first weight's chosen experts [K, rows, cols] against x (one row per expert where mixed, else one for all)
  w0 = gguf_quants.dequantize(raws[0].reshape(n, rows, -1)[chosen[0]], t).astype(np.float64)
  want = np.einsum("kor,kr->ko", w0, np.broadcast_to(x_seen.astype(np.float64), (k, cols)))
  if act:
    gate, up = np.split(want, 2, axis=-1)
    want = gate * (0.5 + 0.5 * np.tanh(gate / 2)) * up   # silu(gate) * up
  want = mix_np.astype(np.float64) @ want if mixed else want if experts else want[0]

  def step(v: Tensor) -> Tensor:
    if isinstance(xs := given(v), Int8Rows): xs.blocks.realize()
    return [matvec(lin, xs, sel).realize() for lin, sel in zip(lins, sels)][-1]
  read = sum(t.nbytes() for lin in lins for t in lin.device_tensors) * k // n
  name = f"gemv {ggml_type} {rows}x{cols}" + (f" experts {k} of {n}{' mixed' if mixed else ''}" if experts else "") + " swiglu" * act
  copy, records = copy_bandwidth(), []
  copy_at_size, copy_at_size_us = copies_at_size(read // copies, copies, iters)
  for sizes in sweep or [None]:
    with (kernels := kernel_settings(row_upcast, tuned, sizes, pdl, prefetch)):   # one kernel per weight, as in a model
      m = steady_state(step, x, iters=iters)
      err = float(np.abs(matvec(lins[0], given(x), sels[0]).numpy() - want).max() / np.abs(want).max())
    compiled_shapes = kernels.heuristic.compiled_shapes if kernels.heuristic is not None else []
    gb_s = read / m.pipelined_ms / 1e6   # device time: the host's time per synchronized call would swamp small weights
    switches = {"strategy": strategy, **({"gpu_matvec": ",".join(map(str, sizes))} if sizes else {}), **({"pdl": True} if pdl else {}),
                **({"pdl_prefetch": True} if pdl and prefetch else {})}
    records.append({**journal.context(), "model": name, "kind": "gemv", "switches": switches,
                    "kernel_shape": compiled_shapes[0] if compiled_shapes else None,
                    "metrics": {"rel_err": float(f"{err:.2e}"), "correct": err <= GEMV_TOLERANCE, "copies": copies,
                                "kernels": m.kernels, "ms": round(m.pipelined_ms, 4), "synced_ms": round(m.median_ms, 4), "bytes": read,
                                "gb_s": round(gb_s, 1),
                                "copy_gb_s": round(copy, 1), "fraction_of_copy": round(gb_s / copy, 3),
                                "copy_at_size_gb_s": round(copy_at_size, 1), "copy_at_size_us": round(copy_at_size_us, 2),
                                "programmatic_edges": kernels.edges[0]}})
  return records
