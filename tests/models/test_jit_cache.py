"""Captured JITs kept across runs (models/jit_cache.py): a later run with the same key takes all four and compiles
nothing, with the same tokens; any change of key misses; a damaged or partial entry is removed and captured again; the
store stays under its limit. Compiled programs kept beside them: a run of another file of the same shapes captures its
JITs again but compiles nothing, to the same tokens as without the store; a damaged program is compiled again. Schedules
kept beside them: a later capture of the model schedules nothing; a damaged schedule is made again."""
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator
import pytest
from models.jit_cache import (COMPILE_SOURCES, JIT_SUFFIX, MAGIC, PACKAGES, PROGRAM_SUFFIX, SCHEDULE_SUFFIX, JitStore, capture_sources, module_file,
                              tinyzoo_imports)
from models.runtime import ALL_JITS, Runtime
from models.synth import synthesize
from ops.sampling import Sampler, SamplerParams
from profiles.hints import resolve

ROOT = Path(__file__).resolve().parents[2]
PROMPT, N = [5, 6, 7, 8], 6
GREEDY = SamplerParams(temperature=0, repeat_penalty=1.0)

@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path: return synthesize("smollm2-135m-tiny", tmp_path_factory.mktemp("jits") / "tiny.gguf", quant="Q8_0")

def generate(path: Path, store: JitStore | None, hints: dict | None = None, ctx: int = 64, params: SamplerParams = GREEDY,
             seed: int = 0, keep: bool = True) -> tuple[Runtime, list[int]]:
  """A run as `tinyzoo run` makes it: load (taking what the store has), warm up, generate, keep the JITs (if `keep`)."""
  rt = Runtime(path, resolve(hints or {}), ctx, jits=store)
  sampler = Sampler(params, seed)
  rt.restore_sampler(sampler)
  rt.warm_up(sampler)
  tokens = list(rt.generate(PROMPT, N, sampler))
  if keep: rt.keep_jits(sampler)
  return rt, tokens

def compiles_of(monkeypatch, memo: dict | None = None) -> list[str]:
  """The names of the programs compiled from here on under a runtime's kernel settings (the in-process cache emptied);
  each program also in `memo` (if given) by its kernel and renderer."""
  from ops import patches
  patches.forget_compiled()
  names, compile = [], patches._originals["do_to_program"]
  def counted(ast, renderer):
    prg = compile(ast, renderer)
    if patches.active() is not None:
      names.append(ast.arg.name)
      if memo is not None: memo[ast, renderer] = prg
    return prg
  monkeypatch.setitem(patches._originals, "do_to_program", counted)
  return names

def jits(store: JitStore) -> list[Path]: return [p for p, _, _ in store.entries((JIT_SUFFIX,))]

def programs(store: JitStore) -> list[Path]: return [p for p, _, _ in store.entries((PROGRAM_SUFFIX,))]

def schedules(store: JitStore) -> list[Path]: return [p for p, _, _ in store.entries((SCHEDULE_SUFFIX,))]

@pytest.fixture(scope="module")
def first_run(model: Path, tmp_path_factory) -> tuple[Runtime, list[int], JitStore, dict]:
  """A first run that compiled each of its kernels itself (none taken from this process's earlier work) into an empty
  store, made once (tests start from a copy of its store, or of its JITs): its runtime, tokens, store and programs (by
  kernel and renderer). The device is opened before it: the programs it compiles for itself, once a process, are none
  of the model's."""
  from tinygrad import Device
  Device[Device.DEFAULT]
  store, memo = JitStore(tmp_path_factory.mktemp("first") / "jits"), {}
  with pytest.MonkeyPatch.context() as patch:
    compiled = compiles_of(patch, memo)
    rt, tokens = generate(model, store)
  assert len(programs(store)) == len(compiled) > 10 and store.notes == []
  return rt, tokens, store, memo

@pytest.fixture(scope="module")
def without_store(model: Path) -> list[int]:
  """The tokens of a run without the store, made once."""
  return generate(model, None)[1]

