"""Taking a model's tensors out of a GGUF file by name, checked against the shapes the config implies, and the
options the blocks are built with. Every device tensor made here is labelled with its name, so that a profile can
say which weight (or cache) each kernel reads."""
from typing import Literal
from tinygrad import Tensor
from tqdm import tqdm
from quant.gguf_file import GGUFFile
from ops.attention import LAYOUTS as KV_LAYOUTS, SOFTMAXES, VARIANTS as ATTENTION_VARIANTS
from ops.norm import NORMS, NormedInput
from ops.topk import topk_by_name
from quant.linear import QuantExperts, QuantLinear, StrategyPlan
from quant.qtensor import QTensor, concat_rows

SKIPPABLE = ("attention", "ffn")   # component isolation: blocks leave these out of the residual stream
LabelKind = Literal["matmul", "experts", "vector", "table", "cache"]   # experts: a matmul of which a token reads a few

class Weights:
  def __init__(self, g: GGUFFile, strategy: StrategyPlan | str = "packed_dot", device: str | None = None,
               progress: bool = False, rounding: str = "exact", fuse: bool = True, skip: tuple[str, ...] = (), topk: str = "pairwise",
               norm: str = "fused", act_break: bool = True, attention: str = "chunked", kv_layout: str = "heads",
               act_in_matmul: bool = False, softmax: str = "max"):
    if (bad := [c for c in skip if c not in SKIPPABLE]): raise ValueError(f"cannot skip {bad[0]!r} (choose from {', '.join(SKIPPABLE)})")
    if norm not in NORMS: raise ValueError(f"unknown norm mode {norm!r} (choose from {', '.join(NORMS)})")
    if attention not in ATTENTION_VARIANTS: raise ValueError(f"unknown attention variant {attention!r} (choose from {', '.join(ATTENTION_VARIANTS)})")
    if kv_layout not in KV_LAYOUTS: raise ValueError(f"unknown KV cache layout {kv_layout!r} (choose from {', '.join(KV_LAYOUTS)})")
    if softmax not in SOFTMAXES: raise ValueError(f"unknown softmax stabilizer {softmax!r} (choose from {', '.join(SOFTMAXES)})")
    self.g, self.device, self.rounding, self.fuse, self.skip, self.norm = g, device, rounding, fuse, frozenset(skip), norm
    self.act_break, self.act_in_matmul, self.attention, self.kv_layout, self.softmax = act_break, act_in_matmul, attention, kv_layout, softmax
    self.topk = topk_by_name(topk)
    self.plan = StrategyPlan.parse(strategy) if isinstance(strategy, str) else strategy
    self.bar = tqdm(total=len(g.tensors), desc="loading weights", unit="tensor", leave=False, disable=not progress)
    self.linears: list[QuantLinear] = []   # every matmul made
    self.labels: list[tuple[str, LabelKind, Tensor]] = []   # (name, kind, device tensor) of everything made here

  def label(self, name: str, kind: LabelKind, t: Tensor) -> Tensor:
    self.labels.append((name, kind, t))
    return t

  def _load(self, name: str, shape: tuple[int, ...]) -> QTensor:
    if name not in self.g.tensors: raise self.g.fail(f"missing tensor {name!r}")
    if (have := self.g.tensors[name].shape) != shape:
      raise self.g.fail(f"tensor {name!r} has shape {have}, but the metadata implies {shape}")
    self.bar.update()
    return self.g.load(name, self.device)

  def has(self, name: str) -> bool: return name in self.g.tensors

  def _bias(self, name: str, size: int) -> Tensor | None: return self.vector(f"{name}.bias", size) if self.has(f"{name}.bias") else None

  def linear(self, name: str, out_features: int, in_features: int) -> QuantLinear:
    return self.over(self._load(f"{name}.weight", (out_features, in_features)), name, self._bias(name, out_features))

  def stacked(self, name: str, shape: tuple[int, ...]) -> QuantLinear:
    """A matmul over a weight with leading dims [..., out, in] (one matrix per head), applied to x [..., in]."""
    return self.over(self._load(f"{name}.weight", shape), name)

  def experts(self, names: list[str], n_experts: int, outs: list[int], in_features: int) -> QuantExperts:
    """Expert weights [experts, out, in] (and biases [experts, out] where the file has them), read per selected expert.
    Several names (gate and up) become one matmul over their joined rows, as `projections` does."""
    weights = [self._load(f"{n}.weight", (n_experts, o, in_features)) for n, o in zip(names, outs)]
    biases = [self._load(f"{n}.bias", (n_experts, o)).dequantize() if self.has(f"{n}.bias") else None for n, o in zip(names, outs)]
    weight, bias, name = _joined(names, weights, biases)
    self.linears.append(linear := QuantExperts(weight, bias, self.plan.for_weight(names[0], weight.ggml_type), self.rounding))
    for t in linear.device_tensors: self.label(name, "experts", t)
    return linear

  def projections(self, names: list[str], outs: list[int], in_features: int) -> "Projections":
    """Linear layers reading one input: with `fuse`, those of one GGML type become a single matmul over their joined rows."""
    weights = [self._load(f"{n}.weight", (o, in_features)) for n, o in zip(names, outs)]
    biases = [self._bias(n, o) for n, o in zip(names, outs)]
    groups: dict = {}
    for i, w in enumerate(weights): groups.setdefault(w.ggml_type if self.fuse else i, []).append(i)
    fused = []
    for members in groups.values():
      weight, bias, name = _joined([names[i] for i in members], [weights[i] for i in members], [biases[i] for i in members])
      fused.append((members, self.over(weight, name, bias)))
    return Projections(fused, outs)

  def over(self, w: QTensor, name: str, bias: Tensor | None = None) -> QuantLinear:
    """A linear layer over an already loaded tensor (a tied output projection reads the embedding table)."""
    self.linears.append(linear := QuantLinear(w, bias, self.plan.for_weight(name, w.ggml_type), self.rounding))
    for t in linear.device_tensors: self.label(name, "matmul", t)
    return linear

  def vector(self, name: str, size: int) -> Tensor:
    """A small float tensor (norm weight, bias), dequantized once."""
    return self.label(name.removesuffix(".weight"), "vector", self._load(name, (size,)).dequantize().realize())

  def table(self, name: str, rows: int, cols: int) -> QTensor:
    """An embedding table, kept packed: rows are dequantized when they are looked up."""
    qt = self._load(name, (rows, cols))
    self.label(name.removesuffix(".weight"), "table", qt.blocks)
    return qt

