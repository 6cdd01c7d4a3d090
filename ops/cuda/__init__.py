"""Hand-written CUDA kernels beside tinygrad's, each a small CUDA C source in this folder with its launch sizes.

A kernel reaches tinygrad through `Tensor.custom_kernel` as a program whose source is given (as quant/int8_cpu.py's on
the CPU): tinygrad compiles it with NVRTC like its own, runs it inside TinyJit and CUDA graphs, counts it as a kernel
and `tinyzoo profile` attributes it by the buffers it reads. A store to the output and a load of each input, never
rendered, tell the scheduler what it writes and reads; the launch sizes are given the same way, as the grid and block
indices (SPECIAL) tinygrad would have rendered. Which kernel a matmul takes is a hint (`gemm`); tinygrad's kernel stays
the reference each one is tested against."""
import ctypes
import dataclasses
import functools
import math
from pathlib import Path
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from tinygrad import Tensor, dtypes
from tinygrad.renderer import Estimates
from tinygrad.uop.ops import KernelInfo, Ops, UOp, sint

HERE = Path(__file__).parent
# the `gemm` hint's choices: tinygrad's generated GEMM, gemm_mma.cu's, or gemm_int8.cu's where it reads the words
GEMMS = ("tinygrad", "mma", "mma_int8")
MIN_CAPABILITY = (8, 0)       # mma.sync m16n8k16, ldmatrix and cp.async: Ampere and later

class KernelRefused(ValueError): pass

def source(file: str, name: str, **defines: int | str) -> str:
  """A kernel's CUDA C from this folder with its defines (its name, its sizes) and what the kernels share (common.cuh)
  before it."""
  return "".join(f"#define {k} {v}\n" for k, v in {"NAME": name, **defines}.items()) + (HERE / "common.cuh").read_text() + (HERE / file).read_text()

def program(name: str, code: str, grid: tuple[int, int, int], block: tuple[int, int, int], flops: int = 0, variables: tuple[UOp, ...] = ()):
  """What `Tensor.custom_kernel` calls to make the program: `code` launched on `grid` blocks of `block` threads, its
  first parameter written and the others read, then each of `variables` (the JIT's, e.g. a decode step's position) as
  an int argument after the buffers, its value the one bound where the program runs."""
  def make(*params: UOp) -> UOp:
    # the flat buffers under the placeholders (a tensor of several axes is a reshape of one): the runtime lays out a
    # program's arguments from its LINEAR's buffers and then its variables, so every buffer must be there
    buffers = [next(u for u in p.toposort() if u.op is Ops.PARAM) for p in params]
    out, *ins = buffers
    first = UOp.const(0, dtypes.int)
    sizes = [UOp.special(n, f"{kind}idx{i}") for kind, dims in (("g", grid), ("l", block)) for i, n in enumerate(dims)]
    args = [UOp.variable(v.expr, v.vmin, v.vmax, dtypes.int32, param=True) for v in variables]
    args = [a.replace(arg=dataclasses.replace(a.arg, slot=len(params) + i)) for i, a in enumerate(args)]   # after the buffers
    read = sum((b.index(first).load().cast(dtypes.float32) for b in ins), sum(s.cast(dtypes.float32) for s in sizes + args))
    nbytes = sum(b.dtype.itemsize * math.prod(b.shape) for b in buffers)
    info = KernelInfo(name=name, estimates=Estimates(ops=flops, lds=nbytes, mem=nbytes))
    return UOp(Ops.PROGRAM, src=(UOp.sink(out.index(first).store(read), arg=info), UOp(Ops.LINEAR, src=tuple(buffers)), UOp(Ops.SOURCE, arg=code)))
  return make

def capability(device: str) -> tuple[int, int] | None:
  """A CUDA device's compute capability; None for another backend."""
  if device.split(":")[0] != "CUDA": return None
  from tinygrad import Device
  arch = str(getattr(Device[device], "arch", ""))
  return (int(arch[3:-1]), int(arch[-1])) if arch.startswith("sm_") else None

