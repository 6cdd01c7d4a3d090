"""llama.cpp as the peer engine: prompt processing and decode speed on the same GGUF, measured as llama-bench does (pp of N
tokens from an empty context, tg after D tokens of context). On the CPU through llama-cpp-python, in a subprocess so its
threads never share a process with tinygrad's (`python -m experiments.peer_llamacpp FILE` prints one JSON line); on a GPU
through a llama-bench binary built for it (`run_llama_bench`), every layer offloaded."""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

def mean_sd(values: list[float], digits: int) -> tuple[float, float]:
  """The mean and the sample standard deviation (0 for one value) of repeats, rounded (here, free of tinygrad, for this
  module's own subprocess and for bench)."""
  return round(statistics.mean(values), digits), round(statistics.stdev(values) if len(values) > 1 else 0.0, digits)

def measure(path: str, prompt_tokens: int, tokens: int, threads: int, pp: int, repeats: int = 3) -> dict:
  """As llama-bench's pp and tg tests, `repeats` times each after a warm-up: pp tok/s of a prompt of `pp` ids from an empty
  context, and decode tok/s (the median step) after a prompt of `prompt_tokens` ids; the mean and standard deviation of
  the repeats."""
  import llama_cpp
  llm = llama_cpp.Llama(model_path=path, n_ctx=max(pp, prompt_tokens) + tokens + 8, n_batch=min(512, max(pp, 1)), n_threads=threads,
                        n_threads_batch=threads, verbose=False)
  ids = lambda n: [(7 * i + 11) % llm.n_vocab() for i in range(n)]
  llm.eval(ids(8))
  def pp_run() -> float:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids(pp))
    return pp / (time.perf_counter() - t0)
  def tg_run() -> float:
    llm.reset()
    llm.eval(ids(prompt_tokens))
    steps = []
    for _ in range(tokens):
      t0 = time.perf_counter()
      llm.eval([0])
      steps.append(time.perf_counter() - t0)
    return 1 / statistics.median(steps)
  pp_run()
  pp_ts = [pp_run() for _ in range(repeats)]
  tg_ts = [tg_run() for _ in range(repeats)]
  (tok_s, tok_s_sd), (pp_tok_s, pp_tok_s_sd) = mean_sd(tg_ts, 2), mean_sd(pp_ts, 1)
  return {"engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, {threads} threads)", "tok_s": tok_s, "tok_s_sd": tok_s_sd,
          "ms_per_token": round(1e3 / statistics.mean(tg_ts), 3), "pp_tok_s": pp_tok_s, "pp_tok_s_sd": pp_tok_s_sd, "pp_tokens": pp,
          "depth": prompt_tokens, "repeats": repeats}

