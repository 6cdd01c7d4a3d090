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

def test_a_users_runs_go_to_their_own_journal(tmp_path: Path, monkeypatch):
  """$TINYZOO_JOURNAL, else the user data directory; the project's journal (results/journal.jsonl, in the checkout) only
  when a command is given it."""
  monkeypatch.delenv("TINYZOO_JOURNAL", raising=False)
  assert journal.user_journal({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "tinyzoo" / "journal.jsonl"
  assert journal.user_journal({"TINYZOO_JOURNAL": "~/j.jsonl", "XDG_DATA_HOME": "/x"}) == Path("~/j.jsonl").expanduser()
  assert journal.user_journal({}) == Path.home() / ".local" / "share" / "tinyzoo" / "journal.jsonl"
  assert journal.PROJECT_JOURNAL == Path(__file__).resolve().parents[2] / "results" / "journal.jsonl"
  monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
  assert journal.read() == [] and journal.append({"a": 1}) == tmp_path / "data" / "tinyzoo" / "journal.jsonl"
  assert journal.read() == [{"a": 1}]

def test_bench_and_plot_use_the_users_journal(tmp_path: Path, monkeypatch, capsys):
  from tinyzoo.cli import main
  monkeypatch.setenv("TINYZOO_JOURNAL", str(mine := tmp_path / "mine.jsonl"))
  project = journal.PROJECT_JOURNAL.read_bytes()
  assert main(["bench", "smollm2-135m-tiny", "--tokens", "2", "--warmup", "0", "--prompt-tokens", "2", "--pp", "4", "--no-peer",
               "--bandwidth", "1", "--kept-programs"]) == 0
  assert main(["bench", "smollm2-135m-tiny", "--tokens", "2", "--warmup", "0", "--depth", "0,3", "--pp", "4", "--no-peer", "--bandwidth", "1",
               "--kept-programs", "--journal", str(other := tmp_path / "other.jsonl")]) == 0
  assert [r["model"] for r in journal.read(mine)] == ["smollm2-135m-tiny"]
  # a record per depth, from one run: depth 0 decodes from the first position, after the one token it starts from
  theirs = journal.read(other)
  assert [(r["metrics"]["depth"], r["prompt_tokens"]) for r in theirs] == [(0, 1), (3, 3)] and len({r["metrics"]["pp_tok_s"] for r in theirs}) == 1
  assert journal.PROJECT_JOURNAL.read_bytes() == project
  assert main(["plot", "--kind", "history", "-o", str(tmp_path / "h.png")]) == 0 and (tmp_path / "h.png").exists()
  monkeypatch.setenv("TINYZOO_JOURNAL", str(tmp_path / "none.jsonl"))
  capsys.readouterr()
  assert main(["plot", "-o", str(tmp_path / "k.png")]) == 1
  assert f"none.jsonl: no journal records (the project's are in {journal.PROJECT_JOURNAL})" in capsys.readouterr().err

def _rec(run: str, time: str, model: str = "m", device: str = "d", variant: str = "v", **extra) -> dict:
  return {"experiment": "e", "run": run, "time": time, "model": model, "device": device, "variant": variant, "metrics": {"tok_s": 1.0}, **extra}

def test_latest_runs_the_newest_run_per_device_and_model():
  """A run is as new as its newest record, whatever order the journal holds them in; each (device, model) keeps its own."""
  older = [_rec("a", "2026-12-01T10:00:00+00:00"), _rec("a", "2026-12-01T12:00:00+00:00", variant="w")]
  newer = _rec("b", "2026-12-01T11:00:00+00:00")
  other = _rec("c", "2026-12-01T09:00:00+00:00", model="n")
  latest = journal.latest_runs([older[0], newer, older[1], other, _rec("x", "2026-12-02T00:00:00+00:00") | {"experiment": "f"}], "e")
  assert latest == {("e", "d", "m"): older, ("e", "d", "n"): [other]}

def test_latest_runs_a_tie_goes_to_the_run_written_last():
  same = "2026-12-01T10:00:00+00:00"
  first, second = _rec("a", same), _rec("b", same)
  assert journal.latest_runs([first, second])[("e", "d", "m")] == [second]
  assert journal.latest_runs([second, first])[("e", "d", "m")] == [first]

def test_latest_runs_a_run_keep_refuses_leaves_the_one_before():
  judged, partial = _rec("a", "2026-12-01T10:00:00+00:00", baseline=True), _rec("b", "2026-12-01T11:00:00+00:00")
  assert journal.latest_runs([judged, partial], keep=lambda run: any(r.get("baseline") for r in run))[("e", "d", "m")] == [judged]
  assert journal.latest_runs([{"experiment": "e", "kind": "gemv", "metrics": {"tok_s": 1.0}}]) == {}   # not a bench record
