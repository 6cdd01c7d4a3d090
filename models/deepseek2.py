"""DeepSeek-style multi-head latent attention (GGUF architecture `deepseek2`: DeepSeek-V2-Lite, GLM-4.7-Flash, Youtu-LLM).

Attention: q from a plain `attn_q` or through a low-rank `attn_q_a` -> `attn_q_a_norm` -> `attn_q_b` (q-LoRA); `attn_kv_a_mqa`
gives the latent c (normalized by `attn_kv_a_norm`) and one shared rope key; q_nope is absorbed through `attn_k_b`, the
latent output expanded through `attn_v_b` (ops/mla.py), so each layer caches only concat(c, k_pe) per position (with the
`mla_v_cache` hint, c again in a value cache of its own). A prompt chunk takes the form the `mla_prefill` hint names, by
default the cheaper for its rows: absorbed, or expanded (each position read expanded through `attn_k_b` transposed and
`attn_v_b` to every head's key and value). Rope on interleaved pairs; with YaRN, llama.cpp moves the magnitude
correction out of the rope into the query scale (below).
FFN: the first `leading_dense_block_count` blocks are dense (all of them in Youtu-LLM), the rest mixtures of experts with
shared experts, gated by softmax or sigmoid (with the `exp_probs_b` selection bias), renormalized and scaled as the
metadata says."""
import math
from dataclasses import dataclass, replace
from tinygrad import Tensor
from tinygrad.uop.ops import sint
from models import spec
from models.blocks import Block, FeedForward, Transformer, kv_cache_dtype, sums_per_output
from models.config import ModelConfig
from models.moe import MoE, MoEConfig
from models.spec import TensorDef
from models.weights import Weights
from ops.activations import swiglu
from ops.cuda import flash_latent, latent_refusal
from ops.mla import LatentCache, expanded_attention, expanded_cheaper, mla_attention
from ops.norm import NormedInput, rms_norm
from ops.rope import Yarn, apply_rope, rope_tables
from ops.routing import Gating
from quant.gguf_file import GGUFFile
from quant.linear import gemm_dtype

ARCH = "deepseek2"
GATING = {1: Gating.SOFTMAX, 2: Gating.SIGMOID}   # `expert_gating_func` values llama.cpp defines for this architecture

def gating(g: GGUFFile, n_layers: int) -> Gating:
  """Files without the key (DeepSeek-V2, converted GLM-4.7-Flash) route as llama.cpp decides from the model's shape:
  sigmoid for GLM-4.7-Flash (47 or 48 blocks and a vocabulary of 154880), softmax otherwise."""
  func = g.get(f"{ARCH}.expert_gating_func", 0)
  if func == 0:
    vocab = g.get(f"{ARCH}.vocab_size") or g.array_len("tokenizer.ggml.tokens")
    return Gating.SIGMOID if n_layers in (47, 48) and vocab == 154880 else Gating.SOFTMAX
  if func not in GATING:
    raise g.fail(f"unknown expert gating function {func} in '{ARCH}.expert_gating_func' (supported: "
                 + ", ".join(f"{k} {v.value}" for k, v in GATING.items()) + ")")
  return GATING[func]

def lite_shape(n_layers: int, vocab_size: int) -> bool:
  """llama.cpp's shape rule for DeepSeek-V2-Lite-like files, whose converter writes no attention.q_lora_rank: it reads
  none from a file of this shape (and requires one from any other)."""
  return n_layers in (26, 27) or (n_layers == 48 and vocab_size == 128256)

