"""CPU kernels run from C: a kernel split over threads (tinygrad's THREAD opt) on every core at once, and a captured
JIT's kernels a batch at a time (`CPUGraph`).

tinygrad renders a split kernel with a `core_id` parameter and launches it once for each id, one after another, on the
caller's thread: the split costs nothing and gains nothing. Here a launch runs the ids together: a pool of helper
threads (one fewer than the cores) each takes its share of the ids while the caller takes the first, and it returns
when every id has run, so kernels still run one after another. tinygrad also launches each kernel of a JIT's replay
from Python, a fixed cost per kernel paid on the caller's core; `CPUGraph`, the CPU device's graph, runs a batch of
them as one table of launches in one call.

The pool is a small C library built with the system's C compiler into the cache directory the first time it is used
(written whole, then renamed into place). Between kernels a helper spins briefly for the next one, then sleeps on a
condition variable, so an idle pool takes no core; the caller, waiting for the helpers, spins briefly, then yields its
core (a helper may be waiting for one where other processes keep the cores busy).
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
import time
from tinygrad.engine.jit import GraphRunner
from tinygrad.uop.ops import UOp
from ops.cache import cache_dir

ARGS = 63   # the arguments a kernel takes at most (tinygrad's CPU kernels take at most 63)
OWN = 3     # the words of a launch before its kernel's arguments: the kernel, its number of ids, which argument is the id
LAUNCH = OWN + ARGS   # the words of one launch
NO_ID = ARGS   # a launch's id argument when the kernel takes none: it runs `ids` times on the caller
SPINS = 1 << 14

_PARAMS = ", ".join(["uint64_t"] * ARGS)
_KERNEL_ARGS = ", ".join(f"a[{i}]" for i in range(ARGS))
SOURCE = f"""
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
typedef void (*kernel_fn)({_PARAMS});
static struct {{ kernel_fn fn; uint64_t ids, id_arg, args[{ARGS}]; }} job;
static uint64_t generation, finished, threads = 1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t woken = PTHREAD_COND_INITIALIZER;

static void relax(void) {{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}}

static void run_ids(uint64_t first) {{
  uint64_t a[{ARGS}];
  memcpy(a, job.args, sizeof a);
  for (uint64_t id = first; id < job.ids; id += threads) {{ a[job.id_arg] = id; job.fn({_KERNEL_ARGS}); }}
}}

