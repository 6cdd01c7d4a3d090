"""Synthetic checkpoints: the shapes, metadata and kind of tokenizer of a real model (or of a small model built the same way), with
seeded random weights in real GGML block layouts, written as a GGUF file that both tinyzoo and llama.cpp load.

Scales keep activations near unit size: every matmul weight has a standard deviation of 1/sqrt(in_features) (its block scales
are drawn to give that), norm weights are 1 + N(0, 0.1^2) (Gemma's GGUFs store the 1 + w already, so these keep its norms near
identity). The embedding table is small (the first residual has an RMS of 1/sqrt(dim)), and the output norm, around
LOGIT_STD / RMS(embedding row), spreads the logits over a few units: with a tied output a token's own row then lifts its logit
only by about LOGIT_STD / RMS(last residual), so that greedy decoding does not merely repeat the last token. Each tensor's random
stream depends only on the seed and the tensor's name: a file is reproducible byte for byte, and `layers` changes nothing in the
blocks two files share."""
import functools
import hashlib
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, LlamaFileType
from gguf.quants import dequantize
from models.config import ModelConfig
from models.registry import ARCHITECTURES, architecture_of
from models.spec import MetadataView, TensorDef
from models.tokenizers.bpe import BYTE_CHARS
from quant.gguf_write import RawTensor, write_gguf
from quant.random_blocks import FLOAT_DTYPES, random_blocks

LOGIT_STD = 4.0      # the spread of the logits of a unit-RMS final hidden state
NORM_STD = 0.1       # norm weights: 1 + N(0, NORM_STD^2)
VOCAB_SEED = 0x70C   # tokenizers do not depend on the weights' seed: a smaller vocabulary is a prefix of a larger one
QUANTS = {t.name: t for t in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)}
_FILE_TYPES = {"F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16, "Q4_0": LlamaFileType.MOSTLY_Q4_0,
               "Q4_1": LlamaFileType.MOSTLY_Q4_1, "Q5_0": LlamaFileType.MOSTLY_Q5_0, "Q8_0": LlamaFileType.MOSTLY_Q8_0,
               "Q4_K": LlamaFileType.MOSTLY_Q4_K_S, "Q5_K": LlamaFileType.MOSTLY_Q5_K_S, "Q6_K": LlamaFileType.MOSTLY_Q6_K,
               "MXFP4": LlamaFileType.MOSTLY_MXFP4_MOE}

# ---- tokenizers

@dataclass(frozen=True)
class BPEVocab:
  """Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the 256 byte tokens, merged tokens each made of two earlier ones, then
  `specials` (control tokens) filling the vocabulary."""
  pre: str
  specials: tuple[str, ...]
  bos: str
  eos: str
  add_bos: bool

  def metadata(self, size: int) -> dict:
    n_merged = size - 256 - len(self.specials)
    if n_merged < 0: raise ValueError(f"a vocabulary of {size} tokens has no room for the 256 bytes and {len(self.specials)} special tokens")
    tokens, merges = _bpe_merges(n_merged)
    tokens = tokens + list(self.specials)
    types = [1] * (size - len(self.specials)) + [3] * len(self.specials)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": self.pre, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": tokens.index(self.bos),
            "tokenizer.ggml.eos_token_id": tokens.index(self.eos), "tokenizer.ggml.add_bos_token": self.add_bos,
            "tokenizer.ggml.add_eos_token": False}

@dataclass(frozen=True)
class SPMVocab:
  """SentencePiece (`tokenizer.ggml.model = "llama"`) as Gemma's: <pad> <eos> <bos> <unk>, the byte tokens <0x00>..<0xFF>, then
  pieces: single characters, and pieces of an earlier piece and one character, scored so that the earlier a piece the
  higher its score."""
  def metadata(self, size: int) -> dict:
    n_pieces = size - 4 - 256
    if n_pieces < len(_SPM_CHARS): raise ValueError(f"a SentencePiece vocabulary of {size} tokens has no room for its {len(_SPM_CHARS)} characters")
    pieces = _spm_pieces(n_pieces)
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    scores = [0.0] * 260 + [-float(i) for i in range(n_pieces)]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * n_pieces
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
            "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": False, "tokenizer.ggml.add_space_prefix": False}

