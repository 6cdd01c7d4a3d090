"""The lab journal: one JSON line per measured run, appended whole under a lock so concurrent runs never interleave.

A user's runs go to their own journal, outside the checkout: $TINYZOO_JOURNAL, else the user data directory
($XDG_DATA_HOME/tinyzoo/journal.jsonl, by default ~/.local/share/tinyzoo/journal.jsonl). The project's committed records
are results/journal.jsonl, written only when a command is given it (`--journal results/journal.jsonl`)."""
import datetime
import fcntl
import json
import math
import os
import statistics
import subprocess
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable
from tinygrad import Device
from profiles.device import device_name

ENV = "TINYZOO_JOURNAL"
RESULTS = Path(__file__).resolve().parent.parent / "results"   # the project's committed records, charts and device logs
PROJECT_JOURNAL = RESULTS / "journal.jsonl"
KINDS = ("kernels", "speed", "breakdown", "history", "pp", "depth", "quality", "gemm")   # the charts experiments/plot.py draws from records

def user_journal(environ: os._Environ | dict = os.environ) -> Path:
  """Where a user's runs are journaled unless a command is given another journal."""
  if environ.get(ENV): return Path(environ[ENV]).expanduser()
  return Path(environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").expanduser() / "tinyzoo" / "journal.jsonl"

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

def append(record: dict[str, Any], path: os.PathLike | None = None) -> Path:
  """Appends `record` to the journal at `path` (default the user's), made with its folder where missing; returns the path."""
  path = Path(path) if path is not None else user_journal()
  path.parent.mkdir(parents=True, exist_ok=True)
  line = (json.dumps(record, sort_keys=True) + "\n").encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    written = os.write(fd, line)
    if written != len(line): raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
    os.fsync(fd)
  finally: os.close(fd)
  return path

def is_bench(record: dict) -> bool:
  """A decode benchmark's record (bench, exp, tune), not a matvec's or another kind's."""
  return isinstance(record.get("metrics"), dict) and "tok_s" in record["metrics"] and "kind" not in record

def upgraded(record: dict[str, Any]) -> dict[str, Any]:
  """A bench record of any generation in today's terms, each key an old record lacks filled with the meaning it had
  then and named in `upgraded`: before --depth the decode followed the prompt of `prompt_tokens` (the metrics' `depth`),
  and before --pp prompt processing was that prompt's prefill (`prefill_tok_s`, of `prompt_tokens` tokens; the peer's
  likewise). Other records come back as they are."""
  if not is_bench(record): return record
  m, filled = dict(record["metrics"]), []
  if "depth" not in m and isinstance(record.get("prompt_tokens"), int):
    m["depth"] = record["prompt_tokens"]
    filled.append("depth")
  if "pp_tok_s" not in m and "prefill_tok_s" in m:
    m["pp_tok_s"], m["pp_tokens"] = m["prefill_tok_s"], record.get("prompt_tokens")
    filled.append("pp_tok_s")
  m.setdefault("pp_tokens", record.get("pp_tokens"))
  out = {**record, "metrics": m}
  if isinstance(peer := out.get("peer"), dict):
    if "pp_tok_s" not in peer and "prefill_tok_s" in peer: filled.append("peer.pp_tok_s")
    out["peer"] = _peer_upgraded(peer)
  if isinstance(out.get("peers"), list): out["peers"] = [_peer_upgraded(p) for p in out["peers"]]
  if filled: out["upgraded"] = filled
  return out

def _peer_upgraded(peer: Any) -> Any:
  """A peer's figures with today's names: pp_tok_s for prefill_tok_s, tok_s_sd for llama-bench's tok_s_stddev."""
  if not isinstance(peer, dict): return peer
  renames = {"prefill_tok_s": "pp_tok_s", "tok_s_stddev": "tok_s_sd", "pp_tok_s_stddev": "pp_tok_s_sd"}
  return {**peer, **{new: peer[old] for old, new in renames.items() if old in peer and new not in peer}}

def record_time(r: dict) -> float:
  """A record's time in Unix seconds; -inf where it has none that can be read (such records sort first)."""
  try: return datetime.datetime.fromisoformat(r["time"]).timestamp()
  except (KeyError, TypeError, ValueError): return -math.inf

def latest_runs(records: list[dict], experiment: str | None = None,
                keep: Callable[[list[dict]], bool] = lambda run: True) -> dict[tuple[str, str, str], list[dict]]:
  """Each experiment's (or `experiment`'s) latest run on each device and model it ran on that `keep` accepts, by
  (experiment, device, model), its records in journal order: a run on a model that cannot show an effect stands beside
  the others, never in their place. A run is as new as its newest record; of runs as new, the one whose last record comes
  later in the journal wins."""
  runs: dict[tuple, list[tuple[int, dict]]] = defaultdict(list)
  for i, r in enumerate(records):
    if r.get("experiment") and is_bench(r) and experiment in (None, r["experiment"]):
      runs[(str(r["experiment"]), str(r.get("device")), str(r.get("model")), r.get("run"))].append((i, r))
  latest: dict[tuple[str, str, str], list[dict]] = {}
  for key, run in sorted(runs.items(), key=lambda kv: (max(record_time(r) for _, r in kv[1]), kv[1][-1][0])):
    if keep(rs := [r for _, r in run]): latest[key[:3]] = rs
  return dict(sorted(latest.items()))

def number(x: Any) -> bool:
  """A finite int or float, not a bool: a figure a record measured."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

NOISY = 0.05      # a mean whose standard deviation over its repeats is more than this fraction of it is flagged noisy
PEER_LOW = 0.5    # a peer under this fraction of the median of its engine's other records of the model, device and depth is flagged

def spread_flags(record: dict) -> list[str]:
  """'noisy: ...' for each of tinyzoo's and the peer's tok/s and pp tok/s whose spread over its repeats is large."""
  flags = []
  for who, m in (("tinyzoo", record.get("metrics") or {}), ("peer", record.get("peer") or {})):
    for key in ("tok_s", "pp_tok_s"):
      mean, sd = m.get(key), m.get(f"{key}_sd")
      if number(mean) and number(sd) and mean > 0 and sd > NOISY * mean:
        flags.append(f"noisy: {who} {key} {mean:.1f} ± {sd:.1f}, sd over {NOISY:.0%} of the mean")
  return flags

def _peer_key(r: dict) -> tuple:
  return (r.get("device"), r.get("model"), r["metrics"].get("depth"), str(r["peer"].get("engine", "")).split(" (")[0])

def peer_flags(record: dict, peers_tok_s: list[float]) -> list[str]:
  """'peer low: ...' when the record's peer ran far below the median of `peers_tok_s`, its engine's other records of the
  same model, device and depth (a busy machine): at least two are needed to say so."""
  peer = record.get("peer")
  if not isinstance(peer, dict) or not number(peer.get("tok_s")) or len(peers_tok_s) < 2: return []
  usual = statistics.median(peers_tok_s)
  if peer["tok_s"] >= PEER_LOW * usual: return []
  return [f"peer low: {peer['tok_s']:.2f} tok/s against a median of {usual:.2f} in {len(peers_tok_s)} other records of its engine, model, "
          "device and depth (a busy machine?)"]

def with_peer_flags(record: dict, path: os.PathLike | None = None) -> dict:
  """`record` with a 'peer low' flag where its peer ran far below its engine's records of the same model, device and depth
  in the journal at `path` (default the user's), as it is written there."""
  return flagged([*read(path), record])[-1] if isinstance(record.get("peer"), dict) else record

def flagged(records: list[dict]) -> list[dict]:
  """The records, each bench record's `flags` the ones it was written with and those its spread and its peer, against
  the others here, call for now."""
  peers = defaultdict(list)
  for r in records:
    if is_bench(r) and isinstance(r.get("peer"), dict) and number(r["peer"].get("tok_s")): peers[_peer_key(r)].append(r)
  out = []
  for r in records:
    if not is_bench(r): out.append(r); continue
    others = [o["peer"]["tok_s"] for o in peers.get(_peer_key(r), []) if o is not r] if isinstance(r.get("peer"), dict) else []
    flags = list(dict.fromkeys([*r.get("flags", []), *spread_flags(r), *peer_flags(r, others)]))
    out.append({**r, "flags": flags} if flags else r)
  return out

def read(path: os.PathLike | None = None) -> list[dict[str, Any]]:
  """The records of the journal at `path` (default the user's), each bench record `upgraded` to today's keys and
  `flagged`; none where it does not exist yet."""
  path = Path(path) if path is not None else user_journal()
  if not path.exists(): return []
  records = []
  for n, line in enumerate(Path(path).read_text().splitlines(), 1):
    if not line.strip(): continue
    try: records.append(upgraded(json.loads(line)))
    except json.JSONDecodeError as e: raise ValueError(f"{path}:{n}: not a journal record ({e.msg})") from None
  return flagged(records)
