"""An independent float64 numpy forward pass of the dense architectures, weights dequantized by gguf.quants."""
import functools
import math
import os
import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from quant.gguf_file import GGUFFile

def _weight(g: GGUFFile, name: str) -> np.ndarray:
  kept = _kept(g.path, os.stat(g.path).st_mtime_ns)
  if name not in kept:
    t = g.tensors[name]
    # gguf.quants dequantizes 16 of the array's rows a call: rows of up to 4096 blocks each, however short the tensor's
    # rows, make its calls few (a block dequantizes alone, so the values are the same)
    raw, size = g.raw(name).reshape(-1), GGML_QUANT_SIZES[t.ggml_type][1]
    kept[name] = quants.dequantize(raw.reshape(-1, math.gcd(raw.size // size, 4096) * size), t.ggml_type).reshape(t.shape)
  return kept[name].astype(np.float64)

@functools.lru_cache(maxsize=1)
def _kept(path: str, mtime_ns: int) -> dict[str, np.ndarray]:
  """The weights of the file read last, as gguf.quants dequantizes them: a model's tests each draw other token ids,
  while dequantizing a real model's weights is most of a forward pass."""
  return {}

def _rope(x: np.ndarray, pos: np.ndarray, base: float, interleaved: bool) -> np.ndarray:
  hd = x.shape[-1]
  theta = pos[:, None, None] * base ** (-np.arange(0, hd, 2) / hd)
  a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :hd // 2], x[..., hd // 2:])
  ra, rb = a * np.cos(theta) - b * np.sin(theta), b * np.cos(theta) + a * np.sin(theta)
  return np.stack([ra, rb], -1).reshape(x.shape) if interleaved else np.concatenate([ra, rb], -1)

def forward(g: GGUFFile, ids: list[int], first: int | None = None) -> np.ndarray:
  """Logits at the last position of `ids`, or with `first` at each position from `first` on ([len(ids) - first, vocab]:
  attention is causal, so position j's are those of ids[:j + 1] at its last), for llama, gemma3 and qwen3 GGUFs."""
  arch = g.architecture
  m = lambda key, default=None: g.get(f"{arch}.{key}", default)
  dim, heads, kv_heads, eps = m("embedding_length"), m("attention.head_count"), m("attention.head_count_kv"), m("attention.layer_norm_rms_epsilon")
  hd, gemma, qk_norm = m("attention.key_length", dim // heads), arch == "gemma3", arch in ("gemma3", "qwen3")
  W = lambda name: _weight(g, name)
  rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
  T, pos = len(ids), np.arange(len(ids), dtype=np.float64)
  embed = W("token_embd.weight")
  x = embed[ids] * (np.sqrt(dim) if gemma else 1.0)
  for i in range(m("block_count")):
    p = f"blk.{i}."
    local = gemma and (i + 1) % 6 != 0
    h = rms(x, W(p + "attn_norm.weight"))
    q, k, v = (h @ W(p + f"attn_{n}.weight").T for n in "qkv")
    q, k, v = q.reshape(T, heads, hd), k.reshape(T, kv_heads, hd), v.reshape(T, kv_heads, hd)
    if qk_norm: q, k = rms(q, W(p + "attn_q_norm.weight")), rms(k, W(p + "attn_k_norm.weight"))
    base = 10000.0 if local else m("rope.freq_base", 10000.0)
    q, k = _rope(q, pos, base, arch == "llama"), _rope(k, pos, base, arch == "llama")
    k, v = np.repeat(k, heads // kv_heads, axis=1), np.repeat(v, heads // kv_heads, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    dist = pos[:, None] - pos[None]
    visible = (dist >= 0) & ((dist < m("attention.sliding_window")) if local else True)
    scores = np.where(visible, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    o = np.einsum("hts,shd->thd", probs / probs.sum(-1, keepdims=True), v).reshape(T, -1) @ W(p + "attn_output.weight").T
    x = x + (rms(o, W(p + "post_attention_norm.weight")) if gemma else o)
    h = rms(x, W(p + "ffn_norm.weight"))
    gate, up = h @ W(p + "ffn_gate.weight").T, h @ W(p + "ffn_up.weight").T
    act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3))) if gemma else gate / (1 + np.exp(-gate))
    o = (act * up) @ W(p + "ffn_down.weight").T
    x = x + (rms(o, W(p + "post_ffw_norm.weight")) if gemma else o)
  return embed @ rms(x[-1], W("output_norm.weight")) if first is None else rms(x[first:], W("output_norm.weight")) @ embed.T