# the characters tokens are grown from, weighted: lower-case letters by their frequency in English, then the rest of ASCII
_ASCII = [chr(c) for c in range(0x21, 0x7f)]
_LETTERS = dict(zip("etaoinshrdlcumwfgypbvkjxqz", (12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0, 1.9,
                                                      1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07)))
_SPM_CHARS = ["\u2581", *_ASCII, *"éèàüöäñçßïôâ"]
MAX_TOKEN_CHARS = 12

def _weight(c: str) -> float: return _LETTERS.get(c, 0.5 if c.isalnum() else 0.3)

def _grow(alphabet: list[str], space: str, n: int) -> list[tuple[str, str]]:
  """n pairs (left, right) of earlier tokens whose joins are new tokens, starting from the alphabet: a word start (space + any
  token) a third of the time; else any token and one of up to 3 characters, two characters drawn by weight, or any token and a
  character drawn by weight."""
  rng = np.random.default_rng(VOCAB_SEED)
  p = np.array([_weight(c) for c in alphabet])
  tokens, known, pairs = list(alphabet), {space, *alphabet}, []
  while len(pairs) < n:
    kind, u, v, c, d = rng.random(4096), rng.random(4096), rng.random(4096), *rng.choice(len(alphabet), (2, 4096), p=p / p.sum())
    for k in range(4096):
      other, any_token = tokens[int(v[k] * len(tokens))], tokens[int(u[k] * len(tokens))]
      if kind[k] < 1 / 3: left, right = space, other
      elif kind[k] < 1 / 2: left, right = any_token, other if len(other) <= 3 else alphabet[c[k]]
      elif kind[k] < 3 / 4: left, right = alphabet[d[k]], alphabet[c[k]]
      else: left, right = any_token, alphabet[c[k]]
      token = left + right
      if right.startswith(space) or token in known or len(token) > MAX_TOKEN_CHARS: continue
      tokens.append(token); known.add(token); pairs.append((left, right))
      if len(pairs) == n: break
  return pairs

@functools.cache
def _bpe_merges(n: int) -> tuple[list[str], list[str]]:
  """The 256 byte tokens (GPT-2's byte -> character table, in byte order) and n merged tokens, with their merges in rank order;
  merged tokens are grown from printable ASCII and the newline."""
  pairs = _grow([BYTE_CHARS[ord(c)] for c in _ASCII + ["\n"]], BYTE_CHARS[ord(" ")], n)
  return BYTE_CHARS + [a + b for a, b in pairs], [f"{a} {b}" for a, b in pairs]

@functools.cache
def _spm_pieces(n: int) -> list[str]:
  """n pieces: the characters, "\u2581" (a space) first, then pieces grown from them."""
  return [*_SPM_CHARS, *(a + b for a, b in _grow(_SPM_CHARS[1:], _SPM_CHARS[0], n - len(_SPM_CHARS)))]

LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                   "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                   "<|eot_id|>", "<|python_tag|>")
SMOLLM2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>", "<filename>", "<gh_stars>",
                    "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
                    "<jupyter_script>", "<empty_output>")

def llama3_specials(n: int) -> tuple[str, ...]:
  """Llama 3's special tokens, reserved ones filling up to n."""
  return LLAMA3_SPECIALS + tuple(f"<|reserved_special_token_{i}|>" for i in range(3, 3 + n - len(LLAMA3_SPECIALS)))

# ---- presets

