"""The `tinyzoo` command."""
import argparse
import sys
from models.catalog import DEFAULT_MODEL, REAL_MODELS, ModelNotFound, resolve_model
from quant.gguf_file import GGUFError, GGUFFile
from quant.qtensor import UnsupportedType

class UsageError(Exception): pass
USER_ERRORS = (GGUFError, ModelNotFound, UnsupportedType, UsageError, ValueError)

MODEL_HELP = f"a GGUF file or a registered model ({', '.join(REAL_MODELS)}); default {DEFAULT_MODEL}"

def cmd_info(args) -> None:
  from tinyzoo.info import describe
  print(describe(GGUFFile(resolve_model(args.model))))

def cmd_matvec(args) -> None:
  from experiments.matvec import bench_model
  bench_model(resolve_model(args.model), args.strategies, args.iters, args.batch)

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
  s.set_defaults(fn=cmd_matvec)
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
