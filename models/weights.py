"""Taking a model's tensors out of a GGUF file by name, checked against the shapes the config implies."""
from gguf import GGMLQuantizationType
from tinygrad import Tensor
from tqdm import tqdm
from quant.gguf_file import GGUFFile
from quant.linear import QuantLinear
from quant.qtensor import QTensor

class Weights:
  def __init__(self, g: GGUFFile, strategy: dict[GGMLQuantizationType, str] | str = "packed_dot", device: str | None = None,
               progress: bool = False, rounding: str = "ggml"):
    self.g, self.device, self.strategy, self.rounding = g, device, strategy, rounding
    self.bar = tqdm(total=len(g.tensors), desc="loading weights", unit="tensor", leave=False, disable=not progress)

  def _load(self, name: str, shape: tuple[int, ...]) -> QTensor:
    if name not in self.g.tensors: raise self.g.fail(f"missing tensor {name!r}")
    if (have := self.g.tensors[name].shape) != shape:
      raise self.g.fail(f"tensor {name!r} has shape {have}, but the metadata implies {shape}")
    self.bar.update()
    return self.g.load(name, self.device)

  def has(self, name: str) -> bool: return name in self.g.tensors

  def linear(self, name: str, out_features: int, in_features: int) -> QuantLinear:
    bias = self.vector(f"{name}.bias", out_features) if self.has(f"{name}.bias") else None
    return self.over(self._load(f"{name}.weight", (out_features, in_features)), bias)

  def over(self, w: QTensor, bias: Tensor | None = None) -> QuantLinear:
    """A linear layer over an already loaded tensor (a tied output projection reads the embedding table)."""
    return QuantLinear(w, bias, self.strategy if isinstance(self.strategy, str) else self.strategy.get(w.ggml_type, "packed_dot"), self.rounding)

  def vector(self, name: str, size: int) -> Tensor:
    """A small float tensor (norm weight, bias), dequantized once."""
    return self._load(name, (size,)).dequantize().realize()

  def table(self, name: str, rows: int, cols: int) -> QTensor:
    """An embedding table, kept packed: rows are dequantized when they are looked up."""
    return self._load(name, (rows, cols))
