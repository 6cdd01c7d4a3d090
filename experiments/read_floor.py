"""The floor under a matvec on a CUDA GPU: experiments/read_floor.cu (built here with nvcc) reads one weight's bytes per
kernel, as fast as any of its launch sizes manages, in a chain of dependent kernels in one CUDA graph, beside a large
copy in the same run. A gemv cannot read its weight faster than that kernel does, which only reads, in a chain whose
kernels each wait for the one before to end. Chained by programmatic dependent launch (Hopper's PDL), a kernel's launch
and start overlap the tail of the one before (`_overlapped`), and its weight can stream into the L2 then too
(`_prefetched`): the read and the matvecs are timed that way as well.
  python -m experiments.read_floor --type Q4_0 --shape 8192x2048     (one journal record)"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from experiments import journal
from experiments.matvec import GEMV_TOLERANCE, default_copies

SOURCE = Path(__file__).with_name("read_floor.cu")
# how read_floor.cu chains a kernel after the one before (the suffix of its kinds)
CHAINS = {"": "", "_overlapped": ", PDL", "_prefetched": ", PDL + L2 prefetch"}
# the hand-written Q4_0 matvecs of read_floor.cu, each timed over its launch sizes (the first three chained each way too)
_DESIGNS = {"matvec": "float x, rows a warp, words a lane", "matvec_staged": "x staged in shared memory, a thread a block",
            "matvec_dp4a": "x quantized to 8 bits, dp4a (llama.cpp's way; x's quantization not timed)"}
MATVEC_DESIGNS = {**{kind + chain: what + how for kind, what in _DESIGNS.items() for chain, how in CHAINS.items()},
                  "matvec_without_x": "float x's design without x's loads (not a matvec)",
                  "matvec_rows": "a warp a row at a time, x in registers"}

def read_floor(ggml_type: str, rows: int, cols: int, iters: int = 20) -> tuple[dict, list[dict]]:
  """One journal record: the fastest read of a [rows, cols] weight's bytes (us a kernel, GB/s) and its launch size,
  against the copy of the same run, chained each way (and for Q4_0 each hand-written matvec design's fastest); and every
  launch size's result. Raises RuntimeError where nvcc or the run fails, or a matvec is wrong."""
  if ggml_type not in GGMLQuantizationType.__members__: raise ValueError(f"unknown GGML type {ggml_type!r}")
  t = GGMLQuantizationType[ggml_type]
  nbytes, copies = math.prod(gguf_quants.quant_shape_to_byte_shape((rows, cols), t)), default_copies(t, rows, cols)
  with tempfile.TemporaryDirectory() as tmp:
    binary = os.path.join(tmp, "read_floor")
    try: built = subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-o", binary, str(SOURCE)], capture_output=True, text=True)
    except FileNotFoundError: raise RuntimeError("the read floor needs CUDA's nvcc on the PATH") from None
    if built.returncode != 0: raise RuntimeError(f"nvcc failed: {(built.stderr.strip().splitlines() or ['no output'])[-1]}")
    # the hand-written matvec is for Q4_0, on rows a multiple of 64 (up to 4 rows a warp and 16 warps a workgroup)
    shape = [str(rows), str(cols)] if t is GGMLQuantizationType.Q4_0 and rows % 64 == 0 else []
    ran = subprocess.run([binary, str(nbytes), str(copies), str(iters), *shape], capture_output=True, text=True, timeout=1800)
  if ran.returncode != 0: raise RuntimeError(f"read_floor failed: {(ran.stderr.strip().splitlines() or ['no output'])[-1]}")
  lines = [json.loads(line) for line in ran.stdout.splitlines()]
  reads, (copy,) = [r for r in lines if r["kind"] == "read"], [r for r in lines if r["kind"] == "copy"]
  fastest_read = lambda kind: max((r for r in lines if r["kind"] == kind), key=lambda r: r["gb_s"], default=None)
  launch = lambda r: f"{r['blocks']}x{r['threads']} unroll {r['unroll']}"
  best = fastest_read("read")
  metrics = {"bytes": nbytes, "copies": copies, "launch_sizes": len(reads), "us": best["us"], "gb_s": best["gb_s"],
             "copy_gb_s": copy["gb_s"], "fraction_of_copy": round(best["gb_s"] / copy["gb_s"], 3)}
  switches = {"launch": launch(best)}
  for chain in list(CHAINS)[1:]:
    if (fastest := fastest_read("read" + chain)):
      metrics[f"read{chain}_us"], metrics[f"read{chain}_fraction_of_copy"] = fastest["us"], round(fastest["gb_s"] / copy["gb_s"], 3)
      switches["launch" + chain] = launch(fastest)
  matvecs = [r for r in lines if r["kind"] in MATVEC_DESIGNS]
  if (wrong := [r for r in matvecs if r["kind"] != "matvec_without_x" and r["rel_err"] > GEMV_TOLERANCE]):
    raise RuntimeError(f"a CUDA matvec is wrong: {wrong[0]}")
  for kind in dict.fromkeys(r["kind"] for r in matvecs):   # each design's fastest launch size
    fastest = min((r for r in matvecs if r["kind"] == kind), key=lambda r: r["us"])
    metrics[f"{kind}_us"] = fastest["us"]
    metrics[f"{kind}_fraction_of_copy"] = round(nbytes / fastest["us"] / 1e3 / copy["gb_s"], 3)
    switches[kind] = ", ".join(f"{k} {v}" for k, v in fastest.items() if k not in ("kind", "us", "rel_err"))
  return {**journal.context(), "model": f"read {ggml_type} {rows}x{cols}", "kind": "read_floor", "switches": switches, "metrics": metrics}, lines

def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--type", default="Q4_0", help="GGML type of the weight whose bytes are read (default Q4_0)")
  p.add_argument("--shape", default="8192x2048", help="ROWSxCOLS of that weight (default 8192x2048)")
  p.add_argument("--iters", type=int, default=20, help="timed graph replays per launch size")
  a = p.parse_args()
  try:
    rows, cols = (int(v) for v in a.shape.lower().split("x"))
    record, runs = read_floor(a.type, rows, cols, a.iters)
  except (ValueError, RuntimeError) as e: sys.exit(f"read_floor: {e}")
  journal.append(record)
  m = record["metrics"]
  print(f"read floor {a.type} {a.shape}: {m['bytes'] / 1e6:.2f} MB a kernel in {m['us']:.2f} us ({m['gb_s']:.1f} GB/s, "
        f"{m['fraction_of_copy']:.0%} of a copy's {m['copy_gb_s']:.1f} GB/s), best of {m['launch_sizes']} launch sizes: "
        f"{record['switches']['launch']} ({record['device']})")
  for chain, how in list(CHAINS.items())[1:]:
    if f"read{chain}_us" in m:
      print(f"  {m[f'read{chain}_us']:6.2f} us ({m[f'read{chain}_fraction_of_copy']:.0%} of the copy)  the read{how}: "
            f"{record['switches']['launch' + chain]}")
  for kind, what in MATVEC_DESIGNS.items():
    if f"{kind}_us" in m:
      print(f"  {m[f'{kind}_us']:6.2f} us ({m[f'{kind}_fraction_of_copy']:.0%} of the copy)  {what}: {record['switches'][kind]}")

if __name__ == "__main__":
  main()
