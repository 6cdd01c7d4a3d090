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
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, LlamaFileType
from gguf.quants import dequantize
from models.tokenizers.bpe import BYTE_CHARS
from quant.gguf_write import RawTensor, write_gguf
from quant.random_blocks import FLOAT_DTYPES, random_blocks

LOGIT_STD = 4.0      # the spread of the logits of a unit-RMS final hidden state
NORM_STD = 0.1       # norm weights: 1 + N(0, NORM_STD^2)
VOCAB_SEED = 0x70C   # tokenizers do not depend on the weights' seed: a smaller vocabulary is a prefix of a larger one
QUANTS = {t.name: t for t in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)}
_FILE_TYPES = {"F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16, "Q4_0": LlamaFileType.MOSTLY_Q4_0,
               "Q4_1": LlamaFileType.MOSTLY_Q4_1, "Q5_0": LlamaFileType.MOSTLY_Q5_0, "Q8_0": LlamaFileType.MOSTLY_Q8_0,
               "Q4_K": LlamaFileType.MOSTLY_Q4_K_S, "Q5_K": LlamaFileType.MOSTLY_Q5_K_S, "Q6_K": LlamaFileType.MOSTLY_Q6_K}

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
class Preset:
  name: str
  arch: str                   # general.architecture: "llama" or "gemma3"
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
  sliding_window: int | None = None   # gemma3: five layers of six attend within this window (rope base 10000), the sixth globally

def _llama32(name: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, vocab_size: int, n_specials: int) -> Preset:
  return Preset(name, "llama", n_layers, dim, n_heads, n_kv_heads, dim // n_heads, ffn_dim, vocab_size, 131072, 1e-5, 500000.0, "Q4_0",
                BPEVocab("llama-bpe", llama3_specials(n_specials), "<|begin_of_text|>", "<|end_of_text|>", add_bos=True), llama3_rope=Llama3Rope())

def _smollm2(name: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, vocab_size: int) -> Preset:
  return Preset(name, "llama", n_layers, dim, n_heads, n_kv_heads, dim // n_heads, ffn_dim, vocab_size, 8192, 1e-5, 100000.0, "Q8_0",
                BPEVocab("smollm", SMOLLM2_SPECIALS, "<|im_start|>", "<|im_end|>", add_bos=False))

def _gemma3(name: str, n_layers: int, dim: int, head_dim: int, ffn_dim: int, vocab_size: int, window: int, quant: str) -> Preset:
  return Preset(name, "gemma3", n_layers, dim, 4, 1, head_dim, ffn_dim, vocab_size, 32768, 1e-6, 1e6, quant, SPMVocab(), sliding_window=window)

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
)}

def _preset(name: str) -> Preset:
  if name not in PRESETS: raise ValueError(f"unknown synthetic preset {name!r} (choose from {', '.join(PRESETS)})")
  return PRESETS[name]

# ---- the file

@dataclass(frozen=True)
class TensorSpec:
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
  return QUANTS[name]

def _layers(p: Preset, layers: int | None) -> int:
  if layers is None: return p.n_layers
  if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1: raise ValueError(f"layers must be an integer >= 1, got {layers!r}")
  return layers

