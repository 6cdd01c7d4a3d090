"""Outputs on an accelerator against the CPU path, before anything is timed there: the same synthetic file on both,
fresh random prompts, last-position logits within a relative error, greedy tokens identical, and the decode step
replayed as graphs where the backend has them.
`python -m experiments.device_check PRESET... [--device CUDA]` prints one line per prompt and exits 1 on a mismatch."""
import argparse
import random
import sys
import numpy as np
from tinygrad import Device
from experiments.kernels import replay_kernels
from models.catalog import resolve_model
from models.runtime import Runtime
from ops.sampling import Sampler, SamplerParams

LOGITS_RTOL = 1e-3   # float32 on both sides: only the order of the sums differs

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

def check(preset: str, device: str, prompts: int, prompt_len: int, greedy: int, rng: random.Random) -> bool:
  path, ok = resolve_model(preset), True
  ctx = prompt_len + greedy + 1
  cpu, dev = Runtime(path, ctx, device="CPU", progress=False), Runtime(path, ctx, device=device, progress=False)
  for _ in range(prompts):
    ids = [rng.randrange(cpu.cfg.vocab_size) for _ in range(prompt_len)]
    (want, want_tokens), (got, got_tokens) = run(cpu, ids, greedy), run(dev, ids, greedy)
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    good = rel < LOGITS_RTOL and int(got.argmax()) == int(want.argmax()) and got_tokens == want_tokens
    ok &= good
    print(f"{preset} on {device}: logits rel err {rel:.2e}, argmax {int(got.argmax())}/{int(want.argmax())}, greedy "
          f"{'identical' if got_tokens == want_tokens else f'{got_tokens} against {want_tokens}'}, "
          f"{graph_batches(dev)} graph launches per decode step, position-dependent launch sizes in %d kernels (%d of them 0 at position 0): "
          f"{'ok' if good else 'MISMATCH'}" % position_dependent(dev), flush=True)
  return ok

def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("presets", nargs="+", help="synthetic presets (or GGUF files) to check")
  p.add_argument("--device", default=Device.DEFAULT, help="the device checked against the CPU (default: tinygrad's default)")
  p.add_argument("--prompts", type=int, default=2, help="random prompts per preset (default 2)")
  p.add_argument("--prompt-len", type=int, default=40, help="tokens per prompt: past 32 the prefill JIT runs too (default 40)")
  p.add_argument("--greedy", type=int, default=8, help="greedy tokens compared; the decode JIT replays from the third (default 8)")
  p.add_argument("--seed", type=int, default=None, help="prompt seed (default: fresh, printed)")
  a = p.parse_args()
  seed = random.SystemRandom().randrange(1 << 31) if a.seed is None else a.seed
  print(f"prompt seed {seed}", flush=True)
  rng = random.Random(seed)
  results = [check(name, a.device, a.prompts, a.prompt_len, a.greedy, rng) for name in a.presets]
  sys.exit(0 if all(results) else 1)

if __name__ == "__main__":
  main()