@dataclass(frozen=True)
class Llama3Rope:
  """Llama 3's rope scaling, which llama.cpp's converter writes as the tensor rope_freqs.weight: per rotated pair, the divisor of
  its frequency (1 for short wavelengths, `factor` for long ones, a smooth ramp between)."""
  factor: float = 32.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  orig_ctx: int = 8192

  def freq_factors(self, rot_dims: int, base: float) -> np.ndarray:
    wavelen = 2 * math.pi * base ** (np.arange(0, rot_dims, 2, dtype=np.float64) / rot_dims)
    smooth = (self.orig_ctx / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
    ramp = 1 / ((1 - smooth) / self.factor + smooth)
    return np.where(wavelen < self.orig_ctx / self.high_freq_factor, 1.0,
                    np.where(wavelen > self.orig_ctx / self.low_freq_factor, self.factor, ramp)).astype(np.float32)

@dataclass(frozen=True)
class MoESpec:
  """Routed experts (and DeepSeek's shared experts and leading dense blocks) as llama.cpp reads them."""
  n_experts: int
  n_used: int
  ffn_dim: int                  # of one expert
  n_shared: int = 0
  n_dense: int = 0              # leading blocks with a dense FFN (deepseek2)
  gating: int | None = None     # deepseek2.expert_gating_func (1 softmax, 2 sigmoid); None leaves the key out
  selection_bias: bool = False  # exp_probs_b: added to the scores only to choose the experts
  norm: bool = False            # expert_weights_norm
  scale: float | None = None    # expert_weights_scale

@dataclass(frozen=True)
class MLASpec:
  """DeepSeek's latent attention: a q-LoRA rank (0: a plain attn_q), the latent rank and the per-head dims."""
  q_lora_rank: int
  kv_lora_rank: int
  nope_dim: int
  rope_dim: int
  v_dim: int

@dataclass(frozen=True)
class YarnSpec:
  factor: float
  orig_ctx: int
  log_mul: float | None = None  # deepseek2: rope.scaling.yarn_log_multiplier as the converter writes it (0.1 * mscale_all_dim)

@dataclass(frozen=True)
class Preset:
  name: str
  arch: str                   # general.architecture: one of models.registry.ARCHITECTURES
  n_layers: int
  dim: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  vocab_size: int
  context_length: int
  norm_eps: float
  rope_base: float
  quant: str                  # default GGML type of the matmul weights
  vocab: BPEVocab | SPMVocab
  llama3_rope: Llama3Rope | None = None
  sliding_window: int | None = None   # gemma3: five layers of six attend within this window (rope base 10000), the sixth globally;
                                      # gpt-oss: even layers slide, odd ones attend fully
  moe: MoESpec | None = None
  mla: MLASpec | None = None
  yarn: YarnSpec | None = None
  tied: bool = True           # the output projection is the embedding table (no output.weight)

  def writes(self, t: TensorDef) -> bool:
    """Whether its files hold tensor t: every one a file needs, and of the optional ones those the model's real files have."""
    if not t.optional: return True
    if t.role == "rope_freqs": return self.llama3_rope is not None
    if t.role == "selection_bias": return self.moe is not None and self.moe.selection_bias
    return t.name == "output.weight" and not self.tied

def _llama32(name: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, vocab_size: int, n_specials: int) -> Preset:
  return Preset(name, "llama", n_layers, dim, n_heads, n_kv_heads, dim // n_heads, ffn_dim, vocab_size, 131072, 1e-5, 500000.0, "Q4_0",
                BPEVocab("llama-bpe", llama3_specials(n_specials), "<|begin_of_text|>", "<|end_of_text|>", add_bos=True), llama3_rope=Llama3Rope())

def _smollm2(name: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, vocab_size: int) -> Preset:
  return Preset(name, "llama", n_layers, dim, n_heads, n_kv_heads, dim // n_heads, ffn_dim, vocab_size, 8192, 1e-5, 100000.0, "Q8_0",
                BPEVocab("smollm", SMOLLM2_SPECIALS, "<|im_start|>", "<|im_end|>", add_bos=False))

def _gemma3(name: str, n_layers: int, dim: int, head_dim: int, ffn_dim: int, vocab_size: int, window: int, quant: str) -> Preset:
  return Preset(name, "gemma3", n_layers, dim, 4, 1, head_dim, ffn_dim, vocab_size, 32768, 1e-6, 1e6, quant, SPMVocab(), sliding_window=window)

def _mixtral(name: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, moe: MoESpec, vocab_size: int) -> Preset:
  return Preset(name, "llama", n_layers, dim, n_heads, n_kv_heads, head_dim, moe.ffn_dim, vocab_size, 32768, 1e-5, 1e6, "Q4_0", SPMVocab(),
                moe=moe, tied=False)

GPT_OSS_SPECIALS = ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
                    "<|call|>")

