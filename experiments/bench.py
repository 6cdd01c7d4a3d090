"""`tinyzoo bench`: decode in JIT steady state after each of --depth tokens of context (as llama-bench's tg test at its
-d depths), with kernels per token, ms per token, bytes read against the memory floor, capture and compile time and the
start of a run whose JITs all come from the cache (cached_start_s: weights loaded to first token); prompt
processing of --pp tokens from an empty context, its prefill JIT captured first (as llama-bench's pp test); and llama.cpp
measured in the same run when it is installed. Each speed is timed `repeats` times (llama-bench's -r), recorded as the mean
and standard deviation of the repeats. One record per depth, all from one load and one capture."""
import dataclasses
import json
import os
import statistics
from collections import Counter
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from tinygrad import Device, Tensor, TinyJit, dtypes
from tinygrad.device import Buffer
from experiments import journal, peer_llamacpp
from experiments.peer_llamacpp import mean_sd
from ops.kernels import CATEGORIES, replay_kernels, topk_kernels
from experiments.quality import Probe
from experiments.profile import attribute, buffer_labels, decode_rows, findings, weights_read
from experiments.steady import back_to_back_ms, queued_steps
from quant.files import file_sha256
from models.deepseek2 import prefill_form
from models.jit_cache import JitStore
from models.moe import MoE
from models.runtime import ALL_JITS, Runtime, Timing
from ops import patches
from ops.topk import topk_by_name
from profiles.hints import Hints, resolve
from quant.requant import requantized_copy
from ops.sampling import Sampler, SamplerParams

@dataclass(frozen=True)
class BenchConfig:
  hints: Hints = field(default_factory=resolve)   # the kernel hints the model is built with (profiles/hints.py), each with its source
  depths: tuple[int, ...] = (32,)  # the context before the timed decode (llama-bench's -d): a record each
  tokens: int = 64
  pp: int = 512                    # the prompt of the timed prompt processing
  warmup: int = 4
  repeats: int = 3                 # timed runs of decode at each depth and of prompt processing (llama-bench's -r): mean and sd
  ctx: int | None = None
  requant: str | None = None        # measure a copy of the model requantized to this GGML type (e.g. Q4_0, Q4_K)
  bandwidth: float | None = None   # GB/s; measured when None
  peer: bool = True
  llama_bench: str | None = None   # a llama-bench binary measured as the peer instead of llama-cpp-python (a GPU build)
  tinygrad_src: str | None = None  # a tinygrad source tree whose own LLM app is measured too
  kept_programs: bool = False      # take compiled programs from the cache directory (compile_s then times taking them)

  def switches(self) -> dict:
    """What a record says was switched: every hint's value, and the requantized copy measured."""
    return {**{n: h["value"] for n, h in self.hints.as_dict().items()}, "requant": self.requant}

  def describe(self) -> str: return changed_switches(self.switches())

  def with_switches(self, **switches) -> "BenchConfig":
    """This config with an experiment's switches: hints set at run time, `requant` as given."""
    requant = switches.pop("requant", self.requant)
    return dataclasses.replace(self, hints=self.hints.with_runtime(**switches), requant=requant)

  def model_file(self, path: Path) -> Path: return requantized_copy(path, self.requant) if self.requant else path

  @property
  def depth(self) -> int:
    """The one depth of a config that measures one (profile, tune)."""
    if len(self.depths) != 1: raise ValueError(f"one depth is measured here, not {len(self.depths)} ({','.join(map(str, self.depths))})")
    return self.depths[0]

  def runtime(self, path: Path, min_context: int) -> Runtime:
    """The model's runtime, which compiles every kernel itself (compile_s is a compile's time) unless told to take
    compiled programs from the cache directory, where a run compiled them before."""
    return Runtime(path, self.hints, self.ctx or min_context, keep_programs=self.kept_programs)

def changed_switches(switches: dict) -> str:
  """The switches of a record that differ from the built-in defaults, or 'default switches'."""
  default = BenchConfig().switches()
  changed = {k: v for k, v in switches.items() if v is not None and v != default.get(k)}
  return ", ".join(f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in changed.items()) or "default switches"

def prompt_ids(rt: Runtime, n: int) -> list[int]:
  """A fixed prompt of n token ids, spread over the vocabulary."""
  return [(7 * i + 11) % rt.cfg.vocab_size for i in range(n)]

