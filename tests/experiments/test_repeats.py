"""Repeats and their spread, as llama-bench's -r: a mean ± sd whose spread is large is flagged noisy, and a peer far below
its engine's other records of the same model, device and depth is flagged low, in the record as it is journaled and in
every record read back, old ones too."""
import json
from pathlib import Path
import pytest
from experiments import journal
from experiments.bench import table
from tinyzoo.cli import main

def record(tok_s: float = 100.0, sd: float | None = 1.0, peer: float | None = 80.0, depth: int = 0, **extra) -> dict:
  m = {"tok_s": tok_s, "pp_tok_s": 1000.0, "depth": depth, "pp_tokens": 512, "kernels_per_token": 40, "floor_ms": 0.1,
       "ms_per_token": {"median": 1e3 / tok_s, "min": 9.0, "max": 11.0}}
  if sd is not None: m |= {"tok_s_sd": sd, "pp_tok_s_sd": 5.0}
  r = {"model": "m", "device": "CPU: X, 2 cores", "switches": {}, "prompt_tokens": max(depth, 1), "metrics": m, **extra}
  if peer is not None:
    r["peer"] = {"engine": "llama.cpp (llama-cpp-python 0.3.36, 2 threads)", "tok_s": peer, "pp_tok_s": 900.0}
    r["peers"] = [r["peer"]]
  return r

def test_a_spread_over_five_percent_is_noisy():
  assert journal.spread_flags(record(sd=4.9)) == []
  (flag,) = journal.spread_flags(record(sd=5.1))
  assert flag.startswith("noisy: tinyzoo tok_s 100.0 ± 5.1")
  assert journal.spread_flags(record(sd=None)) == []   # an old record's spread is unknown, not small
  noisy_peer = record()
  noisy_peer["peer"] |= {"tok_s_sd": 9.0}
  assert journal.spread_flags(noisy_peer) == ["noisy: peer tok_s 80.0 ± 9.0, sd over 5% of the mean"]

def test_a_peer_far_below_its_others_is_low():
  assert journal.peer_flags(record(peer=30.0), [80.0, 84.0, 90.0])[0].startswith("peer low: 30.00 tok/s against a median of 84.00 in 3")
  assert journal.peer_flags(record(peer=50.0), [80.0, 84.0, 90.0]) == []
  assert journal.peer_flags(record(peer=3.0), [80.0]) == []   # one other record says nothing of what is usual

def test_a_journaled_record_is_flagged_against_the_journal_it_joins(tmp_path: Path):
  path = tmp_path / "j.jsonl"
  for tok_s in (80.0, 82.0, 79.0): journal.append(record(peer=tok_s), path)
  journal.append(record(peer=81.0, depth=4096), path)
  assert "flags" not in journal.with_peer_flags(record(peer=78.0), path)
  low = journal.with_peer_flags(record(peer=2.0), path)
  assert low["flags"][0].startswith("peer low: 2.00 tok/s against a median of 80.00 in 3")
  assert "flags" not in journal.with_peer_flags(record(peer=2.0, depth=8), path)   # no record at that depth to compare with

def test_old_records_are_flagged_as_they_are_read_and_peer_names_upgraded(tmp_path: Path):
  path = tmp_path / "j.jsonl"
  old = {**record(peer=None, sd=None), "peer": {"engine": "llama.cpp (llama-bench abc)", "tok_s": 900.0, "tok_s_stddev": 90.0,
                                                 "prefill_tok_s": 40000.0}}
  del old["metrics"]["depth"]
  path.write_text(json.dumps(old) + "\n")
  (r,) = journal.read(path)
  assert r["metrics"]["depth"] == 1 and r["peer"]["tok_s_sd"] == 90.0 and r["peer"]["pp_tok_s"] == 40000.0
  assert r["flags"] == ["noisy: peer tok_s 900.0 ± 90.0, sd over 5% of the mean"]

def test_the_committed_journals_busy_machine_peers_are_flagged():
  low = [r for r in journal.read(journal.PROJECT_JOURNAL) if any(f.startswith("peer low") for f in r.get("flags", []))]
  assert {0.87, 1.54, 3.24} <= {r["peer"]["tok_s"] for r in low}   # llama.cpp on a 2-core CPU that runs it at 37-70 tok/s

def test_tables_print_mean_and_sd_and_mark_flags():
  rows = table(journal.flagged([record(sd=20.0), record(sd=None, peer=None)])).splitlines()
  assert "100.00 ± 20.00 @d0" in rows[2] and "1000.0 ± 5.0 (pp512)" in rows[2] and rows[2].startswith("| m !")
  assert "100.00 @d0" in rows[3] and "±" not in rows[3]
  assert rows[-1] == "! m @d0: noisy: tinyzoo tok_s 100.0 ± 20.0, sd over 5% of the mean"

@pytest.mark.parametrize("argv", [["bench", "smollm2-135m-tiny", "-r", "0", "--no-journal"], ["exp", "run", "isolation", "-r", "0", "--no-journal"]])
def test_no_repeats_is_one_line(argv: list[str], capsys):
  assert main(argv) == 1
  err = capsys.readouterr().err
  assert err == "tinyzoo: error: --repeats must be at least 1, got 0\n"