def tensor_plan(name: str, quant: str | None = None, layers: int | None = None) -> list[TensorSpec]:
  """Every tensor of the file, in order, without data. The embedding table (tied: it is the output projection too) is Q8_0
  under a quantized type and that float type otherwise."""
  p = _preset(name)
  q, n_layers = _quant(quant, p), _layers(p, layers)
  embd = q if GGML_QUANT_SIZES[q][0] == 1 else T.Q8_0
  q_dim, kv_dim = p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim
  matmul = lambda n, out, inp: TensorSpec(n, q, (out, inp), 1 / math.sqrt(inp))
  norm = lambda n, size: TensorSpec(n, T.F32, (size,), NORM_STD, mean=1.0)
  # the first residual (the embedding row, times sqrt(dim) in Gemma) has an RMS of 1/sqrt(dim) (see the module's docstring)
  embd_std = 1 / math.sqrt(p.dim) / (math.sqrt(p.dim) if p.arch == "gemma3" else 1)
  plan = [TensorSpec("token_embd.weight", embd, (p.vocab_size, p.dim), embd_std)]
  if p.llama3_rope is not None:
    factors = p.llama3_rope.freq_factors(p.head_dim, p.rope_base)
    plan.append(TensorSpec("rope_freqs.weight", T.F32, factors.shape, 0.0, values=factors))
  for i in range(n_layers):
    b = f"blk.{i}"
    plan += [norm(f"{b}.attn_norm.weight", p.dim), matmul(f"{b}.attn_q.weight", q_dim, p.dim), matmul(f"{b}.attn_k.weight", kv_dim, p.dim),
             matmul(f"{b}.attn_v.weight", kv_dim, p.dim), matmul(f"{b}.attn_output.weight", p.dim, q_dim)]
    if p.arch == "gemma3":
      plan += [norm(f"{b}.attn_q_norm.weight", p.head_dim), norm(f"{b}.attn_k_norm.weight", p.head_dim),
               norm(f"{b}.post_attention_norm.weight", p.dim)]
    plan += [norm(f"{b}.ffn_norm.weight", p.dim), matmul(f"{b}.ffn_gate.weight", p.ffn_dim, p.dim), matmul(f"{b}.ffn_up.weight", p.ffn_dim, p.dim),
             matmul(f"{b}.ffn_down.weight", p.dim, p.ffn_dim)]
    if p.arch == "gemma3": plan.append(norm(f"{b}.post_ffw_norm.weight", p.dim))
  out_gain = LOGIT_STD / (embd_std * math.sqrt(p.dim))   # the output norm sets the spread of the logits
  plan.append(TensorSpec("output_norm.weight", T.F32, (p.dim,), NORM_STD * out_gain, mean=out_gain))
  for t in plan:
    if t.shape[-1] % (block := GGML_QUANT_SIZES[t.ggml_type][0]):
      raise ValueError(f"{t.ggml_type.name} needs rows of whole {block}-element blocks; {name}'s {t.name} has rows of {t.shape[-1]}")
  return plan

def metadata(name: str, quant: str | None = None, seed: int = 0, layers: int | None = None) -> dict:
  """The file's metadata (without general.architecture, which write_gguf adds): what llama.cpp needs to load it, what tinyzoo reads."""
  p = _preset(name)
  q, n_layers, a = _quant(quant, p), _layers(p, layers), p.arch
  meta = {"general.type": "model", "general.name": f"synthetic {name} (seed {seed})", "general.quantization_version": 2,
          "general.file_type": int(_FILE_TYPES[q.name]),
          f"{a}.context_length": p.context_length, f"{a}.embedding_length": p.dim, f"{a}.block_count": n_layers,
          f"{a}.feed_forward_length": p.ffn_dim,
          f"{a}.attention.head_count": p.n_heads, f"{a}.attention.head_count_kv": p.n_kv_heads, f"{a}.attention.key_length": p.head_dim,
          f"{a}.attention.value_length": p.head_dim, f"{a}.attention.layer_norm_rms_epsilon": p.norm_eps, f"{a}.rope.freq_base": p.rope_base}
  if a == "llama": meta |= {"llama.rope.dimension_count": p.head_dim, "llama.vocab_size": p.vocab_size}
  if p.sliding_window is not None: meta[f"{a}.attention.sliding_window"] = p.sliding_window
  return meta | p.vocab.metadata(p.vocab_size)

def _data(t: TensorSpec, seed: int) -> np.ndarray:
  if t.values is not None: return t.values
  rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
  if t.mean: return (t.mean + t.std * rng.standard_normal(t.shape)).astype(np.float32)
  raw = random_blocks(t.ggml_type, t.shape, rng, t.std / element_std(t.ggml_type))
  return raw.view(FLOAT_DTYPES[t.ggml_type]) if t.ggml_type in FLOAT_DTYPES else raw   # write_gguf takes F32/F16 as values

def synthesize(preset: str, out: str | Path, quant: str | None = None, seed: int = 0, layers: int | None = None) -> Path:
  """Writes the preset as a GGUF file at `out` (atomically) and returns its path. quant: the GGML type of the matmul weights
  (default: the preset's); layers: the number of blocks instead of the preset's. The same arguments give the same bytes."""
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0: raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
  plan = tensor_plan(preset, quant, layers)
  return write_gguf(out, PRESETS[preset].arch, metadata(preset, quant, seed, layers), [RawTensor(t.name, t.ggml_type, _data(t, seed)) for t in plan])
