"""The transformer pieces the architectures here are built from; architecture files only configure them."""
from dataclasses import dataclass
from math import prod
from typing import Callable
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType
from tinygrad.uop.ops import sint
from ops.attention import KVCache, fused_attention
from ops.activations import Gated
from ops.cuda import flash_decode, flash_prefill, flash_refusal
from ops.norm import NormedInput, rms_norm, rms_scale
from ops.rope import apply_rope
from quant.linear import gemm_dtype
from quant.qtensor import QTensor
from models.config import ModelConfig
from models.weights import Weights
from profiles.hints import Hints, half_cache

def normed_input(x: Tensor, weight: Tensor, eps: float, mode: str) -> Tensor | NormedInput:
  """The RMS norm a matmul reads, by the `norm` hint. fused: the matmul computes the normalization inside, a kernel of
  its own summing x's squares first. break: the normalized x is a buffer of its own, so that the matvec reads one plain
  vector rather than x and the norm weight (faster on a GPU: the journal), at one small kernel more.
  single: realized as with break, but by one kernel (its squares summed again for each output, ops/norm.py) where x
  is one row; a prefill's rows as with break. fold: the matmuls that can sum the squares beside their dots do
  (QuantLinear.normed), at one kernel less; other readers compute the norm from the NormedInput."""
  if mode == "fold": return NormedInput(x, weight, eps)
  out = rms_norm(x, weight, eps, sum_per_output=sums_per_output(mode, x))
  return out.contiguous() if mode in ("break", "single") else out

def sums_per_output(mode: str, x: Tensor | NormedInput) -> bool:
  """Whether norms over x (one token's rows) that no matmul folds sum their squares for each output, inside the kernel
  that reads them (norms `single` and `fold`, ops/norm.py); a prefill's tokens sum them once."""
  return mode in ("single", "fold") and prod(x.shape[:-1]) == 1

def down_input(h: Tensor, realize: bool) -> Tensor:
  """The FFN activation the down matmul reads; with `realize` (`act_break`, the default) a buffer of its own. Computed
  inside the matvec, the activation (an exp per element) is recomputed by every group of rows that reads it."""
  return h.contiguous() if realize else h

def gated_down_input(activation: Gated, gate_up: Tensor, one_token: bool, act_break: bool, act_in_matmul: bool) -> Tensor:
  """The down matmul's input from joined gate and up rows [..., 2F] (gate first). With `act_in_matmul` (and act_break)
  it is realized by their matmul's kernel, which sums each gate and up row pair; one token's rows only: a prefill's
  pair kernel is no matvec to the GPU opts, and prefill slowed."""
  if act_break and act_in_matmul and one_token: return activation.of_pairs(gate_up.unflatten(-1, (2, -1))).contiguous()
  return down_input(activation(*gate_up.chunk(2, dim=-1)), act_break)

@dataclass(frozen=True)
class AttentionSpec:
  """How one layer attends: its rope tables and pairing, window, query scale, whether q and k are normalized and whether
  each head has a learned sink logit (`attn_sinks`)."""
  rope: tuple[Tensor, Tensor]
  interleaved: bool
  scale: float
  window: int | None = None
  qk_norm: bool = False
  softcap: float | None = None
  sinks: bool = False

