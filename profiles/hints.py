"""Kernel hints: every switch that changes which kernels a model runs, each resolved by one fixed priority:

  runtime   command-line flags, or the environment's TINYZOO_HINTS="name=value;..." (the flags win), or an experiment's switches
  profile   this device's profile, profiles/<device>.yaml, under `hints:` (and `architectures:`)
  manifest  the model file's metadata, `tinyzoo.hints.<name>` (written by `tinyzoo convert --hints`)
  heuristic the hint's rule, from what the machine offers and the model's shapes (profiles/machine.py), with its reason
  default   built in

`resolve` gives every hint its value and the source it came from, as one frozen `Hints` that is passed whole from the
command line to the runtime, the weights and the blocks that read it; bench records store it. A hint is its entry in
HINTS plus the code that reads it: the flags, `tinyzoo hints`, experiment switches and records all follow HINTS.
Hints marked `run_only` (rounding, skip: they change results or the model, not only speed) are set at run time only.
"""
import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
from tinygrad import Device
from tinygrad.helpers import BEAM, JIT_BATCH_SIZE
from ops.cuda import ATTENTIONS, CACHE_READERS, GEMM_TILE_ROWS, GEMMS, MIN_CAPABILITY
from ops.attention import CHUNK, LAYOUTS as KV_LAYOUTS, SOFTMAXES, VARIANTS as ATTENTION_VARIANTS
from ops.mla import PREFILL_FORMS as MLA_PREFILL_FORMS
from ops.norm import NORMS
from ops.topk import TOPK_ALGORITHMS
from profiles.machine import Machine, Shapes
from quant.activations import ROUNDINGS
from quant.gguf_file import GGUFFile
from quant.linear import PREFILL_MATMULS, STRATEGIES, StrategyPlan
from quant.matvec_opts import DEFAULT_ROW_UPCAST

SOURCES = ("runtime", "profile", "manifest", "heuristic", "default")
ENV = "TINYZOO_HINTS"
MANIFEST_PREFIX = "tinyzoo.hints."
# component isolation: blocks leave attention or the FFN out of the residual stream, MoE blocks their shared experts or the
# routing's choice of experts (every token takes the first k)
SKIPPABLE = ("attention", "ffn", "shared_expert", "topk")
CASTS = ("keep", "drop")   # the float32 upcasts where fp16 operands are multiplied and summed

def _bool(v: Any) -> bool:
  if isinstance(v, bool): return v
  if (s := str(v).strip().lower()) in ("1", "true", "yes", "on"): return True
  if s in ("0", "false", "no", "off"): return False
  raise ValueError(f"{v!r} is not true or false")

def _count(v: Any) -> int:
  if isinstance(v, bool) or not str(v).strip().isdigit(): raise ValueError(f"{v!r} is not a whole number >= 0")
  return int(v)

def _positive(v: Any) -> int:
  if (n := _count(v)) < 1: raise ValueError(f"{n} is not a whole number >= 1")
  return n

def _on_cpu() -> bool: return Device.DEFAULT == "CPU"

def _row_upcast(v: Any) -> int:
  if (n := _count(v)) & (n - 1): raise ValueError(f"{n} is neither 0 nor a power of two")
  return n

def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
  def parse(v: Any) -> str:
    if v not in choices: raise ValueError(f"{v!r} is not one of {', '.join(choices)}")
    return v
  return parse

def _strategy(v: Any) -> str: return StrategyPlan.parse(str(v)).spec()

def _components(v: Any) -> tuple[str, ...]:
  parts = [p.strip() for p in (v.split(",") if isinstance(v, str) else v) if p.strip()]
  if (bad := [p for p in parts if p not in SKIPPABLE]): raise ValueError(f"cannot skip {bad[0]!r} (choose from {', '.join(SKIPPABLE)})")
  return tuple(dict.fromkeys(parts))

# a hint's built-in rule: its value for a machine and a model's shapes (None where resolved without a model), with the
# reason, or None where the default stands
Rule = Callable[[Machine, Shapes | None], tuple[Any, str] | None]

