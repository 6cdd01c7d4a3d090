"""A fix for tinygrad 0.14's CUDA graphs when a kernel's launch size depends on a symbolic variable.

CUDAGraph builds every kernel node with the launch sizes evaluated at 0 for every variable. A size such as the number
of prompt tokens (a variable whose lower bound is 1), or the cache prefix before the current token, then reads 0, and
CUDA rejects a grid dimension of 0 with CUDA_ERROR_INVALID_VALUE ("invalid argument" at cuGraphAddKernelNode). The
sizes given at build time never run: tinygrad sets the real ones before every replay (its launch_dims_replace). So the
build only needs valid ones: `install()` wraps CUDAGraph's constructor so that, while it runs, every launch dimension
is at least 1. tinygrad's files are not touched; the wrapper is installed once per process.
"""
import contextlib
from typing import Iterator
from tinygrad.uop.ops import ProgramInfo

_launch_dims = ProgramInfo.launch_dims

def _launch_dims_at_least_one(self: ProgramInfo, var_vals: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
  global_size, local_size = _launch_dims(self, var_vals)
  return tuple(max(1, d) for d in global_size), None if local_size is None else tuple(max(1, d) for d in local_size)

@contextlib.contextmanager
def valid_build_dims() -> Iterator[None]:
  """Launch sizes evaluated inside are at least 1 in every dimension."""
  ProgramInfo.launch_dims = _launch_dims_at_least_one   # type: ignore[method-assign]
  try: yield
  finally: ProgramInfo.launch_dims = _launch_dims       # type: ignore[method-assign]

def install() -> None:
  """Wraps tinygrad's CUDAGraph constructor in valid_build_dims (once; a no-op where tinygrad has no CUDA graph runner)."""
  try: from tinygrad.runtime.graph.cuda import CUDAGraph
  except (ImportError, OSError): return
  if getattr(CUDAGraph.__init__, "valid_build_dims", False): return
  build = CUDAGraph.__init__

  def __init__(self, *args, **kwargs):
    with valid_build_dims(): build(self, *args, **kwargs)
  __init__.valid_build_dims = True   # type: ignore[attr-defined]
  CUDAGraph.__init__ = __init__      # type: ignore[method-assign]
