"""The `tinyzoo` command."""
import argparse
import sys
from models.catalog import DEFAULT_MODEL, REAL_MODELS, ModelNotFound, resolve_model
from quant.gguf_file import GGUFError, GGUFFile
from quant.qtensor import UnsupportedType

USER_ERRORS = (GGUFError, ModelNotFound, UnsupportedType, ValueError)

MODEL_HELP = f"a GGUF file or a registered model ({', '.join(REAL_MODELS)}); default {DEFAULT_MODEL}"

def cmd_info(args) -> None:
  from tinyzoo.info import describe
  print(describe(GGUFFile(resolve_model(args.model))))

def cmd_matvec(args) -> None:
  from experiments.matvec import bench_model
  bench_model(resolve_model(args.model), args.strategies, args.iters, args.batch, args.row_upcast)

def cmd_run(args) -> None:
  from tinyzoo.run import cmd_run as run
  run(args)

def cmd_logits(args) -> None:
  from tinyzoo.run import cmd_logits as logits
  logits(args)

def cmd_bench(args) -> None:
  from experiments import journal
  from experiments.bench import BenchConfig, bench, dump, table
  for n, v in (("--prompt-tokens", args.prompt_tokens), ("--tokens", args.tokens)):
    if v < 1: raise ValueError(f"{n} must be at least 1, got {v}")
  if args.warmup < 0: raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
  cfg = BenchConfig(args.prompt_tokens, args.tokens, args.warmup, args.ctx, args.strategy, args.rounding, not args.no_fuse, args.row_upcast,
                    args.bandwidth, not args.no_peer, args.tinygrad_src)
  record = bench(resolve_model(args.model), args.model or DEFAULT_MODEL, cfg)
  if not args.no_journal: journal.append(record)
  print(dump(record) if args.json else table([record]))

def add_model_options(s: argparse.ArgumentParser, rounding: str = "exact") -> None:
  from quant.activations import ROUNDINGS
  from quant.linear import STRATEGIES
  s.add_argument("--ctx", type=int, default=None, help="context length to allocate the KV cache for (default 2048, capped by the model's)")
  s.add_argument("--strategy", choices=STRATEGIES, default="packed_dot", help="how matmuls read the packed weights (default packed_dot)")
  s.add_argument("--rounding", choices=ROUNDINGS, default=rounding,
                 help=f"exact keeps activations and the KV cache in fp32; ggml rounds them as llama.cpp's CPU path does: 8-bit activations "
                      f"into quantized matmuls, an fp16 KV cache met by fp16 queries (more kernels, slower; matches llama.cpp's near-ties, "
                      f"see README). Default {rounding}")
  s.add_argument("--no-fuse", action="store_true", help="keep q/k/v and gate/up as separate matmuls instead of one per GGML type")
  add_row_upcast_option(s)

def add_row_upcast_option(s: argparse.ArgumentParser) -> None:
  from quant.matvec_opts import DEFAULT_ROW_UPCAST
  s.add_argument("--row-upcast", type=int, default=DEFAULT_ROW_UPCAST, metavar="N",
                 help=f"CPU matvec kernels compute N output rows at once with the reduce unrolled by 4 (default {DEFAULT_ROW_UPCAST}); "
                      "0 leaves them to tinygrad's heuristic")

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
  add_row_upcast_option(s)
  s.set_defaults(fn=cmd_matvec)

  s = sub.add_parser("run", help="generate text from a prompt, streaming it, with a speed summary",
                     description="Prefills the prompt and decodes under TinyJit, streaming the text; the last line (stderr) gives prompt and "
                                 "decode tok/s and the kernels one decoded token runs. Sampling defaults follow llama.cpp; "
                                 "--temperature 0 is greedy.")
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
  s.set_defaults(fn=cmd_logits)

  s = sub.add_parser("bench", help="JIT steady-state decode benchmark: kernels/token, ms/token, tok/s, bytes against the memory floor",
                     description="Prefills a prompt of --prompt-tokens token ids, captures decode under TinyJit, then times --tokens decode "
                                 "steps after --warmup: kernels per token (every kernel the JIT replays), ms/token (median, min, max), tok/s, "
                                 "bytes of weights read per token and the floor that implies at the copy bandwidth, compile and capture "
                                 "time, prefill tok/s. llama.cpp is measured on the same file in the same run when llama-cpp-python is "
                                 "installed (make reference). Each run is appended to experiments/journal.jsonl.")
  s.add_argument("model", nargs="?", help=MODEL_HELP)
  s.add_argument("--prompt-tokens", type=int, default=32, help="prompt length (default 32)")
  s.add_argument("--tokens", type=int, default=64, help="timed decode steps (default 64)")
  s.add_argument("--warmup", type=int, default=4, help="decode steps after capture before timing (default 4)")
  s.add_argument("--bandwidth", type=float, default=None, help="memory bandwidth in GB/s for the floor (default: a copy measured now)")
  s.add_argument("--no-peer", action="store_true", help="skip the llama.cpp measurement")
  s.add_argument("--tinygrad-src", metavar="DIR", help="also measure tinygrad's own LLM app from this tinygrad source tree (a9069c177a works)")
  s.add_argument("--no-journal", action="store_true", help="do not append the record to experiments/journal.jsonl")
  s.add_argument("--json", action="store_true", help="print the record as JSON instead of a table")
  add_model_options(s)
  s.set_defaults(fn=cmd_bench)
  return p

def main(argv: list[str] | None = None) -> int:
  args = parser().parse_args(argv)
  try: args.fn(args)
  except USER_ERRORS as e:
    print(f"tinyzoo: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt: return 130
  return 0

if __name__ == "__main__": sys.exit(main())
