"""Taking a model's tensors out of a GGUF file by name, checked against its architecture's description of them
(models/spec.py: their shapes as the metadata implies them), read as the kernel hints say (`hints`, which the blocks
read too). Every device tensor made here is labelled with its name, so that a profile can say which weight (or cache)
each kernel reads."""
from typing import Literal
from tinygrad import Tensor
from tqdm import tqdm
from quant.gguf_file import GGUFFile, TensorInfo
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

  def _check(self, name: str) -> TensorInfo:
    if name not in self.g.tensors: raise self.g.fail(f"missing tensor {name!r}")
    if name not in self.spec: raise self.g.fail(f"tensor {name!r} is none that a {self.g.architecture} file holds (models/spec.py)")
    if (have := self.g.tensors[name].shape) != (shape := self.spec[name].shape):
      raise self.g.fail(f"tensor {name!r} has shape {have}, but the metadata implies {shape}")
    return self.g.tensors[name]

  def _load(self, name: str) -> QTensor:
    self._check(name)
    self.bar.update()
    return self.g.load(name, self.device)

  def _load_joined(self, names: list[str]) -> QTensor:
    """Tensors of one GGML type as one over their joined rows."""
    if len(names) == 1: return self._load(names[0])
    infos = [self._check(n) for n in names]
    self.bar.update(len(names))
    try: return concat_rows([(self.g.raw(i.name), i.shape) for i in infos], infos[0].ggml_type, self.device)
    except ValueError as e: raise self.g.fail(f"tensors {', '.join(map(repr, names))}: {e}") from None

  def has(self, name: str) -> bool: return name in self.g.tensors

  def _bias(self, name: str) -> Tensor | None: return self.vector(f"{name}.bias") if self.has(f"{name}.bias") else None

  def linear(self, name: str) -> QuantLinear:
    """A matmul over `{name}.weight` [..., out, in] (leading dims: one matrix per index, e.g. per head), with its bias
    where the file has one, applied to x [..., in]."""
    return self.over(self._load(f"{name}.weight"), name, self._bias(name))

  def experts(self, names: list[str]) -> QuantExperts:
    """Expert weights [experts, out, in] (and biases [experts, out] where the file has them), read per selected expert.
    Several names (gate and up) become one matmul over their joined rows, as `projections` does."""
    weight = self._load_joined([f"{n}.weight" for n in names])
    biases = [self._load(f"{n}.bias").dequantize() if self.has(f"{n}.bias") else None for n in names]
    bias, name = self._joined_bias(names, biases), _joined_name(names)
    self.linears.append(linear := QuantExperts(weight, bias, self.plan.for_weight(names[0], weight.ggml_type), self.hints.rounding,
                                                 self.hints.prefill, self.hints.casts == "keep", self.hints.gemm))
    for t in linear.device_tensors: self.label(name, "experts", t)
    return linear

  def _joined_bias(self, names: list[str], biases: list[Tensor | None]) -> Tensor | None:
    """The biases [..., out_i] of matmuls joined as their weights' rows are (zeros where one has none)."""
    if all(b is None for b in biases): return None
    outs = [self.g.tensors[f"{n}.weight"].shape[:-1] for n in names]
    return Tensor.cat(*[b if b is not None else Tensor.zeros(*out) for b, out in zip(biases, outs)], dim=-1).realize()

  def projections(self, names: list[str]) -> "Projections":
    """Linear layers reading one input: with `fuse`, those of one GGML type become a single matmul over their joined rows."""
    infos = [self._check(f"{n}.weight") for n in names]
    biases = [self._bias(n) for n in names]
    groups: dict = {}
    for i, info in enumerate(infos): groups.setdefault(info.ggml_type if self.hints.fuse else i, []).append(i)
    fused = []
    for members in groups.values():
      weight = self._load_joined([f"{names[i]}.weight" for i in members])
      joined = [names[i] for i in members]
      fused.append((members, self.over(weight, _joined_name(joined), self._joined_bias(joined, [biases[i] for i in members]))))
    return Projections(fused, [info.shape[-2] for info in infos])

  def over(self, w: QTensor, name: str, bias: Tensor | None = None) -> QuantLinear:
    """A linear layer over an already loaded tensor (a tied output projection reads the embedding table)."""
    self.linears.append(linear := QuantLinear(w, bias, self.plan.for_weight(name, w.ggml_type), self.hints.rounding, self.hints.prefill,
                                              self.hints.casts == "keep", self.hints.gemm))
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

def _joined_name(names: list[str]) -> str:
  """'blk.0.ffn_gate+ffn_up' for the names of joined matmuls."""
  return names[0] + "".join("+" + n.rsplit(".", 1)[-1] for n in names[1:])

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