class Attention:
  def __init__(self, w: Weights, prefix: str, cfg: ModelConfig, spec: AttentionSpec, max_context: int):
    self.cfg, self.spec, self.variant, self.softmax, self.norm = cfg, spec, w.hints.attention, w.hints.softmax, w.hints.norm
    self.split, self.weights_break, self.upcast = w.hints.split_kv, w.hints.weights_break, w.hints.casts == "keep"
    self.chunk_dtype = gemm_dtype(w.hints.prefill)
    self.decode_kernel, self.prefill_kernel = w.hints.decode_attention, w.hints.prefill_attention
    self.qkv = w.projections([f"{prefix}.attn_{n}" for n in "qkv"])
    self.o = w.linear(f"{prefix}.attn_output")
    self.q_norm = w.vector(f"{prefix}.attn_q_norm.weight") if spec.qk_norm else None
    self.k_norm = w.vector(f"{prefix}.attn_k_norm.weight") if spec.qk_norm else None
    self.sinks = w.vector(f"{prefix}.attn_sinks.weight") if spec.sinks else None
    kv_dtype = kv_cache_dtype(w.hints)
    # layout rows where q, k and v are one matmul into the cache (k's norm, if any, is applied where it is read); not under
    # ggml rounding, whose fp16 cache holds each key rotated before it is rounded, as llama.cpp's does (rows hold it as
    # projected)
    rows = w.hints.kv_layout == "rows" and self.qkv.joined_linear() is not None and (kv_dtype == dtypes.float32 or w.hints.rounding != "ggml")
    self.cache = KVCache(1, cfg.n_kv_heads, max_context, cfg.head_dim, cfg.v_head_dim, dtype=kv_dtype, device=w.device,
                         q_width=cfg.n_heads * cfg.head_dim if rows else None, per_part=max(1, self.split))
    if self.cache.rows is not None: w.label(f"{prefix}.kv_cache", "cache", self.cache.rows)
    elif self.cache.kv is not None: w.label(f"{prefix}.kv_cache", "cache", self.cache.kv)
    else:
      w.label(f"{prefix}.k_cache", "cache", self.cache.k)
      w.label(f"{prefix}.v_cache", "cache", self.cache.v)

  def _heads(self, h: Tensor, n: int, d: int, norm: Tensor | None) -> Tensor:
    B, T, _ = h.shape
    h = h.reshape(B, T, n, d).transpose(1, 2)
    return h if norm is None else rms_norm(h, norm, self.cfg.norm_eps)

  def __call__(self, x: Tensor | NormedInput, start_pos: sint) -> Tensor:
    B, T, _ = x.shape
    c = self.cfg
    cos, sin = self.spec.rope
    rope = cos[start_pos:start_pos + T], sin[start_pos:start_pos + T]
    if self.cache.rows is not None:
      q, k, v = self.cache.write_rows(self.qkv.joined(x), start_pos)
      # q as stored (fp16 in a half cache), read as float32: attention's output takes q's type
      return self._attend(q=self._heads(q.cast(dtypes.float32), c.n_heads, c.head_dim, None), k=k, v=v, start_pos=start_pos, rope=rope,
                          q_norm=self._norm_read(self.q_norm), key_rope=self.spec.rope, k_norm=self._norm_read(self.k_norm))
    q, k, v = self.qkv(x)
    if self.spec.qk_norm and sums_per_output(self.norm, x) and self.cache.k.dtype == dtypes.float32:
      # norm single: q and k times their norm weights alone, their 1/rms (a rotation keeps it) applied where they are read
      # and summed there, where a norm before the rotation is realized (the rotation reads it at two indices)
      kh = self._heads(k, c.n_kv_heads, c.head_dim, None)
      k = apply_rope(kh * self.k_norm, *rope, self.spec.interleaved) * rms_scale(kh, c.norm_eps, sum_per_output=True)
      q, q_norm = self._heads(q, c.n_heads, c.head_dim, None), self._norm_read(self.q_norm)
    else:
      k = apply_rope(self._heads(k, c.n_kv_heads, c.head_dim, self.k_norm), *rope, self.spec.interleaved)
      q, q_norm = self._heads(q, c.n_heads, c.head_dim, self.q_norm), None
    v = v.reshape(B, T, c.n_kv_heads, c.v_head_dim).transpose(1, 2)
    k, v = self.cache.update(k, v, start_pos)
    return self._attend(q, k, v, start_pos, rope, q_norm)

  def _norm_read(self, weight: Tensor | None) -> tuple[Tensor, float] | None:
    """A q or k norm for attention() to apply where the logits read q or the keys."""
    return None if weight is None else (weight, self.cfg.norm_eps)

  def _attend(self, q: Tensor, k: Tensor, v: Tensor, start_pos: sint, rope: tuple[Tensor, Tensor], q_norm: tuple[Tensor, float] | None,
              key_rope: tuple[Tensor, Tensor] | None = None, k_norm: tuple[Tensor, float] | None = None) -> Tensor:
    B, _, T, _ = q.shape
    if (written := self._flash_reads(q, start_pos, q_norm, key_rope, k_norm)) is not None:
      flash = flash_decode if T == 1 else flash_prefill
      out = flash(apply_rope(q, *rope, self.spec.interleaved), written, start_pos, scale=self.spec.scale, window=self.spec.window,
                  sinks=self.sinks, softcap=self.spec.softcap)
      return self.o(out.transpose(1, 2).reshape(B, T, self.cfg.n_heads * self.cfg.v_head_dim))
    out = fused_attention(q, k, v, start_pos, scale=self.spec.scale, q_rope=(*rope, self.spec.interleaved), window=self.spec.window,
                          sinks=self.sinks, softcap=self.spec.softcap, q_norm=q_norm, key_rope=key_rope, k_norm=k_norm, variant=self.variant,
                          softmax=self.softmax, chunk_dtype=self.chunk_dtype, split=self.split, weights_break=self.weights_break,
                          upcast=self.upcast)
    return self.o(out.transpose(1, 2).reshape(B, T, self.cfg.n_heads * self.cfg.v_head_dim))

  def _flash_reads(self, q: Tensor, start_pos: sint, q_norm: tuple[Tensor, float] | None, key_rope: tuple[Tensor, Tensor] | None,
                   k_norm: tuple[Tensor, float] | None) -> tuple[Tensor, ...] | None:
    """The cache's buffers as written for the flash kernels (ops/cuda: flash_decode, flash_prefill), where the hint of this
    step (decode_attention for one query row, prefill_attention for a chunk's) chooses them and they take it: a cache of
    heads, q normalized already and keys rotated as stored; None for tinygrad's kernels."""
    kernel = self.decode_kernel if q.shape[2] == 1 else self.prefill_kernel
    if kernel != "flash" or q_norm is not None or key_rope is not None or k_norm is not None: return None
    written = (self.cache.kv,) if self.cache.kv is not None else (self.cache.k, self.cache.v)
    return written if flash_refusal(q, written, start_pos, decode=q.shape[2] == 1) is None else None