@dataclass(frozen=True)
class MLAConfig:
  q_lora_rank: int    # 0: a plain attn_q
  kv_lora_rank: int
  nope_dim: int       # per head, the query/key part without rope
  rope_dim: int
  v_dim: int
  yarn_log_mul: float = 0.0

  @staticmethod
  def from_gguf(g: GGUFFile) -> "MLAConfig":
    key = lambda name: g.require(f"{ARCH}.{name}")
    rope_dim = key("rope.dimension_count")
    k_dim = g.get(f"{ARCH}.attention.key_length_mla") or key("attention.key_length")
    if k_dim <= rope_dim: raise g.fail(f"'{ARCH}.attention.key_length_mla' ({k_dim}) leaves no room beside {rope_dim} rope dims")
    # the converter writes 0.1 * mscale_all_dim; llama.cpp divides the 0.1 back out
    return MLAConfig(g.get(f"{ARCH}.attention.q_lora_rank", 0), key("attention.kv_lora_rank"), k_dim - rope_dim, rope_dim,
                     g.get(f"{ARCH}.attention.value_length_mla") or key("attention.value_length"),
                     g.get(f"{ARCH}.rope.scaling.yarn_log_multiplier", 0.0) / 0.1)

  def tensors(self, b: str, cfg: ModelConfig) -> list[TensorDef]:
    """Block b's attention tensors: q (plain, or through the q-LoRA), the latent with the rope key, its norm, the
    per-head absorption and expansion matrices, the output projection."""
    H, r, dk = cfg.n_heads, self.kv_lora_rank, self.nope_dim + self.rope_dim
    q = [*spec.matmul(f"{b}.attn_q_a", self.q_lora_rank, cfg.dim), spec.norm(f"{b}.attn_q_a_norm", self.q_lora_rank),
         *spec.matmul(f"{b}.attn_q_b", H * dk, self.q_lora_rank)] if self.q_lora_rank else spec.matmul(f"{b}.attn_q", H * dk, cfg.dim)
    return [*q, *spec.matmul(f"{b}.attn_kv_a_mqa", r + self.rope_dim, cfg.dim), spec.norm(f"{b}.attn_kv_a_norm", r),
            *spec.matmul(f"{b}.attn_k_b", r, self.nope_dim, lead=(H,)), *spec.matmul(f"{b}.attn_v_b", self.v_dim, r, lead=(H,)),
            *spec.matmul(f"{b}.attn_output", cfg.dim, H * self.v_dim)]

def yarn_scales(yarn: Yarn | None, log_mul: float) -> tuple[Yarn | None, float]:
  """(the rope's YaRN with llama.cpp's attention factor, the factor on the query scale). llama.cpp cancels the rope's
  magnitude correction 1 + 0.1 ln(factor) and, with a log multiplier m (DeepSeek-V2), scales q.k by (1 + 0.1 m ln(factor))^2."""
  if yarn is None or yarn.ext_factor == 0 or yarn.factor <= 1: return yarn, 1.0
  ramp = 1 + 0.1 * math.log(yarn.factor)
  attn_factor = 1 / ramp if log_mul else 1.0   # with m set, llama.cpp's mscale / mscale_all_dim is m / m
  mscale = attn_factor * ramp * (1 + 0.1 * log_mul * math.log(yarn.factor))
  return replace(yarn, attn_factor=attn_factor), mscale * mscale