GPU_PREFILL_CHUNK = 512   # a GPU's prompt chunk by default (prefill_chunk)

VNNI = ("avx512_vnni", "avx_vnni")   # quant/int8_cpu.py's paths of a dot-product instruction (AVX2's takes two)

def _int8_where_cpu_dots(m: Machine, shapes: Shapes | None) -> tuple[str, str] | None:
  """int8_dot on a CPU with VNNI's int8 dot products: activations quantized to 8 bits once, 32 products summed in
  integers an instruction (llama.cpp's CPU path), where float dot products over the unpacked weights take longer. AVX2
  alone keeps the default, which a tune on such a CPU chose (the journal has both)."""
  if m.on_cpu and m.cpu_simd in VNNI: return "int8_dot", f"the CPU has {m.cpu_simd} int8 dot products (quant/int8_cpu.py)"
  return None

# the cache elements a split-KV part holds, about: the parts tuned on the H100 (4 chunks for llama's and gpt-oss's 1,024
# elements a position, 8 for gemma3's 512 and deepseek2's 576) are 2^18 give or take two fifths
SPLIT_PART_ELEMENTS = 1 << 18

def _split_on_gpus(m: Machine, shapes: Shapes | None) -> tuple[int, str] | None:
  """On a GPU, a decode step's value sums split into parts of about SPLIT_PART_ELEMENTS cache elements (the power of two
  of chunks nearest that): unsplit, their workgroups are one a head, far fewer than the multiprocessors, and a long
  context is summed by a few of them."""
  if m.on_cpu or shapes is None or (m.multiprocessors is not None and shapes.n_heads >= m.multiprocessors): return None
  chunks = 2 ** round(math.log2(max(1.0, SPLIT_PART_ELEMENTS / (CHUNK * shapes.kv_width))))
  sms = f"{m.multiprocessors} multiprocessors" if m.multiprocessors else "its multiprocessors"
  return chunks, (f"{shapes.n_heads} heads of {shapes.kv_width} cache elements a position: parts of {chunks} chunks of {CHUNK} "
                  f"positions (about {SPLIT_PART_ELEMENTS:,} elements) spread a long context over the GPU's {sms}")

def _tensor_core_gpu(m: Machine) -> bool:
  """A CUDA GPU of compute capability 8.0 or later: mma.sync, ldmatrix and cp.async, which ops/cuda's kernels use."""
  return m.compute_capability is not None and tuple(map(int, m.compute_capability.split("."))) >= MIN_CAPABILITY

def _mma_on_tensor_core_gpus(m: Machine, shapes: Shapes | None) -> tuple[str, str] | None:
  """gemm_mma on a CUDA GPU of compute capability 8.0 or later (mma.sync, ldmatrix, cp.async): it reads Q4_0, Q8_0 and
  MXFP4 words and Q4_K, Q6_K and Q5_0 blocks itself and stages its tiles in shared memory, where tinygrad's tensor-core
  GEMMs, of weights dequantized first, stage none (the gpu-kernels experiment measures both)."""
  if not _tensor_core_gpu(m): return None
  return "mma", f"compute capability {m.compute_capability}: mma.sync tiles staged by cp.async (ops/cuda/gemm_mma.cu)"

def _flash_on_tensor_core_gpus(m: Machine, shapes: Shapes | None) -> tuple[str, str] | None:
  """The flash attention kernels on such a GPU: each block reads a kv head's positions once for all its query heads and
  keeps no score tensor in memory, where tinygrad's kernels of logits, softmax and value sums read the cache again for
  each (the gpu-kernels and latent-decode experiments measure both). They read an fp16 cache of heads (`flash_cache`)."""
  if not _tensor_core_gpu(m): return None
  return "flash", f"compute capability {m.compute_capability}: one read of a kv head's cache for its query heads (ops/cuda)"

