"""The `tinyzoo` command."""
import argparse
import os
import sys
from pathlib import Path
from models.catalog import DEFAULT_MODEL, REAL_MODELS, ModelNotFound, model_label, resolve_model
from quant.gguf_file import GGUFError, GGUFFile
from quant.qtensor import UnsupportedType
from models.jit_cache import DEFAULT_LIMIT_MB as JIT_DEFAULT_MB, LIMIT_ENV as JIT_LIMIT_ENV

USER_ERRORS = (GGUFError, ModelNotFound, UnsupportedType, ValueError)

LLAMA_BENCH_HELP = ("measure llama.cpp with this llama-bench binary (a CUDA build, all layers offloaded) instead of llama-cpp-python: "
                    "its pp of --pp tokens and its decode of --tokens tokens after each --depth of context, in one run")
MODEL_HELP = f"a GGUF file or a registered model ({', '.join(REAL_MODELS)}); default {DEFAULT_MODEL}"

def cmd_info(args) -> None:
  from tinyzoo.info import describe
  print(describe(GGUFFile(resolve_model(args.model))))

def cmd_matvec(args) -> None:
  from experiments.matvec import SIZE_GRID, bench_model, gemv_bandwidth
  if args.shape is None: return bench_model(resolve_model(args.model), args.strategies, args.iters, args.batch, args.row_upcast)
  if args.model is not None: raise ValueError("give a model or --shape, not both")
  shapes = [parse_shape(v) for v in args.shape.split()]
  if args.copies is not None and args.copies < 1: raise ValueError("--copies must be positive")
  experts = parse_experts(args.experts) if args.experts else None
  import time
  from experiments import journal
  from profiles.device import device_name, device_profile, profile_path, save_matvec_sizes, tuned_sizes
  from quant.matvec_opts import Sizes, parse_gpu_sizes
  tuned = tuned_sizes(device_profile()[0])
  sweep = SIZE_GRID if args.gpu_sizes == "grid" else [parse_gpu_sizes(s) for s in args.gpu_sizes.split()] if args.gpu_sizes else [None]
  if args.save_best and sweep == [None]: raise ValueError("--save-best needs --gpu-sizes to search")
  best: dict[str, tuple[Sizes, float]] = {}
  t0 = time.perf_counter()
  for rows, cols in shapes:
    for strategy in (s.strip() for s in args.strategies.split(",") if s.strip()):
      # the span (a fourth size) splits packed_words blocks only: other strategies time each (T, B, R) once
      sizes_tried = sweep if strategy == "packed_words" else list(dict.fromkeys(s[:3] if s else s for s in sweep))
      for record, sizes in zip(gemv_bandwidth(args.type, rows, cols, strategy, args.copies, args.iters, sizes_tried,
                                                   args.pdl or args.pdl_prefetch, args.pdl_prefetch, args.row_upcast, tuned,
                                                   experts, args.mixed, args.act), sizes_tried):
        if not args.no_journal: journal.append(record, args.journal)
        m, shape = record["metrics"], record["kernel_shape"]
        if sizes and shape and m["correct"] and m["gb_s"] > best.get(shape, (None, 0.0))[1]: best[shape] = (sizes, m["gb_s"])
        label = f"{strategy} sizes {record['switches']['gpu_matvec']}" if sizes else strategy
        print(f"{record['model']} {label}: {m['kernels']} kernels, {m['ms'] * 1e3 / m['copies']:.1f} us per weight, {m['gb_s']} GB/s = "
              f"{100 * m['fraction_of_copy']:.0f}% of a copy's {m['copy_gb_s']} GB/s; copies of a weight's size "
              f"{m['copy_at_size_gb_s']} GB/s, {m['copy_at_size_us']:.1f} us each ({record['device']})"
              + ("" if m["correct"] else f"; WRONG OUTPUT (relative error {m['rel_err']:.1e}), left out of the best"), flush=True)
  if len(sweep) > 1:
    for shape, (sizes, gb_s) in best.items(): print(f"kernel {shape}: best sizes {','.join(map(str, sizes))} at {gb_s} GB/s")
    print(f"search cost: {time.perf_counter() - t0:.0f} s for {len(sweep)} sizes")
  if args.save_best:
    save_matvec_sizes(path := profile_path(name := device_name()), name, best)
    print(f"saved {len(best)} kernel shapes to {path}")

def cmd_gemm(args) -> None:
  from experiments import gemm, journal
  asked = [k.strip() for k in args.kernels.split(",") if k.strip()] if args.kernels else None
  gemm.run(resolve_model(args.model), model_label(args.model), args.rows, asked, args.iters,
           (lambda r: None) if args.no_journal else lambda r: journal.append(r, args.journal))

def parse_shape(spec: str) -> tuple[int, int]:
  try: rows, cols = (int(v) for v in spec.lower().split("x"))
  except ValueError: raise ValueError(f"--shape takes ROWSxCOLS, e.g. 8192x2048, got {spec!r}") from None
  if rows < 1 or cols < 1: raise ValueError(f"--shape sizes must be positive, got {spec!r}")
  return rows, cols

def parse_experts(spec: str) -> tuple[int, int]:
  """N,K as two integers; gemv_bandwidth checks that they make sense."""
  try: n, k = (int(v) for v in spec.split(","))
  except ValueError: raise ValueError(f"--experts takes N,K (K of N experts read), e.g. 8,2, got {spec!r}") from None
  return n, k

