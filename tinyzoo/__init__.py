"""tinyzoo's command line: `main` checks the tinygrad it runs on before it loads anything that uses it."""
import sys

def main(argv: list[str] | None = None) -> int:
  from ops.patches import UnsupportedTinygrad, check_tinygrad
  try: check_tinygrad()
  except UnsupportedTinygrad as e:
    print(f"tinyzoo: error: {e}", file=sys.stderr)
    return 1
  from tinyzoo.cli import main as cli
  return cli(argv)
