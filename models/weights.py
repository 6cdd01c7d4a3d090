"""Taking a model's tensors out of a GGUF file by name, checked against its architecture's description of them
(models/spec.py: their shapes as the metadata implies them), read as the kernel hints say (`hints`, which the blocks
read too). Every device tensor made here is labelled with its name, so that a profile can say which weight (or cache)
each kernel reads."""
from typing import Literal
from tinygrad import Tensor
from tqdm import tqdm
from quant.gguf_file import GGUFFile
from ops.norm import NormedInput
from models.spec import TensorDef
from profiles.hints import Hints
from quant.linear import QuantExperts, QuantLinear, StrategyPlan
from quant.qtensor import QTensor, concat_rows

LabelKind = Literal["matmul", "experts", "vector", "table", "cache"]   # experts: a matmul of which a token reads a few

class Weights:
  def __init__(self, g: GGUFFile, hints: Hints, spec: dict[str, TensorDef], device: str | None = None, progress: bool = False):
    self.g, self.hints, self.spec, self.device, self.plan = g, hints, spec, device, StrategyPlan.parse(hints.strategy)
    self.bar = tqdm(total=len(g.tensors), desc="loading weights", unit="tensor", leave=False, disable=not progress)
    self.linears: list[QuantLinear] = []   # every matmul made
    self.labels: list[tuple[str, LabelKind, Tensor]] = []   # (name, kind, device tensor) of everything made here

  def label(self, name: str, kind: LabelKind, t: Tensor) -> Tensor:
    self.labels.append((name, kind, t))
    return t

  def _load(self, name: str) -> QTensor:
    if name not in self.g.tensors: raise self.g.fail(f"missing tensor {name!r}")
    if name not in self.spec: raise self.g.fail(f"tensor {name!r} is none that a {self.g.architecture} file holds (models/spec.py)")
    if (have := self.g.tensors[name].shape) != (shape := self.spec[name].shape):
      raise self.g.fail(f"tensor {name!r} has shape {have}, but the metadata implies {shape}")
    self.bar.update()
    return self.g.load(name, self.device)

  def has(self, name: str) -> bool: return name in self.g.tensors

  def _bias(self, name: str) -> Tensor | None: return self.vector(f"{name}.bias") if self.has(f"{name}.bias") else None

  def linear(self, name: str) -> QuantLinear:
    """A matmul over `{name}.weight` [..., out, in] (leading dims: one matrix per index, e.g. per head), with its bias
    where the file has one, applied to x [..., in]."""
    return self.over(self._load(f"{name}.weight"), name, self._bias(name))

  def experts(self, names: list[str]) -> QuantExperts:
    """Expert weights [experts, out, in] (and biases [experts, out] where the file has them), read per selected expert.
    Several names (gate and up) become one matmul over their joined rows, as `projections` does."""
    weights = [self._load(f"{n}.weight") for n in names]
    biases = [self._load(f"{n}.bias").dequantize() if self.has(f"{n}.bias") else None for n in names]
    weight, bias, name = _joined(names, weights, biases)
    self.linears.append(linear := QuantExperts(weight, bias, self.plan.for_weight(names[0], weight.ggml_type), self.hints.rounding,
                                                 self.hints.prefill))
    for t in linear.device_tensors: self.label(name, "experts", t)
    return linear

  def projections(self, names: list[str]) -> "Projections":
    """Linear layers reading one input: with `fuse`, those of one GGML type become a single matmul over their joined rows."""
    weights = [self._load(f"{n}.weight") for n in names]
    biases = [self._bias(n) for n in names]
    groups: dict = {}
    for i, w in enumerate(weights): groups.setdefault(w.ggml_type if self.hints.fuse else i, []).append(i)
    fused = []
    for members in groups.values():
      weight, bias, name = _joined([names[i] for i in members], [weights[i] for i in members], [biases[i] for i in members])
      fused.append((members, self.over(weight, name, bias)))
    return Projections(fused, [w.shape[-2] for w in weights])

  def over(self, w: QTensor, name: str, bias: Tensor | None = None) -> QuantLinear:
    """A linear layer over an already loaded tensor (a tied output projection reads the embedding table)."""
    self.linears.append(linear := QuantLinear(w, bias, self.plan.for_weight(name, w.ggml_type), self.hints.rounding, self.hints.prefill))
    for t in linear.device_tensors: self.label(name, "matmul", t)
    return linear

  def vector(self, name: str) -> Tensor:
    """A small float tensor (norm weight, bias), dequantized once."""
    return self.label(name.removesuffix(".weight"), "vector", self._load(name).dequantize().realize())

  def table(self, name: str) -> QTensor:
    """An embedding table, kept packed: rows are dequantized when they are looked up."""
    qt = self._load(name)
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