def cmd_run(args) -> None:
  from tinyzoo.run import cmd_run as run
  run(args)

def cmd_cache(args) -> None:
  from models.jit_cache import JIT_SUFFIX, PROGRAM_SUFFIX, SCHEDULE_SUFFIX, JitStore, total_bytes
  store = JitStore()
  if args.clear: return print(f"removed {store.clear() / 2**20:.1f} MiB of captured JITs, compiled programs and schedules from {store.root}")
  jits, programs, schedules = (store.entries((suffix,)) for suffix in (JIT_SUFFIX, PROGRAM_SUFFIX, SCHEDULE_SUFFIX))
  print(f"{store.root}: {len(jits)} captured JITs, {len(programs)} compiled programs and {len(schedules)} schedules, "
        f"{total_bytes(jits + programs + schedules) / 2**20:.1f} MiB of at most {store.limit / 2**20:.0f} MiB")

def cmd_logits(args) -> None:
  from tinyzoo.run import cmd_logits as logits
  logits(args)

def model_hints(args, path):
  """The kernel hints for the model at `path`: the flags given (and TINYZOO_HINTS) over this device's profile (unless
  --no-profile) over the model's manifest over the defaults."""
  from profiles.device import resolve_hints
  from profiles.hints import given
  return resolve_hints(path, given(args), profile=not args.no_profile)

def depths(text: str) -> tuple[int, ...]:
  """--depth's D[,D...]: whole numbers >= 0."""
  parts = [p.strip() for p in text.split(",")]
  if not all(p.isdigit() for p in parts): raise argparse.ArgumentTypeError(f"expected whole numbers >= 0 apart by commas, got {text!r}")
  return tuple(map(int, parts))

def bench_config(args, path):
  from experiments.bench import BenchConfig
  for n, v in (("--tokens", getattr(args, "tokens", 1)), ("--pp", args.pp)):
    if v < 1: raise ValueError(f"{n} must be at least 1, got {v}")
  if args.warmup < 0: raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
  return BenchConfig(model_hints(args, path), depths=args.depth, tokens=getattr(args, "tokens", 1), pp=args.pp, warmup=args.warmup,
                     repeats=bench_repeats(args),
                     ctx=args.ctx, requant=args.requant, bandwidth=getattr(args, "bandwidth", None), peer=not getattr(args, "no_peer", True),
                     llama_bench=getattr(args, "llama_bench", None), tinygrad_src=getattr(args, "tinygrad_src", None),
                     kept_programs=args.kept_programs)

def cmd_perplexity(args) -> None:
  from tinyzoo.run import cmd_perplexity as perplexity
  perplexity(args)

def cmd_hints(args) -> None:
  import json
  from profiles.device import not_applied, resolve_hints
  from profiles.hints import ENV, HINTS
  from tinygrad import Device
  from models.kernels import hand_written
  from profiles.machine import this_machine
  from quant.gguf_file import GGUFFile
  hints = resolve_hints(path := resolve_model(args.model), {}, profile=True)
  if args.json: return print(json.dumps({"hints": hints.as_dict()}))
  print(f"kernel hints for {path.name} on {this_machine().describe()}: runtime ({ENV}) > profile "
        f"({hints.profile or 'none for this device'}) > manifest (the file's tinyzoo.hints.*) > heuristic (the hint's rule) > default")
  if (why := not_applied()) is not None: print(f"  the device's profile is not applied: {why} (`tinyzoo tune` tunes one here)")
  for name, hint in HINTS.items():
    value = hints.as_dict()[name]["value"]
    why = f"{hints.reasons[name]}. " if name in hints.reasons else ""
    print(f"  {name:<15} {','.join(value) if isinstance(value, list) else str(value):<22} {hints.sources[name]:<9} {why}{hint.help}")
  if uses := hand_written(GGUFFile(path), hints, Device.DEFAULT):
    print("hand-written kernels on this model:")
    for kernel, takes in uses: print(f"  {kernel}: {takes}")

def cmd_bench(args) -> None:
  from experiments import journal
  from experiments.bench import bench, dump, table
  records = bench(path := resolve_model(args.model), model_label(args.model), bench_config(args, path))
  if not args.no_journal:
    for record in records: journal.append(journal.with_peer_flags(record, args.journal), args.journal)
  print("\n".join(map(dump, records)) if args.json else table(records))

def cmd_profile(args) -> None:
  import json
  from experiments.profile import as_json, ncu_kernel_times, profile_model, report
  if args.ncu: title, rows, note = ncu_kernel_times([a for a in sys.argv[2:] if a not in ("--ncu", "--json")])
  else: title, rows, note = profile_model(path := resolve_model(args.model), model_label(args.model), bench_config(args, path), args.repeats,
                                          args.chunk)
  print(json.dumps({"title": title, "note": note, "kernels": as_json(rows)}, indent=1) if args.json else report(title, rows, note, args.all))

