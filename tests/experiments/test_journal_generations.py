"""Records of every generation: an old bench record reads in today's terms (its keys filled with the meaning they had),
a current one as it is; the project's journal holds both; a reader that goes away (`| head`) ends the output quietly."""
import subprocess
import sys
from experiments import journal

OLD = {"time": "2026-11-01T10:00:00+00:00", "model": "m", "prompt_tokens": 32,
       "metrics": {"tok_s": 5.0, "kernels_per_token": 427, "prefill_tok_s": 13.0},
       "peer": {"engine": "llama.cpp", "tok_s": 60.0, "prefill_tok_s": 150.0}}
CURRENT = {"time": "2026-12-01T10:00:00+00:00", "model": "m", "prompt_tokens": 1, "flags": ["noisy: tinyzoo tok_s 5.0 ± 0.4"],
           "metrics": {"tok_s": 5.0, "tok_s_sd": 0.4, "kernels_per_token": 427, "depth": 0, "pp_tok_s": 90.0, "pp_tok_s_sd": 1.0, "pp_tokens": 512,
                       "repeats": 3},
           "peer": {"engine": "llama.cpp", "tok_s": 60.0, "tok_s_sd": 0.5, "pp_tok_s": 400.0, "pp_tok_s_sd": 3.0, "pp_tokens": 512}}

def test_an_old_record_takes_its_old_meaning():
  """Before --depth the decode followed the prompt (depth = prompt_tokens); before --pp prompt processing was that
  prompt's prefill (pp_tok_s = prefill_tok_s, of prompt_tokens tokens), the peer's likewise; `upgraded` names them."""
  up = journal.upgraded(OLD)
  assert (up["metrics"]["depth"], up["metrics"]["pp_tok_s"], up["metrics"]["pp_tokens"], up["peer"]["pp_tok_s"]) == (32, 13.0, 32, 150.0)
  assert up["upgraded"] == ["depth", "pp_tok_s", "peer.pp_tok_s"] and "depth" not in OLD["metrics"]   # the record read is not changed

def test_a_current_record_is_unchanged():
  assert journal.upgraded(CURRENT) == CURRENT
  matvec = {"kind": "gemv", "metrics": {"gb_s": 100.0}}
  assert journal.upgraded(matvec) is matvec

def test_the_projects_journal_holds_every_generation():
  benches = [r for r in journal.read(journal.PROJECT_JOURNAL) if journal.is_bench(r)]
  assert any("upgraded" in r for r in benches) and any("upgraded" not in r for r in benches)
  assert all(isinstance(r["metrics"].get("depth"), int) for r in benches)

def test_a_closed_pipe_ends_quietly():
  """`tinyzoo exp list | head -1`, its reader gone before it writes: no traceback, the exit of a Unix tool."""
  proc = subprocess.Popen([sys.executable, "-c", "import sys; from tinyzoo import main; sys.exit(main(['exp', 'list']))"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()
  _, err = proc.communicate(timeout=120)
  assert err == b"" and proc.returncode in (0, 141)
