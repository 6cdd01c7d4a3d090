"""A CPU kernel split over threads (tinygrad's THREAD opt) run on every core at once.

tinygrad renders such a kernel with a `core_id` parameter and launches it once for each id, one after another, on the
device's single worker thread: the split costs nothing and gains nothing. `fork_join` runs the launches together: a
pool of helper threads (one fewer than the cores) each takes its share of the ids while the caller
takes the first, and it returns when every id has run, so kernels still run one after another.

The pool is a small C library built with the system's C compiler into the cache directory the first time a threaded
kernel runs (written whole, then renamed into place). Between kernels a helper spins briefly for the next one, then
sleeps on a condition variable, so an idle pool takes no core; the caller, waiting for the helpers, spins briefly, then
yields its core (a helper may be waiting for one where other processes keep the cores busy).
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from ops.cache import cache_dir

ARGS = 63   # the arguments fork_join passes on (tinygrad's CPU kernels take at most 63)
OWN = 3     # of them, fork_join's own: the kernel, its number of ids, which of its arguments is the id
SPINS = 1 << 14

_PARAMS = ", ".join(["uint64_t"] * ARGS)
_KERNEL_ARGS = ", ".join(f"a[{i}]" for i in range(ARGS))
_ARG_PARAMS = ", ".join(f"uint64_t a{i}" for i in range(ARGS - OWN))
_ARG_COPY = " ".join(f"job.args[{i}] = a{i};" for i in range(ARGS - OWN))
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

void tz_fork_join(uint64_t fn, uint64_t ids, uint64_t id_arg, {_ARG_PARAMS}) {{
  job.fn = (kernel_fn)fn; job.ids = ids; job.id_arg = id_arg; {_ARG_COPY}
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
      lib.tz_fork_join.argtypes, lib.tz_fork_join.restype = [ctypes.c_uint64] * ARGS, None
      if lib.tz_start(cores()): raise ThreadsUnavailable("starting the CPU thread pool's threads failed")
      _pool.append(lib)
  return _pool[0]

def cores() -> int:
  """The cores this process may run on: the pool's threads, the caller among them."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

def fork_join(kernel: int, ids: int, id_arg: int, args: list[int]) -> None:
  """Runs the kernel at address `kernel` once for each id below `ids` (its argument `id_arg`, among `args`), spread
  over the pool's threads, and returns when all have run. The pool starts on the first call, with a thread a core."""
  _library().tz_fork_join(kernel, ids, id_arg, *args, *[0] * (ARGS - OWN - len(args)))