@functools.cache
def multiprocessors(device: str) -> int | None:
  """A CUDA device's streaming multiprocessors, from its driver; None for another backend or where it does not say."""
  if capability(device) is None: return None
  try:
    from tinygrad import Device
    from tinygrad.runtime.autogen import cuda
    count = ctypes.c_int()
    ok = cuda.cuDeviceGetAttribute(ctypes.byref(count), cuda.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, Device[device].cu_device) == 0
  except (AttributeError, ImportError, OSError): return None
  return count.value if ok else None

def refusal(kernel: str, device: str) -> str | None:
  """Why a hand-written kernel cannot run on `device`, in one line; None where it can."""
  if (cc := capability(device)) is None: return f"{kernel} runs on CUDA GPUs (tinygrad's CUDA backend), not {device}"
  if cc < MIN_CAPABILITY: return f"{kernel} needs compute capability {'.'.join(map(str, MIN_CAPABILITY))} or later, this GPU has {cc[0]}.{cc[1]}"
  return None

# the hints whose values take a hand-written kernel of this folder, and those values
HAND_WRITTEN = {"gemm": ("mma", "mma_int8"), "decode_attention": ("flash",), "prefill_attention": ("flash",)}
# the hints whose hand-written kernel reads the KV cache (an fp16 cache of heads)
CACHE_READERS = tuple(h for h, v in HAND_WRITTEN.items() if "flash" in v)

def hint_refusal(hint: str, value: object, device: str) -> str | None:
  """Why a hint's value cannot run on `device` (a hand-written kernel off a CUDA GPU), in one line; None where it can."""
  return refusal(f"{hint} {value}", device) if value in HAND_WRITTEN.get(hint, ()) else None

GEMM_TILE, GEMM_K_STEP, GEMM_THREADS = 128, 32, 256
# the packed weights gemm_mma reads as they are stored: GGML type name -> its WEIGHTS in gemm_mma.cu (0 is fp16
# weights), in quant/words.py's word layout, or GGUF's own blocks (their sizes gguf's GGML_QUANT_SIZES)
GEMM_WORD_TYPES = {"Q4_0": 1, "Q8_0": 2, "MXFP4": 3}
GEMM_BLOCK_TYPES = {"Q4_K": 4, "Q6_K": 5, "Q5_0": 6}

def _fixed(*ts: Tensor) -> bool: return all(isinstance(s, int) for t in ts for s in t.shape)

def gemm_mma_applies(a: Tensor, b: Tensor) -> bool:
  """Whether gemm_mma computes a @ b.T: two fp16 matrices of fixed shapes sharing K, a multiple of its K step."""
  return (a.ndim == b.ndim == 2 and a.dtype == b.dtype == dtypes.float16 and _fixed(a, b)
          and a.shape[1] == b.shape[1] and a.shape[1] % GEMM_K_STEP == 0)

def gemm_tile_rows(m: int, n: int, sms: int | None) -> int:
  """A tile's rows: 128, or 64 where 128-row tiles would be fewer than the GPU's multiprocessors (a short or narrow GEMM)."""
  return 64 if sms is not None and math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) < sms else GEMM_TILE

GEMM_TILE_ROWS = (128, 64, 32)   # the tile rows gemm_mma.cu is written for (32: an expert tile's alone)

def gemm_mma_source(name: str, m: int, n: int, k: int, weights: int = 0, tile_rows: int = GEMM_TILE, grouped: bool = False,
                    file: str = "gemm_mma.cu") -> str:
  return source(file, name, M=m, N=n, K=k, WEIGHTS=weights, GROUPED=int(grouped), BM=tile_rows, BN=GEMM_TILE, BK=GEMM_K_STEP,
                THREADS=GEMM_THREADS)