def kv_cache_dtype(hints: Hints) -> DType:
  """The KV cache's type: fp16 with the hint kv_cache=half or under ggml rounding (as llama.cpp's default cache; attention
  then rounds q to fp16), else float32."""
  return dtypes.float16 if half_cache(hints.values) else dtypes.float32

def sliding_layers(pattern: int | list, n_layers: int) -> list[bool]:
  """`attention.sliding_window_pattern` as llama.cpp reads it: one flag per layer, or a period whose last layer attends
  globally (0: every layer slides)."""
  if isinstance(pattern, list): return [bool(p) for p in pattern[:n_layers]]
  return [pattern == 0 or (i + 1) % pattern != 0 for i in range(n_layers)]

class FeedForward:
  """down(activation(gate(x), up(x))) over `{prefix}.ffn_{gate,up,down}{suffix}` (suffix "_shexp": DeepSeek's shared experts)."""
  def __init__(self, w: Weights, prefix: str, activation: Gated, suffix: str = ""):
    # gate and up as one matmul over their joined rows (with `fuse`): left as two, tinygrad computes both in one kernel of
    # two reduces, which its GPU optimizer cannot split over threads
    self.gate_up = w.projections([f"{prefix}.ffn_gate{suffix}", f"{prefix}.ffn_up{suffix}"])
    self.down = w.linear(f"{prefix}.ffn_down{suffix}")
    self.activation, self.act_break, self.act_in_matmul = activation, w.hints.act_break, w.hints.act_in_matmul

  def __call__(self, x: Tensor | NormedInput) -> Tensor:
    if self.gate_up.joined_linear() is None: return self.down(down_input(self.activation(*self.gate_up(x)), self.act_break))
    return self.down(gated_down_input(self.activation, self.gate_up.joined(x), prod(x.shape[:-1]) == 1, self.act_break, self.act_in_matmul))

