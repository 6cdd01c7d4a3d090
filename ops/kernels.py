"""What a TinyJit replays, kernel by kernel: the lab's core measurement. Kernels inside graph batches (and HCQ
command batches) are listed one by one, so the count does not depend on how the backend batches them."""
from dataclasses import dataclass
from typing import Callable
from tinygrad import Tensor, TinyJit, dtypes
from tinygrad.engine.jit import _TinyJit
from tinygrad.uop.ops import GroupOp, Ops, UOp

CATEGORIES = ("matmul", "reduce", "elementwise", "copy")

@dataclass(frozen=True)
class Kernel:
  name: str            # tinygrad's name, e.g. r_576_8_16_4
  call: UOp            # the CALL that launches it: its sources are the buffers it touches
  batch: int | None    # position in the replay of the batch that runs it; None when it is launched on its own

  @property
  def program(self) -> UOp | None:
    fn = self.call.src[0]
    return fn if fn.op is Ops.PROGRAM else fn.src[0] if fn.op is Ops.CUSTOM_FUNCTION and fn.src and fn.src[0].op is Ops.PROGRAM else None

  @property
  def is_reduce(self) -> bool: return self.name.startswith("r_")

  @property
  def computes(self) -> bool:
    """Whether it does float arithmetic; a kernel that only moves or casts values is a copy."""
    prg = self.program
    return prg is not None and any(u.op in GroupOp.ALU and dtypes.is_float(u.dtype) for u in prg.src[0].toposort())

def _kernels(call: UOp, batch: int | None) -> list[Kernel]:
  fn = call.src[0]
  if fn.op is Ops.PROGRAM: return [Kernel(fn.arg.function_name, call, batch)]
  if fn.op is Ops.COPY: return [Kernel("copy", call, batch)]
  if fn.op is Ops.CUSTOM_FUNCTION and fn.arg == "graph": return [k for c in fn.src[0].src for k in _kernels(c, batch)]
  if fn.op is Ops.CUSTOM_FUNCTION and fn.arg == "hcq":   # a submit program running a batch of kernels, or one of those kernels
    if (aux := getattr(call.arg, "aux", None)) is not None and aux.kernels:
      return [k for devs, kcall, _ in aux.kernels for _ in devs for k in _kernels(kcall, batch)]
    return [Kernel(fn.src[0].arg.function_name, call, batch)]
  raise RuntimeError(f"cannot count a replayed call of {fn.op.name} {fn.arg!r}")

def replay_kernels(linear: UOp) -> list[Kernel]:
  """Every kernel a linear runs, in order; those sharing a batch carry its position."""
  return [k for i, call in enumerate(linear.src) for k in _kernels(call, None if call.src[0].op in (Ops.PROGRAM, Ops.COPY) else i)]

def jit_kernels(jit: _TinyJit) -> list[Kernel]:
  """Every kernel the captured JIT replays."""
  if jit.captured is None: raise RuntimeError("the JIT has not captured yet: call it at least twice first")
  return replay_kernels(jit.captured.linear)

def jit_programs(jit: _TinyJit) -> list[UOp]:
  return [prg for k in jit_kernels(jit) if (prg := k.program) is not None]

def count_kernels(jit: _TinyJit) -> int: return len(jit_kernels(jit))

def topk_kernels(topk: Callable[[Tensor, int], tuple[Tensor, Tensor]], n: int, k: int, device: str | None = None) -> int:
  """Kernels of one top-k of k out of n scores (one token's routing choice), captured by itself in a TinyJit."""
  run = TinyJit(lambda x: tuple(t.realize() for t in topk(x, k)))
  for _ in range(3): run(Tensor.randn(1, 1, n, device=device).realize())
  return count_kernels(run)
