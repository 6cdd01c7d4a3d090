import contextlib
import errno
import os
# The suite runs a worker a core: numpy's BLAS on one thread in it and in the processes its tests start, since a second
# thread would spin on the core the other worker needs (it multiplied the CPU time of the float64 references).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from pathlib import Path
from typing import Callable, Iterator
import numpy as np
import pytest
from models.jit_cache import PROGRAM_SUFFIX, SCHEDULE_SUFFIX, JitStore
from ops import patches
from profiles.device import select_device

@pytest.fixture
def seed() -> int:
  """A fresh seed per test run, printed (pytest shows it on failure); TINYZOO_TEST_SEED=<n> replays a run."""
  seed = int(os.environ.get("TINYZOO_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
  print(f"TINYZOO_TEST_SEED={seed}")
  return seed

@pytest.fixture
def rng(seed: int) -> np.random.Generator: return np.random.default_rng(seed)

# what the runtime and the CLI install before they compile anything; tests of single ops compile kernels too
patches.install()
# The suite's compile cache: kernels compiled outside a runtime are kept in the cache directory's store, as a runtime's
# are, so that the other worker and later runs of the suite take them instead of compiling them. The store names its
# device first, which fixes the name before a test changes the cores in use. The device is the one kept for this
# machine (select_device), as in the command line, rather than tinygrad trying each, and it opens with the store.
STORE = JitStore()
select_device(STORE)
STORE.device
patches.keep_programs(STORE)

@pytest.fixture
def programs() -> JitStore:
  """The suite's store of compiled programs, for kernel settings a test makes itself (`kernel_settings(..., programs=...)`),
  which keep none unless given one."""
  return STORE

@pytest.fixture
def jits() -> JitStore:
  """The suite's store, for a runtime whose JITs depend only on its file, hints and shapes, as a CLI run's do (no
  test's patch or tinygrad context changes them): `Runtime(..., jits=jits)` takes the JITs an earlier test or run of
  the suite kept for the same key (the file's sha256, the hints, the shapes, the source its capture runs), and
  `rt.keep_jits()` keeps those it captured."""
  return STORE

@pytest.fixture
def linked_store(tmp_path: Path) -> Iterator[JitStore]:
  """A store of the test's own in `tmp_path/jits`, holding no JIT, that starts with links to the suite's compiled programs
  and schedules (so that a capture in it compiles and schedules only what no run of the suite did) and gives those it
  made back to the suite's store for its next run."""
  with linked(tmp_path / "jits") as store: yield store

@pytest.fixture(scope="session")
def suite_links() -> Callable[..., contextlib.AbstractContextManager[JitStore]]:
  """`linked`, for a test module that may not import this one (its processes would install what it installs)."""
  return linked

@contextlib.contextmanager
def linked(root: Path, suffixes: tuple[str, ...] = (PROGRAM_SUFFIX, SCHEDULE_SUFFIX)) -> Iterator[JitStore]:
  """linked_to_suite(root, suffixes), whose programs and schedules made while in use are given back to the suite's store."""
  yield (store := linked_to_suite(root, suffixes))
  give_back(store)

def linked_to_suite(root: Path, suffixes: tuple[str, ...] = (PROGRAM_SUFFIX, SCHEDULE_SUFFIX)) -> JitStore:
  """A new store in `root` holding links to the suite's entries of the kinds `suffixes` names: hard links (a directory
  entry each, where a symbolic link is a file of its own, far slower to make and to remove by the thousand), symbolic
  ones where `root` is on another file system than the suite's store."""
  root.mkdir()
  link = os.link
  for name in [e.name for e in os.scandir(STORE.root) if e.name.endswith(suffixes)]:
    try: link(STORE.root / name, root / name)
    except FileNotFoundError: continue   # removed meanwhile by the other worker's store
    except OSError as e:
      if e.errno != errno.EXDEV or link is os.symlink: raise
      link = os.symlink
      link(STORE.root / name, root / name)
  return JitStore(root)

def give_back(store: JitStore) -> None:
  """Links the programs and schedules made in `store` (a linked_store) into the suite's store."""
  for p in (p for suffix in (PROGRAM_SUFFIX, SCHEDULE_SUFFIX) for p in store.root.glob(f"*{suffix}")):
    if not p.is_symlink() and not (STORE.root / p.name).exists(): os.link(p, STORE.root / p.name)