def _gemm(rows: tuple[Tensor, ...], n: int, ggml_type: str | None, w: tuple[Tensor, ...], tile_expert: Tensor | None = None) -> Tensor:
  """The program of gemm_mma.cu for rows (a [M, K]) against weights `w` of N rows (fp16, or the words or blocks of
  `ggml_type`), with `tile_expert` grouped by expert in tiles of M / len(tile_expert) rows; gemm_int8.cu's for rows
  quantized (their int8 quants and their blocks' scales) against the words."""
  (m, k), grouped, int8 = rows[0].shape, tile_expert is not None, len(rows) == 2
  a = rows[0]
  bm = m // tile_expert.shape[0] if grouped else gemm_tile_rows(m, n, multiprocessors(a.device))
  kind = "f16" if ggml_type is None else ggml_type.lower()
  name = f"r_gemm_{'int8' if int8 else 'mma'}_{kind}{'_grouped' if grouped else ''}_{m}x{n}x{k}"   # r_: a reduce, as tinygrad names them
  grid = (math.ceil(n / GEMM_TILE), math.ceil(m / bm), 1)
  weights = 0 if ggml_type is None else {**GEMM_WORD_TYPES, **GEMM_BLOCK_TYPES}[ggml_type]
  code = gemm_mma_source(name, m, n, k, weights, bm, grouped, "gemm_int8.cu" if int8 else "gemm_mma.cu")
  out = Tensor.empty(m, n, dtype=dtypes.float32, device=a.device)
  ins = [*rows, *w] + ([tile_expert.cast(dtypes.int32)] if grouped else [])
  return Tensor.custom_kernel(out, *(t.contiguous() for t in ins), fxn=program(name, code, grid, (GEMM_THREADS, 1, 1), 2 * m * n * k))[0]

def gemm_mma(a: Tensor, b: Tensor) -> Tensor:
  """a [M, K] @ b [N, K].T -> [M, N] float32, both fp16 (where `gemm_mma_applies`), by gemm_mma.cu."""
  if not gemm_mma_applies(a, b):
    raise KernelRefused(f"gemm mma takes two fp16 matrices of fixed shapes with K a multiple of {GEMM_K_STEP}: "
                        f"{a.shape} {a.dtype}, {b.shape} {b.dtype}")
  return _gemm((a,), b.shape[0], None, (b,))

def gemm_mma_words_applies(a: Tensor, ggml_type: str, words: Tensor, scales: Tensor, tile_expert: Tensor | None = None) -> bool:
  """Whether gemm_mma_words computes a @ W.T: a fp16 [M, K] against one matrix's words [N, K/32, words a block], or with
  tile_expert [tiles] experts' words [experts, N, K/32, words a block] in tiles of 32, 64 or 128 rows."""
  return ggml_type in GEMM_WORD_TYPES and a.dtype == dtypes.float16 and _words_apply(a, words, scales, tile_expert)

def _words_apply(a: Tensor, words: Tensor, scales: Tensor, tile_expert: Tensor | None) -> bool:
  lead = 0 if tile_expert is None else 1
  return (_rows_apply(a, words, tile_expert) and words.ndim == 3 + lead and words.shape[-2] * 32 == a.shape[1]
          and scales.shape == words.shape[:-1])

