"""Device profiles: found by the device's name, merged and written whole, validated with the file and line of a mistake."""
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

@pytest.mark.parametrize("text,error", [
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
  without tinygrad trying every backend (none but the CPU's module is imported); a kept device that does not open is
  chosen again."""
  env = {k: v for k, v in os.environ.items() if k != "DEV"} | {"TINYZOO_CACHE": str(tmp_path)}
  probe = ("from profiles.device import select_device; import sys; d = select_device(); "
           "print(d, sorted(m.rsplit('_', 1)[1] for m in sys.modules if m.startswith('tinygrad.runtime.ops_')))")
  run = lambda: subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120).stdout.split(maxsplit=1)
  first, later = run(), run()
  kept = json.loads((tmp_path / "device.json").read_text())
  assert first[0] == later[0] and list(kept.values()) == [first[0]], (first, later, kept)
  assert later[1].strip() == f"['{first[0].lower()}']" and first[1] != later[1], (first, later)
  (tmp_path / "device.json").write_text(json.dumps({k: "NOSUCH" for k in kept}))
  assert run() == first and json.loads((tmp_path / "device.json").read_text()) == kept