def copy_bandwidth(device: str | None = None) -> float:
  """GB/s (bytes read plus bytes written) of a large copy on the device, the faster of tinygrad's elementwise kernel in JIT
  steady state and the driver's own device-to-device copy, each repeated back to back. 1 GiB off the CPU, so that the
  host's time to issue a copy stays small beside the copy itself (a 256 MiB one read well under a GPU's rate)."""
  mib = 256 if Device.canonicalize(device).split(":")[0] == "CPU" else 1024
  src = Tensor.ones(mib << 18, dtype=dtypes.float32, device=device).contiguous().realize()
  jit = TinyJit(lambda x: (x + 1).realize())
  for _ in range(3): jit(src)
  dest = Buffer(src.device, src.numel(), src.dtype).ensure_allocated().copy_from(src.uop.buffer)
  kernel_ms = back_to_back_ms(lambda: jit(src), src.device, 10)
  driver_ms = back_to_back_ms(lambda: dest.copy_from(src.uop.buffer), src.device, 10)
  return 2 * src.nbytes() / min(kernel_ms, driver_ms) / 1e6

def timed_prefill(rt: Runtime, ids: list[int]) -> tuple[float, Tensor]:
  """Seconds to prefill `ids` in chunks (the prefill JIT, however short) until the device is done, and the logits."""
  t0 = time.perf_counter()
  logits = rt.prefill_chunks(ids).realize()
  Device[logits.device].synchronize()
  return time.perf_counter() - t0, logits

def prompt_length(depth: int) -> int:
  """The prompt before the timed decode at `depth`: depth tokens, and at depth 0 the one token decode starts from (llama-bench's
  tg at depth 0 decodes from an empty context, its first token at position 0)."""
  return max(depth, 1)

def bench(path: Path, name: str, cfg: BenchConfig, quality: Probe | None = None, profile: int | None = None) -> list[dict]:
  """A record for each of cfg.depths, in order; with `quality`, each carries the perplexity (and divergence from the
  probe's base) that it measured on the same runtime; with `profile` (replays), the findings of its depth's decode step
  profiled kernel by kernel there (experiments/profile.py)."""
  path = cfg.model_file(path)
  if not cfg.depths or min(cfg.depths) < 0: raise ValueError(f"depths must be whole numbers >= 0, got {list(cfg.depths)}")
  if cfg.repeats < 1: raise ValueError(f"repeats must be at least 1, got {cfg.repeats}")
  # the peers first, with the device to themselves: beside this process's copy of Mixtral, llama.cpp could not load its own
  peers = peers_by_depth(path, cfg)
  patches.install()
  patches.forget_compiled()   # kernels an earlier run in this process compiled would make compile_s no compile
  t0 = time.perf_counter()
  rt = cfg.runtime(path, max(cfg.pp, prompt_length(max(cfg.depths)) + cfg.warmup + max(cfg.tokens, profile or 0) + 8, quality.ctx if quality else 0))
  load_s = time.perf_counter() - t0
  rt.check_fits(cfg.pp)
  for depth in cfg.depths: rt.check_fits(prompt_length(depth), cfg.warmup + cfg.tokens + 2)
  # prompt processing in JIT steady state: a one-chunk prompt compiles and captures the prefill JIT, apart
  compiled = rt.kernels.compile_s[0]
  prefill_first_s, _ = timed_prefill(rt, [11])
  prefill_compile_s = rt.kernels.compile_s[0] - compiled
  timed_prefill(rt, prompt_ids(rt, cfg.pp))   # a prompt of that length once untimed, as llama-bench's warm-up run
  pp_tok_s, pp_tok_s_sd = mean_sd([cfg.pp / timed_prefill(rt, prompt_ids(rt, cfg.pp))[0] for _ in range(cfg.repeats)], 1)
  shared = {"pp_tok_s": pp_tok_s, "pp_tok_s_sd": pp_tok_s_sd, "repeats": cfg.repeats, "pp_tokens": cfg.pp, "prefill_chunk": rt.chunk,
            "prefill_compile_s": round(prefill_compile_s, 2), "prefill_capture_s": round(prefill_first_s - prefill_compile_s, 2),
            "load_s": round(load_s, 2)}
  bandwidth = cfg.bandwidth or copy_bandwidth(rt.device)
  records = [decode_record(rt, path, name, cfg, depth, shared, bandwidth) for depth in cfg.depths]
  start = cached_start(rt)
  for record in records: record["metrics"]["cached_start_s"] = start
  for record in records if profile else ():
    rows, _, _, step_ms = decode_rows(rt, record["metrics"]["depth"], cfg.warmup, profile)
    record["profile"] = findings(rows, step_ms)
  if quality is not None:
    measured = quality(rt)
    for record in records: record["quality"] = measured
  for record, at_depth in zip(records, peers):
    if at_depth: record["peer"], record["peers"] = at_depth[0], at_depth
    if flags := journal.spread_flags(record): record["flags"] = flags
  return records