class Block:
  """Pre-norm residual block; `sandwich` adds the post-attention and post-FFN norms (Gemma: with norm `single` each is
  computed by the kernel that adds it to the residual stream). `ffn_norm` names the norm
  before the FFN (GPT-OSS calls it post_attention_norm). attn and ffn are any callables of that signature (MLA, MoE).
  Components the weights' options skip are left out of the residual stream, to measure the others alone."""
  def __init__(self, w: Weights, prefix: str, cfg: ModelConfig, attn: Callable[[Tensor | NormedInput, sint], Tensor],
               ffn: Callable[[Tensor | NormedInput], Tensor],
               sandwich: bool = False, ffn_norm: str = "ffn_norm"):
    self.attn, self.ffn, self.eps, self.skip, self.norm = attn, ffn, cfg.norm_eps, w.hints.skip, w.hints.norm
    self.attn_norm, self.ffn_norm = w.vector(f"{prefix}.attn_norm.weight"), w.vector(f"{prefix}.{ffn_norm}.weight")
    self.post_attn_norm = w.vector(f"{prefix}.post_attention_norm.weight") if sandwich else None
    self.post_ffn_norm = w.vector(f"{prefix}.post_ffw_norm.weight") if sandwich else None

  def _post(self, h: Tensor, norm: Tensor | None) -> Tensor:
    return h if norm is None else rms_norm(h, norm, self.eps, sum_per_output=sums_per_output(self.norm, h))

  def __call__(self, x: Tensor, start_pos: sint) -> Tensor:
    if "attention" not in self.skip:
      h = self.attn(normed_input(x, self.attn_norm, self.eps, self.norm), start_pos)
      x = x + self._post(h, self.post_attn_norm)
    if "ffn" not in self.skip:
      x = x + self._post(self.ffn(normed_input(x, self.ffn_norm, self.eps, self.norm)), self.post_ffn_norm)
    return x

class Transformer:
  """Token ids [B, T] -> logits [B, vocab] at the last position: the blocks (`hidden`), then the `head` at the last
  position or at a given row (a prompt chunk's last token, the chunk padded after it)."""
  def __init__(self, w: Weights, cfg: ModelConfig, blocks: list[Block], embed_scale: float = 1.0):
    # the output norm is folded nowhere: its reader, the sampler, takes realized logits
    self.cfg, self.blocks, self.embed_scale = cfg, blocks, embed_scale
    self.norm = "fused" if w.hints.norm == "fold" else w.hints.norm
    self.embed: QTensor = w.table("token_embd.weight")
    self.output_norm = w.vector("output_norm.weight")
    self.lm_head = w.linear("output") if w.has("output.weight") else w.over(self.embed, "output")

  def __call__(self, tokens: Tensor, start_pos: sint) -> Tensor: return self.head(self.hidden(tokens, start_pos))

  def hidden(self, tokens: Tensor, start_pos: sint) -> Tensor:
    """Token ids [B, T] -> the blocks' output [B, T, dim] (the KV caches written)."""
    x = self.embed.rows(tokens)
    if self.embed_scale != 1.0: x = x * self.embed_scale
    # each block scheduled on its own: tinygrad's scheduling time grows faster than the graph, and a block's output is
    # a buffer either way. In one schedule a prompt chunk's blocks would also dequantize every block's weights for its
    # GEMMs (independent of the chunk) first, all of them alive at once
    for block in self.blocks: x = block(x, start_pos).realize()
    return x

  def head(self, x: Tensor, last: sint | None = None) -> Tensor:
    """The blocks' output [B, T, dim] -> logits [B, vocab] at the last position, or at row `last`."""
    return self.logits(x[:, -1] if last is None else x.shrink(((0, x.shape[0]), (last, last + 1), (0, x.shape[2])))[:, 0])

  def logits(self, x: Tensor) -> Tensor:
    """The blocks' output [..., dim] -> logits [..., vocab] at every row."""
    logits = self.lm_head(normed_input(x, self.output_norm, self.cfg.norm_eps, self.norm))
    return logits if self.cfg.final_softcap is None else (logits / self.cfg.final_softcap).tanh() * self.cfg.final_softcap
