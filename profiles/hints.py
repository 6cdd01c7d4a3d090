"""Kernel hints: the switches that change which kernels a model runs, each resolved by one fixed priority:

  runtime   command-line flags, or the environment's TINYZOO_HINTS="name=value;..." (the flags win)
  profile   this device's profile, profiles/<device>.yaml, under `hints:`
  manifest  the model file's metadata, `tinyzoo.hints.<name>` (written by `tinyzoo convert --hints`)
  default   built in

`resolve` gives every hint its value and the source it came from; bench, run, profile and exp build models from the
resolved hints, and journal records store them.
"""
import os
from dataclasses import dataclass
from typing import Any, Callable
from ops.attention import LAYOUTS as KV_LAYOUTS, SOFTMAXES, VARIANTS as ATTENTION_VARIANTS
from ops.norm import NORMS
from ops.topk import TOPK_ALGORITHMS
from quant.gguf_file import GGUFFile
from quant.linear import StrategyPlan
from quant.matvec_opts import DEFAULT_ROW_UPCAST

SOURCES = ("runtime", "profile", "manifest", "default")
ENV = "TINYZOO_HINTS"
MANIFEST_PREFIX = "tinyzoo.hints."

def _bool(v: Any) -> bool:
  if isinstance(v, bool): return v
  if (s := str(v).strip().lower()) in ("1", "true", "yes", "on"): return True
  if s in ("0", "false", "no", "off"): return False
  raise ValueError(f"{v!r} is not true or false")

def _count(v: Any) -> int:
  if isinstance(v, bool) or not str(v).strip().isdigit(): raise ValueError(f"{v!r} is not a whole number >= 0")
  return int(v)

def _row_upcast(v: Any) -> int:
  if (n := _count(v)) & (n - 1): raise ValueError(f"{n} is neither 0 nor a power of two")
  return n

def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
  def parse(v: Any) -> str:
    if v not in choices: raise ValueError(f"{v!r} is not one of {', '.join(choices)}")
    return v
  return parse

def _strategy(v: Any) -> str: return StrategyPlan.parse(str(v)).spec()

@dataclass(frozen=True)
class Hint:
  default: Any
  parse: Callable[[Any], Any]   # a value as written (str from YAML, metadata or the environment) -> the value, or ValueError
  help: str

HINTS: dict[str, Hint] = {
  "strategy": Hint("packed_dot", _strategy, "how matmuls read packed weights, per GGML type or FFN (quant/linear.py)"),
  "topk": Hint("pairwise", _one_of(TOPK_ALGORITHMS), "MoE routing's top-k: pairwise ranks or tinygrad's sort"),
  "fuse": Hint(True, _bool, "q/k/v and gate/up as one matmul per GGML type"),
  "norm": Hint("fused", _one_of(NORMS), "how matmuls read an RMS norm: fused (computed inside, its squares summed first), break (realized "
               "first), single (realized by one kernel) or fold (its squares summed inside the matvecs)"),
  "act_break": Hint(True, _bool, "the FFN activation realized before the down matmul"),
  "act_in_matmul": Hint(False, _bool, "the realized FFN activation computed by the kernel of gate and up's joined matmul, as a product "
                        "over each gate and up row pair (one kernel fewer a dense FFN in a decode step; with act_break, where gate and up "
                        "are one matmul)"),
  "attention": Hint("chunked", _one_of(ATTENTION_VARIANTS), "which KV cache positions attention reads: the chunks that hold valid ones (chunked) or "
                    "every chunk allocated, masked (whole: the same static shapes at every position, each step reading the whole cache)"),
  "kv_layout": Hint("heads", _one_of(KV_LAYOUTS), "the KV cache per kv head, written by a kernel of its own (heads), or one row per position "
                    "holding its q, k and v projections as their joined matmul writes them (rows: one kernel fewer a block; k rotated where "
                    "read; where q, k and v are one matmul into a float32 cache without q/k norms, else heads)"),
  "softmax": Hint("max", _one_of(SOFTMAXES), "attention's softmax stabilizer in a decode step: the logits' max (a kernel of its own) or each "
                  "query's logit of its own key plus a margin (self: summed in the logits kernel, one kernel fewer a block; exact unless a "
                  "logit exceeds the query's own by about 130; not with sinks or a soft cap)"),
  "row_upcast": Hint(DEFAULT_ROW_UPCAST, _row_upcast, "CPU matvec rows computed at once (0: tinygrad's heuristic)"),
  "jit_batch_size": Hint(32, _count, "kernels per graph batch on backends with graphs"),
  "beam": Hint(0, _count, "tinygrad's BEAM search width for the captured kernels (0: hand-coded heuristics)"),
  "pdl": Hint(False, _bool, "programmatic dependent launch in CUDA graphs (sm_90 and later): each kernel lets the next one launch once its "
              "workgroups have started and waits on entry for the ones before it, so that a kernel's launch and start overlap the tail "
              "of the one before (ops/cuda_graph.py; slower on the H100 so far)"),
  "pdl_prefetch": Hint(False, _bool, "with pdl: before it waits, each workgroup of a kernel asks the L2 for its share of every buffer the "
                       "kernel reads at places its launch fixes (a matvec's weight; not gathers, not kernels with variables), so that it "
                       "streams in during the tail of the kernel before (ops/cuda_graph.py)"),
}

