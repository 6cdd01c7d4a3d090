"""`tinyzoo run` (stream a generation) and `tinyzoo logits` (top logits and greedy tokens as JSON)."""
import argparse
import json
import os
import sys
import time
import numpy as np
from models.catalog import resolve_model
from models.config import ModelConfig
from models.jit_cache import JitStore
from models.runtime import ALL_JITS, Runtime, Timing
from models.tokenizer import Tokenizer
from ops.sampling import Sampler, SamplerParams
from quant.gguf_file import GGUFFile

def load(args, longest: int | None = None) -> Runtime:
  """The model built from its resolved kernel hints, with the JITs earlier runs kept unless --no-cache. `longest`: the
  longest prompt the run will take, where it is known before loading; a prompt chunk no flag, profile or manifest sets
  is then sized to it (a power of two of at least 16 rows, at most the default), since a short prompt padded to a whole
  chunk pays for every row."""
  from tinyzoo.cli import model_hints
  hints = model_hints(args, path := resolve_model(args.model))
  if longest is not None and hints.sources["prefill_chunk"] == "default":
    hints = hints.with_runtime(prefill_chunk=min(hints.prefill_chunk, max(16, 1 << (longest - 1).bit_length())))
  return Runtime(path, hints, args.ctx, progress=sys.stderr.isatty(), jits=None if args.no_cache else JitStore(), keep_programs=not args.no_cache)

def keep(rt: Runtime, sampler: Sampler | None = None) -> None:
  """Stores the JITs this run captured, saying what could not be kept or was rebuilt."""
  rt.keep_jits(sampler)
  for note in rt.jits.notes if rt.jits else []: print(note, file=sys.stderr)

def prompt_ids(rt: Runtime, prompt: str, chat: bool) -> list[int]:
  return rt.tokenizer.encode_chat([{"role": "user", "content": prompt}]) if chat else rt.tokenizer.encode(prompt)

def cmd_run(args) -> None:
  params = SamplerParams(args.temperature, args.top_k, args.top_p, args.repeat_penalty)
  if args.n < 1: raise ValueError(f"-n must be at least 1, got {args.n}")
  t0 = time.perf_counter()
  rt = load(args)
  sampler = Sampler(params, args.seed)
  rt.restore_sampler(sampler)
  loaded = time.perf_counter()
  load_s, from_cache, first_s = loaded - t0, len(rt.cached), None
  ids = prompt_ids(rt, args.prompt, args.chat)
  rt.check_fits(len(ids), args.n)
  compile_s = rt.warm_up(sampler, progress=sys.stderr.isatty())
  timing, stream = Timing(), rt.tokenizer.stream()
  sys.stdout.write(args.prompt if not args.chat else "")
  for token in rt.generate(ids, args.n, sampler, timing):
    if first_s is None: first_s = time.perf_counter() - loaded
    sys.stdout.write(stream.add(token))
    sys.stdout.flush()
  sys.stdout.write(stream.flush() + "\n")
  sys.stdout.flush()
  keep(rt, sampler)
  prompt_rate = timing.prompt_tokens / timing.prompt_s if timing.prompt_s else 0.0
  decode_rate = f"{timing.decoded / timing.decode_s:.1f} tok/s" if timing.decoded else "n/a"
  cached = f" ({from_cache} of {len(ALL_JITS)} JITs from the cache)" if rt.jits is not None else " (--no-cache)"
  print(f"load {load_s:.1f} s | compile {compile_s:.1f} s{cached} | first token {first_s:.2f} s after loading | prompt {timing.prompt_tokens} tokens "
        f"at {prompt_rate:.1f} tok/s | decode {timing.decoded} tokens at {decode_rate} | {timing.kernels_per_token} kernels/token", file=sys.stderr)

def cmd_logits(args) -> None:
  if not args.cases: raise ValueError("give at least one -p PROMPT or --tokens IDS")
  g = GGUFFile(resolve_model(args.model))
  tokenizer, vocab_size = Tokenizer.from_gguf(g), ModelConfig.from_gguf(g).vocab_size
  prompts = [tokenizer.encode(value) if kind == "prompt" else parse_ids(value, vocab_size) for kind, value in args.cases]
  rt = load(args, max(map(len, prompts)))
  greedy = Sampler(SamplerParams(temperature=0, repeat_penalty=1.0))
  cases = []
  for (kind, value), ids in zip(args.cases, prompts):
    rt.check_fits(len(ids), args.greedy)
    logits = rt.prefill(ids)
    values = logits.numpy()[0]
    top = np.argsort(-values, kind="stable")[:args.top].tolist()
    tokens = list(rt.continue_from(logits, len(ids), args.greedy, greedy)) if args.greedy else []
    cases.append({"prompt": value if kind == "prompt" else None, "tokens": ids, "top": [[i, float(values[i])] for i in top], "greedy": tokens})
  keep(rt)
  if args.json: print(json.dumps({"cases": cases}))
  else:
    for c in cases:
      top = ", ".join(f"{i} {v:.3f}" for i, v in c["top"][:10])
      print(f"{c['prompt']!r} -> {len(c['tokens'])} tokens; top: {top}; greedy: {c['greedy']}")

def parse_ids(text: str, vocab_size: int) -> list[int]:
  try: ids = [int(t) for t in text.replace(" ", "").split(",") if t]
  except ValueError: raise ValueError(f"--tokens takes comma-separated integers, got {text!r}") from None
  if not ids or not all(0 <= i < vocab_size for i in ids): raise ValueError(f"--tokens needs ids in [0, {vocab_size}), got {text!r}")
  return ids

def cmd_perplexity(args) -> None:
  from experiments.quality import DEFAULT_TEXT, BaseWriter, SavedBase, measure, model_windows, read_text, scored_rows
  text_path = args.file or DEFAULT_TEXT
  if args.file is None and not DEFAULT_TEXT.exists(): raise ValueError(f"no -f TEXT given and no default text at {DEFAULT_TEXT}")
  text = read_text(text_path)
  rt = load(args, args.ctx)
  w = model_windows(rt.tokenizer, text, args.ctx, args.chunks, str(text_path))
  base = None
  if args.kl_divergence is not None:
    if args.kl_divergence.endswith(".gguf") or not os.path.isfile(args.kl_divergence):
      other = load(argparse.Namespace(**{**vars(args), "model": args.kl_divergence}), args.ctx)
      if other.cfg.vocab_size != rt.cfg.vocab_size or other.tokenizer.encode(text) != list(w.tokens):
        raise ValueError(f"{args.kl_divergence} is not the same model's vocabulary: it tokenizes the text otherwise")
      base = lambda i: scored_rows(other.logprobs, w, i)
    else:
      saved = SavedBase(args.kl_divergence)
      saved.check(w, rt.cfg.vocab_size)
      base = lambda i: saved.rows[i]
  save = BaseWriter(args.save_base, w, rt.cfg.vocab_size, os.path.basename(rt.path)) if args.save_base else None
  q = measure(rt.logprobs, w, base, save, progress=sys.stderr.isatty())
  keep(rt)
  print(json.dumps(q.summary()) if args.json else q.line())
