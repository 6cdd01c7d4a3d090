"""Peer engine: tinygrad's own LLM app (tinygrad.llm) from a tinygrad source tree, measured in JIT steady state.

The tree's model code runs in a subprocess with only that tree on the import path (python -S, PYTHONPATH=--src), so it never
mixes with the tinygrad installed here; this module imports nothing from tinygrad. The small driver in DRIVER is ours: it loads
the GGUF with the tree's Transformer.from_gguf, warms up (model.warmup() compiles and captures both JITs), prefills a prompt,
decodes --warmup tokens, then times --tokens decode steps of the app's own generate() loop (each step ends in .item(), so it
is synchronized). kernels_per_token counts the programs in the decode JIT's captured list, looking inside graph batches;
kernels_counted is GlobalCounters.kernel_count per step (one more than the captured list: a COPY that runs outside the JIT
each step, around the fed-back token). cpu_util is process CPU time over wall time while timing: this tree's CPU backend runs
its kernels on the calling thread (core_id lanes in a loop), so ~1.0 means one whole core; it does not show a busy sibling.

  python -m experiments.peer_tinygrad --src /work/peers/tinygrad MODEL.gguf
prints one JSON line: {"engine": "tinygrad.llm@<commit>", "tok_s": ..., "kernels_per_token": ..., "ms_per_token": ...}
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

DRIVER = r"""
import sys, time, json, statistics
src, gguf, ctx, prompt_len, warm, n = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
import tinygrad
assert tinygrad.__file__.startswith(src), f"imported tinygrad from {tinygrad.__file__}, not from {src}"
from tinygrad import Device
from tinygrad.uop.ops import Ops
from tinygrad.helpers import GlobalCounters
from tinygrad.llm.model import Transformer

def count_programs(linear):
  n = 0
  for call in linear.src:
    fn = call.src[0]
    if fn.op is Ops.PROGRAM: n += 1
    elif fn.op is Ops.CUSTOM_FUNCTION and fn.arg == "graph": n += count_programs(fn.src[0])
    elif fn.op is Ops.CUSTOM_FUNCTION and fn.arg == "hcq":  # HCQ2=1: the batch's finalizer lists its kernels
      n += sum(1 for _, k, _ in getattr(call.arg.aux, "kernels", ()) if k.src[0].src[0].op is Ops.PROGRAM)
  return n

model, _ = Transformer.from_gguf(gguf, ctx)
model.warmup()
gen = model.generate([257] + [1000 + i % 1000 for i in range(prompt_len - 1)])
next(gen)  # prefill
for _ in range(warm): next(gen)
cap = model.rollout_jit.captured
assert cap is not None, "decode JIT did not capture"
kernels = count_programs(cap._linear)
kc0, times, cpu0, wall0 = GlobalCounters.kernel_count, [], time.process_time(), time.perf_counter()
for _ in range(n):
  t0 = time.perf_counter()
  next(gen)
  times.append(time.perf_counter() - t0)
counted = (GlobalCounters.kernel_count - kc0) / n
cpu_util = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
ms = statistics.median(times) * 1e3
print(json.dumps({"tok_s": round(1e3 / ms, 3), "kernels_per_token": kernels, "ms_per_token": round(ms, 3),
                  "tok_s_mean": round(n / sum(times), 3), "kernels_counted": counted,
                  "cpu_util": round(cpu_util, 2), "device": Device.DEFAULT}))
"""

def commit_of(src: pathlib.Path) -> str:
  if (f := src / "COMMIT").is_file(): return f.read_text().strip()[:10]
  try: return subprocess.run(["git", "-C", str(src), "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
  except (subprocess.CalledProcessError, FileNotFoundError): return "unknown"

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("model", type=pathlib.Path, help="GGUF file")
  ap.add_argument("--src", type=pathlib.Path, required=True, help="tinygrad source tree holding tinygrad/llm/model.py")
  ap.add_argument("--python", default=sys.executable, help="interpreter for the subprocess, run with -S (default: this one)")
  ap.add_argument("--dev", default="CPU", help="DEV for the subprocess (default: %(default)s)")
  ap.add_argument("--max-context", type=int, default=1024, help="KV cache length (default: %(default)s)")
  ap.add_argument("--prompt", type=int, default=32, help="prompt tokens prefilled before decoding (default: %(default)s)")
  ap.add_argument("--warmup", type=int, default=4, help="decode steps run before timing (default: %(default)s)")
  ap.add_argument("--tokens", type=int, default=32, help="decode steps timed; ms_per_token is their median (default: %(default)s)")
  args = ap.parse_args()
  src = args.src.resolve()
  if not (src / "tinygrad" / "llm" / "model.py").is_file(): sys.exit(f"peer_tinygrad: no tinygrad/llm/model.py under {src}")
  if not args.model.is_file(): sys.exit(f"peer_tinygrad: no such GGUF file: {args.model}")
  if args.prompt + args.warmup + args.tokens + 1 > args.max_context: sys.exit("peer_tinygrad: prompt+warmup+tokens exceed --max-context")
  # the tree's compile cache stays in the tree, apart from the installed tinygrad's
  env = {"CACHEDB": str(src / ".peer_cache.db"), **os.environ, "PYTHONPATH": str(src), "DEV": args.dev}
  cmd = [args.python, "-S", "-c", DRIVER, str(src), str(args.model.resolve()), *map(str, (args.max_context, args.prompt, args.warmup, args.tokens))]
  p = subprocess.run(cmd, env=env, cwd=src, stdout=subprocess.PIPE, text=True)
  if p.returncode != 0: sys.exit(f"peer_tinygrad: subprocess failed with exit code {p.returncode} (its stderr is above)")
  res = json.loads(p.stdout.strip().splitlines()[-1])
  print(json.dumps({"engine": f"tinygrad.llm@{commit_of(src)}", **res}))
  return 0

if __name__ == "__main__": sys.exit(main())
