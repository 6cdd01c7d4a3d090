"""The hints' built-in rules: values from what the machine offers and the model's shapes, named `heuristic` with their
reason; the same for a new architecture as for an old one of the same shapes; the tuned entries of the shipped GPU
profile met by the rule where the profile is left out; a profile tuned on another kind of machine not applied."""
from pathlib import Path
import pytest
from models.catalog import synthesized
from models.synth import PRESETS
from profiles import device
from profiles.device import device_profile, load, not_applied, resolve_hints
from profiles.hints import SPLIT_PART_ELEMENTS, resolve
from profiles.machine import Machine, Shapes
from quant.gguf_file import GGUFFile

H200 = Machine("CUDA", compute_capability="9.0", multiprocessors=132)
VNNI, AVX2 = Machine("CPU", cpu_simd="avx512_vnni"), Machine("CPU", cpu_simd="avx2")

def preset_shapes(name: str) -> Shapes:
  """A real model's shapes from its synthetic preset's definition (models/synth.py), no file written."""
  p = PRESETS[name]
  width = p.mla.kv_lora_rank + p.mla.rope_dim if p.mla else p.n_kv_heads * 2 * p.head_dim
  return Shapes(p.arch, p.n_heads, width, *((p.moe.n_experts, p.moe.n_used) if p.moe else ()))

def test_a_rules_value_is_named_heuristic_with_its_reason():
  h = resolve(machine=H200, shapes=preset_shapes("qwen3-0.6b"))
  assert (h.split_kv, h.sources["split_kv"]) == (2, "heuristic")
  assert "2048 cache elements a position" in h.reasons["split_kv"] and "132 multiprocessors" in h.as_dict()["split_kv"]["reason"]
  assert resolve(machine=VNNI).as_dict()["strategy"] == {"value": "int8_dot", "source": "heuristic",
                                                         "reason": "the CPU has avx512_vnni int8 dot products (quant/int8_cpu.py)"}
  # a source above the rule wins, and a runtime value drops its reason
  assert resolve({"split_kv": 0}, machine=H200, shapes=preset_shapes("qwen3-0.6b")).sources["split_kv"] == "runtime"
  assert "split_kv" not in resolve(machine=H200, shapes=preset_shapes("qwen3-0.6b")).with_runtime(split_kv=1).reasons
  # where no rule applies: the default (no machine given; the CPU splits no cache; a CPU without VNNI keeps packed_dot)
  assert resolve().sources["strategy"] == "default" and resolve(machine=VNNI, shapes=preset_shapes("qwen3-0.6b")).split_kv == 0
  assert resolve(machine=Machine("CPU")).strategy == resolve(machine=AVX2).strategy == "packed_dot"
  assert resolve(machine=Machine("CPU", cpu_simd="avx_vnni")).strategy == "int8_dot"

def test_a_tensor_core_gpu_takes_the_hand_written_gemm():
  """gemm mma where mma.sync runs (compute capability 8.0 on), with or without a model; tinygrad's GEMM before it and off
  CUDA."""
  assert (resolve(machine=H200).gemm, resolve(machine=H200).sources["gemm"]) == ("mma", "heuristic")
  assert "compute capability 9.0" in resolve(machine=H200, shapes=preset_shapes("llama3.2-1b")).reasons["gemm"]
  assert resolve(machine=Machine("CUDA", compute_capability="7.5")).gemm == resolve(machine=VNNI).gemm == resolve().gemm == "tinygrad"

@pytest.mark.parametrize("name, tile", [("mixtral-8x7b", 128), ("gpt-oss-20b", 64), ("deepseek-v2-lite", 32), ("glm-4.7-flash", 32)])
def test_a_moes_expert_tile_holds_the_rows_a_chunk_gives_an_expert(name: str, tile: int):
  """On a GPU that runs gemm_mma, a MoE's tile is the largest of the kernel's tile rows not above a 512-row chunk's rows an
  expert (mixtral: 512 x 2 / 8 = 128; deepseek: 48, the smallest tile below it); a dense model, or the CPU, keeps the
  default; a file's own metadata gives the same."""
  h = resolve(machine=H200, shapes=preset_shapes(name))
  assert (h.expert_tile, h.sources["expert_tile"]) == (tile, "heuristic") and f"tiles of {tile}" in h.reasons["expert_tile"]
  assert resolve(machine=H200, shapes=preset_shapes("llama3.2-1b")).sources["expert_tile"] == "default"
  assert resolve(machine=VNNI, shapes=preset_shapes(name)).expert_tile == 8
  shapes = Shapes.of(GGUFFile(synthesized("mixtral-8x7b-tiny")))
  assert (shapes.experts, shapes.experts_used) == (4, 2) and resolve(machine=H200, shapes=shapes).expert_tile == 128   # 256 rows