def _half_cache_on_tensor_core_gpus(m: Machine, shapes: Shapes | None) -> tuple[str, str] | None:
  """An fp16 KV cache on such a GPU, as llama.cpp's default: the flash kernels read one, and it halves what attention reads."""
  if not _tensor_core_gpu(m): return None
  return "half", f"compute capability {m.compute_capability}: the flash attention kernels read an fp16 cache, half the bytes"

def _expert_tiles_of_the_chunks_rows(m: Machine, shapes: Shapes | None) -> tuple[int, str] | None:
  """On a GPU that runs gemm_mma, a MoE's expert tile of the rows a GPU's chunk gives each expert on average (the
  largest of gemm_mma's tile rows not above it, at least the smallest): a 128-row tile decodes each weight block once for
  four times the rows a 32-row one does, which outweighs the padding of the experts' last tiles where they get that
  many rows (the empty tiles past every run cost only their zeros)."""
  if not _tensor_core_gpu(m) or shapes is None or not shapes.experts or not shapes.experts_used: return None
  rows = GPU_PREFILL_CHUNK * shapes.experts_used / shapes.experts
  tile = max([t for t in GEMM_TILE_ROWS if t <= rows] or [min(GEMM_TILE_ROWS)])
  return tile, (f"a {GPU_PREFILL_CHUNK}-token chunk gives each of {shapes.experts} experts {rows:g} rows on average "
                f"({shapes.experts_used} a token): tiles of {tile}")

def half_cache(values: Mapping[str, Any]) -> bool:
  """Whether these hint values make the KV cache fp16: kv_cache half, or ggml rounding (as llama.cpp's default cache)."""
  return values["kv_cache"] == "half" or values["rounding"] == "ggml"

