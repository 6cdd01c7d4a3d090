"""Counting the kernels a TinyJit replays: the lab's core measurement."""
from tinygrad.engine.jit import _TinyJit
from tinygrad.uop.ops import UOp, Ops

def _programs(linear: UOp) -> list[UOp]:
  out: list[UOp] = []
  for call in linear.src:
    fn = call.src[0]
    if fn.op is Ops.PROGRAM: out.append(fn)
    elif fn.op is Ops.CUSTOM_FUNCTION and fn.arg == "graph": out.extend(_programs(fn.src[0]))
  return out

def jit_programs(jit: _TinyJit) -> list[UOp]:
  """Every kernel (PROGRAM) the captured JIT replays, in order, looking inside graph batches."""
  if jit.captured is None: raise RuntimeError("the JIT has not captured yet: call it at least twice first")
  return _programs(jit.captured.linear)

def count_kernels(jit: _TinyJit) -> int: return len(jit_programs(jit))
