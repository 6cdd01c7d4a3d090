"""Device profiles: what was tuned on one device, in `profiles/<backend>-<device>.yaml`, found by the device's name.

A profile holds kernel hints for the device (profiles/hints.py: below runtime flags, above a model's manifest) and the
GPU matvec sizes found fastest per kernel shape (`tinyzoo matvec --shape ... --gpu-sizes grid --save-best`), with the
GB/s each reached:

  device: 'CUDA: NVIDIA H100 80GB HBM3'
  machine: {compute_capability: '9.0'}   # what the tune ran on that decides hints (profiles/machine.py): a machine
                                          # that differs in any of them is not given this profile's hints
  hints:
    strategy: packed_words
    norm: break
  architectures:       # hints for one architecture's models (general.architecture), over the device's
    gemma3: {norm: fold}
  matvec_sizes:
    2048x4x2x64x4: {sizes: '64,1,2,1', gb_s: 624.9}

A profile may be `based_on` another in its folder (another part of the same chip, say): it starts from that one's hints,
per-architecture hints and matvec sizes, and what it sets itself wins; tuning it writes only its own.
"""
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import re
import subprocess
from importlib.metadata import version
from pathlib import Path
from typing import Any
import yaml
from tinygrad import Device
from tinygrad.helpers import DEV, NUM_CPU_THREADS
from ops.cache import cache_dir, write_whole
from profiles.hints import HINTS, Hints, check, from_env, from_manifest, resolve
from profiles.machine import PROFILE_KEYS as MACHINE_KEYS, Machine, Shapes, this_machine
from quant.gguf_file import GGUFFile
from quant.matvec_opts import Sizes, parse_gpu_sizes

PROFILES = Path(__file__).parent

class ProfileError(ValueError): pass

def select_device(programs: Any = None) -> str:
  """tinygrad's default device. To choose it, tinygrad imports and tries every backend it has in turn (most of a second
  on a machine with the CPU alone), so the choice is kept in the cache directory, for this machine's name, its device
  files and the tinygrad version, and taken from there while that backend opens. DEV, where set, wins as in tinygrad.
  A backend that compiles programs of its own as it opens (the CPU's: its workers' loop, signals and timestamps) takes
  them from `programs` where given (a store of compiled programs, models/jit_cache.py's), as a runtime's kernels do."""
  if DEV.device:
    if programs is not None:
      with contextlib.suppress(Exception): _open(Device.DEFAULT, programs)   # one that does not open fails where it is used
    return Device.DEFAULT
  path, key = cache_dir() / "device.json", None
  with contextlib.suppress(Exception):   # anything amiss with the kept choice: tinygrad chooses
    key = hashlib.sha256(repr((version("tinygrad"), platform.node(), sorted(os.listdir("/dev")))).encode()).hexdigest()
    if isinstance(dev := json.loads(path.read_text()).get(key), str):
      before = DEV.value   # named before it opens (the store names the device it keeps programs for), a renderer DEV sets kept
      DEV.value = [dataclasses.replace(before[0], device=dev), *before[1:]]
      try: _open(dev, programs)
      except Exception:
        DEV.value = before
        raise
      os.environ["DEV"] = repr(DEV)
      return dev
  dev = Device.DEFAULT
  if key is not None:
    with contextlib.suppress(OSError): write_whole(path, json.dumps({key: dev}))
  return dev

def _open(dev: str, programs: Any) -> None:
  if programs is None:
    Device[dev]
    return
  from ops import patches
  patches.install()   # before tinygrad imports the backend, which compiles through what it imported
  with patches.KernelSettings(programs=programs): Device[dev]

def device_name() -> str:
  """The backend and the hardware under it, e.g. 'CPU: Intel(R) Xeon(R) ..., 2 cores' (the cores its kernels are split
  over, tinygrad's NUM_CPU_THREADS) or 'CUDA: NVIDIA H100 80GB HBM3'."""
  dev = Device.DEFAULT
  if dev in ("CUDA", "NV"):
    try: return f"{dev}: " + subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=20).stdout.splitlines()[0].strip()
    except (OSError, IndexError): return dev
  cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), platform.machine()) \
    if Path("/proc/cpuinfo").exists() else platform.machine()
  cores = NUM_CPU_THREADS.value
  return f"{dev}: {cpu}, {cores} {'core' if cores == 1 else 'cores'}"

def profile_path(device: str, folder: Path | None = None) -> Path:
  """'CUDA: NVIDIA H100 80GB HBM3' -> profiles/cuda-nvidia-h100-80gb-hbm3.yaml (the core count of a CPU name is left out)."""
  name = re.sub(r",\s*\d+ cores?$", "", device)
  return (folder or PROFILES) / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".yaml")

