"""One description of each architecture's files: every tensor they hold, its shape and role, and whether a file may leave
it out, derived from the file's metadata by the architecture's module (`tensors(cfg, meta)`) out of the shared layouts
below. The model loads and checks its tensors by it (models/weights.py), the synthetic presets write them by it
(models/synth.py), and the tests take llama.cpp's expectations from it.

Shapes are numpy's (row-major, a matmul's weight [..., out, in]); llama.cpp names them reversed (its `ne`)."""
from dataclasses import dataclass
from typing import Any, Iterable
from models.config import ModelConfig

# what a tensor is, which says how a synthetic file fills it
ROLES = ("embedding", "rope_freqs", "matmul", "router", "experts", "norm", "output_norm", "bias", "router_bias", "selection_bias", "sinks")

@dataclass(frozen=True)
class TensorDef:
  name: str
  shape: tuple[int, ...]
  role: str
  optional: bool = False   # llama.cpp loads a file without it; the model reads it where the file has it

  def __post_init__(self):
    if self.role not in ROLES: raise ValueError(f"{self.name}: unknown role {self.role!r}")

class MetadataView:
  """A file's metadata as a dict (a synthetic file before it is written), read as a GGUFFile's is: get, require, fail."""
  def __init__(self, metadata: dict[str, Any]):
    self.metadata, self.architecture, self.tensors = metadata, metadata["general.architecture"], {}
    self.path = f"metadata of {metadata.get('general.name', self.architecture)}"

  def get(self, key: str, default: Any = None) -> Any: return self.metadata.get(key, default)

  def keys(self) -> Iterable[str]: return self.metadata.keys()

  def fail(self, msg: str) -> ValueError: return ValueError(f"{self.path}: {msg}")

  def require(self, key: str) -> Any:
    if key not in self.metadata: raise self.fail(f"missing metadata key {key!r}")
    return self.metadata[key]

  def array_len(self, key: str) -> int: return len(self.metadata.get(key, ()))

def by_name(tensors: list[TensorDef]) -> dict[str, TensorDef]: return {t.name: t for t in tensors}

# ---- the shared layouts, in the order llama.cpp's converters write them

def embedding(cfg: ModelConfig) -> TensorDef: return TensorDef("token_embd.weight", (cfg.vocab_size, cfg.dim), "embedding")

def head(cfg: ModelConfig, tied: bool = True) -> list[TensorDef]:
  """The output norm and projection; with `tied`, a file may leave the projection out (the embedding table is read)."""
  return [TensorDef("output_norm.weight", (cfg.dim,), "output_norm"), TensorDef("output.weight", (cfg.vocab_size, cfg.dim), "matmul", tied)]

def norm(name: str, size: int) -> TensorDef: return TensorDef(f"{name}.weight", (size,), "norm")

def matmul(name: str, out: int, inp: int, bias: bool | None = False, lead: tuple[int, ...] = (), role: str = "matmul") -> list[TensorDef]:
  """A weight [*lead, out, in] and its bias [*lead, out] where it has one (None: a file may have one)."""
  weight = [TensorDef(f"{name}.weight", (*lead, out, inp), role)]
  return weight if bias is False else weight + [TensorDef(f"{name}.bias", (*lead, out), "bias", bias is None)]

def attention(b: str, cfg: ModelConfig, biases: bool | None = False, output_bias: bool | None = False) -> list[TensorDef]:
  """q, k, v and the output projection of grouped-query attention (biases as `matmul` has them)."""
  q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  return [*matmul(f"{b}.attn_q", q, cfg.dim, biases), *matmul(f"{b}.attn_k", kv, cfg.dim, biases),
          *matmul(f"{b}.attn_v", cfg.n_kv_heads * cfg.v_head_dim, cfg.dim, biases),
          *matmul(f"{b}.attn_output", cfg.dim, cfg.n_heads * cfg.v_head_dim, output_bias)]

def qk_norms(b: str, cfg: ModelConfig) -> list[TensorDef]: return [norm(f"{b}.attn_q_norm", cfg.head_dim), norm(f"{b}.attn_k_norm", cfg.head_dim)]

def feed_forward(b: str, dim: int, ffn_dim: int | None, suffix: str = "") -> list[TensorDef]:
  """gate, up and down of a gated FFN (suffix "_shexp": shared experts)."""
  if ffn_dim is None: raise ValueError(f"missing metadata key 'feed_forward_length', which {b}'s dense feed-forward needs")
  return [*matmul(f"{b}.ffn_gate{suffix}", ffn_dim, dim), *matmul(f"{b}.ffn_up{suffix}", ffn_dim, dim),
          *matmul(f"{b}.ffn_down{suffix}", dim, ffn_dim)]

def experts(b: str, dim: int, n_experts: int, ffn_dim: int, biases: bool = False, selection_bias: bool = False) -> list[TensorDef]:
  """The router (F32 rows, with `biases` a bias of its own), DeepSeek's optional selection bias, and gate, up and down
  experts [experts, out, in] (with `biases`, each with a bias [experts, out]); gate and up may come joined instead, as
  one `ffn_gate_up_exps` of both their rows (a newer converter's layout, which llama.cpp's loader here does not read)."""
  E = (n_experts,)
  router = [TensorDef(f"{b}.ffn_gate_inp.weight", (n_experts, dim), "router")] + \
    ([TensorDef(f"{b}.ffn_gate_inp.bias", E, "router_bias")] if biases else [])
  chosen = [TensorDef(f"{b}.exp_probs_b.bias", E, "selection_bias", optional=True)] if selection_bias else []
  joined = [TensorDef(t.name, t.shape, t.role, optional=True)
            for t in matmul(f"{b}.ffn_gate_up_exps", 2 * ffn_dim, dim, biases, E, "experts")]
  return router + chosen + [t for n, out, inp in (("gate", ffn_dim, dim), ("up", ffn_dim, dim), ("down", dim, ffn_dim))
                            for t in matmul(f"{b}.ffn_{n}_exps", out, inp, biases, E, "experts")] + joined
