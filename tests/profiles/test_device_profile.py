"""Device profiles: found by the device's name, merged and written whole, validated with the file and line of a mistake."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path
import pytest
from profiles.device import ProfileError, device_profile, load, profile_path, save_matvec_sizes, tuned_sizes

H100 = "CUDA: NVIDIA H100 80GB HBM3"

def test_path_from_the_device_name(tmp_path: Path):
  assert profile_path(H100, tmp_path) == tmp_path / "cuda-nvidia-h100-80gb-hbm3.yaml"
  assert profile_path("CPU: Intel(R) Xeon(R) Platinum 8488C, 2 cores", tmp_path).name == "cpu-intel-r-xeon-r-platinum-8488c.yaml"
  assert profile_path("CPU: Intel(R) Xeon(R) Platinum 8488C, 1 core", tmp_path).name == "cpu-intel-r-xeon-r-platinum-8488c.yaml"

def test_save_merges_and_the_device_finds_its_sizes(tmp_path: Path):
  path = profile_path(H100, tmp_path)
  save_matvec_sizes(path, H100, {"2048x256x4x4x2": ((64, 2, 2), 355.12), "8192x64x4x4x2": ((16, 4, 4), 272.0)})
  save_matvec_sizes(path, H100, {"8192x64x4x4x2": ((32, 4, 2), 301.5)})
  assert [p.name for p in tmp_path.iterdir()] == [path.name]   # no temporary file left
  got = load(path)
  assert got["device"] == H100
  assert got["matvec_sizes"] == {"2048x256x4x4x2": {"sizes": (64, 2, 2), "gb_s": 355.1}, "8192x64x4x4x2": {"sizes": (32, 4, 2), "gb_s": 301.5}}
  profile, found = device_profile(H100, tmp_path)
  assert found == path and tuned_sizes(profile) == {"2048x256x4x4x2": (64, 2, 2), "8192x64x4x4x2": (32, 4, 2)}
  profile, found = device_profile("CUDA: another GPU", tmp_path)
  assert found is None and tuned_sizes(profile) == {}

def test_a_profile_based_on_another_starts_from_it_and_tuning_writes_its_own(tmp_path: Path):
  base, own = tmp_path / "base.yaml", profile_path("CUDA: NVIDIA H200", tmp_path)
  base.write_text("device: b\nhints: {norm: single, beam: 0}\narchitectures:\n  llama: {split_kv: 4, kv_cache: half}\n"
                  "  gemma3: {norm: fold}\nmatvec_sizes:\n  2048x4x2x64x4: {sizes: '64,1,2,1', gb_s: 600}\n"
                  "  8192x4x2x64x4: {sizes: '32,2,4,1', gb_s: 700}\n")
  own.write_text("device: 'CUDA: NVIDIA H200'\nbased_on: base\nhints: {beam: 2}\narchitectures:\n  llama: {split_kv: 8}\n"
                 "matvec_sizes:\n  8192x4x2x64x4: {sizes: '64,1,8,1', gb_s: 900}\n")
  got, found = device_profile("CUDA: NVIDIA H200", tmp_path)
  assert found == own and got["device"] == "CUDA: NVIDIA H200"
  assert got["hints"] == {"norm": "single", "beam": 2}
  assert got["architectures"] == {"llama": {"split_kv": 8, "kv_cache": "half"}, "gemma3": {"norm": "fold"}}
  assert tuned_sizes(got) == {"2048x4x2x64x4": (64, 1, 2, 1), "8192x4x2x64x4": (64, 1, 8, 1)}
  save_matvec_sizes(own, "CUDA: NVIDIA H200", {"2048x256x4x4x2": ((64, 2, 2), 355.0)})
  kept = load(own)   # its own entries and the base's name, none of the base's entries copied in
  assert kept["based_on"] == "base" and kept["hints"] == {"beam": 2}
  assert set(kept["matvec_sizes"]) == {"8192x4x2x64x4", "2048x256x4x4x2"} and load(base)["hints"] == {"norm": "single", "beam": 0}
  assert tuned_sizes(device_profile("CUDA: NVIDIA H200", tmp_path)[0])["2048x4x2x64x4"] == (64, 1, 2, 1)

def test_profiles_based_on_each_other_in_a_circle_are_refused(tmp_path: Path):
  (tmp_path / "a.yaml").write_text("device: a\nbased_on: b\n")
  (tmp_path / "b.yaml").write_text("device: b\nbased_on: a\n")
  with pytest.raises(ProfileError, match="based_on goes round in a circle: a -> b -> a"): device_profile("a", tmp_path)

def test_the_h200_takes_what_it_did_not_tune_from_the_h100():
  own, h100, h200 = load(profile_path("CUDA: NVIDIA H200")), device_profile(H100)[0], device_profile("CUDA: NVIDIA H200")[0]
  assert own["based_on"] == profile_path(H100).stem and h100["hints"] and h100["matvec_sizes"]
  assert h200["hints"] == {**h100["hints"], **own["hints"]}
  assert tuned_sizes(h200) == {**tuned_sizes(h100), **tuned_sizes(own)}

@pytest.mark.parametrize("text,error", [
  ("device: x\nbased_on: nosuch\n", ":2: based_on names another profile in"),
  ("device: x\nmatvec_sizes:\n  2048x256: {sizes: '64,2', gb_s: 1}\n", ":3: 2048x256: GPU matvec sizes are THREADS,ROWS_PER_GROUP,ROWS_PER_THREAD"),
  ("device: x\nmatvec_sizes:\n  2048x4x2x64x4: {sizes: '64,1,4,3', gb_s: 1}\n",
   ":3: 2048x4x2x64x4: GPU matvec sizes are THREADS,ROWS_PER_GROUP,ROWS_PER_THREAD[,SPAN] (a span of 0, 1, 2, 4 or 8"),
  ("device: x\nhint: {}\n", ":2: unknown key 'hint'"),
  ("device: x\nhints:\n  norm: break\n  beams: 2\n", ":4: unknown hint 'beams' (known: strategy,"),
  ("device: x\nhints:\n  act_break: maybe\n", ":3: hint act_break: 'maybe' is not true or false"),
  ("device: x\nhints:\n  norm: realized\n", ":3: hint norm: 'realized' is not one of fused, break, single, fold"),
  ("device: x\nhints:\n  strategy: packed_dot,Q6_K=fast\n", ":3: hint strategy: unknown matmul strategy 'fast'"),
  ("device: x\nhints:\n  row_upcast: [8]\n", ":3: hint row_upcast: a value, not a list or mapping"),
  ("device: x\nhints: [norm]\n", ":2: hints maps hint names to values"),
  ("device: x\narchitectures: [gemma3]\n", ":2: architectures maps architecture names to their hints"),
  ("device: x\narchitectures:\n  gemma3:\n    norm: folded\n", ":4: hint norm: 'folded' is not one of"),
  ("device: x\nhints:\n  rounding: ggml\n", ":3: hint rounding is set at run time only, not by a profile"),
  ("device: x\nmatvec_sizes:\n  q4_0: {sizes: '1,1,1'}\n", ":3: 'q4_0' is no kernel shape"),
  ("device: x\nmatvec_sizes: [1, 2]\n", ":2: matvec_sizes maps kernel shapes"),
  ("device: [x\n", ":2: not valid YAML"),
  ("- a\n- b\n", ":1: a profile is a mapping"),
])
def test_bad_profiles_name_the_file_and_line(tmp_path: Path, text: str, error: str):
  path = tmp_path / "p.yaml"
  path.write_text(text)
  with pytest.raises(ProfileError) as e: load(path)
  assert str(e.value).startswith(f"{path}{error}"), str(e.value)

def test_the_chosen_device_is_kept_per_machine(tmp_path: Path):
  """Without DEV, the first process takes tinygrad's choice of device and keeps it; a later one takes the kept choice
  without tinygrad trying every backend (none but the CPU's module is imported), and so does the command line, whose
  parser's defaults depend on the device (it imports only the modules tinyzoo's changes to tinygrad import besides);
  a kept device that does not open is chosen again."""
  env = {k: v for k, v in os.environ.items() if k != "DEV"} | {"TINYZOO_CACHE": str(tmp_path)}
  backends = "print(sorted(m.rsplit('_', 1)[1] for m in sys.modules if m.startswith('tinygrad.runtime.ops_')))"
  probe = f"from profiles.device import select_device; import sys; d = select_device(); print(d, end=' '); {backends}"
  run = lambda: subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120).stdout.split(maxsplit=1)
  first, later = run(), run()
  kept = json.loads((tmp_path / "device.json").read_text())
  assert first[0] == later[0] and list(kept.values()) == [first[0]], (first, later, kept)
  assert later[1].strip() == f"['{first[0].lower()}']" and first[1] != later[1], (first, later)
  cli = f"import atexit, sys; atexit.register(lambda: {backends}); from tinyzoo.cli import main; main(['run', '--help'])"
  r = subprocess.run([sys.executable, "-c", cli], env=env, capture_output=True, text=True, timeout=120)
  # the command line installs tinyzoo's changes to tinygrad before the device opens: their hook of CUDA graphs imports
  # the CUDA backend's module (and opens no CUDA device)
  patched = subprocess.run([sys.executable, "-c", f"import sys; from ops import patches; patches.install(); {backends}"], env=env,
                           capture_output=True, text=True, timeout=120).stdout.strip()
  assert "kernel hints" in r.stdout and r.stdout.splitlines()[-1] == str(sorted({first[0].lower(), *ast.literal_eval(patched)})), r.stdout[-300:]
  (tmp_path / "device.json").write_text(json.dumps({k: "NOSUCH" for k in kept}))
  assert run() == first and json.loads((tmp_path / "device.json").read_text()) == kept

def test_the_cpus_own_programs_come_from_the_store(tmp_path: Path):
  """The CPU backend compiles programs of its own as it opens (its workers' loop, signals, timestamps): the command line
  opens the kept device with the cache directory's store of programs, which keeps them, and a later process that
  opens it with that store compiles none, with DEV set too. (Each is a process of its own: a process opens a device
  once.)"""
  env = {k: v for k, v in os.environ.items() if k != "DEV"} | {"TINYZOO_CACHE": str(tmp_path)}
  probe = ("from ops import patches; patches.install(); from models.jit_cache import JitStore, PROGRAM_SUFFIX; "
           "from profiles.device import select_device; made, compile = [], patches._originals['do_to_program']; "
           "patches._originals['do_to_program'] = lambda *a: made.append(a[0]) or compile(*a); store = JitStore(); "
           "print(select_device(store), len(made), len(store.entries((PROGRAM_SUFFIX,))))")
  run = lambda *args: subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)
  first = run("-c", probe).stdout.split()   # tinygrad chooses the device (no store): kept for the machine
  if first[0] != "CPU": pytest.skip(f"the device kept here is {first[0]}")
  assert int(first[1]) > 0 and first[2] == "0", first
  assert run("-m", "tinyzoo", "cache").returncode == 0
  kept = len(list((tmp_path / "jits").glob("*.prg")))
  assert kept == int(first[1]) and run("-c", probe).stdout.split() == ["CPU", "0", str(kept)]
  env["DEV"] = "CPU"   # named by the user (a key of its own: the variables of tinygrad's settings set are keyed): with the store too
  assert run("-c", probe).stdout.split() == ["CPU", str(kept), str(2 * kept)] and run("-c", probe).stdout.split() == ["CPU", "0", str(2 * kept)]