def stored(run: tuple[Runtime, list[int], JitStore, dict], tmp_path: Path) -> tuple[JitStore, list[int]]:
  """A copy of first_run's store, the state a test's own first run would leave, and its tokens."""
  return JitStore(Path(shutil.copytree(run[2].root, tmp_path / "jits"))), run[1]

def given_jits(run: tuple[Runtime, list[int], JitStore, dict], store: JitStore) -> tuple[JitStore, list[int]]:
  """`store` (a linked_store: links to the suite's programs and schedules) with first_run's JITs, and its tokens: a
  capture under another key in it compiles only what no run of the suite compiled."""
  for path in jits(run[2]): shutil.copy(path, store.root)
  return store, run[1]

LATER_RUN = """
import json, os, sys
from pathlib import Path
from tinygrad.helpers import getenv
from models.jit_cache import JitStore
from models.runtime import Runtime
from ops.sampling import Sampler
from profiles.hints import resolve
from tests.models.test_jit_cache import GREEDY, N, PROMPT
rt = Runtime(sys.argv[1], resolve({}), 64, jits=JitStore(Path(sys.argv[2])))
os.environ["ASSERT_COMPILE"] = "1"   # from here on, any compile is an error
getenv.cache_clear()
sampler = Sampler(GREEDY)
rt.restore_sampler(sampler)
rt.warm_up(sampler)
print(json.dumps({"cached": sorted(rt.cached), "tokens": list(rt.generate(PROMPT, N, sampler))}))
"""

