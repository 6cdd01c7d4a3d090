"""The real models against llama.cpp, through `tinyzoo logits` with its defaults, one process per model: every prompt of
../shared/references and the fixtures made here by tests/models/fixtures/make_logits_fixtures.py.

Acceptance: identical token ids, top-20 overlap >= 15, identical argmax at the last prompt position, first 4 greedy
tokens equal. `logits` rounds as llama.cpp does by default (--rounding ggml), and every case of ../shared/references
is held to that strictly. For the fixtures one measured exception remains: two llama.cpp builds (the one here and the
one behind ../shared/references) differ by up to 0.4 in a logit, so where llama.cpp's own top-two margin at a step is
below NOISE, either token is a faithful answer; the comparison of that case stops at such a step, since the texts may
then part."""
import json
import subprocess
import sys
from pathlib import Path
import pytest

NOISE = 0.4
REFERENCES = Path(__file__).resolve().parents[2].parent / "shared" / "references"
FIXTURES = Path(__file__).with_name("fixtures") / "logits_llama_cpp.json"
MODELS = ("smollm2-135m", "gemma3-270m")

def expected_cases(model: str) -> list[dict]:
  fixtures = json.loads(FIXTURES.read_text())["models"][model]
  margins = {c["prompt"]: c["greedy_margins"] for c in fixtures}
  shared = [{"prompt": c["prompt"], "tokens": c["tokens"], "top20": c["top20"], "greedy": c["greedy16"][:8], "greedy_margins": margins[c["prompt"]],
             "source": "shared/references"} for c in json.loads((REFERENCES / f"{model}.json").read_text())["cases"]] if REFERENCES.exists() else []
  return shared + [{**c, "source": "fixture"} for c in fixtures]

def disagreements(want: dict, have: dict) -> list[str]:
  where = f"{want['source']}: {want['prompt']!r}"
  if have["tokens"] != want["tokens"]: return [f"{where}: tokens {have['tokens']} vs {want['tokens']}"]
  problems = []
  if (overlap := len({t for t, _ in have["top"]} & {t for t, _ in want["top20"]})) < 15: problems.append(f"{where}: top-20 overlap {overlap}")
  tolerance = 0 if want["source"] == "shared/references" else NOISE
  for step, (ours, theirs, margin) in enumerate(zip(have["greedy"], want["greedy"][:4], want["greedy_margins"])):
    if ours == theirs: continue
    if margin >= tolerance: problems.append(f"{where}: greedy step {step} gives {ours}, llama.cpp {theirs} by a margin of {margin:.2f}")
    break
  return problems

@pytest.mark.parametrize("model", MODELS)
def test_agrees_with_llama_cpp(model: str):
  expected = expected_cases(model)
  args = [a for c in expected for a in ("-p", c["prompt"])]
  r = subprocess.run([sys.executable, "-m", "tinyzoo", "logits", model, *args, "--top", "20", "--greedy", "4", "--json"],
                     capture_output=True, text=True, timeout=1800)
  assert r.returncode == 0, r.stderr
  got = json.loads(r.stdout)["cases"]
  assert len(got) == len(expected) and all(h["top"][0][0] == h["greedy"][0] for h in got)
  problems = [p for want, have in zip(expected, got) for p in disagreements(want, have)]
  assert not problems, "\n".join(problems)