def check(name: str, value: Any) -> Any:
  """The value of hint `name` as written; ValueError for an unknown name or a bad value."""
  if name not in HINTS: raise ValueError(f"unknown hint {name!r} (known: {', '.join(HINTS)})")
  try: return HINTS[name].parse(value)
  except ValueError as e: raise ValueError(f"hint {name}: {e}") from None

@dataclass(frozen=True)
class Hints:
  values: dict[str, Any]
  sources: dict[str, str]

  def __getitem__(self, name: str) -> Any: return self.values[name]

  def as_dict(self) -> dict[str, dict[str, Any]]:
    """{name: {"value": ..., "source": ...}}, as `tinyzoo hints --json` prints it and journal records store it."""
    return {n: {"value": self.values[n], "source": self.sources[n]} for n in HINTS}

def resolve(runtime: dict[str, Any] | None = None, profile: dict[str, Any] | None = None, manifest: dict[str, Any] | None = None) -> Hints:
  """Each hint from the first source that sets it: runtime, profile, manifest, else its default (every value checked)."""
  values, sources = {}, {}
  for name, hint in HINTS.items():
    source, value = next(((s, layer[name]) for s, layer in zip(SOURCES, (runtime, profile, manifest)) if layer and name in layer),
                         ("default", hint.default))
    values[name], sources[name] = check(name, value), source
  return Hints(values, sources)

def parse(spec: str, where: str) -> dict[str, Any]:
  """Hints written "name=value;..." (items apart by ';': a strategy spec has commas), checked; `where` names them in errors."""
  out = {}
  for item in filter(None, (i.strip() for i in spec.split(";"))):
    name, eq, value = item.partition("=")
    if not eq: raise ValueError(f"{where}: {item!r} is not name=value")
    try: out[name.strip()] = check(name.strip(), value.strip())
    except ValueError as e: raise ValueError(f"{where}: {e}") from None
  return out

def from_env(environ: os._Environ | dict = os.environ) -> dict[str, Any]:
  """The runtime hints of TINYZOO_HINTS="name=value;..."."""
  return parse(environ.get(ENV, ""), ENV)

def from_manifest(g: GGUFFile) -> dict[str, Any]:
  """The hints a model file's metadata carries (`tinyzoo.hints.<name>`), checked."""
  out = {}
  for key in (k for k in g.keys() if k.startswith(MANIFEST_PREFIX)):
    try: out[key.removeprefix(MANIFEST_PREFIX)] = check(key.removeprefix(MANIFEST_PREFIX), g.get(key))
    except ValueError as e: raise ValueError(f"{g.path}: metadata {key}: {e}") from None
  return out
