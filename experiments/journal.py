"""The lab journal: one JSON line per measured run, appended whole under a lock so concurrent runs never interleave."""
import datetime
import fcntl
import json
import os
import subprocess
from importlib.metadata import version
from pathlib import Path
from typing import Any
from tinygrad import Device
from profiles.device import device_name

JOURNAL = Path(__file__).with_name("journal.jsonl")

def _git(*args: str) -> str:
  try: return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10).stdout.strip()
  except OSError: return ""

def commit_times() -> dict[str, int]:
  """The commit time (Unix seconds) of every commit this checkout's git knows, by its first 7 hex digits; empty without git."""
  return {h[:7]: int(t) for h, t in (line.split() for line in _git("log", "--all", "--format=%H %ct").splitlines())}

def context() -> dict[str, Any]:
  """What every record carries: when, which code, on what."""
  if commit := os.environ.get("TINYZOO_COMMIT"):   # a copied tree (a lent GPU machine), whose .git may be missing or stale
    dirty = os.environ.get("TINYZOO_DIRTY", "0") != "0"
  else: commit, dirty = _git("rev-parse", "--short=12", "HEAD"), bool(_git("status", "--porcelain", "--untracked-files=no"))
  return {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
          "dirty": dirty, "device": device_name(), "backend": Device.DEFAULT, "tinygrad": version("tinygrad")}

def append(record: dict[str, Any], path: os.PathLike = JOURNAL) -> None:
  line = (json.dumps(record, sort_keys=True) + "\n").encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    written = os.write(fd, line)
    if written != len(line): raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
    os.fsync(fd)
  finally: os.close(fd)

def read(path: os.PathLike = JOURNAL) -> list[dict[str, Any]]:
  records = []
  for n, line in enumerate(Path(path).read_text().splitlines(), 1):
    if not line.strip(): continue
    try: records.append(json.loads(line))
    except json.JSONDecodeError as e: raise ValueError(f"{path}:{n}: not a journal record ({e.msg})") from None
  return records
