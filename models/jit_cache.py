"""Captured JITs kept across runs in the cache directory (`jits/`), so that a later run with the same key schedules and
compiles nothing; and the compiled programs of the kernels in them (and of any kernel compiled under no settings, where
ops/patches.py's keep_programs was given a store), so that a run with another key (another model file of the same shapes,
another context or hint) compiles only the kernels no run compiled before; and the schedules of the functions a capture
realizes (a model's blocks, its head), so that a capture under a new key (after a change to tinyzoo, under another hint)
schedules only the functions no run scheduled before.

An entry is one pickled TinyJit (its planned calls, compiled programs and output tensors) under a key that hashes
everything that changes it: the model file's sha256, the resolved hints, the device and its name, tinygrad's version and
settings, the tinyzoo source its capture depends on (capture_sources: the runtime's modules and its architecture's, so
that a change to another architecture, the command line or the lab keeps it), and the caller's shapes (context, chunk,
sampler). The buffers a JIT reads from its model's state (weights, caches, rope tables, the host slots) are not written
into it: each is named by its path in the objects that hold it and bound to the loading run's buffer of that name.
Buffers the JIT writes (its arena) are written as sizes and allocated afresh; any other buffer it reads (a constant
realized in capture) is written whole, up to MAX_OTHER_BYTES. Each compiled program in it is pickled on its own, under
its digest: a process that loads JITs holding the same program (a model run again, under another hint) makes it once.
A program is kept under tinygrad's key of it (its graph, renderer and compile settings) with tinyzoo's kernel
settings, the device's name, tinygrad's version and settings, and only the tinyzoo source that runs while a kernel
compiles (COMPILE_SOURCES): a change elsewhere in tinyzoo leaves its compiled programs usable. A schedule is kept
under tinygrad's key of the function it schedules (its graph, the buffers in it made parameters), with the same
settings and source (no tinyzoo code runs while tinygrad schedules); it names no buffer of the run. A file is a magic
line, the payload's sha256 and the payload, written to a temporary file and renamed into place (two runs at once each
leave a whole entry); one that fails any check is deleted and made again, and one that cannot be read or written is
made and not kept. The directory is kept under its limit by removing the entries least recently used, whenever a JIT
is kept and after every TRIM_EVERY programs and schedules."""
import ast
import collections
import contextlib
import functools
import hashlib
import io
import json
import os
import pickle
from pathlib import Path
from typing import Any, Callable
from tinygrad import Tensor
from tinygrad.device import Buffer
from tinygrad.engine.jit import CapturedJit, _TinyJit
from tinygrad.uop.ops import Ops, UOp, buffers
from ops.cache import cache_dir, write_whole

MAGIC = b"tinyzoo-jit 1\n"
DEFAULT_LIMIT_MB = 2048
MAX_OTHER_BYTES = 16 << 20
LIMIT_ENV = "TINYZOO_JIT_CACHE_MB"
PACKAGES = ("models", "ops", "quant", "profiles", "tinyzoo")
JIT_SUFFIX, PROGRAM_SUFFIX, SCHEDULE_SUFFIX = ".jit", ".prg", ".sch"
SUFFIXES = (JIT_SUFFIX, PROGRAM_SUFFIX, SCHEDULE_SUFFIX)   # the kinds of entry a store holds
TRIM_EVERY = 64   # programs and schedules written between checks of the store's size (each lists the directory)
PROGRAMS_KEPT = 2048   # compiled programs a process keeps from the JITs it loaded, for the next JIT that holds them

class NotCacheable(ValueError): pass

def total_bytes(entries: list[tuple[Any, int, float]]) -> int:
  """The bytes of entries as JitStore.entries lists them."""
  return sum(size for _, size, _ in entries)

ROOT = Path(__file__).resolve().parent.parent
# tinyzoo's modules whose code runs inside a kernel's compile (its opts and rendering), and the tinyzoo modules they import
COMPILE_SOURCES = ("ops/patches.py", "ops/dp4a.py", "ops/cuda_graph.py", "ops/cpu_threads.py", "ops/cache.py", "quant/matvec_opts.py")

def module_file(name: str) -> str | None:
  """The file (relative to ROOT) of the tinyzoo module called `name`, or None where no file is (an attribute's name)."""
  for rel in (name.replace(".", "/") + ".py", name.replace(".", "/") + "/__init__.py"):
    if (ROOT / rel).is_file(): return rel
  return None