def _gpt_oss(name: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, moe: MoESpec, vocab_size: int, window: int) -> Preset:
  return Preset(name, "gpt-oss", n_layers, dim, n_heads, n_kv_heads, head_dim, moe.ffn_dim, vocab_size, 131072, 1e-5, 150000.0, "MXFP4",
                BPEVocab("gpt-4o", GPT_OSS_SPECIALS, "<|startoftext|>", "<|return|>", add_bos=False), sliding_window=window, moe=moe,
                yarn=YarnSpec(32.0, 4096), tied=False)

QWEN3_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                  "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")

def _qwen3(name: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn_dim: int, vocab_size: int) -> Preset:
  return Preset(name, "qwen3", n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, 40960, 1e-6, 1e6, "Q8_0",
                BPEVocab("qwen2", QWEN3_SPECIALS, "<|endoftext|>", "<|im_end|>", add_bos=False))

DEEPSEEK_VOCAB = BPEVocab("deepseek-llm", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"), "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                          add_bos=True)
# GLM's own pre-tokenizer ("glm4") is not one tinyzoo's BPE knows; llama.cpp splits it with Llama 3's expression, so it gets Llama 3's
GLM_VOCAB = BPEVocab("llama-bpe", ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
                                "<|observation|>"), "[gMASK]", "<|endoftext|>", add_bos=False)
# Youtu-LLM's vocabulary is Llama 3's size; its own pre-tokenizer ("youtu") is not one tinyzoo's BPE knows: gpt-4o's splits ASCII
# text the same way but for digits (runs of up to 3 where youtu's takes them one by one)
YOUTU_VOCAB = BPEVocab("gpt-4o", llama3_specials(16), "<|begin_of_text|>", "<|end_of_text|>", add_bos=True)

def _deepseek2(name: str, n_layers: int, dim: int, n_heads: int, mla: MLASpec, ffn_dim: int, moe: MoESpec | None, vocab_size: int, ctx: int,
               eps: float, rope_base: float, vocab: BPEVocab, yarn: YarnSpec | None = None, tied: bool = False) -> Preset:
  # converted to the MLA form: one kv head whose key is the latent plus the rope key, and whose value is the latent
  return Preset(name, "deepseek2", n_layers, dim, n_heads, 1, mla.kv_lora_rank + mla.rope_dim, ffn_dim, vocab_size, ctx, eps, rope_base, "Q4_0",
                vocab, moe=moe, mla=mla, yarn=yarn, tied=tied)

DEEPSEEK_V2_YARN = YarnSpec(40.0, 4096, 0.1 * 0.707)