def cached_start(rt: Runtime) -> float | None:
  """Seconds from loaded weights to the first token of a run that takes every JIT from the cache (as `run`'s second
  run does): this run's JITs kept in a temporary store and taken back from it, then a one-token prompt's prefill and
  its first greedy token. None where a JIT cannot be kept (the store's note says why, on stderr)."""
  with tempfile.TemporaryDirectory() as tmp:
    rt.jits, sampler = JitStore(Path(tmp)), Sampler(SamplerParams(temperature=0))
    try:
      rt.warm_up(sampler)
      rt.keep_jits(sampler)
      if rt.cached != set(ALL_JITS):
        for note in rt.jits.notes: print(note, file=sys.stderr)
        return None
      rt.cached.clear()
      t0 = time.perf_counter()
      rt.restore_jits()
      rt.restore_sampler(sampler := Sampler(SamplerParams(temperature=0)))
      next(rt.generate([11], 1, sampler))
      return round(time.perf_counter() - t0, 3)
    finally: rt.jits = None

def decode_record(rt: Runtime, path: Path, name: str, cfg: BenchConfig, depth: int, shared: dict, bandwidth: float) -> dict:
  """The record of decode after `depth` tokens of context; `shared` holds the run's prompt processing and load figures.
  The decode JIT is captured once, at the first depth; later depths replay it (their compile and capture times ~0)."""
  _, logits = timed_prefill(rt, prompt_ids(rt, prompt_length(depth)))
  # the generation loop as `run` has it (sampled tokens stay on the device, read back in batches), greedy, no stop token
  sampler = Sampler(SamplerParams(temperature=0))
  with sampler.trial(), rt.kernels:   # the sampler captured apart: the first decode step's time is the decode JIT's alone
    sampler.prepare(1, logits.device)
    sampler.queue(logits)
  compiled, runs = rt.kernels.compile_s[0], []
  for _ in range(cfg.repeats):   # each repeat decodes from the same position again: its warm-up steps, then the timed ones
    timing = Timing()
    for _ in rt.continue_from(logits, prompt_length(depth), 2 + cfg.warmup + cfg.tokens, sampler, timing, stop_ids=frozenset()): pass
    if not runs: steps, compile_s = timing.steps, rt.kernels.compile_s[0] - compiled   # the first step of all compiles and captures
    runs.append([t * 1e3 for t in timing.steps[1 + cfg.warmup:]])
  ms = [t for run in runs for t in run]
  tok_s, tok_s_sd = mean_sd([1e3 / statistics.median(run) for run in runs], 3)   # a repeat's speed: its median step
  # the same steps queued back to back at one position, never read: the device's time per step where the host keeps ahead
  with rt.kernels: token = sampler.queue(logits)
  issue_ms, queued_ms = queued_steps(rt, sampler, token, prompt_length(depth), cfg.tokens)
  labels = buffer_labels(rt.weights.labels)
  kernels = replay_kernels(rt._decode.captured.linear) + replay_kernels(sampler.jit.captured.linear)
  matvecs = rt.kernels.heuristic
  moe = [b.ffn.cfg for b in rt.model.blocks if isinstance(b.ffn, MoE)]
  nbytes = weights_read(rt, labels)(kernels)
  categories = Counter(cat for cat, *_ in attribute(kernels, labels))
  record = {**journal.context(), "model": name, "file": os.path.basename(path), "model_sha256": file_sha256(path),
            "switches": cfg.switches(), "hints": cfg.hints.as_dict(), "profile_file": cfg.hints.profile.name if cfg.hints.profile else None,
            "matvec_shapes": {"gpu_compiled": len(set(matvecs.compiled_shapes)) if matvecs else 0,
                              "untuned": matvecs.untuned_shapes() if matvecs else []},
            "prompt_tokens": prompt_length(depth), "tokens": cfg.tokens, "pp_tokens": cfg.pp,
            "metrics": {"kernels_per_token": len(kernels), "kernel_categories": {c: categories[c] for c in CATEGORIES},
                        "tok_s": tok_s, "tok_s_sd": tok_s_sd,
                        "ms_per_token": {"median": round(statistics.median(ms), 3), "min": round(min(ms), 3), "max": round(max(ms), 3)},
                        "queued_ms": round(queued_ms, 3), "issue_ms": round(issue_ms, 3),
                        "bytes_per_token": nbytes, "bandwidth_gb_s": round(bandwidth, 2), "floor_ms": round(nbytes / bandwidth / 1e6, 3),
                        **shared, "depth": depth, "compile_s": round(compile_s, 2), "capture_s": round(steps[0] - compile_s, 2),
                        "kept_programs": cfg.kept_programs,
                        "programmatic_edges": rt.kernels.edges[0]}}
  if (form := prefill_form(rt.model, rt.chunk)) is not None: record["metrics"]["mla_prefill"] = form
  if moe and "topk" not in cfg.hints.skip:   # the routing's choice of experts, as its own kernels would be: captured alone, times the MoE blocks
    per_block = topk_kernels(topk_by_name(cfg.hints.topk), moe[0].n_experts, moe[0].n_used, rt.device)
    record["metrics"]["topk"] = {"algorithm": cfg.hints.topk, "kernels_per_block": per_block, "kernels_per_token": per_block * len(moe)}
  return record

