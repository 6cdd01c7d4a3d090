"""Which of a model's ops the hand-written CUDA kernels (ops/cuda) take under its hints, and which stay with tinygrad's:
`tinyzoo hints` prints it, so that a kernel a hint chooses and the model's types or shapes leave out is said, not
dropped in silence. Read from the file's tensor directory and metadata, no weight loaded; the attention kernels' own
refusal (ops/cuda flash_refusal) judges the model's heads."""
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from ops.cuda import GEMM_BLOCK_TYPES, GEMM_INT8_TYPES, GEMM_WORD_TYPES, HAND_WRITTEN, flash_refusal, hint_refusal, latent_refusal
from profiles.hints import Hints
from quant.gguf_file import GGUFFile
from quant.linear import WORD_STRATEGIES, StrategyPlan
from models.config import ModelConfig
from models.deepseek2 import MLAConfig

def _gemm(g: GGUFFile, hints: Hints) -> str:
  if hints.prefill != "half": return f"tinygrad's for every GEMM: mma takes GEMMs of fp16 inputs (prefill half), this prefill is {hints.prefill}"
  plan, tied = StrategyPlan.parse(hints.strategy), "output.weight" not in g.tensors   # tied: the embedding table is the output matmul
  kinds = ("dense int8", "dense words", "dense blocks", "expert int8", "expert words", "expert blocks", "dequantized", "experts", "routers")
  taken: dict[str, set[str]] = {k: set() for k in kinds}
  for t in g.tensors.values():
    if len(t.shape) not in (2, 3) or (t.name == "token_embd.weight" and not tied): continue
    name, expert = t.ggml_type.name, "_exps" in t.name
    # the words where the strategy keeps them, else GGUF's blocks of the types the kernel reads as stored
    words = name in GEMM_WORD_TYPES and plan.for_weight(t.name, t.ggml_type) in WORD_STRATEGIES
    integers = hints.gemm == "mma_int8" and name in GEMM_INT8_TYPES
    packed = ("int8" if integers else "words") if words else "blocks" if name in GEMM_BLOCK_TYPES else None
    kind = "routers" if t.ggml_type is T.F32 else f"{'expert' if expert else 'dense'} {packed}" if packed else "experts" if expert else "dequantized"
    taken[kind].add(name)
  said = {"dense int8": "{} words' int8 products by the kernel, the rows quantized to 8 bits",
          "expert int8": "{} experts' words' int8 products by the kernel, the rows quantized to 8 bits, grouped by tile",
          "dense words": "{} words decoded by the kernel", "dense blocks": "{} blocks decoded by the kernel",
          "expert words": "{} experts' words decoded by the kernel, grouped by tile",
          "expert blocks": "{} experts' blocks decoded by the kernel, grouped by tile",
          "dequantized": "{} dequantized to fp16 first", "experts": "{} experts: tinygrad's grouped GEMM", "routers": "{} (routers): tinygrad's"}
  return "; ".join(said[k].format(", ".join(sorted(types))) for k, types in taken.items() if types)

def _attention(g: GGUFFile, hints: Hints, rows: int) -> str:
  cfg = ModelConfig.from_gguf(g)
  if isinstance(g.get(f"{g.architecture}.attention.kv_lora_rank"), int): return _latent(g, cfg, hints, rows)
  cache = tuple(Tensor.empty(1, cfg.n_kv_heads, 64, d, dtype=dtypes.float16) for d in (cfg.head_dim, cfg.v_head_dim))
  why = flash_refusal(Tensor.empty(1, cfg.n_heads, rows, cfg.head_dim), cache, 0, decode=rows == 1)
  return "every layer" if why is None else f"tinygrad's: {why}"

def _latent(g: GGUFFile, cfg: ModelConfig, hints: Hints, rows: int) -> str:
  if hints.mla_v_cache: return "tinygrad's: the latent cache's values in a cache of their own (mla_v_cache)"
  if rows != 1 and hints.mla_prefill == "expanded": return "tinygrad's: the chunk's latent attention expanded to every head (mla_prefill)"
  mla = MLAConfig.from_gguf(g)
  d = mla.kv_lora_rank + mla.rope_dim
  why = latent_refusal(Tensor.empty(1, cfg.n_heads, rows, d), Tensor.empty(1, 64, d, dtype=dtypes.float16), 0, mla.kv_lora_rank)
  return "every layer, from the latent cache (absorbed)" if why is None else f"tinygrad's: {why}"

def hand_written(g: GGUFFile, hints: Hints, device: str) -> list[tuple[str, str]]:
  """(hint and value, what its kernel takes of this model on `device`) for each hint whose value is a hand-written kernel."""
  takes = {"gemm": lambda: _gemm(g, hints), "decode_attention": lambda: _attention(g, hints, 1),
           "prefill_attention": lambda: _attention(g, hints, hints.prefill_chunk)}
  out = []
  for hint, kernels in HAND_WRITTEN.items():
    if (kernel := getattr(hints, hint)) not in kernels: continue
    why = hint_refusal(hint, kernel, device)
    out.append((f"{hint} {kernel}", f"refused here: {why}" if why else takes[hint]()))
  return out