def flash_cache(values: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> str | None:
  """Why the cache these hint values make is not what the flash kernels read (fp16, a cache of heads), in one line; None
  where it is."""
  if values["kv_layout"] == "heads" and half_cache(values): return None
  src = lambda n: f" ({sources[n]})" if sources else ""
  return (f"flash reads an fp16 cache of heads (kv_cache half, kv_layout heads), not kv_cache {values['kv_cache']}{src('kv_cache')}, "
          f"kv_layout {values['kv_layout']}{src('kv_layout')}")

@dataclass(frozen=True)
class Hint:
  default: Any                    # the built-in value, or a function of nothing giving it when hints are resolved
  parse: Callable[[Any], Any]     # a value as written (str from YAML, metadata or the environment) -> the value, or ValueError
  help: str
  choices: tuple[str, ...] = ()   # the values a flag takes, where they are a few names
  metavar: str | None = None
  run_only: bool = False          # set at run time only (flags, TINYZOO_HINTS, experiment switches), never by a profile or manifest
  rule: Rule | None = None        # where it gives a value, that value wins over the default (source `heuristic`)

  def default_value(self) -> Any: return self.default() if callable(self.default) else self.default

def _choice(default: str, choices: tuple[str, ...], help: str, run_only: bool = False, rule: Rule | None = None) -> Hint:
  return Hint(default, _one_of(choices), help, choices, run_only=run_only, rule=rule)

HINTS: dict[str, Hint] = {
  "strategy": Hint("packed_dot", _strategy, f"how matmuls read the packed weights: one of {', '.join(STRATEGIES)}, optionally followed "
                   "by per-type, FFN and MoE-expert overrides, e.g. 'packed_dot,Q6_K=split', 'fused,ffn=split' or "
                   "'packed_words,experts=int8_dot' (quant/linear.py); by rule int8_dot on a CPU with VNNI int8 dot products", metavar="SPEC",
                   rule=_int8_where_cpu_dots),
  "rounding": _choice("exact", ROUNDINGS, "exact keeps activations and the KV cache in fp32; ggml rounds them as llama.cpp's CPU path "
                      "does: 8-bit activations into quantized matmuls, an fp16 KV cache met by fp16 queries (more kernels; matches "
                      "llama.cpp's near-ties)", run_only=True),
  "skip": Hint((), _components, "components left out of every block, to measure the rest alone: attention, ffn, and in MoE blocks "
               "shared_expert (their shared experts) or topk (the routing's choice: every token takes the first k experts, with their "
               "scores as weights); comma-separated, or the flag repeated", SKIPPABLE, run_only=True),
  "casts": _choice("keep", CASTS, "where fp16 operands meet (a half KV cache's keys and values in a decode step's logits and value "
                   "sums, a half prefill's GEMM inputs), keep casts them to float32 and sums their products in float32; drop multiplies "
                   "them in fp16, each sum rounded to fp16 (seed 003's load-bearing .float() casts removed)", run_only=True),
  "topk": _choice("pairwise", TOPK_ALGORITHMS, "how MoE routing picks its experts: pairwise rank comparisons (2 kernels) or "
                  "tinygrad's Tensor.topk (a sort)"),
  "fuse": Hint(True, _bool, "q/k/v and gate/up as one matmul per GGML type"),
  "norm": _choice("fused", NORMS, "how matmuls read an RMS norm: fused (computed inside them, a kernel summing x's squares first), "
                  "break (realized first: one small kernel more per norm, the matvec reads one plain vector), single (realized by one "
                  "kernel that sums x's squares again for every group of outputs) or fold (its squares summed inside the matvecs over "
                  "packed_words weights, with exact rounding: one small kernel fewer per norm)"),
  "shared_break": Hint(True, _bool, "a MoE block's shared experts realized before they are added to the chosen experts' sum (off: "
                       "the shared down matmul and the down experts are one kernel of two reduces, one launch size for both)"),
  "act_break": Hint(True, _bool, "the FFN activation realized before the down matmul (off: one kernel fewer per FFN, but the "
                    "matvec recomputes the activation for each group of rows)"),
  "act_in_matmul": Hint(False, _bool, "the realized FFN activation computed by the kernel of gate and up's joined matmul, as a product "
                        "over each gate and up row pair (one kernel fewer a dense FFN in a decode step; with act_break and fuse)"),
  "attention": _choice("chunked", ATTENTION_VARIANTS, "which KV cache positions attention reads: the chunks that hold valid ones "
                       "(chunked) or every chunk allocated, masked (whole: the same static shapes at every position, each step "
                       "reading the whole cache)"),
  "kv_layout": _choice("heads", KV_LAYOUTS, "the KV cache per kv head, written by a kernel of its own (heads), or one row per "
                       "position holding its q, k and v projections as their joined matmul writes them (rows: one kernel fewer a "
                       "block, k rotated where read; where q, k and v are one matmul into a float32 cache, else heads)"),
  "split_kv": Hint(0, _count, "a decode step's attention value sums split into parts of N chunks of 64 positions "
                   "(flash-decoding; layers without a window): a kernel whose workgroups cover every head and part, then one adding "
                   "the parts up (one kernel more a block, two under softmax max; spreads a long context over the whole GPU; the "
                   "cache is allocated and read in whole parts; 0: one sum; by rule on a GPU, parts of about "
                   f"{SPLIT_PART_ELEMENTS:,} cache elements)", metavar="N", rule=_split_on_gpus),
  "kv_cache": _choice("float", ("float", "half"), "the KV cache's type: float32, or fp16 (half the bytes attention reads, as "
                      "llama.cpp's default cache; q is rounded to half against it); ggml rounding makes it fp16 whatever this says; "
                      "by rule half on a CUDA GPU of compute capability 8.0 and later", rule=_half_cache_on_tensor_core_gpus),
  "softmax": _choice("max", SOFTMAXES, "attention's softmax stabilizer in a decode step: the logits' max (a kernel of its own) or "
                     "each query's logit of its own key plus a margin (self: summed in the logits kernel, one kernel fewer a block; "
                     "exact unless a logit exceeds the query's own by about 130; not with a soft cap)"),
  "weights_break": Hint(_on_cpu, _bool, "a decode step's attention weights realized before the value sum: a kernel of "
                        "their own, each exp computed once, where the value sum computing them computes each again for every value "
                        "column (default on the CPU, whose exps are dear; off on a GPU, where the kernel costs more than the exps)"),
  "prefill": Hint(lambda: "float" if _on_cpu() else "half", _one_of(PREFILL_MATMULS), "how a prompt chunk's matmuls read the "
                  "weights: packed (as a decode step does, the packed blocks read by the matmul for every row), half (each weight "
                  "dequantized to fp16 once per chunk, then a GEMM of fp16 inputs summed in fp32: tensor cores on a GPU; F32 weights such "
                  "as routers in fp32) or "
                  "float (the same in fp32; default half on a GPU, float on the CPU)", PREFILL_MATMULS),
  "prefill_chunk": Hint(lambda: 128 if _on_cpu() else GPU_PREFILL_CHUNK, _positive, "prompt tokens run through the model at once; a prompt's "
                        "last partial chunk is padded to a whole one, so one capture serves every length (default 512 on a GPU, "
                        "128 on the CPU, where the padding of a short prompt costs most)", metavar="N"),
  "prefill_steps": Hint(8, _count, "prompts of at most N tokens run as N decode steps instead of a padded prefill chunk: a "
                        "step costs about a ninth of a chunk's time (128 rows on the CPU, 512 on a GPU; 0: every prompt in chunks). Not under "
                        "ggml rounding, whose prompt runs in chunks as llama.cpp's batch does",
                        metavar="N"),
  "expert_tile": Hint(lambda: 8 if _on_cpu() else 32, _positive, "rows of a prompt chunk's MoE GEMM that share an expert: the "
                      "chunk's choices are sorted by expert, each expert's padded to whole tiles, and each tile reads its "
                      "expert's weights once (default 32 on a GPU, 8 on the CPU; smaller tiles pad less and read the weights "
                      "more often); by rule, on a GPU that runs gemm mma, the largest of its tiles (32, 64, 128) not above the "
                      "rows a chunk gives each expert on average", metavar="N", rule=_expert_tiles_of_the_chunks_rows),
  "mla_v_cache": Hint(False, _bool, "latent attention (DeepSeek-style MLA) keeps its values in a cache of their own, the latent "
                      "written there beside the key rows (off: the values are the key rows' first kv_lora_rank columns, as llama.cpp "
                      "reads them)"),
  "mla_prefill": _choice("auto", MLA_PREFILL_FORMS, "the form of a prompt chunk's latent attention (DeepSeek-style MLA): absorbed "
                        "(as a decode step: queries through attn_k_b, the latent output through attn_v_b), expanded (each position "
                        "read expanded to every head's key and value, then plain attention) or auto (whichever costs fewer "
                        "multiplications for the chunk's rows: expanded for hundreds of rows)"),
  "decode_attention": _choice("tinygrad", ATTENTIONS, "which kernels compute a decode step's attention over an fp16 cache of "
                              "heads (kv_cache half, kv_layout heads): tinygrad's (attention, split_kv, softmax), or flash "
                              "(ops/cuda/decode_attention.cu: flash-decoding, the positions split into parts whose blocks each read "
                              "a kv head once for its query heads, then their combine; over a latent (MLA) cache latent_attention.cu, "
                              "its heads the rows of mma.sync tiles; CUDA GPUs); another step, tinygrad's; by rule flash on a CUDA "
                              "GPU of compute capability 8.0 and later, unless a source above the rule makes the cache another",
                              rule=_flash_on_tensor_core_gpus),
  "prefill_attention": _choice("tinygrad", ATTENTIONS, "which kernels compute a prompt chunk's attention over an fp16 cache of heads "
                               "(kv_cache half, kv_layout heads): tinygrad's (logits and value sums as GEMMs over the chunks read), "
                               "or flash (ops/cuda/prefill_attention.cu: one tiled kernel, online softmax, no score tensor in "
                               "memory; heads of up to 128; CUDA GPUs; over a latent (MLA) cache latent_attention.cu, the chunk's "
                               "rows of every head in its mma.sync tiles, the absorbed form); other heads, tinygrad's; by rule as "
                               "decode_attention",
                               rule=_flash_on_tensor_core_gpus),
  "gemm": _choice("tinygrad", GEMMS, "which kernel computes a prompt chunk's GEMMs of fp16 inputs (prefill half; dense "
                  "matmuls and a MoE's experts grouped by tile): tinygrad's generated one, or mma (ops/cuda/gemm_mma.cu: "
                  "shared-memory tiles copied by cp.async, read by ldmatrix into mma.sync, Q4_0, Q8_0 and MXFP4 words and Q4_K, "
                  "Q6_K and Q5_0 blocks decoded on their way in, other types dequantized to fp16 first; CUDA GPUs of compute "
                  "capability 8.0 and later; a GEMM it does not take, tinygrad's; by rule mma on such a GPU), or mma_int8 (as "
                  "llama.cpp's MMQ: the rows quantized to 8 bits once, their products with Q4_0's and Q8_0's words in integers "
                  "by ops/cuda/gemm_int8.cu; other GEMMs as mma)", rule=_mma_on_tensor_core_gpus),
  "tensor_cores": Hint(True, _bool, "tinygrad's tensor-core kernels for matmuls of half inputs (off: its TC=0)"),
  "row_upcast": Hint(DEFAULT_ROW_UPCAST, _row_upcast, "CPU matvec rows computed at once, the reduce unrolled by 4 (0: tinygrad's "
                     "heuristic for every kernel, GPU ones too)", metavar="N"),
  "jit_batch_size": Hint(lambda: JIT_BATCH_SIZE.value, _count, "kernels per graph batch on backends with graphs (tinygrad's "
                         "JIT_BATCH_SIZE)", metavar="N"),
  "graphs": Hint(True, _bool, "a captured step's kernels replayed in graph batches on backends with graphs (CUDA graphs; off: "
                 "launched one by one, tinygrad's JIT=2, as before capture)"),
  "beam": Hint(lambda: BEAM.value, _count, "tinygrad's BEAM search width for the kernels (0: hand-coded heuristics; slow to "
               "compile)", metavar="N"),
  "pdl": Hint(False, _bool, "programmatic dependent launch in CUDA graphs (sm_90 and later): each kernel lets the next one launch "
              "once its workgroups have started and waits on entry for the ones before it (ops/cuda_graph.py)"),
  "pdl_prefetch": Hint(False, _bool, "with pdl: before it waits, each workgroup of a kernel asks the L2 for its share of every "
                       "buffer the kernel reads at places its launch fixes (a matvec's weight; not gathers, not kernels with variables)"),
}

def check(name: str, value: Any, source: str = "runtime") -> Any:
  """The value of hint `name` as written by `source`; ValueError for an unknown name, a bad value, or a run-only hint
  from a profile or manifest."""
  if name not in HINTS: raise ValueError(f"unknown hint {name!r} (known: {', '.join(HINTS)})")
  if HINTS[name].run_only and source != "runtime": raise ValueError(f"hint {name} is set at run time only, not by a {source}")
  try: return HINTS[name].parse(value)
  except ValueError as e: raise ValueError(f"hint {name}: {e}") from None

@dataclass(frozen=True)
class Hints:
  """Every hint's value (`hints.norm`, ...) and source; the device profile's GPU matvec sizes per kernel shape, and the
  profile's path (None without one)."""
  values: Mapping[str, Any]
  sources: Mapping[str, str]
  matvec_sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
  profile: Path | None = None
  reasons: Mapping[str, str] = field(default_factory=dict)   # why a rule chose a hint's value (source heuristic)

  def __getattr__(self, name: str) -> Any:
    if name in (values := self.__dict__.get("values", {})): return values[name]
    raise AttributeError(f"no hint {name!r}")

  def as_dict(self) -> dict[str, dict[str, Any]]:
    """{name: {"value": ..., "source": ...[, "reason": ...]}}, as `tinyzoo hints --json` prints it and journal records store it."""
    return {n: {"value": list(v) if isinstance(v := self.values[n], tuple) else v, "source": self.sources[n],
                **({"reason": self.reasons[n]} if n in self.reasons else {})} for n in HINTS}

  def with_runtime(self, **values: Any) -> "Hints":
    """These hints with `values` set at run time (an experiment's switches, a tuning trial), each checked."""
    return Hints({**self.values, **{n: check(n, v) for n, v in values.items()}}, {**self.sources, **{n: "runtime" for n in values}},
                 self.matvec_sizes, self.profile, {n: r for n, r in self.reasons.items() if n not in values})

def resolve(runtime: dict[str, Any] | None = None, profile: dict[str, Any] | None = None, manifest: dict[str, Any] | None = None,
            matvec_sizes: Mapping[str, tuple[int, ...]] | None = None, profile_path: Path | None = None,
            machine: Machine | None = None, shapes: Shapes | None = None) -> Hints:
  """Each hint from the first source that sets it: runtime, profile, manifest, then, given the machine (and the model's
  shapes), its rule where it gives a value, else its default (every value checked)."""
  values, sources, reasons = {}, {}, {}
  for name, hint in HINTS.items():
    source, value = next(((s, layer[name]) for s, layer in zip(SOURCES, (runtime, profile, manifest)) if layer and name in layer),
                         ("default", None))
    if source == "default" and machine is not None and hint.rule is not None and (ruled := hint.rule(machine, shapes)) is not None:
      (value, reasons[name]), source = ruled, "heuristic"
    if source == "default": value = hint.default_value()
    values[name], sources[name] = check(name, value, source if source not in ("default", "heuristic") else "runtime"), source
  # a flash kernel the rule chose yields to a cache it does not read, made by a source above the rule (a profile's kv_layout rows)
  for name in CACHE_READERS:
    if sources[name] == "heuristic" and (why := flash_cache(values, sources)) is not None:
      values[name], reasons[name] = HINTS[name].default_value(), f"tinygrad's: {why}"
  return Hints(values, sources, dict(matvec_sizes or {}), profile_path, reasons)

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
    try: out[key.removeprefix(MANIFEST_PREFIX)] = check(key.removeprefix(MANIFEST_PREFIX), g.get(key), "manifest")
    except ValueError as e: raise ValueError(f"{g.path}: metadata {key}: {e}") from None
  return out

def manifest_entries(hints: dict[str, Any]) -> dict[str, Any]:
  """The metadata entries (`tinyzoo.hints.<name>`) that carry `hints` as a model's manifest, each checked."""
  return {MANIFEST_PREFIX + name: check(name, value, "manifest") for name, value in hints.items()}

def add_flags(parser: argparse.ArgumentParser, **defaults: Any) -> None:
  """Every hint as a flag (`--norm`, `--act-break/--no-act-break`, `--skip` repeated, ...), left unset unless given so that
  TINYZOO_HINTS, the device profile or the model's manifest can set it; `defaults` are a command's own."""
  group = parser.add_argument_group("kernel hints", "Each from the first source that sets it: these flags, TINYZOO_HINTS='name=value;...', "
                                    "this device's profile, the model file's manifest, the built-in default. `tinyzoo hints MODEL` shows "
                                    "what applies.")
  for name, hint in HINTS.items():
    flag, default = "--" + name.replace("_", "-"), defaults.get(name, hint.default_value())
    text = f"{hint.help} (default {','.join(default) or 'none' if isinstance(default, tuple) else default})".replace("%", "%%")
    if isinstance(default, bool): group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
    elif isinstance(default, tuple): group.add_argument(flag, dest=name, action="append", choices=hint.choices, help=text)
    else: group.add_argument(flag, dest=name, choices=hint.choices or None, metavar=hint.metavar, default=defaults.get(name), help=text)

def given(args: argparse.Namespace) -> dict[str, Any]:
  """The hints a command's flags (add_flags) set."""
  return {n: v for n in HINTS if (v := getattr(args, n, None)) is not None}
