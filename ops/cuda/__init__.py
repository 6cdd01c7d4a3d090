"""Hand-written CUDA kernels beside tinygrad's, each a small CUDA C source in this folder with its launch sizes.

A kernel reaches tinygrad through `Tensor.custom_kernel` as a program whose source is given (as quant/int8_cpu.py's on
the CPU): tinygrad compiles it with NVRTC like its own, runs it inside TinyJit and CUDA graphs, counts it as a kernel
and `tinyzoo profile` attributes it by the buffers it reads. A store to the output and a load of each input, never
rendered, tell the scheduler what it writes and reads; the launch sizes are given the same way, as the grid and block
indices (SPECIAL) tinygrad would have rendered. Which kernel a matmul takes is a hint (`gemm`); tinygrad's kernel stays
the reference each one is tested against."""
import ctypes
import functools
import math
from pathlib import Path
from tinygrad import Tensor, dtypes
from tinygrad.renderer import Estimates
from tinygrad.uop.ops import KernelInfo, Ops, UOp

HERE = Path(__file__).parent
GEMMS = ("tinygrad", "mma")   # the `gemm` hint's choices: tinygrad's generated GEMM, or gemm_mma.cu's
MIN_CAPABILITY = (8, 0)       # mma.sync m16n8k16, ldmatrix and cp.async: Ampere and later

class KernelRefused(ValueError): pass

def source(file: str, name: str, **defines: int) -> str:
  """A kernel's CUDA C from this folder with its defines (its name, its sizes) before it."""
  return "".join(f"#define {k} {v}\n" for k, v in {"NAME": name, **defines}.items()) + (HERE / file).read_text()

def program(name: str, code: str, grid: tuple[int, int, int], block: tuple[int, int, int], flops: int = 0):
  """What `Tensor.custom_kernel` calls to make the program: `code` launched on `grid` blocks of `block` threads, its
  first parameter written and the others read."""
  def make(*params: UOp) -> UOp:
    out, *ins = [p.flatten() for p in params]
    first = UOp.const(0, dtypes.int)
    sizes = [UOp.special(n, f"{kind}idx{i}") for kind, dims in (("g", grid), ("l", block)) for i, n in enumerate(dims)]
    read = sum((b.index(first).load().cast(dtypes.float32) for b in ins), sum(s.cast(dtypes.float32) for s in sizes))
    nbytes = sum(p.dtype.itemsize * math.prod(p.shape) for p in params)
    info = KernelInfo(name=name, estimates=Estimates(ops=flops, lds=nbytes, mem=nbytes))
    return UOp(Ops.PROGRAM, src=(UOp.sink(out.index(first).store(read), arg=info), UOp(Ops.LINEAR, src=params), UOp(Ops.SOURCE, arg=code)))
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

def mma_refusal(device: str) -> str | None:
  """Why gemm_mma cannot run on `device`, in one line; None where it can."""
  if (cc := capability(device)) is None: return f"gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not {device}"
  if cc < MIN_CAPABILITY: return f"gemm mma needs compute capability {'.'.join(map(str, MIN_CAPABILITY))} or later, this GPU has {cc[0]}.{cc[1]}"
  return None

GEMM_TILE, GEMM_K_STEP, GEMM_THREADS = 128, 32, 256
# the packed weights gemm_mma reads as they are stored (quant/words.py's word layout): GGML type name -> its WEIGHTS
# in gemm_mma.cu; 0 is fp16 weights
GEMM_WORD_TYPES = {"Q4_0": 1, "Q8_0": 2, "MXFP4": 3}

def _fixed(*ts: Tensor) -> bool: return all(isinstance(s, int) for t in ts for s in t.shape)