# the -tiny presets: 2 blocks and small dimensions, built like their model (GQA ratio, head size against dim, rope, norms, window pattern,
# tokenizer). The Gemma ones slide a window of 4, so that a short prompt already meets its edge, and keep a head size whose
# 1/sqrt is a power of two, as the real ones (256): llama.cpp scales Gemma's queries before rounding them to fp16, tinyzoo after
PRESETS: dict[str, Preset] = {p.name: p for p in (
  _llama32("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, 256),
  _llama32("llama3.2-1b-tiny", 2, 128, 4, 1, 512, 1024, 16),
  _smollm2("smollm2-135m", 30, 576, 9, 3, 1536, 49152),
  _smollm2("smollm2-135m-tiny", 2, 96, 3, 1, 256, 1024),
  _gemma3("gemma3-270m", 18, 640, 256, 2048, 262144, 512, "Q8_0"),
  _gemma3("gemma3-270m-tiny", 2, 64, 64, 256, 2048, 4, "Q8_0"),
  _gemma3("gemma3-1b", 26, 1152, 256, 6912, 262144, 512, "Q4_0"),
  _gemma3("gemma3-1b-tiny", 2, 96, 16, 576, 2048, 4, "Q4_0"),
  _mixtral("mixtral-8x7b", 32, 4096, 32, 8, 128, MoESpec(8, 2, 14336), 32000),
  _mixtral("mixtral-8x7b-tiny", 2, 128, 4, 1, 32, MoESpec(4, 2, 256), 1024),
  _gpt_oss("gpt-oss-20b", 24, 2880, 64, 8, 64, MoESpec(32, 4, 2880), 201088, 128),
  _gpt_oss("gpt-oss-20b-tiny", 2, 96, 4, 2, 32, MoESpec(4, 2, 96), 1024, 4),
  _deepseek2("deepseek-v2-lite", 27, 2048, 16, MLASpec(0, 512, 128, 64, 128), 10944, MoESpec(64, 6, 1408, 2, 1, gating=1, scale=1.0), 102400,
             163840, 1e-6, 10000.0, DEEPSEEK_VOCAB, DEEPSEEK_V2_YARN),
  _deepseek2("deepseek-v2-lite-tiny", 3, 128, 4, MLASpec(0, 64, 32, 16, 32), 256, MoESpec(8, 3, 64, 2, 1, gating=1, scale=1.0), 1024,
             163840, 1e-6, 10000.0, DEEPSEEK_VOCAB, DEEPSEEK_V2_YARN),
  # converted GLM-4.7-Flash files carry no gating function: llama.cpp picks sigmoid from the shape (47 blocks, 154880 tokens)
  _deepseek2("glm-4.7-flash", 47, 2048, 20, MLASpec(768, 512, 192, 64, 256), 10240,
             MoESpec(64, 4, 1536, 1, 1, selection_bias=True, norm=True, scale=1.8), 154880, 202752, 1e-5, 1e6, GLM_VOCAB),
  _deepseek2("glm-4.7-flash-tiny", 3, 128, 4, MLASpec(96, 64, 64, 16, 64), 256,
             MoESpec(8, 2, 64, 1, 1, gating=2, selection_bias=True, norm=True, scale=1.8), 1024, 202752, 1e-5, 1e6, GLM_VOCAB),
  _deepseek2("youtu-llm-2b", 32, 2048, 16, MLASpec(1536, 512, 128, 64, 128), 6144, None, 128256, 131072, 1e-6, 1.6e6, YOUTU_VOCAB, tied=True),
  _deepseek2("youtu-llm-2b-tiny", 2, 128, 4, MLASpec(96, 64, 32, 16, 32), 256, None, 1024, 131072, 1e-6, 1.6e6, YOUTU_VOCAB, tied=True),
  _qwen3("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936),
  _qwen3("qwen3-0.6b-tiny", 2, 128, 4, 2, 64, 384, 1024),
)}

def _preset(name: str) -> Preset:
  if name not in PRESETS: raise ValueError(f"unknown synthetic preset {name!r} (choose from {', '.join(PRESETS)})")
  return PRESETS[name]

# ---- the file: its tensors as its architecture describes them (models/spec.py), filled by their role

@dataclass(frozen=True)
class SynthTensor:
  name: str
  ggml_type: T
  shape: tuple[int, ...]           # logical, row-major
  std: float                       # of the logical values (around `mean`)
  mean: float = 0.0
  values: np.ndarray | None = None   # fixed values instead of random ones

@functools.cache
def element_std(ggml_type: T) -> float:
  """The standard deviation of a weight of random_blocks(ggml_type, ..., scale=1), measured once on fixed blocks (4 digits)."""
  if GGML_QUANT_SIZES[ggml_type][0] == 1: return 1.0
  raw = random_blocks(ggml_type, (64, 1024), np.random.default_rng(0))
  return float(f"{dequantize(raw, ggml_type).std():.4g}")

def _quant(quant: str | None, p: Preset) -> T:
  name = p.quant if quant is None else quant
  if name not in QUANTS: raise ValueError(f"unknown quant type {name!r} (choose from {', '.join(QUANTS)})")
  if name == "MXFP4" and p.moe is None: raise ValueError(f"MXFP4 is for expert weights, and {p.name} has no experts")
  return QUANTS[name]

def _layers(p: Preset, layers: int | None) -> int:
  if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
    raise ValueError(f"layers must be an integer >= 1, got {layers!r}")
  return p.n_layers if layers is None else layers

ROUTER_BIAS_STD = 0.5   # gpt-oss router biases, against router logits of unit spread
BIAS_STD = 0.1          # projection biases; also DeepSeek's expert selection bias, against sigmoid scores in (0, 1)
SINK_STD = 1.0          # gpt-oss attention sinks, logits of the attention softmax
FILLS = {"norm": (1.0, NORM_STD), "bias": (0.0, BIAS_STD), "router_bias": (0.0, ROUTER_BIAS_STD), "selection_bias": (0.0, BIAS_STD),
         "sinks": (0.0, SINK_STD)}   # F32 vectors: (mean, std)

def tensor_plan(name: str, quant: str | None = None, layers: int | None = None) -> list[SynthTensor]:
  """Every tensor of the file, in order, without data: those its architecture's files hold (models/spec.py) that the
  preset writes. The embedding table (tied unless the preset has an output projection) is Q8_0 under a quantized type and
  that float type otherwise. MXFP4 (gpt-oss's default) puts the experts in MXFP4 and every other matmul in Q8_0, as real
  GPT-OSS files are. Routers, norms, biases and sinks are F32."""
  p = _preset(name)
  xq = _quant(quant, p)
  q = T.Q8_0 if xq == T.MXFP4 else xq
  embd = q if GGML_QUANT_SIZES[q][0] == 1 else T.Q8_0
  # the first residual (the embedding row, times sqrt(dim) in Gemma) has an RMS of 1/sqrt(dim) (see the module's docstring)
  embd_std = 1 / math.sqrt(p.dim) / (math.sqrt(p.dim) if p.arch == "gemma3" else 1)
  out_gain = LOGIT_STD / (embd_std * math.sqrt(p.dim))   # the output norm sets the spread of the logits
  def fill(t: TensorDef) -> SynthTensor:
    if t.role == "embedding": return SynthTensor(t.name, embd, t.shape, embd_std)
    if t.role == "rope_freqs":
      assert p.llama3_rope is not None
      return SynthTensor(t.name, T.F32, t.shape, 0.0, values=p.llama3_rope.freq_factors(2 * t.shape[0], p.rope_base))
    if t.role in ("matmul", "router", "experts"): return SynthTensor(t.name, {"matmul": q, "router": T.F32, "experts": xq}[t.role], t.shape,
                                                                        1 / math.sqrt(t.shape[-1]))
    mean, std = (out_gain, NORM_STD * out_gain) if t.role == "output_norm" else FILLS[t.role]
    return SynthTensor(t.name, T.F32, t.shape, std, mean=mean)
  # the config needs the vocabulary's size only, not its tokens
  meta = MetadataView({"general.architecture": p.arch, **hyperparameters(name, quant, 0, layers), f"{p.arch}.vocab_size": p.vocab_size})
  plan = [fill(t) for t in architecture_of(meta).tensors(ModelConfig.from_gguf(meta), meta) if p.writes(t)]
  for t in plan:
    if t.shape[-1] % (block := GGML_QUANT_SIZES[t.ggml_type][0]):
      raise ValueError(f"{t.ggml_type.name} needs rows of whole {block}-element blocks; {name}'s {t.name} has rows of {t.shape[-1]}")
  return plan

def metadata(name: str, quant: str | None = None, seed: int = 0, layers: int | None = None) -> dict:
  """The file's metadata (without general.architecture, which write_gguf adds): the hyperparameters tinyzoo and llama.cpp
  read, then what the architecture's files say of their own (its module's `metadata`), then the tokenizer."""
  p = _preset(name)
  return hyperparameters(name, quant, seed, layers) | p.vocab.metadata(p.vocab_size)

def hyperparameters(name: str, quant: str | None = None, seed: int = 0, layers: int | None = None) -> dict:
  """The file's metadata but the tokenizer's."""
  p = _preset(name)
  q, n_layers, a = _quant(quant, p), _layers(p, layers), p.arch
  meta = {"general.type": "model", "general.name": f"synthetic {name} (seed {seed})", "general.quantization_version": 2,
          "general.file_type": int(_FILE_TYPES[q.name]),
          f"{a}.context_length": p.context_length, f"{a}.embedding_length": p.dim, f"{a}.block_count": n_layers,
          f"{a}.feed_forward_length": p.ffn_dim,
          f"{a}.attention.head_count": p.n_heads, f"{a}.attention.head_count_kv": p.n_kv_heads, f"{a}.attention.key_length": p.head_dim,
          f"{a}.attention.value_length": p.head_dim if p.mla is None else p.mla.kv_lora_rank,
          f"{a}.attention.layer_norm_rms_epsilon": p.norm_eps, f"{a}.rope.freq_base": p.rope_base}
  arch = ARCHITECTURES[a]
  if hasattr(arch, "metadata"): meta |= arch.metadata(p, n_layers)
  if p.sliding_window is not None: meta[f"{a}.attention.sliding_window"] = p.sliding_window
  if p.moe is not None: meta |= {f"{a}.expert_count": p.moe.n_experts, f"{a}.expert_used_count": p.moe.n_used}
  if p.yarn is not None:
    meta |= {f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": p.yarn.factor,
             f"{a}.rope.scaling.original_context_length": p.yarn.orig_ctx}
    if p.yarn.log_mul is not None: meta[f"{a}.rope.scaling.yarn_log_multiplier"] = p.yarn.log_mul
  return meta

def _data(t: SynthTensor, seed: int) -> np.ndarray:
  if t.values is not None: return t.values
  rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
  if t.mean: return (t.mean + t.std * rng.standard_normal(t.shape)).astype(np.float32)
  raw = random_blocks(t.ggml_type, t.shape, rng, t.std / element_std(t.ggml_type))
  return raw.view(FLOAT_DTYPES[t.ggml_type]) if t.ggml_type in FLOAT_DTYPES else raw   # write_gguf takes F32/F16 as values

def synthesize(preset: str, out: str | Path, quant: str | None = None, seed: int = 0, layers: int | None = None) -> Path:
  """Writes the preset as a GGUF file at `out` (atomically) and returns its path. quant: the GGML type of the matmul weights
  (default: the preset's); layers: the number of blocks instead of the preset's. The same arguments give the same bytes."""
  return write_gguf(out, _preset(preset).arch, metadata(preset, quant, seed, layers), tensors(preset, quant, seed, layers))

# the modules whose code turns a plan and its metadata into the file's bytes
WRITERS = ("models/synth.py", "quant/random_blocks.py", "quant/gguf_write.py")

def digest(preset: str, quant: str | None = None, seed: int = 0, layers: int | None = None) -> str:
  """sha256 of what decides the bytes synthesize writes: the preset (its tokenizer is made from it by this module's code),
  the metadata but the tokenizer's, each tensor's plan (with its block layout and the spread of its random blocks), the
  source of WRITERS and the versions of gguf and numpy. A change elsewhere in tinyzoo (a model's forward pass, a kernel)
  leaves it, and the catalog's file of the preset, as they were."""
  from importlib.metadata import version
  from models.jit_cache import source_digest
  from quant.qtensor import block_format
  def planned(t: SynthTensor) -> dict:
    fmt = block_format(t.ggml_type)
    return {"name": t.name, "type": t.ggml_type.name, "shape": t.shape, "std": t.std, "mean": t.mean, "element_std": element_std(t.ggml_type),
            "block": (fmt.block_elems, fmt.block_bytes, fmt.f16_fields),
            "values": None if t.values is None else hashlib.sha256(np.ascontiguousarray(t.values).tobytes()).hexdigest()}
  parts = {"preset": repr(_preset(preset)), "metadata": hyperparameters(preset, quant, seed, layers), "seed": seed,
           "tensors": [planned(t) for t in tensor_plan(preset, quant, layers)], "writers": source_digest(WRITERS),
           "versions": [version("gguf"), np.__version__]}
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

def tensors(preset: str, quant: str | None = None, seed: int = 0, layers: int | None = None) -> list[RawTensor]:
  """The file's tensors with their data, in order (see synthesize)."""
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0: raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
  return [RawTensor(t.name, t.ggml_type, _data(t, seed)) for t in tensor_plan(preset, quant, layers)]