def _rows_apply(a: Tensor, w: Tensor, tile_expert: Tensor | None) -> bool:
  """Whether gemm_mma takes a's rows against the packed w: [M, K] of fixed shapes, in tiles of 32, 64 or 128 rows where
  grouped by expert."""
  return (a.ndim == 2 and _fixed(a, w)
          and (tile_expert is None or (tile_expert.ndim == 1 and a.shape[0] % tile_expert.shape[0] == 0
                                       and a.shape[0] // tile_expert.shape[0] in GEMM_TILE_ROWS)))

def gemm_mma_words(a: Tensor, ggml_type: str, words: Tensor, scales: Tensor, tile_expert: Tensor | None = None) -> Tensor:
  """a [M, K] (fp16) @ W.T -> [M, N] float32, W one matrix of a 32-element block format in quant/words.py's word layout
  (words uint32 [N, K/32, words a block], scales [N, K/32]: fp16, or MXFP4's E8M0 bytes), decoded inside the GEMM. With
  tile_expert [tiles], W is a MoE's experts ([experts, N, ...]) and a's rows are tiles of M / tiles rows, tile t through
  expert tile_expert[t] (ops/routing.py ExpertGroups)."""
  if not gemm_mma_words_applies(a, ggml_type, words, scales, tile_expert):
    raise KernelRefused(f"gemm mma reads the words of {', '.join(GEMM_WORD_TYPES)} against fp16 rows of fixed shapes (grouped: tiles of "
                        f"{', '.join(map(str, GEMM_TILE_ROWS))} rows): {ggml_type} {words.shape}, {a.shape} {a.dtype}")
  return _gemm((a,), words.shape[-3], ggml_type, (words, scales), tile_expert)

# the word formats gemm_int8.cu reads, their integer quants' products by mma.sync's int8 form
GEMM_INT8_TYPES = ("Q4_0", "Q8_0")

def gemm_int8_words(q: Tensor, d: Tensor, ggml_type: str, words: Tensor, scales: Tensor, tile_expert: Tensor | None = None) -> Tensor:
  """Rows quantized to Q8_0's blocks (q [M, K] int8, d [M, K / 32] float32 their scales: quant/activations.py
  q8_0_blocks) @ W.T -> [M, N] float32 in integers, as llama.cpp's MMQ: their products with the words of Q4_0 or Q8_0
  (as gemm_mma_words takes them, one matrix's or a MoE's experts' by tile) summed in int32 a block by gemm_int8.cu, each
  block's sums scaled in float32."""
  if (ggml_type not in GEMM_INT8_TYPES or q.dtype != dtypes.int8 or q.ndim != 2 or d.shape != (q.shape[0], q.shape[1] // 32)
      or not _words_apply(q, words, scales, tile_expert)):
    raise KernelRefused(f"gemm mma_int8 reads the words of {', '.join(GEMM_INT8_TYPES)} against int8 rows of fixed shapes and their "
                        f"scales (grouped: tiles of {', '.join(map(str, GEMM_TILE_ROWS))} rows): {ggml_type} {words.shape}, {q.shape} {q.dtype}")
  return _gemm((q, d.cast(dtypes.float32)), words.shape[-3], ggml_type, (words, scales), tile_expert)

def gemm_mma_blocks_applies(a: Tensor, ggml_type: str, blocks: Tensor, tile_expert: Tensor | None = None) -> bool:
  """Whether gemm_mma_blocks computes a @ W.T: a fp16 [M, K] against one matrix's GGUF blocks [N, K / elements, bytes]
  (QTensor.blocks), or with tile_expert [tiles] experts' [experts, N, ...], in tiles of 32, 64 or 128 rows."""
  if ggml_type not in GEMM_BLOCK_TYPES: return False
  elements, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
  return (a.dtype == dtypes.float16 and _rows_apply(a, blocks, tile_expert) and blocks.ndim == 3 + (tile_expert is not None)
          and blocks.dtype == dtypes.uint8 and blocks.shape[-1] == nbytes and blocks.shape[-2] * elements == a.shape[1])

def gemm_mma_blocks(a: Tensor, ggml_type: str, blocks: Tensor, tile_expert: Tensor | None = None) -> Tensor:
  """a [M, K] (fp16) @ W.T -> [M, N] float32, W one matrix of GGUF blocks as stored (QTensor.blocks, uint8 [N, K /
  elements, bytes]: Q4_K, Q6_K, Q5_0), decoded inside the GEMM; with tile_expert [tiles] a MoE's experts, as gemm_mma_words."""
  if not gemm_mma_blocks_applies(a, ggml_type, blocks, tile_expert):
    raise KernelRefused(f"gemm mma reads the blocks of {', '.join(GEMM_BLOCK_TYPES)} against fp16 rows of fixed shapes (grouped: tiles of "
                        f"{', '.join(map(str, GEMM_TILE_ROWS))} rows): {ggml_type} {blocks.shape}, {a.shape} {a.dtype}")
  return _gemm((a,), blocks.shape[-3], ggml_type, (blocks,), tile_expert)

# the `decode_attention` and `prefill_attention` hints' choices: tinygrad's kernels (ops/attention.py), or the flash
# kernels of decode_attention.cu (flash-decoding) and prefill_attention.cu (flash attention)
ATTENTIONS = ("tinygrad", "flash")
ATTENTION_THREADS = 128
ATTENTION_TILE = 64   # prefill_attention.cu's query rows a block

def flash_decode_parts(kv_heads: int, positions: int, sms: int | None) -> int:
  """Parts a decode step's positions split into: a power of two giving at least two blocks an SM over the kv heads (32
  SMs assumed where the driver does not say), no more than the cache has spans of 128 positions (a part's sums are
  written and combined whatever it read)."""
  want = math.ceil(2 * (sms or 32) / kv_heads)
  return max(1, min(1 << (want - 1).bit_length(), positions // 128))

def _cache(kv: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
  """A cache's keys and values, from its written buffers: (k, v), or one [2, 1, Hkv, L, D] holding both."""
  return (kv[0][0], kv[0][1]) if len(kv) == 1 else (kv[0], kv[1])

def flash_refusal(q: Tensor, kv: tuple[Tensor, ...], start_pos: sint, decode: bool = False) -> str | None:
  """Why the flash kernels cannot take this attention, in one line; None where they can: q [1, Hq, T, D] of one sequence
  (one row for flash_decode, `decode`; a chunk's for flash_prefill) against an fp16 cache of heads (kv: k [1, Hkv, L, D] and
  v, or both as one [2, 1, Hkv, L, D]), at most 16 query heads a kv head, a position that is a number or one variable,
  and the head sizes the kernel is written for: keys of whole 16-byte rows and values of 32 to 256 columns in steps of 32
  (decode), both 16 to 128 in steps of 16 (prefill)."""
  k, v = _cache(kv)
  what = "flash decoding" if decode else "flash attention"
  if q.ndim != 4 or q.shape[0] != 1 or (decode and q.shape[2] != 1):
    return f"{what} takes {'one query row' if decode else 'query rows'} of one sequence, not q of {q.shape}"
  if k.dtype != dtypes.float16 or v.dtype != dtypes.float16: return f"{what} reads an fp16 cache, not {k.dtype.name}"
  if not _fixed(q, k, v) or k.ndim != 4 or k.shape[0] != 1: return f"{what} reads a cache of heads [1, Hkv, L, D], not {k.shape}"
  (_, hq, _, d), (_, hkv, _, dk), dv = q.shape, k.shape, v.shape[-1]
  if d != dk or hq % hkv or hq // hkv > 16: return f"{what} takes up to 16 query heads a kv head of one size: {hq} of {d}, {hkv} of {dk}"
  if decode and (d % 8 or dv % 32 or dv > 256):
    return f"{what} takes keys of whole 16-byte rows and value heads of 32 to 256 columns, not {d} and {dv}"
  if decode and 4 * (hq // hkv) * (d + ATTENTION_THREADS // 32 * (dv + 2)) > 48 * 1024:
    return f"{what} keeps a block's query rows and sums in 48 KB of shared memory: {hq // hkv} query heads a kv head of {d} and {dv} do not fit"
  if not decode and (d % 16 or dv % 16 or d > 128 or dv > 128):
    return f"{what} takes key and value heads of 16 to 128 in steps of 16, not {d} and {dv}"
  if not isinstance(start_pos, int) and len(start_pos.variables()) != 1: return f"{what} takes a position of one variable"
  return None

def _attention_source(file: str, name: str, q: Tensor, kv: tuple[Tensor, ...], start_pos: sint, scale: float, window: int | None,
                      sinks: Tensor | None, softcap: float | None, **more: int) -> str:
  """A flash kernel's source with the defines both take: the heads, the cache, the softmax's scale, cap, window and sinks,
  where V lies, and the position where it is a number."""
  k, v = _cache(kv)
  (_, hq, _, d), (_, hkv, positions, _) = q.shape, k.shape
  return source(file, name, HKV=hkv, G=hq // hkv, D=d, DV=v.shape[-1], L=positions, WINDOW=window or 0, SCALE=f"{float(scale)!r}f",
                SOFTCAP=f"{float(softcap or 0)!r}f", SINKS=int(sinks is not None), V_OFFSET=hkv * positions * d if len(kv) == 1 else 0,
                SEPARATE_V=int(len(kv) == 2), THREADS=ATTENTION_THREADS, **more, **({"START_POS": start_pos} if isinstance(start_pos, int) else {}))

def _variables(start_pos: sint) -> tuple[UOp, ...]: return () if isinstance(start_pos, int) else tuple(start_pos.variables())

def flash_decode(q: Tensor, kv: tuple[Tensor, ...], start_pos: sint, *, scale: float, window: int | None = None, sinks: Tensor | None = None,
                 softcap: float | None = None) -> Tensor:
  """Attention of one query row q [1, Hq, 1, D] (float32, rotated and normalized) over positions 0 .. start_pos of an fp16
  cache kv (as written, after this step's write: (k, v) or one [2, 1, Hkv, L, D] buffer of both), decode_attention.cu's
  two kernels: the parts, then their combine -> [1, Hq, 1, Dv] float32. Softmax(q.k * scale), soft-capped, within a
  sliding window, with a sink logit per query head: as ops/attention.py's attention (where `flash_refusal` is None)."""
  if (why := flash_refusal(q, kv, start_pos, decode=True)) is not None: raise KernelRefused(why)
  k, v = _cache(kv)
  (_, hq, _, d), (_, hkv, positions, _), dv = q.shape, k.shape, v.shape[-1]
  parts = flash_decode_parts(hkv, positions, multiprocessors(q.device))
  name = f"r_flash_decode_{hq}x{hkv}x{d}x{dv}x{positions}"   # r_: reduces, as tinygrad names them
  code = _attention_source("decode_attention.cu", name, q, kv, start_pos, scale, window, sinks, softcap, PARTS=parts)
  qs = q.reshape(hq, d).cast(dtypes.float32).contiguous()
  part_sums = Tensor.empty(hq, parts, dv + 2, dtype=dtypes.float32, device=q.device)
  reads = 2 * hq * positions * (d + dv)
  part_sums = Tensor.custom_kernel(part_sums, qs, *kv, fxn=program(f"{name}_parts", code, (parts, hkv, 1), (ATTENTION_THREADS, 1, 1), reads,
                                                                  _variables(start_pos)))[0]
  return _combine(name, code, part_sums, sinks)

def _combine(name: str, code: str, part_sums: Tensor, sinks: Tensor | None) -> Tensor:
  """flash-decoding's second kernel (common.cuh NAME_combine): the parts [Hq, parts, Dv + 2] combined -> [1, Hq, 1, Dv]."""
  hq, _, dv = part_sums.shape[0], part_sums.shape[1], part_sums.shape[2] - 2
  out = Tensor.empty(hq, dv, dtype=dtypes.float32, device=part_sums.device)
  ins = (part_sums,) + (() if sinks is None else (sinks.cast(dtypes.float32).contiguous(),))
  return Tensor.custom_kernel(out, *ins, fxn=program(f"{name}_combine", code, (hq, 1, 1), (dv, 1, 1)))[0].reshape(1, hq, 1, dv)

LATENT_ROWS = 16   # latent_attention.cu's query rows a block

def latent_refusal(q: Tensor, rows: Tensor, start_pos: sint, v_dim: int) -> str | None:
  """Why flash_latent cannot take this latent attention, in one line; None where it can: query rows q [1, H, T, D] of one
  sequence against an fp16 latent cache rows [1, L, D] whose first v_dim columns are the values, D of 16 to 640 in steps
  of 16 and v_dim up to 512 in steps of 64, a position that is a number or one variable."""
  if q.ndim != 4 or q.shape[0] != 1: return f"flash attention of a latent cache takes query rows of one sequence, not q of {q.shape}"
  if rows.dtype != dtypes.float16: return f"flash attention of a latent cache reads an fp16 cache, not {rows.dtype.name}"
  if not _fixed(q, rows) or rows.ndim != 3 or rows.shape[0] != 1 or rows.shape[2] != q.shape[3]:
    return f"flash attention of a latent cache reads rows [1, L, D] of q's D, not {rows.shape} for q of {q.shape}"
  d = q.shape[3]
  if d % 16 or d > 640 or v_dim % 64 or v_dim > min(d, 512):
    return f"flash attention of a latent cache takes rows of 16 to 640 in steps of 16 and up to 512 value columns in steps of 64, not {d} and {v_dim}"
  if not isinstance(start_pos, int) and len(start_pos.variables()) != 1: return "flash attention of a latent cache takes a position of one variable"
  return None

def flash_latent(q: Tensor, rows: Tensor, start_pos: sint, *, scale: float, v_dim: int) -> Tensor:
  """Absorbed latent attention (DeepSeek-style MLA): q [1, H, T, D] (each head's q_nope through k_b, then its rotated q_pe;
  row t at position start_pos + t, which sees positions 0 .. start_pos + t) over the fp16 latent cache rows [1, L, D] as
  written (ops/mla.py LatentCache), their first v_dim columns the values: latent_attention.cu's parts, then their
  combine -> [1, H, T, v_dim] float32, softmax(q.row * scale) times the rows' values, as ops/mla.py's mla_attention (where
  `latent_refusal` is None). A decode step is T = 1; a prompt chunk's T * H rows share every read of a cache row."""
  if (why := latent_refusal(q, rows, start_pos, v_dim)) is not None: raise KernelRefused(why)
  (_, h, t, d), positions = q.shape, rows.shape[1]
  tiles = math.ceil(t * h / LATENT_ROWS)
  parts = flash_decode_parts(tiles, positions, multiprocessors(q.device))
  name = f"r_flash_latent_{h}x{t}x{d}x{v_dim}x{positions}"
  code = source("latent_attention.cu", name, H=h, T=t, D=d, DV=v_dim, L=positions, PARTS=parts, SCALE=f"{float(scale)!r}f", SINKS=0,
                THREADS=ATTENTION_THREADS, HT=LATENT_ROWS, **({"START_POS": start_pos} if isinstance(start_pos, int) else {}))
  qs = q.reshape(h, t, d).permute(1, 0, 2).reshape(t * h, d).cast(dtypes.float16).contiguous()
  part_sums = Tensor.empty(t * h, parts, v_dim + 2, dtype=dtypes.float32, device=q.device)
  part_sums = Tensor.custom_kernel(part_sums, qs, rows, fxn=program(f"{name}_parts", code, (parts, tiles, 1), (ATTENTION_THREADS, 1, 1),
                                                                   2 * t * h * positions * (d + v_dim), _variables(start_pos)))[0]
  return _combine(name, code, part_sums, None).reshape(t, h, v_dim).permute(1, 0, 2).reshape(1, h, t, v_dim)

def flash_prefill(q: Tensor, kv: tuple[Tensor, ...], start_pos: sint, *, scale: float, window: int | None = None,
                  sinks: Tensor | None = None, softcap: float | None = None) -> Tensor:
  """A prompt chunk's attention, q [1, Hq, T, D] (rotated and normalized; row i at position start_pos + i) over an fp16
  cache kv as written after the chunk's write, causal, as prefill_attention.cu's one tiled kernel -> [1, Hq, T, Dv]
  float32: no [T, positions] score tensor in memory. As ops/attention.py's attention (where `flash_refusal` is None)."""
  if (why := flash_refusal(q, kv, start_pos)) is not None: raise KernelRefused(why)
  k, v = _cache(kv)
  (_, hq, t, d), (_, hkv, positions, _), dv = q.shape, k.shape, v.shape[-1]
  name = f"r_flash_prefill_{hq}x{hkv}x{t}x{d}x{dv}x{positions}"
  code = _attention_source("prefill_attention.cu", name, q, kv, start_pos, scale, window, sinks, softcap, T=t, BR=ATTENTION_TILE)
  out = Tensor.empty(hq, t, dv, dtype=dtypes.float32, device=q.device)
  ins = (q.reshape(hq, t, d).cast(dtypes.float16).contiguous(), *kv) + (() if sinks is None else (sinks.cast(dtypes.float32).contiguous(),))
  flops = 2 * hq * t * positions * (d + dv)   # as if every row saw the whole cache: an upper bound
  return Tensor.custom_kernel(out, *ins, fxn=program(name, code, (math.ceil(t / ATTENTION_TILE), hq, 1), (ATTENTION_THREADS, 1, 1), flops,
                                                     _variables(start_pos)))[0].reshape(1, hq, t, dv)