def test_a_tensor_core_gpu_takes_the_flash_attention_kernels_over_an_fp16_cache():
  """decode_attention and prefill_attention flash and kv_cache half where mma.sync runs; a flash kernel the rule chose
  gives way to a cache it does not read that a source above the rule made (a profile's rows, the user's float cache),
  saying why; the shipped H200 profile keeps llama's cache of heads, gemma3's rows."""
  h = resolve(machine=H200, shapes=preset_shapes("qwen3-0.6b"))
  assert (h.decode_attention, h.prefill_attention, h.kv_cache) == ("flash", "flash", "half")
  assert {h.sources[n] for n in ("decode_attention", "prefill_attention", "kv_cache")} == {"heuristic"}
  for above, why in (({"profile": {"kv_layout": "rows"}}, "kv_layout rows (profile)"),
                     ({"runtime": {"kv_cache": "float"}}, "kv_cache float (runtime)")):
    h = resolve(**above, machine=H200)
    assert h.decode_attention == h.prefill_attention == "tinygrad" and h.sources["decode_attention"] == "heuristic"
    assert h.reasons["decode_attention"].startswith("tinygrad's: flash reads an fp16 cache of heads") and why in h.reasons["prefill_attention"]
  # chosen by a source above the rule, flash stays (the runtime refuses it over such a cache)
  assert resolve({"decode_attention": "flash", "kv_layout": "rows"}, machine=H200).decode_attention == "flash"
  for m in (Machine("CUDA", compute_capability="7.5"), VNNI, None):
    h = resolve(machine=m)
    assert (h.decode_attention, h.prefill_attention, h.kv_cache) == ("tinygrad", "tinygrad", "float")
  shipped = device_profile("CUDA: NVIDIA H200", machine=H200)[0]["architectures"]
  assert shipped["llama"]["kv_layout"] == "heads" and shipped["gemma3"]["kv_layout"] == "rows"

def test_a_new_architecture_takes_the_value_of_an_old_one_of_the_same_shapes():
  """qwen3 has no entry in any profile: its split comes from its shapes alone, as llama's would at the same shapes; both
  tiny presets are split on a GPU, from their files' metadata, and neither on the CPU."""
  qwen3 = preset_shapes("qwen3-0.6b")
  llama_like = Shapes("llama", qwen3.n_heads, qwen3.kv_width)
  assert resolve(machine=H200, shapes=qwen3).split_kv == resolve(machine=H200, shapes=llama_like).split_kv
  for name in ("qwen3-0.6b-tiny", "llama3.2-1b-tiny"):
    path = synthesized(name)
    gpu, cpu = (resolve_hints(path, {}, profile=False, machine=m) for m in (H200, VNNI))
    width = Shapes.of(GGUFFile(path)).kv_width
    assert gpu.sources["split_kv"] == "heuristic" and gpu.split_kv * 64 * width == pytest.approx(SPLIT_PART_ELEMENTS, rel=0.5), name
    assert (cpu.split_kv, cpu.sources["split_kv"]) == (0, "default")

@pytest.mark.parametrize("name, arch", [("llama3.2-1b", "llama"), ("gemma3-270m", "gemma3"), ("deepseek-v2-lite", "deepseek2"),
                                        ("gpt-oss-20b", "gpt-oss")])
def test_the_rule_meets_the_tuned_split_of_each_architecture(name: str, arch: str):
  """Where the H100 profile (and the H200's, based on it) is left out, each architecture it tuned keeps its split: the
  value does not change silently, only its source, to `heuristic`."""
  tuned = load(Path(device.PROFILES) / "cuda-nvidia-h100-80gb-hbm3.yaml")["architectures"][arch]["split_kv"]
  h = resolve(machine=H200, shapes=preset_shapes(name))
  assert (h.split_kv, h.sources["split_kv"]) == (tuned, "heuristic")

def test_a_profile_of_another_cpu_kind_is_not_applied(tmp_path: Path):
  name = "CPU: Some CPU, 2 cores"
  (tmp_path / "cpu-some-cpu.yaml").write_text("device: 'CPU: Some CPU, 2 cores'\nmachine: {cpu_simd: avx2}\nhints: {norm: single}\n")
  assert device_profile(name, tmp_path, AVX2)[0]["hints"] == {"norm": "single"} and not_applied(name, tmp_path, AVX2) is None
  assert device_profile(name, tmp_path, VNNI) == (device._empty(), None)
  assert not_applied(name, tmp_path, VNNI) == "cpu-some-cpu.yaml was tuned where cpu_simd is avx2, this machine's is avx512_vnni"
  # the shipped profile of the AMD EPYC tuned without AVX-512 is not an AVX-512 EPYC's; the H200's is the H100's chip's
  assert device_profile("CPU: AMD EPYC, 2 cores", machine=VNNI)[1] is None
  assert device_profile("CPU: AMD EPYC, 2 cores", machine=AVX2)[1] is not None
  assert device_profile("CUDA: NVIDIA H200", machine=H200)[0]["machine"] == {"compute_capability": "9.0"}
  assert device_profile("CUDA: NVIDIA H200", machine=Machine("CUDA", compute_capability="8.0"))[1] is None

def test_a_bad_machine_key_is_named(tmp_path: Path):
  (bad := tmp_path / "x.yaml").write_text("device: x\nmachine: {cores: 2}\n")
  with pytest.raises(device.ProfileError, match=r"x.yaml:2: machine maps what the tune ran on to its value: cpu_simd, compute_capability"):
    load(bad)

def test_tune_keys_the_profile_it_writes_by_the_machine(tmp_path: Path):
  device.save_hints(path := tmp_path / "p.yaml", "CPU: x", {"norm": "single"}, {"model": "m", "tok_s": 1.0}, AVX2)
  assert load(path)["machine"] == {"cpu_simd": "avx2"}

def test_this_machine_is_described_by_what_decides_hints():
  from quant.int8_cpu import simd_path
  from profiles.machine import this_machine
  m = this_machine("CPU")
  assert m == Machine("CPU", cpu_simd=simd_path()) and m.on_cpu and device.machine_key(m) == ({"cpu_simd": m.cpu_simd} if m.cpu_simd else {})
  assert H200.describe() == "CUDA, compute capability 9.0, 132 multiprocessors" and not H200.on_cpu
  assert Machine("CPU").describe() == "CPU, int8 dot products: none" and Machine("METAL").describe() == "METAL"
