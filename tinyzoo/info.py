"""`tinyzoo info`: what a GGUF file holds, from its metadata and tensor directory alone."""
import os
from collections import defaultdict
from quant.gguf_file import GGUFFile
from quant.formats import FORMATS

TOKENIZER_KINDS = {"llama": "SentencePiece", "gpt2": "byte-level BPE", "bert": "WordPiece", "t5": "Unigram", "rwkv": "RWKV"}

def _value(v) -> str:
  if isinstance(v, list): return f"[{', '.join(map(str, v[:8]))}{', ...' if len(v) > 8 else ''}] ({len(v)})"
  return f"{v:g}" if isinstance(v, float) else str(v)

def _table(rows: list[tuple], header: tuple) -> list[str]:
  widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
  fmt = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
  return [fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, rows)]

def describe(g: GGUFFile) -> str:
  arch = g.architecture
  lines = [f"file          {g.path} ({os.path.getsize(g.path):,} bytes)",
           f"architecture  {arch}" + (f"  ({name})" if (name := g.get("general.name")) else "")]
  lines += ["", "hyperparameters"] + [f"  {k[len(arch) + 1:]:<36} {_value(g.get(k))}" for k in g.keys() if k.startswith(arch + ".")]
  kind = g.get("tokenizer.ggml.model")
  tok = f"{kind} ({TOKENIZER_KINDS.get(kind, 'unknown kind')}), {g.array_len('tokenizer.ggml.tokens'):,} tokens" if kind else "none in the file"
  if (pre := g.get("tokenizer.ggml.pre")): tok += f", pre-tokenizer {pre}"
  specials = [f"{s} {g.get(f'tokenizer.ggml.{s}_token_id')}" for s in ("bos", "eos", "padding") if f"tokenizer.ggml.{s}_token_id" in g]
  lines += ["", f"tokenizer     {tok}" + (f"; {', '.join(specials)}" if specials else "")]
  count, nbytes = defaultdict(int), defaultdict(int)
  for t in g.tensors.values(): count[t.ggml_type] += 1; nbytes[t.ggml_type] += t.nbytes
  rows = [(t.name + ("" if t in FORMATS else " (unsupported)"), count[t], f"{nbytes[t]:,}") for t in sorted(count, key=lambda t: -nbytes[t])]
  rows.append(("total", len(g.tensors), f"{sum(nbytes.values()):,}"))
  return "\n".join(lines + ["", *_table(rows, ("type", "tensors", "bytes"))])