def tinyzoo_imports(source: str) -> set[str]:
  """The files of the tinyzoo modules that the file `source` imports, at its top or inside a function."""
  out = set()
  for node in ast.walk(ast.parse((ROOT / source).read_text())):
    if isinstance(node, ast.Import): names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module: names = [f"{node.module}.{a.name}" for a in node.names]   # a submodule or an attribute
    else: continue
    for parts in (n.split(".") for n in names if n.split(".")[0] in PACKAGES):
      out.add(next((f for i in range(len(parts), 0, -1) if (f := module_file(".".join(parts[:i]))) is not None), None))
  return out - {None}

# the file that names every architecture: a model's JITs depend on its own architecture's module, not on the others
REGISTRY = "models/registry.py"
IMPORTS_FILE = "imports.json"   # in the cache directory: tinyzoo_imports of each source file, by its digest
IMPORTS_KEPT = 1024             # entries of it at most; past that it starts again empty

class KeptImports:
  """tinyzoo_imports of each source file by the sha256 of its path and text, kept in the cache directory for the files
  tinyzoo's packages hold now (a module added or removed turns an imported name from an attribute into a module or
  back) and this file's code that works them out: a run takes each unchanged file's from there instead of parsing it
  again. An entry that names anything but those files is worked out again."""
  def __init__(self):
    self.path, self.changed = cache_dir() / IMPORTS_FILE, False
    self.files = sorted(str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    self.header = {"files": self.files, "parser": source_digest(("models/jit_cache.py",))}
    try:
      kept = json.loads(self.path.read_text())
      self.imports: dict[str, Any] = kept["imports"] if {k: kept[k] for k in self.header} == self.header and isinstance(kept["imports"], dict) else {}
    except (OSError, ValueError, KeyError, TypeError): self.imports = {}   # none yet, or unreadable: worked out again

  def __call__(self, source: str) -> list[str]:
    digest = hashlib.sha256(source.encode() + b"\0" + (ROOT / source).read_bytes()).hexdigest()
    if not (isinstance(found := self.imports.get(digest), list) and all(isinstance(f, str) and f in self.header["files"] for f in found)):
      if len(self.imports) >= IMPORTS_KEPT: self.imports = {}
      self.imports[digest], self.changed = (found := sorted(tinyzoo_imports(source))), True
    return found

  def keep(self) -> None:
    """Writes the entries worked out in this run, where any was (a cache directory that takes no file keeps none)."""
    if self.changed:
      with contextlib.suppress(OSError): write_whole(self.path, json.dumps({**self.header, "imports": self.imports}))

@functools.cache
def capture_sources(arch: str) -> tuple[str, ...]:
  """The tinyzoo source that the captured JITs of a model whose architecture is the module `arch` depend on: the files
  that models/runtime.py and that module import, and those they import in turn (but the other architectures, which the
  registry imports), with the packages they are in."""
  todo, seen, imports = ["models/runtime.py", module_file(arch)], set(), KeptImports()
  while todo:
    if (source := todo.pop()) in seen: continue
    seen.add(source)
    if source != REGISTRY: todo += imports(source)
  imports.keep()
  packages = {str(p / "__init__.py") for s in seen for p in Path(s).parents[:-1] if (ROOT / p / "__init__.py").is_file()}
  return tuple(sorted(seen | packages))

@functools.cache
def source_digest(paths: tuple[str, ...]) -> str:
  """sha256 over the tinyzoo source files `paths` names: any change to them is another key."""
  h = hashlib.sha256()
  for path in [ROOT / p for p in paths]:
    h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
  return h.hexdigest()

# settings that change no kernel and no schedule: what tinygrad prints, where it caches compiles; where tinyzoo keeps files
UNKEYED = frozenset({"DEBUG", "CCACHE", "CACHELEVEL", "CACHEDB", "VIZ", "PROFILE", "TRACK_MATCH_STATS", "TINYZOO_CACHE",
                     "TINYZOO_JOURNAL", "TINYZOO_TEST_SEED", LIMIT_ENV})

def settings() -> dict[str, Any]:
  """tinygrad's version and the environment that sets its context variables (BEAM, NUM_CPU_THREADS, ...) and tinyzoo's
  (TINYZOO_GPU_MATVEC, ...), but those in UNKEYED. By the variables set, not by every one tinygrad has: which of those
  exist depends on the modules a process imported."""
  from importlib.metadata import version
  from tinygrad.helpers import ContextVar
  env = {k: v for k, v in sorted(os.environ.items()) if (k in ContextVar._cache or k.startswith("TINYZOO_")) and k not in UNKEYED}
  return {"version": version("tinygrad"), "env": env}

def cache_key(sources: tuple[str, ...], **parts: Any) -> str:
  """A key of `parts` with tinygrad's settings and the tinyzoo source files `sources` names."""
  return hashlib.sha256(json.dumps({**parts, "tinyzoo": source_digest(sources), "tinygrad": settings()}, sort_keys=True,
                                   default=str).encode()).hexdigest()

def state_of(roots: dict[str, Any]) -> dict[str, Tensor]:
  """The tensors reachable from `roots` through tinyzoo's objects, each by the path that first reaches it."""
  out: dict[str, Tensor] = {}
  seen: set[int] = set()
  def walk(obj: Any, path: str):
    if id(obj) in seen: return
    seen.add(id(obj))
    if isinstance(obj, Tensor): out[path] = obj
    elif isinstance(obj, (list, tuple)):
      for i, x in enumerate(obj): walk(x, f"{path}.{i}")
    elif isinstance(obj, dict):
      for k, x in obj.items(): walk(x, f"{path}.{k}")
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in PACKAGES:
      for k, x in vars(obj).items(): walk(x, f"{path}.{k}")
  for name, root in roots.items(): walk(root, name)
  return out

def _buffer_uop(t: Tensor) -> UOp | None:
  return u if (u := t.uop.base).op is Ops.BUFFER and u in buffers else None

class _Writer(pickle.Pickler):
  def __init__(self, f, state: dict[str, Tensor], written: set[Buffer]):
    super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
    self.uops: dict[UOp, str] = {}
    for name, t in state.items():
      if (u := _buffer_uop(t)) is not None: self.uops.setdefault(u, name)
    self.bufs = {u.buffer: name for u, name in self.uops.items()}
    self.written = written
    self.programs: dict[UOp, tuple] = {}

  def reducer_override(self, obj: Any):
    """A captured JIT goes with the buffers it writes, which it would otherwise work out from every call again at its
    first replay (most of the replay's time)."""
    if type(obj) is not CapturedJit: return NotImplemented
    return _captured, (obj.ret, obj._linear, obj.expected_names, obj.expected_input_info, obj._written_uops)

  def persistent_id(self, obj: Any):
    if isinstance(obj, UOp) and obj.op is Ops.PROGRAM:
      if (pid := self.programs.get(obj)) is None:
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.programs[obj] = pid = ("program", hashlib.sha256(payload).digest(), payload)
      return pid
    if isinstance(obj, UOp) and obj.op is Ops.BUFFER and obj in buffers:   # a device buffer (not a kernel's registers)
      if obj in self.uops: return ("state-uop", self.uops[obj])
      return ("uop", id(obj), obj.device, obj.buffer.size, obj.dtype, obj.buffer)
    if isinstance(obj, Buffer) and obj._base is None:
      if obj in self.bufs: return ("state", self.bufs[obj])
      if obj in self.written: return ("scratch", id(obj), obj.device, obj.size, obj.dtype, obj.options)
      if obj.nbytes > MAX_OTHER_BYTES: raise NotCacheable(f"a buffer of {obj.nbytes / 2**20:.0f} MiB outside the model's state")
    return None

def _captured(ret, linear: UOp, names: list, inputs: list, written: set[UOp]) -> CapturedJit:
  jit = CapturedJit(ret, linear, names, inputs)
  jit.__dict__["_written_uops"] = written   # its cached_property's value
  return jit

# the compiled programs of the JITs loaded in this process, by the digest of each one's pickle, least recently used first
_programs: collections.OrderedDict[bytes, UOp] = collections.OrderedDict()

def _program(digest: bytes, payload: bytes) -> UOp:
  """A JIT's compiled program: the one a JIT loaded before in this process took, where one did (its graph is not made
  again, nor its key worked out again when a graph looks its runtime up), else unpickled from `payload`."""
  if (prg := _programs.get(digest)) is not None:
    _programs.move_to_end(digest)
    return prg
  if not isinstance(prg := pickle.loads(payload), UOp) or prg.op is not Ops.PROGRAM: raise pickle.UnpicklingError("not a compiled program")
  _programs[digest] = prg
  if len(_programs) > PROGRAMS_KEPT: _programs.popitem(last=False)
  return prg

class _Reader(pickle.Unpickler):
  def __init__(self, f, state: dict[str, Tensor]):
    super().__init__(f)
    self.state, self.made = state, {}

  def persistent_load(self, pid):
    kind, rest = pid[0], pid[1:]
    if kind == "program": return _program(*rest)
    if kind in ("state", "state-uop"):   # realized here if it is not yet (a weight copied from the file when first read)
      if (t := self.state.get(rest[0])) is None or (u := _buffer_uop(t.realize())) is None:
        raise pickle.UnpicklingError(f"no state buffer {rest[0]!r} in this run")
      return u.buffer if kind == "state" else u
    if rest[0] not in self.made:
      if kind == "scratch":
        device, size, dtype, options = rest[1:]
        self.made[rest[0]] = Buffer(device, size, dtype, options=options).ensure_allocated()
      elif kind == "uop":
        device, size, dtype, buf = rest[1:]
        self.made[rest[0]] = u = UOp.new_buffer(device, size, dtype)   # a fresh slot: the saved one may name another buffer here
        buffers[u] = buf.ref(1)
      else: raise pickle.UnpicklingError(f"unknown entry {kind!r}")
    return self.made[rest[0]]

def written_buffers(jit: _TinyJit) -> set[Buffer]:
  """The base buffers a captured JIT writes (its arena and outputs): their contents are never read before written."""
  assert jit.captured is not None
  return {buffers[u].base for u in jit.captured._written_uops if u in buffers}

class JitStore:
  """Captured JITs in `root` (default: the cache directory's jits/), at most `limit` bytes (TINYZOO_JIT_CACHE_MB, default
  DEFAULT_LIMIT_MB)."""
  def __init__(self, root: Path | None = None, limit: int | None = None):
    self.root = root or cache_dir() / "jits"
    if limit is None:
      try: limit = int(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT_MB)) << 20
      except ValueError: raise ValueError(f"{LIMIT_ENV} must be a whole number of MiB, got {os.environ[LIMIT_ENV]!r}") from None
    self.limit = limit
    self.notes: list[str] = []   # what went wrong with an entry (rebuilt), for the caller to show
    self.unchecked = 0           # programs and schedules written since the store's size was last checked

  def path(self, key: str) -> Path: return self.root / f"{key}{JIT_SUFFIX}"

  def _read(self, path: Path, unpickle: Callable[[bytes], Any], made_again: str) -> Any:
    """The object in the entry at `path`, as `unpickle` makes it of the payload and checks it; None if there is none or
    it is damaged (then it is removed, with a note)."""
    try: data = path.read_bytes()
    except OSError as e:   # none, or one this process cannot read: made, and not kept
      if not isinstance(e, FileNotFoundError): self.notes.append(f"jit cache: {path.name} unreadable ({e})")
      return None
    try:
      if not data.startswith(MAGIC): raise pickle.UnpicklingError("not a tinyzoo cache entry of this version")
      digest, payload = data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
      if len(digest) != 32 or hashlib.sha256(payload).digest() != digest: raise pickle.UnpicklingError("truncated or altered")
      obj = unpickle(payload)
    except Exception as e:   # whatever a damaged file makes pickle raise: the entry is made again
      self.notes.append(f"jit cache: {path.name} was unusable ({type(e).__name__}: {e}); {made_again}")
      path.unlink(missing_ok=True)
      return None
    with contextlib.suppress(FileNotFoundError): os.utime(path)   # most recently used, unless another run removed it meanwhile
    return obj

  def _write(self, path: Path, payload: bytes) -> bool:
    """Writes an entry whole; False (with a note) where the directory takes none (full, read-only)."""
    try: write_whole(path, MAGIC + hashlib.sha256(payload).digest() + payload)
    except OSError as e:
      self.notes.append(f"jit cache: {path.name} not kept ({e})")
      return False
    return True

  def load(self, key: str, state: dict[str, Tensor]) -> _TinyJit | None:
    """The JIT stored under `key`, bound to `state`; None if there is none or it is damaged (then it is removed)."""
    def unpickle(payload: bytes) -> _TinyJit:
      jit = _Reader(io.BytesIO(payload), state).load()
      if not isinstance(jit, _TinyJit) or jit.captured is None: raise pickle.UnpicklingError("not a captured JIT")
      return jit
    return self._read(self.path(key), unpickle, "capturing it again")

  def save(self, key: str, jit: _TinyJit, state: dict[str, Tensor]) -> bool:
    """Stores a captured JIT whole or not at all; False (with a note) if it holds what cannot be cached or the directory
    takes no entry."""
    f = io.BytesIO()
    try: _Writer(f, state, written_buffers(jit)).dump(jit)
    except (NotCacheable, pickle.PicklingError, TypeError, AttributeError) as e:   # what pickle raises on an object it cannot write
      self.notes.append(f"jit cache: not kept ({e})")
      return False
    if not self._write(self.path(key), f.getvalue()): return False
    self.trim()
    return True

  @functools.cached_property
  def device(self) -> str:
    """This device's name (profiles/device.py), asked once a store: on a GPU it runs nvidia-smi."""
    from profiles.device import device_name
    return device_name()

  def program(self, key: tuple, compile: Callable[[], UOp]) -> UOp:
    """The compiled program (a PROGRAM) that tinygrad keys by `key` (with the kernel settings in force), taken from the
    store where a run compiled it before, else compiled by `compile` and kept."""
    path = self.root / f"{cache_key(COMPILE_SOURCES, program=repr(key), device=self.device)}{PROGRAM_SUFFIX}"
    def unpickle(payload: bytes) -> UOp:
      if not isinstance(prg := pickle.loads(payload), UOp) or prg.op is not Ops.PROGRAM: raise pickle.UnpicklingError("not a compiled program")
      return prg
    if (prg := self._read(path, unpickle, "compiling it again")) is not None: return prg
    self._keep(path, prg := compile(), "a program")
    return prg

  def _schedule_path(self, key: bytes) -> Path:
    return self.root / f"{cache_key(COMPILE_SOURCES, schedule=key.hex(), device=self.device)}{SCHEDULE_SUFFIX}"

  def schedule(self, key: bytes) -> UOp | None:
    """The schedule (a LINEAR) that tinygrad keys by `key` (a function's graph), where a run kept it; else None."""
    def unpickle(payload: bytes) -> UOp:
      if not isinstance(linear := pickle.loads(payload), UOp) or linear.op is not Ops.LINEAR: raise pickle.UnpicklingError("not a schedule")
      return linear
    return self._read(self._schedule_path(key), unpickle, "scheduling it again")

  def keep_schedule(self, key: bytes, linear: UOp) -> None: self._keep(self._schedule_path(key), linear, "a schedule")

  def _keep(self, path: Path, obj: UOp, what: str) -> None:
    """Writes a program or a schedule, checking the store's size every TRIM_EVERY of them."""
    try: self._write(path, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, TypeError, AttributeError) as e: self.notes.append(f"jit cache: {what} not kept ({e})")
    self.unchecked += 1
    if self.unchecked >= TRIM_EVERY: self.trim()

  def _listing(self, suffixes: tuple[str, ...] = SUFFIXES) -> list[tuple[str, int, float]]:
    """entries() with each path a string: one pass over the directory, made on every JIT kept."""
    try: listing = os.scandir(self.root)
    except (FileNotFoundError, NotADirectoryError): return []
    found = []
    with listing:
      for entry in listing:
        if not entry.name.endswith(suffixes): continue
        try: st = entry.stat()
        except FileNotFoundError: continue   # removed by another run meanwhile
        found.append((entry.path, st.st_size, st.st_mtime))
    return sorted(found, key=lambda e: e[2])

  def entries(self, suffixes: tuple[str, ...] = SUFFIXES) -> list[tuple[Path, int, float]]:
    """(path, bytes, last use) of each entry (of the kinds named by `suffixes`), least recently used first."""
    return [(Path(path), size, used) for path, size, used in self._listing(suffixes)]

  def size(self) -> int: return total_bytes(self._listing())

  def trim(self) -> None:
    self.unchecked, entries = 0, self._listing()
    total = total_bytes(entries)
    for path, size, _ in entries[:-1]:   # the newest stays, even alone over the limit
      if total <= self.limit: break
      try: os.unlink(path)
      except FileNotFoundError: pass   # removed by another run meanwhile
      except OSError: continue   # one it may not remove stays, and counts
      total -= size

  def clear(self) -> int:
    """Removes every entry (and leftovers of interrupted writes); returns the bytes freed."""
    freed = 0
    if self.root.is_dir():
      for p in [p for pattern in (*(f"*{suffix}" for suffix in SUFFIXES), ".*.tmp") for p in self.root.glob(pattern)]:
        try: freed += p.stat().st_size
        except FileNotFoundError: continue
        p.unlink(missing_ok=True)
    return freed