class MLAttention:
  def __init__(self, w: Weights, prefix: str, cfg: ModelConfig, mla: MLAConfig, rope: tuple[Tensor, Tensor], scale: float, max_context: int):
    self.cfg, self.mla, self.rope, self.scale, self.variant, self.form = cfg, mla, rope, scale, w.hints.attention, w.hints.mla_prefill
    self.softmax, self.norm = w.hints.softmax, w.hints.norm
    self.chunk_dtype = gemm_dtype(w.hints.prefill)
    r = mla.kv_lora_rank
    self.inputs = w.projections([f"{prefix}.attn_q_a" if mla.q_lora_rank else f"{prefix}.attn_q", f"{prefix}.attn_kv_a_mqa"])
    if mla.q_lora_rank:
      self.q_a_norm = w.vector(f"{prefix}.attn_q_a_norm.weight")
      self.q_b = w.linear(f"{prefix}.attn_q_b")
    self.kv_a_norm = w.vector(f"{prefix}.attn_kv_a_norm.weight")
    if w.has(f"{prefix}.attn_kv_b.weight") and not w.has(f"{prefix}.attn_k_b.weight"):
      raise w.g.fail(f"tensor '{prefix}.attn_kv_b.weight' is the old unsplit layout; reconvert the model with a current llama.cpp "
                     "(which writes attn_k_b and attn_v_b)")
    self.k_b = w.linear(f"{prefix}.attn_k_b")
    self.v_b = w.linear(f"{prefix}.attn_v_b")
    self.o = w.linear(f"{prefix}.attn_output")
    self.cache = LatentCache(1, max_context, r, mla.rope_dim, dtype=kv_cache_dtype(w.hints), device=w.device, per_part=max(1, w.hints.split_kv),
                             values=w.hints.mla_v_cache)
    self.split, self.weights_break, self.upcast = w.hints.split_kv, w.hints.weights_break, w.hints.casts == "keep"
    self.decode_kernel, self.prefill_kernel = w.hints.decode_attention, w.hints.prefill_attention
    w.label(f"{prefix}.kv_cache", "cache", self.cache.rows)
    if self.cache.v is not None: w.label(f"{prefix}.v_cache", "cache", self.cache.v)

  def __call__(self, x: Tensor | NormedInput, start_pos: sint) -> Tensor:
    (B, T, _), c, m = x.shape, self.cfg, self.mla
    q, kv = self.inputs(x)
    if m.q_lora_rank: q = self.q_b(rms_norm(q, self.q_a_norm, c.norm_eps))
    q = q.reshape(B, T, c.n_heads, m.nope_dim + m.rope_dim)
    cos, sin = (t[start_pos:start_pos + T] for t in self.rope)
    q_pe = apply_rope(q[..., m.nope_dim:].transpose(1, 2), cos, sin, interleaved=True)
    # one token's latent normalized by the kernel that writes it to the cache, its squares summed there (norm single)
    latent = rms_norm(kv[..., :m.kv_lora_rank], self.kv_a_norm, c.norm_eps, sum_per_output=sums_per_output(self.norm, kv))
    k_pe = apply_rope(kv[..., m.kv_lora_rank:].unsqueeze(1), cos, sin, interleaved=True).squeeze(1)
    rows, values = self.cache.update(latent, k_pe, start_pos)
    if self.prefill_form(T) == "expanded":
      q_full = q[..., :m.nope_dim].transpose(1, 2).cat(q_pe.cast(q.dtype), dim=-1)   # [B, H, T, nope + rope]
      out = expanded_attention(q_full, rows, values, start_pos, self._expand, scale=self.scale, variant=self.variant,
                               chunk_dtype=self.chunk_dtype, upcast=self.upcast).transpose(1, 2)
    else:
      q_lat = self.k_b(q[..., :m.nope_dim]).transpose(1, 2)   # per head [B, T, H, nope] -> [B, H, T, r]
      if self._flash(q_abs := q_lat.cat(q_pe.cast(q_lat.dtype), dim=-1), rows, start_pos):
        latent_out = flash_latent(q_abs, rows, start_pos, scale=self.scale, v_dim=m.kv_lora_rank)
      else:
        latent_out = mla_attention(q_lat, q_pe, rows, values, start_pos, scale=self.scale, variant=self.variant, chunk_dtype=self.chunk_dtype,
                                   split=self.split, softmax=self.softmax, weights_break=self.weights_break, upcast=self.upcast)
      out = self.v_b(latent_out.transpose(1, 2))   # [B, T, H, v_dim]
    return self.o(out.reshape(B, T, c.n_heads * m.v_dim))

  def _flash(self, q: Tensor, rows: Tensor, start_pos: sint) -> bool:
    """Whether this step's absorbed attention (q [B, H, T, r + d_rope]) is ops/cuda's flash attention of the latent cache:
    under the step's hint (decode_attention for one query row, prefill_attention for a chunk's) flash, the values read
    from the cache rows (no value cache of their own), where the kernel takes it."""
    kernel = self.decode_kernel if q.shape[2] == 1 else self.prefill_kernel
    return kernel == "flash" and self.cache.v is None and latent_refusal(q, rows, start_pos, self.mla.kv_lora_rank) is None

  def prefill_form(self, rows: int) -> str:
    """The form of a step of `rows` query rows: absorbed for one (a decode step), else the hint's; by default absorbed
    where the flash kernel takes the chunk (it reads each cache row once for all the chunk's rows of a tile and keeps
    no score tensor in memory), else the form of fewer multiplications."""
    if rows == 1: return "absorbed"
    if self.form != "auto": return self.form
    q = Tensor.empty(1, self.cfg.n_heads, rows, self.cache.rows.shape[-1])
    if self._flash(q, self.cache.rows, 0): return "absorbed"
    return "expanded" if expanded_cheaper(rows, self.mla.kv_lora_rank, self.mla.nope_dim, self.mla.v_dim) else "absorbed"

  def _expand(self, c: Tensor) -> tuple[Tensor, Tensor]:
    """Latent rows c [..., r] -> every head's k_nope [..., H, nope] and v [..., H, v_dim], as prefill GEMMs."""
    heads = c.unsqueeze(-2).expand(*c.shape[:-1], self.cfg.n_heads, c.shape[-1])
    return self.k_b.transposed_gemm_of(heads), self.v_b.gemm_of(heads)

