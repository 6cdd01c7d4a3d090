"""The journal: concurrent appends from several processes leave every record whole, one per line."""
import json
import multiprocessing
from pathlib import Path
import pytest
from experiments import journal

def _writer(path: str, worker: int) -> None:
  for i in range(50): journal.append({"worker": worker, "i": i, "pad": "x" * (5000 + 97 * i)}, path)

def test_concurrent_appends_stay_whole(tmp_path: Path):
  path = tmp_path / "journal.jsonl"
  procs = [multiprocessing.Process(target=_writer, args=(str(path), w)) for w in range(4)]
  for p in procs: p.start()
  for p in procs: p.join()
  records = journal.read(path)
  assert sorted((r["worker"], r["i"]) for r in records) == [(w, i) for w in range(4) for i in range(50)]
  assert all(len(r["pad"]) == 5000 + 97 * r["i"] for r in records)

def test_context_names_code_and_device():
  ctx = journal.context()
  assert ctx["device"].startswith(ctx["backend"]) and len(ctx["commit"]) == 12 and isinstance(ctx["dirty"], bool) and ctx["tinygrad"] == "0.14.0"

def test_bad_line_is_named(tmp_path: Path):
  path = tmp_path / "j.jsonl"
  path.write_text(json.dumps({"a": 1}) + "\n{broken\n")
  with pytest.raises(ValueError, match=r":2: not a journal record"): journal.read(path)
