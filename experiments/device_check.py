"""Outputs on an accelerator against the CPU path, before anything is timed there. The lent GPU machines have no
compiler tinygrad's CPU backend can use, so the CPU side runs where one is: `--save` runs fresh random prompts through
synthetic presets on the CPU and writes their last-position logits and greedy tokens; `--against` runs the same
prompts on the accelerator (the presets are seeded, so the files are the same bytes there: their sha256 is checked)
and compares: logits within a relative error, argmax and greedy tokens identical, decode fed the reference's tokens
keeping to them, decode replayed as graphs.
  here:  python -m experiments.device_check --save ref.json llama3.2-1b-tiny gemma3-270m-tiny
  there: python -m experiments.device_check --against ref.json      (exits 1 on a mismatch)"""
import argparse
import json
import random
import sys
from pathlib import Path
import numpy as np
from tinygrad import Device
from ops.cache import write_whole
from ops.kernels import replay_kernels
from models.catalog import resolve_model
from quant.files import file_sha256
from models.runtime import Runtime
from profiles.device import device_profile, tuned_sizes
from profiles.hints import add_flags, given, resolve
from ops.sampling import Sampler, SamplerParams

LOGITS_RTOL = 1e-3   # float32 on both sides: only the order of the sums differs
# a prompt through fp16 GEMMs (the `half` prefill) rounds every matmul's inputs to half: the prompt's logits move within
# tests/models/test_prefill.py's half tolerance, and greedy tokens after it may part at a near tie, so only the argmax is held
HALF_PREFILL_RTOL = 3e-2

def graph_batches(rt: Runtime) -> int:
  """Graph launches one captured decode step makes (0 on backends without graphs)."""
  assert rt._decode.captured is not None
  return len({k.batch for k in replay_kernels(rt._decode.captured.linear) if k.batch is not None})

def position_dependent(rt: Runtime) -> tuple[int, int]:
  """Kernels of the decode step whose launch sizes depend on a variable, and how many of those are 0 with the variables at 0
  (what tinygrad's CUDA graph builds them with: ops/cuda_graph.py)."""
  assert rt._decode.captured is not None
  progs = [p.arg for p in (k.program for k in replay_kernels(rt._decode.captured.linear)) if p is not None]
  symbolic = [p for p in progs if not all(isinstance(d, int) for d in (*p.global_size, *(p.local_size or ())))]
  zero = [p for p in symbolic if 0 in (d for dims in p.launch_dims({v.expr: 0 for v in p.vars}) if dims for d in dims)]
  return len(symbolic), len(zero)

def run(rt: Runtime, ids: list[int], greedy: int) -> tuple[np.ndarray, list[int]]:
  logits = rt.prefill(ids)
  return logits.numpy()[0].astype(np.float64), list(rt.continue_from(logits, len(ids), greedy, Sampler(SamplerParams(temperature=0))))

def forced(rt: Runtime, ids: list[int], tokens: list[int], rtol: float) -> int:
  """Decode steps fed the reference's greedy tokens after the prompt (the CPU's inputs, where the device's own tokens may
  part from them at a near tie): how many leave the reference's next token below their maximum by more than `rtol` of
  the logits' RMS, twice (the most rounding moves a logit where it moves the whole vector by `rtol`). A decode step that
  reads the wrong cache positions fails here whatever the prompt's rounding."""
  rt.prefill(ids)
  wrong = 0
  for i, (token, following) in enumerate(zip(tokens, tokens[1:])):
    lg = rt.decode(token, len(ids) + i).numpy()[0].astype(np.float64)
    wrong += lg[following] < lg.max() - 2 * rtol * np.sqrt(np.mean(lg ** 2))
  return wrong

def runtime(preset: str, ctx: int, device: str, hints: dict) -> tuple[Runtime, str]:
  """The preset's runtime with these kernel hints over the built-in ones, and the device profile's GPU matvec sizes."""
  path = resolve_model(preset)
  return Runtime(path, resolve(hints, matvec_sizes=tuned_sizes(device_profile()[0])), ctx, device), file_sha256(path)