def cmd_exp(args) -> None:
  import textwrap
  from experiments import journal, named
  if args.exp_command == "list":
    for exp in named.load_all().values():
      print(f"{exp.name:<20} {exp.model:<16} {1 + len(exp.variants)} runs  {textwrap.shorten(exp.description, 90)}")
  elif args.exp_command == "show": print(named.describe(named.find(args.name), journal.read(args.journal)))
  elif args.exp_command == "run":
    exp, sizes, base = named.find(args.name), experiment_sizes(args), experiment_base(args)
    named.chosen_variants(exp, args.variant)
    records = named.run(exp, resolve_model, args.model, base, args.variant, sizes, on_record=trial_noter(args), progress=sys.stderr.isatty())
    print(named.results_table(records))
  else:
    def results(exp: named.Experiment, records: list[dict]) -> None:
      print(f"{exp.name} ({exp.reproduces})\n{named.results_table(records)}\n", flush=True)
    done = named.reproduce(resolve_model, experiment_base(args), args.defs or named.DEFS, args.only, experiment_sizes(args), trial_noter(args),
                           results, sys.stderr.isatty())
    print(done.summary())
    if done.failed: raise named.ExperimentError(f"{len(done.failed)} of the experiments failed: {'; '.join(why for _, why in done.failed)}")

def experiment_sizes(args) -> dict[str, int]:
  """The bench sizes `exp run` and `exp reproduce` were given, over every experiment's own."""
  sizes = {k: v for k, v in (("tokens", args.tokens), ("warmup", args.warmup)) if v is not None}
  if any(v < (1 if k == "tokens" else 0) for k, v in sizes.items()): raise ValueError(f"bad --tokens/--warmup: {sizes}")
  return sizes

def experiment_base(args):
  """What makes an experiment's config from its model's file: the file's hints (with this device's profile unless
  --no-profile), the peer and repeats as the flags say."""
  from experiments.bench import BenchConfig
  from profiles.device import resolve_hints
  repeats = bench_repeats(args)
  return lambda path: BenchConfig(resolve_hints(path, {}, profile=not args.no_profile), peer=not args.no_peer, llama_bench=args.llama_bench,
                                  kept_programs=args.kept_programs, repeats=repeats)

def cmd_plot(args) -> None:
  from experiments import journal
  from experiments.plot import plot
  path = args.journal or journal.user_journal()
  if not (records := journal.read(path)):
    raise ValueError(f"{path}: no journal records (the project's are in {journal.PROJECT_JOURNAL})")
  out = plot(records, args.kind, args.output, experiment=args.experiment, model=args.model, device=args.device)
  print(f"wrote {out}")

def cmd_report(args) -> None:
  from experiments import journal
  from experiments.report import report
  print(f"wrote {report(args.journal or journal.user_journal(), args.output)}")

def trial_noter(args):
  """What `exp run` and `tune` do with each trial's record as it comes: journal it (unless --no-journal) and say it."""
  from experiments import journal
  def note(record: dict) -> None:
    if not args.no_journal: journal.append(journal.with_peer_flags(record, args.journal), args.journal)
    m = record["metrics"]
    print(f"{record['variant']}: {m['kernels_per_token']} kernels/token, {m['tok_s']:.2f} tok/s", file=sys.stderr)
  return note

TUNE_PP = 64

