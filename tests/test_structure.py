"""The code's shape: the packages import one another in one direction only (ops, quant, profiles, models, experiments,
tinyzoo: each may import those before it), and library docstrings and comments say what the code does, with no
measurements or commit hashes (those belong in the journal, README and results/)."""
import ast
import io
import re
import tokenize
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("ops", "quant", "profiles", "models", "experiments", "tinyzoo")

def modules(package: str) -> list[Path]: return sorted((ROOT / package).rglob("*.py"))

def imported_packages(path: Path) -> set[str]:
  """The tinyzoo packages a module imports (at its top or inside functions)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import): names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module: names.add(node.module)
  return {n.split(".")[0] for n in names} & set(LAYERS)

@pytest.mark.parametrize("package", LAYERS)
def test_packages_import_only_those_below_them(package: str):
  allowed = set(LAYERS[:LAYERS.index(package) + 1])
  wrong = {str(p.relative_to(ROOT)): sorted(imported_packages(p) - allowed) for p in modules(package) if imported_packages(p) - allowed}
  assert not wrong, f"{package} may import only {sorted(allowed)}: {wrong}"

HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
MEASURE = re.compile(r"\d\s?(tok/s|us|ms|GB/s|TB/s|TFLOP/s|x faster|x slower|%)(?!\w)")

def prose(path: Path) -> list[tuple[int, str]]:
  """(line, text) of every docstring and comment of a module."""
  src = path.read_text()
  docs = [(n.body[0].lineno, doc) for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
          and (doc := ast.get_docstring(n, clean=False))]
  return docs + [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT]

@pytest.mark.parametrize("package", LAYERS)
def test_docstrings_hold_no_measurements_or_commit_hashes(package: str):
  found = [f"{p.relative_to(ROOT)}:{line}: {m.group(0)!r}" for p in modules(package) for line, text in prose(p)
           for m in [*HASH.finditer(text), *MEASURE.finditer(text)]]
  assert not found, found

def test_the_checks_see_what_they_look_for(tmp_path: Path):
  """Each check finds its kind of fault in a module written to have it."""
  bad = tmp_path / "bad.py"
  bad.write_text('"""Ran at 1.45x faster, 12.5 tok/s on commit f65f19b."""\nimport experiments.bench  # 3.2 ms a token\n')
  assert [m.group(0) for _, text in prose(bad) for m in [*HASH.finditer(text), *MEASURE.finditer(text)]] == ["f65f19b", "5x faster", "5 tok/s",
                                                                                                                 "2 ms"]
  assert imported_packages(bad) == {"experiments"}