def test_a_later_run_takes_every_jit_and_compiles_nothing(model: Path, first_run, without_store: list[int], tmp_path: Path):
  """The later run is another process with tinygrad's compile cache off and, once the model is loaded (its weights'
  packing kernels compile in any run), any compile an error (ASSERT_COMPILE): it takes prefill, head, decode and the
  sampler's JIT from the store, and its tokens are those of the first run and of a run without the store."""
  first, tokens, store, _ = first_run
  assert first.cached == set(ALL_JITS) and len(jits(store)) == 4 and store.notes == []
  store, _ = stored(first_run, tmp_path)
  assert without_store == tokens
  env = {**os.environ, "PYTHONPATH": str(ROOT), "CCACHE": "0"}
  r = subprocess.run([sys.executable, "-c", LATER_RUN, str(model), str(store.root)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  later = json.loads(r.stdout.splitlines()[-1])
  assert later == {"cached": sorted(set(ALL_JITS)), "tokens": tokens}

def test_a_process_unpickles_each_program_of_its_jits_once(model: Path, first_run, tmp_path: Path, monkeypatch):
  """The four JITs a runtime takes from the store unpickle each program they hold once (one in two JITs too); a second
  runtime that takes them again (the first one gone) unpickles none and runs the programs the first one made, to the
  same tokens."""
  import gc
  from models import jit_cache
  from models.runtime import JIT_NAMES
  from ops.kernels import jit_programs
  store, tokens = stored(first_run, tmp_path)
  unpickled = []   # each program unpickled, as the process's programs take it
  class Programs(type(jit_cache._programs)):
    def __setitem__(self, digest, prg):
      unpickled.append(prg)
      super().__setitem__(digest, prg)
  monkeypatch.setattr(jit_cache, "_programs", Programs())
  def programs_run(rt: Runtime) -> list:
    return [prg for name in JIT_NAMES for prg in jit_programs(getattr(rt, f"_{name}"))]
  rt, first = generate(model, store)
  made = programs_run(rt)
  assert first == tokens and rt.cached == set(ALL_JITS) and len(made) > 10
  assert len({id(p) for p in unpickled}) == len(unpickled) and {id(p) for p in made} <= {id(p) for p in unpickled}
  del rt
  gc.collect()
  unpickled.clear()
  rt, again = generate(model, store)
  assert again == tokens and rt.cached == set(ALL_JITS) and unpickled == [] and all(a is b for a, b in zip(programs_run(rt), made, strict=True))

def test_sampled_tokens_are_the_same_from_the_store(model: Path, tmp_path: Path, seed: int):
  """Sampling at a temperature with a repeat penalty (the sampler's JIT reads its draws and recent tokens from slots of
  its own): the same seed gives the same tokens without the store, capturing into it and taking everything from it."""
  store, params = JitStore(tmp_path / "jits"), SamplerParams(temperature=0.9, repeat_penalty=1.3)
  want = generate(model, None, params=params, seed=seed)[1]
  assert generate(model, store, params=params, seed=seed)[1] == want
  rt, tokens = generate(model, store, params=params, seed=seed)
  assert rt.cached == set(ALL_JITS) and tokens == want and store.notes == []

@pytest.mark.parametrize("change", [{"hints": {"row_upcast": 4}}, {"ctx": 80}])
def test_any_change_of_key_misses(model: Path, first_run, linked_store: JitStore, change: dict):
  """Another hint or context misses all four JITs: those it captures are kept beside the first run's, to the same tokens.
  The store holds the first run's JITs and links to the suite's programs and schedules."""
  store, tokens = given_jits(first_run, linked_store)
  rt, changed = generate(model, store, **change)
  assert len(jits(store)) == 8 and changed == tokens and store.notes == []

def damage(path: Path, how: str) -> None:
  data = path.read_bytes()
  if how == "truncated": path.write_bytes(data[:len(data) // 2])
  elif how == "flipped": path.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
  elif how == "other version": path.write_bytes(b"tinyzoo-jit 0\n" + data[len(MAGIC):])
  elif how == "empty": path.write_bytes(b"")
  elif how == "garbage": path.write_bytes(MAGIC + os.urandom(32) + os.urandom(1000))

@pytest.mark.parametrize("how", ["truncated", "flipped", "other version", "empty", "garbage"])
def test_a_damaged_entry_is_removed_and_captured_again(model: Path, first_run, tmp_path: Path, how: str):
  store, tokens = stored(first_run, tmp_path)
  for path in jits(store): damage(path, how)
  rt, again = generate(model, store)
  assert again == tokens and len(store.notes) == 4 and all("was unusable" in n for n in store.notes)
  assert len(jits(store)) == 4 and all(p.read_bytes().startswith(MAGIC) for p in jits(store))
  store.notes.clear()
  assert generate(model, store)[1] == tokens and store.notes == []

def test_an_interrupted_write_leaves_no_entry(first_run, tmp_path: Path, monkeypatch):
  """A write stopped before its rename leaves neither an entry nor its temporary file; two writers of one key at once
  each leave a whole entry, the last one's."""
  rt, store = first_run[0], stored(first_run, tmp_path)[0]
  store.clear()
  def stopped(*_): raise KeyboardInterrupt
  monkeypatch.setattr(os, "replace", stopped)
  with pytest.raises(KeyboardInterrupt): store.save("k", rt._decode, rt._state())
  monkeypatch.undo()
  assert list(store.root.iterdir()) == []
  writers = [threading.Thread(target=store.save, args=("k", rt._decode, rt._state())) for _ in range(4)]
  for w in writers: w.start()
  for w in writers: w.join()
  assert [p.name for p in store.root.iterdir()] == ["k.jit"] and store.load("k", rt._state()) is not None and store.notes == []

def test_the_store_keeps_under_its_limit_the_most_recently_used(first_run, tmp_path: Path):
  rt, store = first_run[0], stored(first_run, tmp_path)[0]
  for path in programs(store) + schedules(store): path.unlink()
  sizes = {p.name: size for p, size, _ in store.entries()}
  state = rt._state()
  small = JitStore(store.root, limit=sum(sizes.values()) - 1)
  oldest = small.entries()[0][0]
  small.load(oldest.stem, state)   # used now: another is the least recently used
  small.trim()
  assert oldest.exists() and len(small.entries()) == 3 and small.size() <= small.limit
  assert small.clear() > 0 and small.entries() == []

def test_a_jit_pickle_cannot_write_is_not_kept(model: Path, without_store: list[int], tmp_path: Path, monkeypatch):
  """What pickle cannot write (a device's handle, say) leaves no entry and one note; the run goes on."""
  import pickle
  from models import jit_cache
  def refuse(self, obj): raise pickle.PicklingError("cannot pickle 'CUgraph' object")
  monkeypatch.setattr(jit_cache._Writer, "dump", refuse)
  store = JitStore(tmp_path / "jits")
  rt, tokens = generate(model, store)
  assert rt.cached == set() and jits(store) == [] and len(store.notes) == 4
  assert all(n == "jit cache: not kept (cannot pickle 'CUgraph' object)" for n in store.notes) and tokens == without_store

@pytest.fixture(scope="module")
def same_shapes(tmp_path_factory) -> Path:
  return synthesize("smollm2-135m-tiny", tmp_path_factory.mktemp("same") / "other.gguf", quant="Q8_0", seed=7)

@pytest.fixture(scope="module")
def same_shapes_without_store(same_shapes: Path) -> list[int]:
  """The tokens of the same-shaped file without a store, made once."""
  return generate(same_shapes, None)[1]

def test_another_file_of_the_same_shapes_compiles_nothing(same_shapes: Path, first_run, same_shapes_without_store: list[int], tmp_path: Path,
                                                          monkeypatch):
  store, want = stored(first_run, tmp_path)[0], same_shapes_without_store
  compiled = compiles_of(monkeypatch)
  rt, tokens = generate(same_shapes, store)
  assert compiled == [] and tokens == want and store.notes == []
  assert len(jits(store)) == 8   # its JITs captured (the first run's are another file's) and kept beside those

@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_program_is_compiled_again(same_shapes: Path, first_run, same_shapes_without_store: list[int], tmp_path: Path, monkeypatch,
                                             how: str):
  """Every 8th program of the first run's damaged: a run of another file of the same shapes compiles those again, and
  only those (the others it takes from the store), to the same tokens as without the store."""
  store, want = stored(first_run, tmp_path)[0], same_shapes_without_store
  damaged = programs(store)[::8]
  for path in damaged: damage(path, how)
  compiled = compiles_of(monkeypatch)
  rt, tokens = generate(same_shapes, store)
  assert tokens == want and len(compiled) == len(damaged) == len(store.notes) and all("compiling it again" in n for n in store.notes)
  assert all(p.read_bytes().startswith(MAGIC) and len(p.read_bytes()) > 1000 for p in programs(store))

def test_an_entry_the_store_may_not_remove_still_counts_toward_its_limit(tmp_path: Path, monkeypatch):
  """Trimming past an entry it may not remove (another user's, a read-only file) removes the next ones in its place."""
  store = JitStore(tmp_path / "jits", limit=2500)
  for i in range(4):
    write = store.root / f"{i}{PROGRAM_SUFFIX}"
    store._write(write, bytes(1000))
    os.utime(write, (i, i))
  stuck, unlink = str(store.root / f"0{PROGRAM_SUFFIX}"), os.unlink
  def refuse(path: str):
    if path == stuck: raise PermissionError(f"may not remove {path}")
    unlink(path)
  monkeypatch.setattr(os, "unlink", refuse)
  store.trim()
  assert sorted(p.name for p in store.root.iterdir()) == [f"0{PROGRAM_SUFFIX}", f"3{PROGRAM_SUFFIX}"]

def profiler() -> cProfile.Profile:
  """A profile of the Python functions called, what tinyzoo_files reads: without their callers or built-ins, whose
  bookkeeping would double the time profiled."""
  return cProfile.Profile(subcalls=False, builtins=False)

def tinyzoo_files(profile: cProfile.Profile) -> set[str]:
  """The files of tinyzoo's packages (relative to the root) that a function called under `profile` is in."""
  return {str(p.relative_to(ROOT)) for f, _, _ in pstats.Stats(profile).stats if (p := Path(f)).is_absolute() and p.is_relative_to(ROOT)
          and p.parts[len(ROOT.parts)] in PACKAGES}

def test_a_programs_key_hashes_the_tinyzoo_source_its_compile_runs(model: Path, tmp_path: Path, monkeypatch):
  """Every tinyzoo function called while a model's prompt kernels compile (int8 dot products too, so dp4a's) is in a
  file of COMPILE_SOURCES, the only tinyzoo source a kept program's key hashes. int8_dot's CPU kernel of its own is
  left out (its source is given: nothing of tinyzoo runs while it compiles), so that tinygrad renders dp4a."""
  from ops import patches
  from quant import int8_cpu
  monkeypatch.setattr(int8_cpu, "simd_path", lambda flags=None: None)
  patches.forget_compiled()
  profile, compile = profiler(), patches._originals["do_to_program"]
  def watched(ast, renderer):
    with profile: return compile(ast, renderer)
  monkeypatch.setitem(patches._originals, "do_to_program", watched)
  Runtime(model, resolve({"strategy": "int8_dot"}), 64, jits=JitStore(tmp_path / "jits")).prefill([5, 6, 7]).realize()
  ours = tinyzoo_files(profile)
  assert {"quant/matvec_opts.py", "ops/dp4a.py", "ops/patches.py"} <= ours <= set(COMPILE_SOURCES), ours

CAPTURE_RUN = """
import json, sys
from pathlib import Path
import tinygrad.schedule as schedule
from models.jit_cache import JitStore
from ops import patches
from tests.models.test_jit_cache import generate
store = JitStore(Path(sys.argv[2]))
store.device
patches.install()
patches.keep_programs(store)   # the model's loading kernels kept there too
scheduled, make = [], schedule.get_kernel_graph
schedule.get_kernel_graph = lambda function: scheduled.append(function) or make(function)
tokens = generate(Path(sys.argv[1]), store, keep=False)[1]
print(json.dumps({"scheduled": len(scheduled), "tokens": tokens, "notes": store.notes}))
"""

def test_a_capture_under_a_new_key_takes_its_schedules_from_the_store(model: Path, tmp_path: Path, suite_links):
  """A capture keeps the schedule of each function it realizes; a later process that captures the model again (its
  JITs not kept, as after a change to tinyzoo's source) takes every schedule from the store, schedules nothing and
  gives the same tokens; a damaged schedule (every third) is made again, and only it. Each run is a process of its own:
  tinygrad remembers what it scheduled in the process. The store starts with links to the suite's compiled programs
  (none of its schedules) and gives what it made back to the suite's store."""
  with suite_links(tmp_path / "jits", (PROGRAM_SUFFIX,)) as store:
    def capture() -> dict:
      env = {**os.environ, "PYTHONPATH": str(ROOT)}
      r = subprocess.run([sys.executable, "-c", CAPTURE_RUN, str(model), str(store.root)], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
      assert r.returncode == 0, r.stderr[-3000:]
      return json.loads(r.stdout.splitlines()[-1])
    first = capture()
    kept = schedules(store)
    assert first["scheduled"] == len(kept) > 0 and first["notes"] == []
    assert capture() == {**first, "scheduled": 0}
    damaged = kept[::3]
    for p in damaged: damage(p, "garbage")
    again = capture()
    assert again["scheduled"] == len(again["notes"]) == len(damaged) and again["tokens"] == first["tokens"]
    assert all("scheduling it again" in n for n in again["notes"]), again["notes"]

def test_the_imports_of_each_source_file_are_kept_by_its_digest(tmp_path: Path, monkeypatch):
  """capture_sources takes each file's tinyzoo imports from the cache directory where a run worked them out before:
  the same sources for every architecture with none parsed again; a file whose text changed is parsed again (and only
  it), and so is every file where the kept file is damaged, was kept for other package files or by other code, or
  names files that are not there."""
  from models import jit_cache
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path))
  parsed, parse = [], jit_cache.tinyzoo_imports
  monkeypatch.setattr(jit_cache, "tinyzoo_imports", lambda source: parsed.append(source) or parse(source))
  def sources() -> dict[str, tuple[str, ...]]: return {arch: jit_cache.capture_sources.__wrapped__(arch) for arch in ARCH_PRESETS}
  first, files = sources(), len(set(parsed))
  assert len(parsed) == files > 20 and (tmp_path / jit_cache.IMPORTS_FILE).is_file()
  parsed.clear()
  assert sources() == first and parsed == []
  read = Path.read_bytes
  monkeypatch.setattr(Path, "read_bytes", lambda p: read(p) + (b"# edited" if p == ROOT / "ops/rope.py" else b""))
  assert sources() == first and parsed == ["ops/rope.py"]
  monkeypatch.setattr(Path, "read_bytes", read)
  header = {k: v for k, v in json.loads((tmp_path / jit_cache.IMPORTS_FILE).read_text()).items() if k != "imports"}
  named_elsewhere = {d: ["models/gone.py"] for d in json.loads((tmp_path / jit_cache.IMPORTS_FILE).read_text())["imports"]}
  for kept in ("{", {**header, "files": ["models/gone.py"]}, {**header, "parser": "another"}, {**header, "imports": named_elsewhere}):
    (tmp_path / jit_cache.IMPORTS_FILE).write_text(kept if isinstance(kept, str) else json.dumps({"imports": {}, **kept}))
    parsed.clear()
    assert sources() == first and len(parsed) == files

def test_the_compile_sources_import_no_other_tinyzoo_module():
  """What a file of COMPILE_SOURCES imports from tinyzoo (at its top or inside a function) is in COMPILE_SOURCES too, so
  that a table or helper it reads from elsewhere is hashed with it."""
  for source in COMPILE_SOURCES: assert tinyzoo_imports(source) <= set(COMPILE_SOURCES), source

# a preset of each architecture's module
ARCH_PRESETS = {"models.llama": "smollm2-135m-tiny", "models.gemma3": "gemma3-270m-tiny", "models.qwen3": "qwen3-0.6b-tiny",
                "models.mixtral": "mixtral-8x7b-tiny", "models.gpt_oss": "gpt-oss-20b-tiny", "models.deepseek2": "deepseek-v2-lite-tiny"}

@pytest.fixture(scope="module")
def captures(tmp_path_factory, suite_links) -> Iterator[JitStore]:
  """A linked store made once for the module's captures (linking the suite's entries takes seconds). Each
  architecture's JITs have keys of their own: a capture finds none of another's."""
  with suite_links(tmp_path_factory.mktemp("captures") / "jits") as store: yield store

@pytest.mark.parametrize("arch", ARCH_PRESETS)
def test_a_jits_key_hashes_the_tinyzoo_source_its_capture_runs(arch: str, captures: JitStore):
  """Every tinyzoo function called while a runtime loads, builds and captures a model (prefill, head, decode and the
  sampler's JIT) and keeps its JITs is in a file of capture_sources(its architecture's module), the only tinyzoo source
  a kept JIT's key hashes; the other architectures' modules are not among them, but for one the module imports itself
  (Mixtral's, Llama's). The store takes the suite's programs and schedules: the profile is of the capture. The sources
  are worked out before it (kept for the process, as where a JIT of the architecture was keyed before)."""
  from models.catalog import resolve_model
  sources, path, profile = set(capture_sources(arch)), resolve_model(ARCH_PRESETS[arch]), profiler()
  with profile:
    rt, sampler = Runtime(path, resolve({}), 64, jits=captures), Sampler(GREEDY)
    rt.warm_up(sampler)
    rt.keep_jits(sampler)
  assert rt.arch.__name__ == arch and rt.cached == set(ALL_JITS)
  ran = tinyzoo_files(profile)
  others = {module_file(a) for a in ARCH_PRESETS} - {module_file(arch)} - tinyzoo_imports(module_file(arch))
  assert {module_file(arch), "models/runtime.py", "ops/sampling.py"} <= ran <= sources, ran - sources
  assert not others & sources

@pytest.mark.parametrize("edited,misses", [("models/llama.py", True), ("ops/attention.py", True), ("models/gemma3.py", False),
                                           ("tinyzoo/cli.py", False), ("models/synth.py", False)])
def test_an_edit_misses_where_the_capture_runs_it(model: Path, first_run, tmp_path: Path, monkeypatch, edited: str, misses: bool):
  """An edit of a file (its digest another) misses every JIT of the smollm2 preset (a Llama) where its capture runs that
  file's code (the architecture's module, a shared op) and keeps all four where it does not (another architecture, the
  command line, the writer of synthetic files); the tokens stay those of the first run."""
  from models import jit_cache
  digest = jit_cache.source_digest
  monkeypatch.setattr(jit_cache, "source_digest", lambda paths: digest(paths) + ("edited" if edited in paths else ""))
  store, tokens = stored(first_run, tmp_path)
  rt, again = generate(model, store)
  assert again == tokens and store.notes == [] and rt.cached == set(ALL_JITS)
  assert len(jits(store)) == (8 if misses else 4)

def test_a_store_whose_directory_takes_no_entry_runs_without_it(model: Path, first_run, tmp_path: Path):
  """A cache directory that cannot be made (its parent a file) keeps nothing: the run answers as one with a store does,
  with a note for each JIT not kept."""
  (tmp_path / "file").write_text("")
  store = JitStore(tmp_path / "file" / "jits")
  rt, tokens = generate(model, store)
  assert tokens == first_run[1] and rt.cached == set() and store.entries() == []
  assert sum(f"{JIT_SUFFIX} not kept" in n for n in store.notes) == 4 and all("not kept" in n or "unreadable" in n for n in store.notes)

def test_a_runtime_without_a_store_keeps_its_programs_in_the_cache_directory(same_shapes: Path, first_run, tmp_path: Path, monkeypatch):
  """A runtime told not to keep programs keeps none of those it compiles; one without a store keeps them in the cache
  directory's. Both compile every kernel (the in-process cache emptied), each compile giving the program the first run
  compiled for the same kernel (a file of the same shapes, under the same settings) where it has one."""
  from ops import patches
  monkeypatch.setenv("TINYZOO_CACHE", str(tmp_path))
  compiled, compile = first_run[3], patches._originals["do_to_program"]
  def first_runs(ast, renderer): return compile(ast, renderer) if (prg := compiled.get((ast, renderer))) is None else prg
  monkeypatch.setitem(patches._originals, "do_to_program", first_runs)
  patches.forget_compiled()
  Runtime(same_shapes, resolve({}), 64, keep_programs=False).prefill([5, 6, 7]).realize()
  assert programs(JitStore()) == []
  patches.forget_compiled()
  Runtime(same_shapes, resolve({}), 64).prefill([5, 6, 7]).realize()
  assert JitStore().root == tmp_path / "jits" and len(programs(JitStore())) > 10 and jits(JitStore()) == []

def test_a_first_run_shows_its_compile_as_a_progress_bar_of_the_jits(model: Path, capfd):
  """Warming up with progress on, a run with nothing kept draws a bar on stderr that counts the four JITs it captures
  (prefill and head, decode, the sampler's); one with every JIT given draws none."""
  rt, sampler = Runtime(model, resolve({}), 64), Sampler(GREEDY)
  assert rt.warm_up(sampler, progress=True) > 0
  err = capfd.readouterr().err
  assert "compiling" in err and "4/4" in err, err
  assert rt.warm_up(sampler, progress=True) == 0.0 and capfd.readouterr().err == ""
