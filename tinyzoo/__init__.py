"""tinyzoo's command line: `main` checks the tinygrad it runs on before it loads anything that uses it."""
import atexit
import os
import sys

def main(argv: list[str] | None = None) -> int:
  """Runs the command and ends the process: exit handlers run and the output is flushed, but a model's objects (hundreds
  of thousands of graph nodes) are not freed one by one as the interpreter shuts down, which takes most of a second."""
  from ops.patches import UnsupportedTinygrad, check_tinygrad
  try: check_tinygrad()
  except UnsupportedTinygrad as e:
    print(f"tinyzoo: error: {e}", file=sys.stderr)
    return 1
  from tinyzoo.cli import main as cli
  code = cli(argv)
  atexit._run_exitfuncs()
  for stream in (sys.stdout, sys.stderr):
    try: stream.flush()
    except OSError: pass   # a reader that went away (`| head`)
  os._exit(code)