def prefill_form(model: Transformer, rows: int) -> str | None:
  """The form a prompt chunk of `rows` takes in a model's latent attention; None for a model without."""
  return next((b.attn.prefill_form(rows) for b in model.blocks if isinstance(b.attn, MLAttention)), None)

def _layout(g, cfg: ModelConfig) -> tuple[MLAConfig, MoEConfig | None, int, int]:
  """The file's latent attention, its experts (None without), the blocks run (multi-token-prediction ones are not) and
  the leading dense ones."""
  n_layers = cfg.n_layers - g.get(f"{ARCH}.nextn_predict_layers", 0)
  n_dense = g.get(f"{ARCH}.leading_dense_block_count", 0)
  moe = None if n_dense >= n_layers else MoEConfig.from_gguf(g, gating(g, cfg.n_layers), renorm=g.get(f"{ARCH}.expert_weights_norm", False))
  return MLAConfig.from_gguf(g), moe, n_layers, n_dense

def tensors(cfg: ModelConfig, g) -> list[TensorDef]:
  mla, moe, n_layers, n_dense = _layout(g, cfg)
  def block(i: int, b: str) -> list[TensorDef]:
    ffn = spec.feed_forward(b, cfg.dim, cfg.ffn_dim) if i < n_dense or moe is None else moe.tensors(b, cfg.dim, selection_bias=True)
    return [spec.norm(f"{b}.attn_norm", cfg.dim), *mla.tensors(b, cfg), spec.norm(f"{b}.ffn_norm", cfg.dim), *ffn]
  return [spec.embedding(cfg), *(t for i in range(n_layers) for t in block(i, f"blk.{i}")), *spec.head(cfg)]

def metadata(p, n_layers: int) -> dict:
  """What a deepseek2 file says beyond the shared hyperparameters, as llama.cpp's converter writes the MLA form. llama.cpp
  requires attention.q_lora_rank unless the file has DeepSeek-V2-Lite's shape (whose converter leaves it out), so a
  preset without q-LoRA of another shape writes 0."""
  m, moe, a = p.mla, p.moe, ARCH
  if m.q_lora_rank and lite_shape(n_layers, p.vocab_size):
    raise ValueError(f"llama.cpp reads no q-LoRA rank from a deepseek2 file of {n_layers} blocks and {p.vocab_size} tokens (it takes one "
                     f"for DeepSeek-V2-Lite), and {p.name} has q-LoRA: choose another number of layers")
  meta = {f"{a}.attention.kv_lora_rank": m.kv_lora_rank, f"{a}.attention.key_length_mla": m.nope_dim + m.rope_dim,
          f"{a}.attention.value_length_mla": m.v_dim, f"{a}.rope.dimension_count": m.rope_dim, f"{a}.vocab_size": p.vocab_size,
          f"{a}.leading_dense_block_count": n_layers if moe is None else moe.n_dense,
          f"{a}.expert_feed_forward_length": p.ffn_dim if moe is None else moe.ffn_dim,
          f"{a}.expert_shared_count": 0 if moe is None else moe.n_shared}
  if m.q_lora_rank or not lite_shape(n_layers, p.vocab_size): meta[f"{a}.attention.q_lora_rank"] = m.q_lora_rank
  if moe is not None:
    if moe.scale is not None: meta[f"{a}.expert_weights_scale"] = moe.scale
    if moe.norm: meta[f"{a}.expert_weights_norm"] = True
    if moe.gating is not None: meta[f"{a}.expert_gating_func"] = moe.gating
  return meta

def build(w: Weights, cfg: ModelConfig, max_context: int) -> Transformer:
  mla, moe, n_layers, n_dense = _layout(w.g, cfg)
  yarn, mscale2 = yarn_scales(cfg.yarn, mla.yarn_log_mul)
  rope = rope_tables(mla.rope_dim, cfg.rope_base, max_context, yarn, w.device)
  scale = mscale2 / math.sqrt(mla.nope_dim + mla.rope_dim)
  blocks = []
  for i in range(n_layers):
    p = f"blk.{i}"
    ffn = FeedForward(w, p, swiglu) if i < n_dense or moe is None else MoE(w, p, moe, swiglu)
    blocks.append(Block(w, p, cfg, MLAttention(w, p, cfg, mla, rope, scale, max_context), ffn))
  return Transformer(w, cfg, blocks)