def run(path: str, prompt_tokens: int, tokens: int, pp: int, threads: int = 2, repeats: int = 3) -> dict | None:
  """The peer's figures, or None (with the reason on stderr) when llama-cpp-python is not installed or fails."""
  r = subprocess.run([sys.executable, "-m", "experiments.peer_llamacpp", path, "--prompt-tokens", str(prompt_tokens), "--tokens", str(tokens),
                      "--pp", str(pp), "--threads", str(threads), "--repeats", str(repeats)], capture_output=True, text=True, timeout=1800)
  if r.returncode != 0:
    print(f"llama.cpp peer not measured: {(r.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
    return None
  return json.loads(r.stdout.strip().splitlines()[-1])

def run_llama_bench(binary: str, path: str, depths: tuple[int, ...], tokens: int, pp: int, repetitions: int = 3) -> list[dict | None]:
  """llama-bench's prompt processing of `pp` tokens from an empty context (its pp test at depth 0) and decode of `tokens`
  tokens after each of `depths` tokens of context (its tg test at each -d depth), in one run: a figure for each depth, None
  for all (reason on stderr) when it fails or leaves one out."""
  missed = [None] * len(depths)
  cmd = [binary, "-m", path, "-p", str(pp), "-n", str(tokens), "-d", ",".join(map(str, sorted({0, *depths}))), "-ngl", "99",
         "-r", str(repetitions), "-o", "json"]
  try: r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
  except OSError as e:
    print(f"llama.cpp peer not measured: {e}", file=sys.stderr)
    return missed
  if r.returncode != 0:
    print(f"llama.cpp peer not measured: {(r.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
    return missed
  tests = json.loads(r.stdout)
  pp_test = next((t for t in tests if t["n_prompt"] == pp and t["n_gen"] == 0 and t["n_depth"] == 0), None)
  tg = [next((t for t in tests if t["n_gen"] == tokens and t["n_prompt"] == 0 and t["n_depth"] == d), None) for d in depths]
  if pp_test is None or None in tg:
    print(f"llama.cpp peer not measured: llama-bench printed no pp{pp} at depth 0 or no tg{tokens} at a depth of "
          f"{','.join(map(str, depths))}", file=sys.stderr)
    return missed
  return [{"engine": f"llama.cpp (llama-bench {t['build_commit']}, {t['backends']}, {t['gpu_info']}, all layers offloaded)",
           "tok_s": round(t["avg_ts"], 2), "tok_s_sd": round(t["stddev_ts"], 2), "ms_per_token": round(1e3 / t["avg_ts"], 3),
           "depth": t["n_depth"], "tokens": t["n_gen"], "pp_tok_s": round(pp_test["avg_ts"], 1),
           "pp_tok_s_sd": round(pp_test["stddev_ts"], 1), "pp_tokens": pp, "repeats": repetitions} for t in tg]

NCU_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}   # ncu versions name units either way

def ncu_us(row: dict) -> float:
  """The time in one row of ncu's CSV, in us."""
  return float(row["Metric Value"].replace(",", "")) * NCU_US[row["Metric Unit"]]

def kernel_name(demangled: str) -> str:
  """A demangled CUDA kernel name without its return type and parameters, template arguments kept."""
  name, depth = demangled.removeprefix("void "), 0
  for i, c in enumerate(name):
    depth += (c == "<") - (c == ">")
    if c == "(" and depth == 0: return name[:i]
  return name

def ncu_llama_bench(binary: str, path: str, prompt_tokens: int, tokens: int, skip: int = 300, count: int = 1500, ncu: str = "ncu") -> list[dict]:
  """llama-bench's decode kernels timed one by one by Nsight Compute inside its CUDA graphs, as `tinyzoo profile --ncu`
  times tinygrad's (clocks and caches left as they are): `count` kernels after the first `skip` (most of the warmup's; a
  prompt's own kernels, such as mul_mat_q, keep lines of their own), grouped by kernel, launch size and mode (`modes`),
  each group's median time and its launches. Raises RuntimeError if ncu fails."""
  with tempfile.TemporaryDirectory() as tmp:
    log = os.path.join(tmp, "ncu.csv")
    cmd = [ncu, "--graph-profiling", "node", "--metrics", "gpu__time_duration.sum", "--clock-control", "none", "--cache-control", "none",
           "--launch-skip", str(skip), "--launch-count", str(count), "--csv", "--log-file", log,
           binary, "-m", path, "-p", "0", "-n", str(tokens), "-d", str(prompt_tokens), "-ngl", "99", "-r", "1"]
    try: r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except FileNotFoundError: raise RuntimeError(f"profiling llama-bench needs Nsight Compute's {ncu!r} on the PATH") from None
    if r.returncode != 0: raise RuntimeError(f"ncu failed: {(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    with open(log) as f: lines = [l for l in f if l.startswith('"')]
  groups: dict[tuple, list[float]] = {}
  for row in csv.DictReader(lines):
    if row["Metric Name"] != "gpu__time_duration.sum": continue
    groups.setdefault((kernel_name(row["Kernel Name"]), row["Grid Size"], row["Block Size"]), []).append(ncu_us(row))
  return sorted(({"kernel": n, "grid": g, "block": b, "launches": len(us), "median_us": round(statistics.median(us), 2),
                  "total_us": round(sum(us), 1)} for (n, g, b), times in groups.items() for us in modes(times)), key=lambda k: -k["total_us"])

def modes(times: list[float], gap: float = 1.3) -> list[list[float]]:
  """Times split where the next slower one is `gap` times slower: one kernel and launch size can serve weights of
  different sizes (llama.cpp's 2048-row matvec is both attention output and FFN down for Llama-3.2-1B)."""
  ordered = sorted(times)
  split = [[ordered[0]]]
  for before, t in zip(ordered, ordered[1:]):
    if t > gap * before: split.append([])
    split[-1].append(t)
  return split

if __name__ == "__main__":
  p = argparse.ArgumentParser(description="Prompt processing and decode speed of llama.cpp on a GGUF file (a --pp prompt from an "
                                          "empty context; the median of single-token steps after --prompt-tokens); "
                                          "with --ncu-llama-bench, its GPU decode's kernels timed by Nsight Compute instead.")
  p.add_argument("path")
  p.add_argument("--prompt-tokens", type=int, default=32)
  p.add_argument("--tokens", type=int, default=64)
  p.add_argument("--pp", type=int, default=512, help="prompt tokens of the timed prompt processing (default 512)")
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--repeats", type=int, default=3, help="timed runs of each test: their mean and sd (default 3)")
  p.add_argument("--ncu-llama-bench", metavar="BINARY", help="time this llama-bench's decode kernels under ncu: one line a kernel and launch size")
  a = p.parse_args()
  if a.ncu_llama_bench:
    try: rows = ncu_llama_bench(a.ncu_llama_bench, a.path, a.prompt_tokens, a.tokens)
    except RuntimeError as e: sys.exit(str(e))
    print(f"{'total us':>9} {'median us':>9} {'launches':>8} {'grid':>14} {'block':>12}  kernel")
    for k in rows: print(f"{k['total_us']:>9.1f} {k['median_us']:>9.2f} {k['launches']:>8} {k['grid']:>14} {k['block']:>12}  {k['kernel']}")
    sys.exit(0)
  try: import llama_cpp  # noqa: F401
  except ImportError: sys.exit("llama-cpp-python is not installed (make reference)")
  print(json.dumps(measure(a.path, a.prompt_tokens, a.tokens, a.threads, a.pp, a.repeats)))