def save(presets: list[str], out: str, prompts: int, prompt_len: int, greedy: int, hints: dict | None = None) -> None:
  """Writes the CPU's logits and greedy tokens for fresh random prompts through the presets, with `hints` (the strategy
  above all: int8_dot rounds activations its own way and needs a reference of its own)."""
  seed, strategy = random.SystemRandom().randrange(1 << 31), resolve(hints).strategy
  rng, cases = random.Random(seed), []
  for preset in presets:
    rt, sha = runtime(preset, prompt_len + greedy + 1, "CPU", hints or {})
    for _ in range(prompts):
      ids = [rng.randrange(rt.cfg.vocab_size) for _ in range(prompt_len)]
      logits, tokens = run(rt, ids, greedy)
      cases.append({"preset": preset, "sha256": sha, "ids": ids, "logits": logits.tolist(), "greedy": tokens})
  write_whole(Path(out), json.dumps({"seed": seed, "device": "CPU", "strategy": strategy, "cases": cases}))
  print(f"wrote {len(cases)} CPU cases ({strategy}, prompt seed {seed}) to {out}")

def against(ref_path: str, device: str, hints: dict | None = None) -> tuple[bool, int]:
  """Whether every case of the reference matches on `device` with `hints`, and the programmatic edges its graphs were
  built with."""
  with open(ref_path) as f: ref = json.load(f)
  ok, runtimes = True, {}
  for case in ref["cases"]:
    if case["preset"] not in runtimes:
      runtimes[case["preset"]] = runtime(case["preset"], len(case["ids"]) + len(case["greedy"]) + 1, device, hints or {})
    rt, sha = runtimes[case["preset"]]
    if sha != case["sha256"]:
      raise SystemExit(f"{case['preset']}: the file made here differs from the reference's (sha256 {sha[:12]} against {case['sha256'][:12]})")
    want = np.array(case["logits"])
    got, tokens = run(rt, case["ids"], len(case["greedy"]))
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    half = rt.hints.prefill == "half"
    rtol = HALF_PREFILL_RTOL if half else LOGITS_RTOL
    off = forced(rt, case["ids"], case["greedy"], rtol)
    good = rel < rtol and int(got.argmax()) == int(want.argmax()) and (half or tokens == case["greedy"]) and not off
    ok &= good
    greedy = "identical" if tokens == case["greedy"] else f"{tokens} against {case['greedy']}"
    print(f"{case['preset']} on {device} ({', '.join(f'{n} {v}' for n, v in (hints or {}).items()) or 'built-in hints'}, prefill "
          f"{rt.hints.prefill} in chunks of {rt.chunk}) against CPU: "
          f"logits rel err {rel:.2e}, "
          f"argmax {int(got.argmax())}/{int(want.argmax())}, greedy "
          f"{greedy}, fed its tokens {len(case['greedy']) - 1 - off}/{len(case['greedy']) - 1} steps within tolerance, {graph_batches(rt)} graph launches per "
          "decode step, position-dependent launch sizes in %d kernels (%d of them 0 at position 0): " % position_dependent(rt)
          + ("ok" if good else "MISMATCH"), flush=True)
  return ok, sum(rt.kernels.edges[0] for rt, _ in runtimes.values())

def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("presets", nargs="*", help="synthetic presets to save references of")
  mode = p.add_mutually_exclusive_group(required=True)
  mode.add_argument("--save", metavar="FILE", help="run the presets on the CPU and write the reference")
  mode.add_argument("--against", metavar="FILE", help="run a reference's cases on --device and compare")
  p.add_argument("--device", default=Device.DEFAULT, help="the device checked (default: tinygrad's default)")
  add_flags(p)
  p.add_argument("--prompts", type=int, default=2, help="random prompts per preset (default 2)")
  p.add_argument("--prompt-len", type=int, default=40, help="tokens per prompt: past 32 the prefill JIT runs too (default 40)")
  p.add_argument("--greedy", type=int, default=8, help="greedy tokens compared; the decode JIT replays from the third (default 8)")
  a = p.parse_args()
  if a.save:
    if not a.presets: p.error("--save needs presets")
    save(a.presets, a.save, a.prompts, a.prompt_len, a.greedy, given(a))
  else:
    ok, edges = against(a.against, a.device, given(a))
    if a.pdl:   # a check of kernels chained by programmatic launch that made none is no check of it
      print(f"programmatic edges built: {edges}" + ("" if edges else " (PDL NOT IN EFFECT)"))
      ok &= edges > 0
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
  main()