def _joined(names: list[str], weights: list[QTensor], biases: list[Tensor | None]) -> tuple[QTensor, Tensor | None, str]:
  """Weights [..., out_i, in] as one over their joined rows, their biases [..., out_i] likewise (zeros where one has
  none), and the joined name: 'blk.0.ffn_gate+ffn_up'."""
  weight = weights[0] if len(weights) == 1 else concat_rows(weights)
  bias = None if all(b is None for b in biases) else \
    Tensor.cat(*[b if b is not None else Tensor.zeros(*w.shape[:-1]) for b, w in zip(biases, weights)], dim=-1).realize()
  return weight, bias, names[0] + "".join("+" + n.rsplit(".", 1)[-1] for n in names[1:])

class Projections:
  """Calls its matmuls on one input and returns each projection's output, in the order they were named."""
  def __init__(self, fused: list[tuple[list[int], QuantLinear]], outs: list[int]):
    self.fused, self.outs = fused, outs

  def __call__(self, x: Tensor | NormedInput) -> list[Tensor]:
    out: list[Tensor | None] = [None] * len(self.outs)
    for members, linear in self.fused:
      for i, part in zip(members, _apply(linear, x).split([self.outs[i] for i in members], dim=-1)): out[i] = part
    return out  # type: ignore[return-value]

  def joined_linear(self) -> QuantLinear | None:
    """The one matmul over all the projections' rows, in their order, where they are one."""
    return self.fused[0][1] if len(self.fused) == 1 else None

  def joined(self, x: Tensor | NormedInput) -> Tensor:
    """All the projections as one output [..., sum(outs)] (needs joined_linear)."""
    if (linear := self.joined_linear()) is None: raise ValueError("the projections are not one matmul")
    return _apply(linear, x)

def _apply(linear: QuantLinear, x: Tensor | NormedInput) -> Tensor:
  return linear.normed(x) if isinstance(x, NormedInput) else linear(x)
