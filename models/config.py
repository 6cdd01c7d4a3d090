"""The hyperparameters of a model, read once from GGUF metadata into a frozen dataclass (from a file, or from the metadata
of a synthetic one before it is written: models/spec.py MetadataView)."""
from dataclasses import dataclass, replace
from gguf.quants import dequantize
from ops.rope import Yarn
from quant.gguf_file import GGUFFile

@dataclass(frozen=True)
class ModelConfig:
  arch: str
  n_layers: int
  dim: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  v_head_dim: int
  ffn_dim: int | None   # of the dense FFN; None where the model has none (GPT-OSS: experts only)
  vocab_size: int
  context_length: int
  norm_eps: float
  rope_base: float
  rope_dims: int
  yarn: Yarn | None = None
  sliding_window: int | None = None
  final_softcap: float | None = None

  @staticmethod
  def from_gguf(g: GGUFFile) -> "ModelConfig":
    """The config of the file's metadata; the vocabulary is the tokenizer's, as llama.cpp reads it."""
    arch = g.architecture
    key = lambda name: g.require(f"{arch}.{name}")
    opt = lambda name, default=None: g.get(f"{arch}.{name}", default)
    dim, n_heads = key("embedding_length"), key("attention.head_count")
    head_dim = opt("attention.key_length", dim // n_heads)
    yarn = None
    if opt("rope.scaling.type") in ("yarn", "linear") and opt("rope.scaling.factor", 1.0) != 1.0:
      yarn = Yarn(opt("rope.scaling.factor"), opt("rope.scaling.original_context_length", key("context_length")),
                  ext_factor=1.0 if opt("rope.scaling.type") == "yarn" else 0.0)
    if (factors := rope_freq_factors(g)) is not None:
      yarn = replace(yarn, freq_factors=factors) if yarn else Yarn(1.0, key("context_length"), ext_factor=0.0, freq_factors=factors)
    if not (vocab := g.array_len("tokenizer.ggml.tokens") or opt("vocab_size", 0)): raise g.fail("missing metadata key 'tokenizer.ggml.tokens'")
    return ModelConfig(
      arch=arch, n_layers=key("block_count"), dim=dim, n_heads=n_heads, n_kv_heads=opt("attention.head_count_kv", n_heads),
      head_dim=head_dim, v_head_dim=opt("attention.value_length", head_dim), ffn_dim=opt("feed_forward_length"),
      vocab_size=vocab, context_length=key("context_length"),
      norm_eps=key("attention.layer_norm_rms_epsilon"), rope_base=opt("rope.freq_base", 10000.0), rope_dims=opt("rope.dimension_count", head_dim),
      yarn=yarn, sliding_window=opt("attention.sliding_window"), final_softcap=opt("final_logit_softcapping"))

def rope_freq_factors(g: GGUFFile) -> tuple[float, ...] | None:
  """`rope_freqs.weight`: per rotated pair, the divisor of its frequency (Llama 3's rope scaling, as llama.cpp applies it)."""
  if (info := g.tensors.get("rope_freqs.weight")) is None: return None
  return tuple(float(f) for f in dequantize(g.raw(info.name), info.ggml_type).reshape(-1))