def peers_by_depth(path: Path, cfg: BenchConfig) -> list[list[dict]]:
  """The peers measured at each of cfg.depths (llama.cpp first): llama-bench once for every depth, llama-cpp-python and
  tinygrad's app once per depth."""
  if not cfg.peer: llama = [None] * len(cfg.depths)
  elif cfg.llama_bench: llama = peer_llamacpp.run_llama_bench(cfg.llama_bench, str(path), cfg.depths, cfg.tokens, cfg.pp, cfg.repeats)
  else: llama = [peer_llamacpp.run(str(path), depth, cfg.tokens, cfg.pp, repeats=cfg.repeats) for depth in cfg.depths]
  apps = [tinygrad_app(path, cfg, depth) if cfg.tinygrad_src else None for depth in cfg.depths]
  return [[p for p in pair if p is not None] for pair in zip(llama, apps)]

def tinygrad_app(path: Path, cfg: BenchConfig, depth: int) -> dict | None:
  args = ["--src", str(cfg.tinygrad_src), str(path), "--prompt", str(prompt_length(depth)), "--warmup", str(cfg.warmup), "--tokens", str(cfg.tokens)]
  r = subprocess.run([sys.executable, "-m", "experiments.peer_tinygrad", *args], capture_output=True, text=True, timeout=3600)
  if r.returncode != 0:
    print(f"tinygrad app peer not measured: {(r.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
    return None
  return json.loads(r.stdout.strip().splitlines()[-1])

def startup(m: dict) -> str:
  """Compile and capture of prefill and decode, and (in brackets) weights loaded to first token with the JITs cached."""
  first = sum(m.get(k, 0) for k in ("compile_s", "capture_s", "prefill_compile_s", "prefill_capture_s"))
  return f"{first:.1f}" + (f" ({m['cached_start_s']:.2f})" if m.get("cached_start_s") is not None else "")

def pm(m: dict, key: str, digits: int) -> str:
  """A figure as `mean ± sd` where its spread was measured, else the mean alone."""
  sd = m.get(f"{key}_sd")
  return f"{m[key]:.{digits}f}" + (f" ± {sd:.{digits}f}" if isinstance(sd, (int, float)) else "")

def table(records: list[dict]) -> str:
  """One row per record (! marks a flagged one, its flags listed under the table)."""
  head = ("model", "device", "switches", "kernels/tok", "ms/tok (min-max)", "tok/s", "floor ms", "pp tok/s", "start s (cached)",
          "peers tok/s (pp tok/s)")
  rows = [(r["model"] + (" !" if r.get("flags") else ""), r["device"].split(",")[0][:40], changed_switches(r["switches"]),
           str(m["kernels_per_token"]), f"{m['ms_per_token']['median']:.2f} ({m['ms_per_token']['min']:.2f}-{m['ms_per_token']['max']:.2f})",
           f"{pm(m, 'tok_s', 2)} @d{m['depth']}", f"{m['floor_ms']:.2f}", f"{pm(m, 'pp_tok_s', 1)} (pp{m.get('pp_tokens', r['prompt_tokens'])})",
           f"{startup(m)}", ", ".join(f"{p['engine'].split(' ')[0]} {pm(p, 'tok_s', 2)}" + (f" ({pm(p, 'pp_tok_s', 1)})" if "pp_tok_s" in p else "")
                     for p in r.get("peers", [])) or "-") for r in records for m in [r["metrics"]]]
  widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
  line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
  flags = [f"! {r['model']} @d{r['metrics']['depth']}: {flag}" for r in records for flag in r.get("flags", [])]
  return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows), *flags])

def dump(record: dict) -> str: return json.dumps(record, indent=1)