static void *helper(void *arg) {{
  uint64_t first = (uint64_t)arg, seen = 0;
  for (;;) {{
    for (int spin = 0; __atomic_load_n(&generation, __ATOMIC_ACQUIRE) == seen; spin++) {{
      if (spin < {SPINS}) {{ relax(); continue; }}
      pthread_mutex_lock(&lock);
      while (__atomic_load_n(&generation, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&woken, &lock);
      pthread_mutex_unlock(&lock);
    }}
    seen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    run_ids(first);
    __atomic_fetch_add(&finished, 1, __ATOMIC_RELEASE);
  }}
  return 0;
}}

int tz_start(uint64_t count) {{
  pthread_t t;
  for (threads = 1; threads < count; threads++)
    if (pthread_create(&t, 0, helper, (void *)threads) || pthread_detach(t)) return -1;
  return 0;
}}

static void launch(const uint64_t *l) {{
  const uint64_t *a = l + {OWN};
  if (l[2] == {NO_ID}) {{
    for (uint64_t i = 0; i < l[1]; i++) ((kernel_fn)l[0])({_KERNEL_ARGS});
    return;
  }}
  job.fn = (kernel_fn)l[0]; job.ids = l[1]; job.id_arg = l[2]; memcpy(job.args, a, sizeof job.args);
  __atomic_store_n(&finished, 0, __ATOMIC_RELAXED);
  pthread_mutex_lock(&lock);
  __atomic_fetch_add(&generation, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&woken);
  pthread_mutex_unlock(&lock);
  run_ids(0);
  for (int spin = 0; __atomic_load_n(&finished, __ATOMIC_ACQUIRE) < threads - 1; spin++) {{
    if (spin < {SPINS}) relax(); else sched_yield();
  }}
}}

void tz_run(const uint64_t *launches, uint64_t count) {{
  for (uint64_t i = 0; i < count; i++) launch(launches + i * {LAUNCH});
}}
"""

class ThreadsUnavailable(RuntimeError): pass

def _compiler() -> str:
  for name in (os.environ.get("CC"), "clang", "cc", "gcc"):
    if name and (path := shutil.which(name)): return path
  raise ThreadsUnavailable("no C compiler (clang, cc or gcc) to build the CPU thread pool: install clang")

def build() -> str:
  """The pool library's path in the cache directory, compiled there once (into a temporary file renamed into place)."""
  digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
  lib = cache_dir() / "cpu_threads" / f"pool-{digest}.so"
  if lib.exists(): return str(lib)
  lib.parent.mkdir(parents=True, exist_ok=True)
  src, tmp = lib.with_suffix(f".{os.getpid()}.c"), lib.with_suffix(f".{os.getpid()}.tmp")
  try:
    src.write_text(SOURCE)
    done = subprocess.run([_compiler(), "-O2", "-shared", "-fPIC", "-pthread", str(src), "-o", str(tmp)], capture_output=True, text=True)
    if done.returncode: raise ThreadsUnavailable(f"building the CPU thread pool failed: {done.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, lib)
  finally:
    for f in (src, tmp): f.unlink(missing_ok=True)
  return str(lib)

_pool: list = []
_starting = threading.Lock()

def _library():
  """The pool's library, its helpers started (a thread a core, the caller among them) on the first call."""
  if _pool: return _pool[0]
  with _starting:
    if not _pool:
      lib = ctypes.CDLL(build())
      lib.tz_start.argtypes, lib.tz_start.restype = [ctypes.c_uint64], ctypes.c_int
      lib.tz_run.argtypes, lib.tz_run.restype = [ctypes.c_void_p, ctypes.c_uint64], None
      if lib.tz_start(cores()): raise ThreadsUnavailable("starting the CPU thread pool's threads failed")
      _pool.append(lib)
  return _pool[0]

def cores() -> int:
  """The cores this process may run on: the pool's threads, the caller among them."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

def launch_words(kernel: int, ids: int, id_arg: int, args: list[int]) -> list[int]:
  """One launch as the library reads it: the kernel at address `kernel` run once for each id below `ids`, the id in its
  argument `id_arg` (spread over the pool's threads), or `ids` times on the caller where `id_arg` is NO_ID."""
  return [kernel, ids, id_arg, *args, *[0] * (ARGS - len(args))]

def run(launches: ctypes.Array | int, count: int) -> None:
  """Runs `count` launches (LAUNCH words each, from `launch_words`, in an array or at an address) one after another,
  each done before the next begins. The pool starts on the first call, with a thread a core."""
  _library().tz_run(launches, count)

def fork_join(kernel: int, ids: int, id_arg: int, args: list[int]) -> None:
  """Runs the kernel at address `kernel` once for each id below `ids` (its argument `id_arg`, among `args`), spread
  over the pool's threads, and returns when all have run."""
  run((ctypes.c_uint64 * LAUNCH)(*launch_words(kernel, ids, id_arg, args)), 1)

class CPUGraph(GraphRunner):
  """A batch of a captured JIT's CPU kernels run by one call into the pool's library (`run`): each kernel a launch in a
  table made once, into which each replay writes only what it changes (the buffers passed in, the variables' values,
  symbolic launch sizes)."""
  def __init__(self, linear: UOp, input_uops: tuple[UOp, ...] = ()):
    super().__init__(linear, input_uops)
    self.table = (ctypes.c_uint64 * (LAUNCH * len(self.calls)))()
    self.first_var: list[int] = []   # where each launch's variables begin in the table
    for j, ((_, prg, bufs, device_vars), rt) in enumerate(zip(self.calls, self.runtimes)):
      id_arg = rt.runtimevars.get("core_id", NO_ID)
      args = [b._buf.va_addr for b in bufs] + [device_vars.get(v.expr, 0) for v in prg.arg.vars]
      ids = prg.arg.launch_dims({v: 0 for v in self.vars})[0][0]
      self.table[j * LAUNCH:(j + 1) * LAUNCH] = launch_words(rt.addr, ids, id_arg, args)
      self.first_var.append(j * LAUNCH + OWN + len(bufs))

  @staticmethod
  def supports_uop(batch_devs: list, new_call: UOp) -> bool:
    """A kernel of one CPU device, rendered as machine code taking its arguments in registers."""
    from tinygrad.engine.realize import get_runtime
    return GraphRunner.supports_uop(batch_devs, new_call) and not get_runtime(new_call.src[1].device, new_call.src[0]).lvp

  def _write(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int]) -> None:
    for j, replace in enumerate(self.uop_replace):
      for pos, slot in replace: self.table[j * LAUNCH + OWN + pos] = input_uops[slot].buffer._buf.va_addr
    for j, i, v in self.updated_vars(var_vals): self.table[self.first_var[j] + i] = v
    for j, global_size, _ in self.updated_launch_dims(var_vals): self.table[j * LAUNCH + 1] = global_size[0]

  def __call__(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int], wait: bool = False) -> float | None:
    self._write(input_uops, var_vals)
    start = time.perf_counter()
    run(self.table, len(self.calls))
    return time.perf_counter() - start if wait else None

  def kernel_times(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int]) -> list[float]:
    """Runs the batch as a replay does, but a kernel at a time: the seconds of each (a per-kernel profile)."""
    self._write(input_uops, var_vals)
    times = []
    for j in range(len(self.calls)):
      start = time.perf_counter()
      run(ctypes.addressof(self.table) + j * LAUNCH * ctypes.sizeof(ctypes.c_uint64), 1)
      times.append(time.perf_counter() - start)
    return times