def cmd_tune(args) -> None:
  import datetime
  from experiments.bench import BenchConfig
  from experiments.named import results_table
  from experiments.tune import tune, winner_hints
  from profiles.device import device_name, profile_path, resolve_hints, save_hints
  if args.budget <= 0 or args.tokens < 1: raise ValueError("--budget and --tokens must be positive")
  path = resolve_model(args.model)
  # trials rank decode: their prompt processing is timed on one short prompt
  start = BenchConfig(resolve_hints(path, {}), tokens=args.tokens, pp=TUNE_PP, peer=False, kept_programs=args.kept_programs)
  records = tune(path, model_label(args.model), start, args.budget, trial_noter(args))
  print(results_table(records))
  if args.no_save: return
  best, device = records[0], device_name()
  tuned = {"model": model_label(args.model), "tok_s": best["metrics"]["tok_s"],
           "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
  save_hints(out := profile_path(device), device, winner_hints(best), tuned)
  print(f"saved the fastest hints ({best['metrics']['tok_s']:.2f} tok/s) to {out}")

def cmd_convert(args) -> None:
  from profiles.hints import manifest_entries, parse
  from quant.convert import convert
  manifest = manifest_entries(parse(args.hints or "", "--hints"))
  out = convert(resolve_model(args.input), args.output, args.quant, args.only, args.embeddings, manifest, command=args.command_line)
  print(out)

def cmd_synth(args) -> None:
  from models.synth import synthesize
  print(synthesize(args.preset, args.output, args.quant, args.seed, args.layers))

def add_model_options(s: argparse.ArgumentParser, ctx: bool = True, **defaults) -> None:
  """Every kernel hint as a flag (profiles/hints.py; `defaults` are this command's own), and the options of building a
  model that are no hints (--ctx unless the command gives it a meaning of its own)."""
  from profiles.hints import add_flags
  if ctx: s.add_argument("--ctx", type=int, default=None, help="context length to allocate the KV cache for (default 2048, capped by the model's)")
  s.add_argument("--no-profile", action="store_true", help="ignore this device's profile (profiles/<device>.yaml): its hints, and the GPU "
                 "matvec sizes tuned per kernel shape (the built-in ones instead)")
  add_flags(s, **defaults)

def add_cache_option(s: argparse.ArgumentParser) -> None:
  s.add_argument("--no-cache", action="store_true", help="neither take captured JITs, compiled programs and schedules from the cache directory "
                 "nor keep this run's (see `tinyzoo cache`)")

def add_journal_options(s: argparse.ArgumentParser, what: str = "the record") -> None:
  s.add_argument("--journal", metavar="PATH", help=f"append {what} to this journal (default: $TINYZOO_JOURNAL, else "
                 "~/.local/share/tinyzoo/journal.jsonl; the project's is results/journal.jsonl)")
  s.add_argument("--no-journal", action="store_true", help=f"do not journal {what}")

def add_bench_options(s: argparse.ArgumentParser) -> None:
  """Sizes of a decode benchmark, and the requantized copy an experiment may measure."""
  s.add_argument("--depth", "--prompt-tokens", type=depths, default=(32,), metavar="D[,D...]", help="tokens of context before the timed "
                 "decode, as llama-bench's -d (0: decode from the first position); bench takes several, a record each (default 32)")
  s.add_argument("--pp", type=int, default=512, metavar="N", help="prompt processing measured on a prompt of N tokens from an empty "
                 "context, after the prefill JIT is captured, as llama-bench's ppN (default 512)")
  s.add_argument("--warmup", type=int, default=4, help="decode steps after capture before measuring (default 4)")
  s.add_argument("--requant", metavar="TYPE", help="measure a copy of the model requantized to this GGML type, e.g. Q4_0 or Q4_K (made once, cached)")
  add_kept_programs_option(s)

def bench_repeats(args) -> int:
  """-r's N (add_repeats_option), checked; 1 for a command without it (profile: its --repeats are replays)."""
  if (n := getattr(args, "bench_repeats", 1)) < 1: raise ValueError(f"--repeats must be at least 1, got {n}")
  return n

def add_repeats_option(s: argparse.ArgumentParser) -> None:
  s.add_argument("-r", "--repeats", dest="bench_repeats", type=int, default=3, metavar="N", help="time decode at each depth and prompt "
                 "processing N times, as llama-bench's -r, and the peer likewise: records and tables give the mean ± sd, and a "
                 "spread over 5%% of the mean is flagged noisy (default 3)")

def add_experiment_options(s: argparse.ArgumentParser) -> None:
  """The bench sizes, peer, profile and journal of `exp run` and `exp reproduce`."""
  s.add_argument("--tokens", type=int, help="timed decode steps (default: the experiment's, else 64)")
  s.add_argument("--warmup", type=int, help="decode steps after capture before timing (default: the experiment's, else 4)")
  add_repeats_option(s)
  s.add_argument("--no-peer", action="store_true", help="skip the llama.cpp measurement beside the baseline")
  s.add_argument("--no-profile", action="store_true", help="start from the built-in hints instead of this device's profile (the "
                 "variants' switches apply over either), and the built-in GPU matvec sizes")
  s.add_argument("--llama-bench", metavar="BINARY", help=LLAMA_BENCH_HELP)
  add_kept_programs_option(s)
  add_journal_options(s, "the records")

def add_kept_programs_option(s: argparse.ArgumentParser) -> None:
  s.add_argument("--kept-programs", action="store_true", help="take compiled programs from the cache directory where a run compiled "
                 "them before, and keep new ones there (compile_s then times taking them; the record says kept_programs); by "
                 "default every kernel compiles, so compile_s is a compile's time")


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="tinyzoo", description="tinygrad model zoo and optimization lab for quantized GGUF models")
  sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
  s = sub.add_parser("info", help="architecture, hyperparameters, tokenizer and tensor types of a GGUF file")
  s.add_argument("model", nargs="?", help=MODEL_HELP)
  s.set_defaults(fn=cmd_info)
  s = sub.add_parser("matvec", help="JIT steady-state matvec of each weight type of a model under each matmul strategy",
                     description="For every GGML type in the model, times one real weight's matvec in JIT steady state under each "
                                 "matmul strategy: kernels per call, time, and the bandwidth it reaches on the packed bytes.")
  s.add_argument("model", nargs="?", help=MODEL_HELP)
  s.add_argument("--strategies", default="packed_dot,fused,dequant_cache", help="comma-separated strategies (default: all)")
  s.add_argument("--iters", type=int, default=20, help="timed calls after warm-up (default 20)")
  s.add_argument("--batch", type=int, default=1, help="activation rows: 1 is a matvec (default 1)")
  s.add_argument("--shape", metavar="'ROWSxCOLS ...'", help="instead of a model: random weights of these shapes, timed against a device copy "
                 "and journaled")
  s.add_argument("--type", default="Q4_0", help="GGML type of the --shape weights (default Q4_0)")
  s.add_argument("--copies", type=int, help="--shape weights read in turn, so that together they outgrow the caches and a "
                 "replay outlasts the host's time to issue it (default: enough for 1 GiB, at most 512)")
  s.add_argument("--gpu-sizes", metavar="'T,B,R[,S] ...'|grid", help="with --shape on a GPU: sweep these matvec sizes (threads per row, rows per "
                 "workgroup, rows per thread, optionally the span: the words of a packed_words block each thread reads, a whole "
                 "block by default) or a grid of them, one journal record each (default: the device profile's or built-in sizes)")
  s.add_argument("--experts", metavar="N,K", help="with --shape: each weight is N experts of that shape, of which a MoE's expert "
                 "matmul reads K drawn at random (one x for all K, as gate and up are read); bytes counted are the K experts'")
  s.add_argument("--mixed", action="store_true", help="with --experts: an x per chosen expert, their outputs summed with random "
                 "weights, as a MoE's down experts are read")
  s.add_argument("--act", action="store_true", help="with --shape: the rows are joined gate and up halves, and the matvec's kernel "
                 "computes SwiGLU of each pair of rows (the act_in_matmul hint's kernel)")
  s.add_argument("--save-best", action="store_true", help="write the fastest sizes per kernel shape into this device's profile "
                 "(profiles/<device>.yaml), which bench, run and matvec then use")
  add_journal_options(s, "the --shape records")
  s.add_argument("--pdl", action="store_true", help="with --shape on an sm_90 or later CUDA GPU: the matvecs chained by programmatic "
                 "dependent launch, each one's launch and start overlapping the one before (see `tinyzoo bench --help`)")
  s.add_argument("--pdl-prefetch", action="store_true", help="--pdl, and each matvec's workgroups ask the L2 for their share of its "
                 "weight before waiting for the one before")
  from profiles.hints import HINTS
  s.add_argument("--row-upcast", type=int, default=HINTS["row_upcast"].default, metavar="N", help=HINTS["row_upcast"].help)
  s.set_defaults(fn=cmd_matvec)
  s = sub.add_parser("gemm", help="JIT steady-state GEMM of each weight shape of a model over a prompt chunk, per GEMM kernel",
                     description="For every type and shape of the model's matmul weights, times a prompt chunk's GEMM as prefill "
                                 "runs it (the weights read as the model's strategy keeps them: dequantized to fp16 first, or Q4_0, Q8_0 and "
                                 "MXFP4 words decoded by mma itself; the GEMM summed in float32) under each GEMM kernel this device runs "
                                 "(the gemm hint: tinygrad's, the hand-written mma on a CUDA GPU), beside cuBLAS through torch where it "
                                 "sees a CUDA GPU; a MoE's expert weights in the grouped form a chunk takes them (a random routing). "
                                 "TFLOP/s with the dequantization counted in, and the largest error against float64. One journal record "
                                 "a shape and kernel.")
  s.add_argument("model", nargs="?", help=MODEL_HELP)
  s.add_argument("--rows", type=int, default=512, help="the chunk's rows, the GEMM's M (default 512, a GPU's prefill chunk)")
  s.add_argument("--kernels", metavar="K[,K...]", help="GEMM kernels to time (default: every one this device runs)")
  s.add_argument("--iters", type=int, default=20, help="timed replays of each (default 20)")
  add_journal_options(s, "the records")
  s.set_defaults(fn=cmd_gemm)

  s = sub.add_parser("run", help="generate text from a prompt, streaming it, with a speed summary",
                     description="Prefills the prompt and decodes under TinyJit, streaming the text; the last line (stderr) gives the "
                                 "seconds to load the model, to compile (capture) its JITs and from loaded to the first token, prompt "
                                 "and decode tok/s apart from them, and "
                                 "the kernels one decoded token runs. The JITs are kept in the cache directory (`tinyzoo cache`): a later "
                                 "run of the same model file, hints, device and tinyzoo compiles nothing. Sampling defaults follow "
                                 "llama.cpp; --temperature 0 is greedy.")
  s.add_argument("model", nargs="?", help=MODEL_HELP)
  s.add_argument("-p", "--prompt", required=True, help="the prompt text")
  s.add_argument("-n", type=int, default=64, help="tokens to generate at most (default 64)")
  s.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default 0.8)")
  s.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens, 0 keeps all (default 40)")
  s.add_argument("--top-p", type=float, default=0.95, help="keep the smallest set with this much probability (default 0.95)")
  s.add_argument("--repeat-penalty", type=float, default=1.0, help="penalty on the last 64 tokens, 1 is off (default 1.0)")
  s.add_argument("--seed", type=int, default=None, help="seed for sampling (default: random)")
  s.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template as one user turn")
  add_model_options(s)
  add_cache_option(s)
  s.set_defaults(fn=cmd_run)

  s = sub.add_parser("logits", help="top logits at the last prompt position and greedy tokens, for several prompts in one process",
                     description="For each -p PROMPT or --tokens IDS, in order: its token ids, the top-K logits at the last prompt position and "
                                 "the first N greedy tokens. The model loads and compiles once for all cases. It rounds as llama.cpp does by default "
                                 "(--rounding ggml), so near-ties resolve as they do there.")
  s.add_argument("model", help=MODEL_HELP)
  s.add_argument("-p", "--prompt", dest="cases", action="append", type=lambda v: ("prompt", v), help="a prompt (repeatable)")
  s.add_argument("--tokens", dest="cases", action="append", type=lambda v: ("tokens", v), help="comma-separated token ids (repeatable)")
  s.add_argument("--top", type=int, default=20, help="logits to report (default 20)")
  s.add_argument("--greedy", type=int, default=4, help="greedy tokens to generate (default 4)")
  s.add_argument("--json", action="store_true", help='print {"cases": [{"prompt", "tokens", "top", "greedy"}]}')
  add_model_options(s, rounding="ggml")
  add_cache_option(s)
  s.set_defaults(fn=cmd_logits)

  s = sub.add_parser("perplexity", help="perplexity of a text, and KL divergence from a base model, as llama.cpp's llama-perplexity computes them",
                     description="Cuts the text's tokens into windows of --ctx tokens (at least two), runs each from position 0 (its first "
                                 "token replaced by BOS where the model adds one) and scores its second half: perplexity is exp of the mean "
                                 "negative log-probability of each next token, as llama-perplexity -c N reports it. With --kl-divergence it "
                                 "also compares each scored position's distribution with a base's: mean KL(base || model) and its 99th "
                                 "percentile, how often both rank the same token first, and the ratio of the perplexities. By default its "
                                 "matmuls compute as llama.cpp's CPU ones do (--rounding ggml --prefill packed): on the real models its figure "
                                 "then matches llama-perplexity's with an fp32 KV cache and flash attention off (-fa off -ctk f32 -ctv f32) "
                                 "to within the spread that the float summation order gives under that rounding (about 1%).")
  s.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=MODEL_HELP)
  s.add_argument("-f", "--file", help="UTF-8 text to score (default: /usr/share/common-licenses/GPL-3, which Debian and Ubuntu systems ship)")
  s.add_argument("--ctx", type=int, default=512, help="tokens a window, as llama-perplexity's -c (default 512)")
  s.add_argument("--chunks", type=int, default=None, help="score only the first K windows, as llama-perplexity's --chunks (default: all)")
  s.add_argument("--kl-divergence", metavar="BASE", help="compare with a base: another GGUF file (or registered model) of the same vocabulary, "
                 "run here on the same windows, or log-probabilities saved by --save-base")
  s.add_argument("--save-base", metavar="FILE", help="save this model's log-probabilities at the scored positions (float32, vocabulary x "
                 "ctx/2 a window) for a later --kl-divergence FILE; written whole or not at all")
  s.add_argument("--json", action="store_true", help='print {"perplexity", "tokens" (scored), "windows", "ctx"} and, against a base, '
                 '"kl_mean", "kl_p99", "top1", "base_perplexity", "ppl_ratio"')
  add_model_options(s, ctx=False, rounding="ggml", prefill="packed")
  add_cache_option(s)
  s.set_defaults(fn=cmd_perplexity)

  s = sub.add_parser("cache", help="the captured JITs, compiled programs and schedules kept across runs: where, how many, how large; --clear "
                     "removes them",
                     description="`run` and `logits` keep each JIT they capture (prefill, head, decode, the sampler's) in the cache "
                                 "directory ($TINYZOO_CACHE, else ~/.cache/tinyzoo), under a key of the model file's sha256, the resolved "
                                 "hints, the device and its name, tinygrad's version and settings and the tinyzoo source its capture runs "
                                 "(the runtime's modules and the architecture's, with what they import), and each kernel "
                                 "program they compile, under a key of its graph, its compile settings, the device, tinygrad's version and "
                                 "settings and only the tinyzoo source that runs in a compile, not the model file (a run of another file "
                                 "of the same shapes, or with another context or hint, compiles only the kernels no run compiled "
                                 "before), and the schedule of each function a capture realizes (a block), under a key of its graph "
                                 "and the same settings and source (a capture after a change to tinyzoo's source schedules only what "
                                 "changed); the least recently used go beyond "
                                 f"${JIT_LIMIT_ENV} MiB (default {JIT_DEFAULT_MB}).")
  s.add_argument("--clear", action="store_true", help="remove every kept JIT, program and schedule")
  s.set_defaults(fn=cmd_cache)

  s = sub.add_parser("bench", help="JIT steady-state decode benchmark: kernels/token, ms/token, tok/s, bytes against the memory floor",
                     description="Prefills --depth token ids of context, captures decode under TinyJit, then times --tokens decode "
                                 "steps after --warmup, at each depth given (one load and capture for all, a record each): kernels per "
                                 "token (every kernel the JIT replays), ms/token (median, min, max), tok/s, "
                                 "bytes of weights read per token and the floor that implies at the copy bandwidth, compile and capture "
                                 "time, prefill tok/s. llama.cpp is measured on the same file in the same run when llama-cpp-python is "
                                 "installed (make reference). Each run is appended to the journal (--journal).")
  s.add_argument("model", nargs="?", help=MODEL_HELP)
  s.add_argument("--tokens", type=int, default=64, help="timed decode steps (default 64)")
  s.add_argument("--bandwidth", type=float, default=None, help="memory bandwidth in GB/s for the floor (default: a copy measured now)")
  s.add_argument("--no-peer", action="store_true", help="skip the llama.cpp measurement")
  s.add_argument("--llama-bench", metavar="BINARY", help=LLAMA_BENCH_HELP)
  s.add_argument("--tinygrad-src", metavar="DIR", help="also measure tinygrad's own LLM app from this tinygrad source tree (README "
                 "names a commit that works)")
  add_journal_options(s)
  s.add_argument("--json", action="store_true", help="print the record as JSON instead of a table")
  add_repeats_option(s)
  add_model_options(s)
  add_bench_options(s)
  s.set_defaults(fn=cmd_bench)

  s = sub.add_parser("profile", help="one decode step kernel by kernel: category, block and module, time",
                     description="Captures decode after --depth tokens of context and replays it --repeats times, launching and timing "
                                 "every kernel alone where the backend allows (inside a graph batch only the batch can be timed: those "
                                 "times are averages and are marked *). Prints a per-block summary by category (matmul/GEMV, reduce, "
                                 "elementwise, copy), then the per-block kernel map: each kernel's name, category, the weight or cache it "
                                 "reads (which says which module made it) and its time.")
  s.add_argument("model", nargs="?", help=MODEL_HELP)
  s.add_argument("--repeats", type=int, default=5, help="timed replays; times are medians (default 5)")
  s.add_argument("--all", action="store_true", help="also list every kernel in replay order")
  s.add_argument("--chunk", action="store_true", help="profile one prompt chunk (a prompt of --pp tokens, at most one chunk) instead "
                 "of a decode step, and say the TFLOP/s its matmul kernels reached on the blocks' dense weights")
  s.add_argument("--json", action="store_true", help='print {"title", "note", "kernels": [...]} instead')
  s.add_argument("--ncu", action="store_true", help="on an NVIDIA GPU: each kernel's own device time inside its CUDA graph, measured "
                 "by Nsight Compute (ncu on the PATH) on one replayed step, instead of launching kernels alone")
  add_model_options(s)
  add_bench_options(s)
  s.set_defaults(fn=cmd_profile)

  s = sub.add_parser("exp", help="named experiments: list, show, run (baseline and variants, one journal record each), reproduce (every "
                     "seed finding this device can run)",
                     description="Experiments are YAML files in experiments/defs/: a model, a baseline and variants, each a set of switches "
                                 "(strategy per quant type, FFN split, component isolation, requantized copies, BEAM, JIT batch size, ...).")
  exp = s.add_subparsers(dest="exp_command", required=True, metavar="ACTION")
  exp.add_parser("list", help="the experiments, one line each")
  e = exp.add_parser("show", help="an experiment's variants and its latest recorded results")
  e.add_argument("name")
  e.add_argument("--journal", metavar="PATH", help="the journal to find its results in (default: yours; the project's is "
                 "results/journal.jsonl)")
  e = exp.add_parser("run", help="bench the baseline and every variant in one run, appending one journal record each")
  e.add_argument("name")
  e.add_argument("--model", help="run on this model instead of the experiment's (its model for this device)")
  e.add_argument("--variant", action="append", help="run only this variant (repeatable; the baseline always runs)")
  add_experiment_options(e)
  e = exp.add_parser("reproduce", help="run every experiment that reproduces a seed finding and that this device can run, at one clean "
                     "commit, each on its model for this device with its baseline beside its variants",
                     description="Runs each experiment whose `reproduces` names a seed, on its model for this device (a definition's "
                                 "`model: {gpu: ..., cpu: ...}`), printing its results table as it ends; one that this device or its "
                                 "model cannot show (its `needs`) is refused with the reason. A tree with uncommitted changes is "
                                 "refused unless TINYZOO_COMMIT names the commit. Every record carries the reproduction's id.")
  e.add_argument("--only", metavar="NAME", action="append", help="run only this experiment (repeatable)")
  e.add_argument("--defs", metavar="DIR", type=Path, help="the experiment definitions of this folder instead of experiments/defs/")
  add_experiment_options(e)
  s.set_defaults(fn=cmd_exp)

  s = sub.add_parser("report", help="the results page of a journal: report.md and its charts",
                     description="Writes DIR/report.md and the charts it shows into DIR/charts/: for each named experiment the seed's "
                                 "claim, its latest run on each device and model with every variant's mean ± sd, and the verdict its "
                                 "definition's rule gives (reproduced, not reproduced, contradicted, or not run on that device); then the "
                                 "speed matrix beside llama.cpp: per device and model, the latest pp512 and decode at each depth recorded, "
                                 "with the ratio, kernels per token and the memory floor. The project's page is remade by "
                                 "`tinyzoo report results/journal.jsonl -o results`.")
  s.add_argument("journal", nargs="?", default=None, help="a journal file (default: yours, $TINYZOO_JOURNAL or "
                 "~/.local/share/tinyzoo/journal.jsonl; the project's records are results/journal.jsonl)")
  s.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write report.md and charts/ into (made where missing)")
  s.set_defaults(fn=cmd_report)

  from experiments.journal import KINDS   # not experiments.plot: matplotlib takes half a second to import
  s = sub.add_parser("plot", help="charts from the journal: kernels and tok/s per variant, category breakdown, history, prompt processing, "
                     "depth, quality",
                     description="kernels: kernels/token per experiment variant with tok/s on a second axis; speed: tok/s per variant "
                                 "against the memory floor and peer engines; breakdown: kernels per category, stacked; history: tok/s "
                                 "and kernels/token over commits; pp: prompt processing tok/s per model beside llama.cpp's of the same "
                                 "prompt length (bench --pp), the newest record of each; depth: decode tok/s against the depth of context "
                                 "before it (bench --depth), a line per variant and one per peer at the same depths; quality: decode tok/s "
                                 "against mean KL divergence from the baseline per variant (experiments with quality:). Experiments show "
                                 "their latest run.")
  s.add_argument("journal", nargs="?", default=None, help="a journal file (default: yours, $TINYZOO_JOURNAL or "
                 "~/.local/share/tinyzoo/journal.jsonl; the project's records are results/journal.jsonl)")
  s.add_argument("--kind", choices=KINDS, default="kernels", help="which chart (default kernels)")
  s.add_argument("--experiment", help="only this experiment")
  s.add_argument("--model", help="only this model")
  s.add_argument("--device", help="only records on a device whose name contains this (e.g. CUDA, H100)")
  s.add_argument("-o", "--output", required=True, help="the chart file: .png, .svg or .pdf")
  s.set_defaults(fn=cmd_plot)

  from models.synth import PRESETS, QUANTS
  s = sub.add_parser("hints", help="the kernel hints a model gets on this device, each with its value and where it came from",
                     description="Kernel hints are the switches that change which kernels run (profiles/hints.py). Each is resolved by "
                                 "one priority: runtime (flags of run/bench/profile, or TINYZOO_HINTS='name=value;...') > this device's "
                                 "profile (profiles/<device>.yaml, hints:) > the model file's manifest (metadata tinyzoo.hints.<name>) > "
                                 "the built-in default. This command shows the runtime part of the environment only.")
  s.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"a GGUF file or a registered model (default {DEFAULT_MODEL})")
  s.add_argument("--json", action="store_true", help='print {"hints": {name: {"value": ..., "source": ...}}}')
  s.set_defaults(fn=cmd_hints)

  s = sub.add_parser("tune", help="search kernel hints for a model on this device; the fastest become this device's profile",
                     description="Benches the hints resolved now, then one hint at a time every other value of it with the best of the "
                                 "rest (norm, act_break, strategy, fuse, kv_layout, act_in_matmul, softmax, weights_break, and row_upcast on a "
                                 "CPU or the JIT batch size on a GPU), in JIT "
                                 "steady state, until --budget runs out. Prints the trials ranked, journals each (experiment tune) and "
                                 "writes the fastest hints, with the tok/s they reached, into profiles/<device>.yaml (its matvec sizes kept).")
  s.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"a GGUF file or a registered model (default {DEFAULT_MODEL})")
  s.add_argument("--budget", type=float, default=600, metavar="SECONDS", help="stop starting trials after this long (default 600)")
  s.add_argument("--tokens", type=int, default=32, help="timed decode steps per trial (default 32)")
  add_kept_programs_option(s)
  add_journal_options(s, "the trials")
  s.add_argument("--no-save", action="store_true", help="print the ranking only; leave the device profile as it is")
  s.set_defaults(fn=cmd_tune)

  from quant.convert import PARTS, TARGETS
  s = sub.add_parser("convert", help="requantize a GGUF file's matmul weights to one type, recording how in its metadata",
                     description="Writes a copy of IN with its 2-D matmul weights requantized to --quant (e.g. Q4_K to Q4_0, which "
                                 "packed-dot reads). Norms, biases, F32 tensors and the token embedding (unless --embeddings) stay as "
                                 "they are. The copy's metadata records the source and its sha256, the command, the time and the "
                                 "converter (tinyzoo.convert.*) and the --hints given, as the model's manifest of kernel hints "
                                 "(tinyzoo.hints.*, read by `tinyzoo hints`). Written whole or not at all.")
  s.add_argument("input", metavar="IN", help="a GGUF file or a registered model")
  s.add_argument("-o", "--output", required=True, metavar="OUT", help="the converted file (replaced whole if it exists)")
  s.add_argument("--quant", required=True, type=str.upper, choices=[t.name for t in TARGETS], help="the type the weights are requantized to")
  s.add_argument("--only", choices=list(PARTS), help="convert only these tensors of each block (experts: *_exps; attention: attn_*; "
                 "ffn: ffn_*, experts included)")
  s.add_argument("--embeddings", action="store_true", help="requantize the token embedding too (kept by default)")
  s.add_argument("--hints", metavar="'NAME=VALUE;...'", help="kernel hints to write into the file, e.g. 'strategy=packed_words;norm=break'")
  s.set_defaults(fn=cmd_convert)

  s = sub.add_parser("synth", help="write a synthetic GGUF with a real model's shapes and seeded random weights",
                     description="Writes a GGUF with the shapes, metadata and tokenizer kind of a named model, seeded random weights in real "
                                 "block layouts and a valid tokenizer; general.name says it is synthetic. llama.cpp loads every preset. "
                                 "Presets are also accepted as model names by the other commands (made once into the cache).")
  s.add_argument("preset", choices=list(PRESETS), metavar="PRESET", help=f"one of {', '.join(PRESETS)}")
  s.add_argument("-o", "--output", required=True, help="the GGUF file to write")
  s.add_argument("--quant", help=f"GGML type of the matmul weights: {', '.join(QUANTS)} (default: the preset's; MXFP4, for presets with "
                                 "experts, puts the experts in MXFP4 and every other matmul in Q8_0)")
  s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
  s.add_argument("--layers", type=int, help="number of blocks (default: the preset's)")
  s.set_defaults(fn=cmd_synth)
  return p

def main(argv: list[str] | None = None) -> int:
  import shlex
  from models.jit_cache import JitStore
  from profiles.device import select_device
  given = sys.argv[1:] if argv is None else argv
  try: programs = None if any(len(a) > 5 and "--no-cache".startswith(a) for a in given) else JitStore()   # as argparse abbreviates
  except ValueError: programs = None   # TINYZOO_JIT_CACHE_MB unreadable: the command that keeps anything says so
  select_device(programs)   # before the parser, whose hint defaults ask for the device
  args = parser().parse_args(argv)
  args.command_line = shlex.join(["tinyzoo", *given])   # as conversion records it
  try:
    args.fn(args)
    sys.stdout.flush()   # a reader that went away shows here, not as an error at exit
  except BrokenPipeError:   # the reader went away (`| head`): stop quietly, as a Unix tool killed by SIGPIPE does
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # so the output still buffered has somewhere to go at exit
    return 141
  except USER_ERRORS as e:
    print(f"tinyzoo: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt: return 130
  return 0

if __name__ == "__main__": sys.exit(main())
