"""Hand-written CUDA kernels beside tinygrad's, each a small CUDA C source in this folder with its launch sizes.

A kernel reaches tinygrad through `Tensor.custom_kernel` as a program whose source is given (as quant/int8_cpu.py's on
the CPU): tinygrad compiles it with NVRTC like its own, runs it inside TinyJit and CUDA graphs, counts it as a kernel
and `tinyzoo profile` attributes it by the buffers it reads. A store to the output and a load of each input, never
rendered, tell the scheduler what it writes and reads; the launch sizes are given the same way, as the grid and block
indices (SPECIAL) tinygrad would have rendered. Which kernel a matmul takes is a hint (`gemm`); tinygrad's kernel stays
the reference each one is tested against."""
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
    sizes = [UOp(Ops.SPECIAL, dtypes.int, (UOp.const(n, dtypes.int),), f"{kind}idx{i}")
             for kind, dims in (("g", grid), ("l", block)) for i, n in enumerate(dims)]
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

def mma_refusal(device: str) -> str | None:
  """Why gemm_mma cannot run on `device`, in one line; None where it can."""
  if (cc := capability(device)) is None: return f"gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not {device}"
  if cc < MIN_CAPABILITY: return f"gemm mma needs compute capability {'.'.join(map(str, MIN_CAPABILITY))} or later, this GPU has {cc[0]}.{cc[1]}"
  return None

GEMM_TILE, GEMM_K_STEP, GEMM_THREADS = 128, 32, 256

def gemm_mma_applies(a: Tensor, b: Tensor) -> bool:
  """Whether gemm_mma computes a @ b.T: two fp16 matrices of fixed shapes sharing K, a multiple of its K step."""
  return (a.ndim == b.ndim == 2 and a.dtype == b.dtype == dtypes.float16 and all(isinstance(s, int) for s in (*a.shape, *b.shape))
          and a.shape[1] == b.shape[1] and a.shape[1] % GEMM_K_STEP == 0)

def gemm_mma_source(name: str, m: int, n: int, k: int) -> str:
  return source("gemm_mma.cu", name, M=m, N=n, K=k, BM=GEMM_TILE, BN=GEMM_TILE, BK=GEMM_K_STEP, THREADS=GEMM_THREADS)

def gemm_mma(a: Tensor, b: Tensor) -> Tensor:
  """a [M, K] @ b [N, K].T -> [M, N] float32, both fp16 (where `gemm_mma_applies`), by gemm_mma.cu."""
  if not gemm_mma_applies(a, b):
    raise KernelRefused(f"gemm mma takes two fp16 matrices of fixed shapes with K a multiple of {GEMM_K_STEP}: "
                        f"{a.shape} {a.dtype}, {b.shape} {b.dtype}")
  (m, k), n = a.shape, b.shape[0]
  name = f"r_gemm_mma_{m}x{n}x{k}"   # r_: a reduce, as tinygrad names them
  grid = (math.ceil(n / GEMM_TILE), math.ceil(m / GEMM_TILE), 1)
  code = gemm_mma_source(name, m, n, k)
  out = Tensor.empty(m, n, dtype=dtypes.float32, device=a.device)
  return Tensor.custom_kernel(out, a.contiguous(), b.contiguous(), fxn=program(name, code, grid, (GEMM_THREADS, 1, 1), 2 * m * n * k))[0]