def _fail(path: Path, node: yaml.Node | None, msg: str) -> ProfileError:
  return ProfileError(f"{path}:{node.start_mark.line + 1 if node is not None else 1}: {msg}")

def _empty() -> dict:
  return {"device": None, "machine": {}, "based_on": None, "hints": {}, "architectures": {}, "tuned": None, "matvec_sizes": {}}

KEYS = "device, machine, based_on, hints, architectures, tuned, matvec_sizes"

def _hints(path: Path, node: yaml.Node) -> dict:
  if not isinstance(node, yaml.MappingNode): raise _fail(path, node, "hints maps hint names to values (e.g. norm: break)")
  out = {}
  for name, v in node.value:
    if not isinstance(v, yaml.ScalarNode): raise _fail(path, v, f"hint {name.value}: a value, not a list or mapping")
    try: out[name.value] = check(name.value, v.value, "profile")
    except ValueError as e: raise _fail(path, name, str(e)) from None
  return out

def load(path: Path) -> dict:
  """A profile's own contents, validated: {'device': str, 'machine': {feature: value}, 'based_on': str | None, 'hints': {name: value},
  'architectures': {arch: {name: value}}, 'matvec_sizes': {shape: {'sizes': (T, B, R[, S]), 'gb_s': float}}}."""
  try: root = yaml.compose(path.read_text())
  except yaml.YAMLError as e:
    line = getattr(getattr(e, "problem_mark", None), "line", 0) + 1
    raise ProfileError(f"{path}:{line}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
  out = _empty()
  if root is None: return out
  if not isinstance(root, yaml.MappingNode):
    raise _fail(path, root, f"a profile is a mapping of keys ({KEYS})")
  for key, value in root.value:
    if key.value == "device": out["device"] = value.value
    elif key.value == "machine":
      if not isinstance(value, yaml.MappingNode) or any(k.value not in MACHINE_KEYS or not isinstance(v, yaml.ScalarNode) for k, v in value.value):
        raise _fail(path, value, f"machine maps what the tune ran on to its value: {', '.join(MACHINE_KEYS)}")
      out["machine"] = {k.value: v.value for k, v in value.value}
    elif key.value == "based_on":
      if not isinstance(value, yaml.ScalarNode) or not (path.parent / f"{value.value}.yaml").is_file():
        raise _fail(path, value, f"based_on names another profile in {path.parent} by its file name without .yaml")
      out["based_on"] = value.value
    elif key.value == "tuned":   # what `tinyzoo tune` reached with the hints: a record, not a setting
      if not isinstance(value, yaml.MappingNode): raise _fail(path, value, "tuned maps model, tok_s and time to their values")
      out["tuned"] = yaml.safe_load(yaml.serialize(value))
    elif key.value == "hints": out["hints"] = _hints(path, value)
    elif key.value == "architectures":
      if not isinstance(value, yaml.MappingNode): raise _fail(path, value, "architectures maps architecture names to their hints")
      out["architectures"] = {arch.value: _hints(path, hints) for arch, hints in value.value}
    elif key.value == "matvec_sizes":
      if not isinstance(value, yaml.MappingNode): raise _fail(path, value, "matvec_sizes maps kernel shapes to {sizes: 'T,B,R[,S]', gb_s: N}")
      for shape, entry in value.value:
        if not re.fullmatch(r"\d+(x\d+)*", shape.value): raise _fail(path, shape, f"{shape.value!r} is no kernel shape (like 2048x4x2x64x4)")
        fields = {k.value: v.value for k, v in entry.value} if isinstance(entry, yaml.MappingNode) else {}
        try: out["matvec_sizes"][shape.value] = {"sizes": parse_gpu_sizes(fields.get("sizes", "")), "gb_s": float(fields.get("gb_s", "nan"))}
        except ValueError as e: raise _fail(path, entry, f"{shape.value}: {e}") from None
    else: raise _fail(path, key, f"unknown key {key.value!r} (known: {KEYS})")
  return out

def save_matvec_sizes(path: Path, device: str, best: dict[str, tuple[Sizes, float]]) -> None:
  """Merges {shape: (sizes, gb_s)} into the profile at `path` (a shape measured again is replaced), written atomically."""
  old = load(path) if path.exists() else _empty()
  old["matvec_sizes"].update({shape: {"sizes": sizes, "gb_s": gb_s} for shape, (sizes, gb_s) in best.items()})
  _save(path, {**old, "device": device})

def machine_key(machine: Machine) -> dict[str, str]:
  """What of `machine` a profile tuned on it is keyed by: the features it has of MACHINE_KEYS."""
  return {k: str(v) for k in MACHINE_KEYS if (v := getattr(machine, k)) is not None}

def save_hints(path: Path, device: str, hints: dict, tuned: dict, machine: Machine | None = None) -> None:
  """Replaces the hints of the profile at `path` (its matvec sizes and per-architecture hints kept) with those of `hints`
  a profile may set (run-only ones are left out), and `tuned` (the model, tok/s and time they reached), keyed by the
  machine they were tuned on (default this one), written atomically."""
  old = load(path) if path.exists() else _empty()
  kept = {n: check(n, v, "profile") for n, v in hints.items() if not HINTS[n].run_only}
  _save(path, {**old, "device": device, "machine": machine_key(machine or this_machine()), "hints": kept, "tuned": tuned})

def _save(path: Path, profile: dict) -> None:
  sizes = {s: {"sizes": ",".join(map(str, e["sizes"])), "gb_s": round(e["gb_s"], 1)} for s, e in sorted(profile["matvec_sizes"].items())}
  doc = {"device": profile["device"], **{k: profile[k] for k in ("machine", "based_on", "hints", "architectures", "tuned") if profile.get(k)},
         "matvec_sizes": sizes}
  write_whole(path, "# this device's kernel hints (profiles/hints.py: by `tinyzoo tune`, or each from a measured run in the journal), and,\n"
                 "# by `tinyzoo matvec --save-best`, GPU matvec sizes (threads per row, rows per workgroup, rows per thread[, words of\n"
                 "# a block per thread]) found fastest per kernel shape on this device (gb_s 0: chosen by a model bench's tok/s)\n"
                 + yaml.safe_dump(doc, sort_keys=False))

def _merged(path: Path, seen: tuple[Path, ...] = ()) -> dict:
  """The profile at `path` over the one it is based on (and so on)."""
  if path in seen: raise ProfileError(f"{seen[0]}: based_on goes round in a circle: {' -> '.join(p.stem for p in (*seen, path))}")
  own = load(path)
  if own["based_on"] is None: return own
  base = _merged(path.parent / f"{own['based_on']}.yaml", (*seen, path))
  archs = {a: {**base["architectures"].get(a, {}), **own["architectures"].get(a, {})} for a in {**base["architectures"], **own["architectures"]}}
  return {**own, "machine": {**base["machine"], **own["machine"]}, "hints": {**base["hints"], **own["hints"]}, "architectures": archs,
          "matvec_sizes": {**base["matvec_sizes"], **own["matvec_sizes"]}}

def device_profile(device: str | None = None, folder: Path | None = None, machine: Machine | None = None) -> tuple[dict, Path | None]:
  """The profile of this device (or the one named `device`; in `folder`, default profiles/), over the one it is based on,
  and its path; an empty one and None without one, or where it was tuned on a machine that differs from `machine`
  (default: this one, for this device's profile) in what it is keyed by (`not_applied`)."""
  if not (path := profile_path(device or device_name(), folder)).exists(): return _empty(), None
  found = _merged(path)
  return (_empty(), None) if _mismatch(path, found, device, machine) is not None else (found, path)

def not_applied(device: str | None = None, folder: Path | None = None, machine: Machine | None = None) -> str | None:
  """Why the profile of this device (or of `device`) is not applied on `machine` (default: this one, for this device's
  profile; a named device's is checked only against a machine given); None where it applies or there is none."""
  if not (path := profile_path(device or device_name(), folder)).exists(): return None
  return _mismatch(path, _merged(path), device, machine)

def _mismatch(path: Path, profile: dict, device: str | None, machine: Machine | None) -> str | None:
  """The first feature the profile's `machine:` names that the machine has otherwise, said in a line; None where none."""
  if (machine := machine or (this_machine() if device is None else None)) is None: return None
  for key, tuned in profile["machine"].items():
    if str(have := getattr(machine, key)) != tuned:
      return f"{path.name} was tuned where {key} is {tuned}, this machine's is {have if have is not None else 'none'}"
  return None

def tuned_sizes(profile: dict) -> dict[str, Sizes]:
  """The GPU matvec sizes a profile tuned per kernel shape."""
  return {shape: e["sizes"] for shape, e in profile["matvec_sizes"].items()}

def resolve_hints(model: str | os.PathLike, runtime: dict, profile: bool = True, folder: Path | None = None,
                  machine: Machine | None = None) -> Hints:
  """The hints for `model` on this machine (or `machine`): `runtime` (flags) over TINYZOO_HINTS over the device profile
  (its hints for the model's architecture over its others, and its GPU matvec sizes; unless `profile` is off, or it was
  tuned on another kind of machine) over the file's manifest over the hints' rules for the machine and the model's
  shapes over the defaults."""
  g, machine = GGUFFile(model), machine or this_machine()
  found, path = device_profile(folder=folder, machine=machine) if profile else (_empty(), None)
  hints = {**found["hints"], **found["architectures"].get(g.architecture, {})}
  return resolve({**from_env(), **runtime}, hints, from_manifest(g), tuned_sizes(found), path, machine, Shapes.of(g))