def gemm_mma_applies(a: Tensor, b: Tensor) -> bool:
  """Whether gemm_mma computes a @ b.T: two fp16 matrices of fixed shapes sharing K, a multiple of its K step."""
  return (a.ndim == b.ndim == 2 and a.dtype == b.dtype == dtypes.float16 and _fixed(a, b)
          and a.shape[1] == b.shape[1] and a.shape[1] % GEMM_K_STEP == 0)

def gemm_tile_rows(m: int, n: int, sms: int | None) -> int:
  """A tile's rows: 128, or 64 where 128-row tiles would be fewer than the GPU's multiprocessors (a short or narrow GEMM)."""
  return 64 if sms is not None and math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE) < sms else GEMM_TILE

GEMM_TILE_ROWS = (128, 64, 32)   # the tile rows gemm_mma.cu is written for (32: an expert tile's alone)

def gemm_mma_source(name: str, m: int, n: int, k: int, weights: int = 0, tile_rows: int = GEMM_TILE, grouped: bool = False) -> str:
  return source("gemm_mma.cu", name, M=m, N=n, K=k, WEIGHTS=weights, GROUPED=int(grouped), BM=tile_rows, BN=GEMM_TILE, BK=GEMM_K_STEP,
                THREADS=GEMM_THREADS)

def _gemm(a: Tensor, n: int, weights: int, w: tuple[Tensor, ...], tile_expert: Tensor | None = None) -> Tensor:
  """The program of gemm_mma.cu for a [M, K] against weights `w` of N rows (`weights` as the source numbers them), with
  `tile_expert` grouped by expert in tiles of M / len(tile_expert) rows."""
  (m, k), grouped = a.shape, tile_expert is not None
  bm = m // tile_expert.shape[0] if grouped else gemm_tile_rows(m, n, multiprocessors(a.device))
  kind = "f16" if weights == 0 else next(t for t, v in GEMM_WORD_TYPES.items() if v == weights).lower()
  name = f"r_gemm_mma_{kind}{'_grouped' if grouped else ''}_{m}x{n}x{k}"   # r_: a reduce, as tinygrad names them
  grid = (math.ceil(n / GEMM_TILE), math.ceil(m / bm), 1)
  code = gemm_mma_source(name, m, n, k, weights, bm, grouped)
  out = Tensor.empty(m, n, dtype=dtypes.float32, device=a.device)
  ins = [a, *w] + ([tile_expert.cast(dtypes.int32)] if grouped else [])
  return Tensor.custom_kernel(out, *(t.contiguous() for t in ins), fxn=program(name, code, grid, (GEMM_THREADS, 1, 1), 2 * m * n * k))[0]

def gemm_mma(a: Tensor, b: Tensor) -> Tensor:
  """a [M, K] @ b [N, K].T -> [M, N] float32, both fp16 (where `gemm_mma_applies`), by gemm_mma.cu."""
  if not gemm_mma_applies(a, b):
    raise KernelRefused(f"gemm mma takes two fp16 matrices of fixed shapes with K a multiple of {GEMM_K_STEP}: "
                        f"{a.shape} {a.dtype}, {b.shape} {b.dtype}")
  return _gemm(a, b.shape[0], 0, (b,))

def gemm_mma_words_applies(a: Tensor, ggml_type: str, words: Tensor, scales: Tensor, tile_expert: Tensor | None = None) -> bool:
  """Whether gemm_mma_words computes a @ W.T: a fp16 [M, K] against one matrix's words [N, K/32, words a block], or with
  tile_expert [tiles] experts' words [experts, N, K/32, words a block] in tiles of 32, 64 or 128 rows."""
  lead = 0 if tile_expert is None else 1
  return (ggml_type in GEMM_WORD_TYPES and a.ndim == 2 and a.dtype == dtypes.float16 and words.ndim == 3 + lead and _fixed(a, words)
          and words.shape[-2] * 32 == a.shape[1] and scales.shape == words.shape[:-1]
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
  return _gemm(a, words.shape[-3], GEMM_WORD_TYPES[ggml_type], (words, scales), tile_expert)
