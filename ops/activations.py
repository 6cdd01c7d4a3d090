"""Gated feed-forward activations: each is gate_fn(gate) * up_fn(up) of the gate and up projections."""
from dataclasses import dataclass
from typing import Callable
from tinygrad import Tensor, dtypes

def _unchanged(x: Tensor) -> Tensor: return x

@dataclass(frozen=True)
class Gated:
  name: str
  gate: Callable[[Tensor], Tensor]
  up: Callable[[Tensor], Tensor] = _unchanged

  def __call__(self, gate: Tensor, up: Tensor) -> Tensor: return self.gate(gate) * self.up(up)

  def of_pairs(self, both: Tensor) -> Tensor:
    """The activation of both [..., 2, F] (gate, then up) as a product over the pair axis. Read from one sum over joined
    gate and up rows, tinygrad computes it in that sum's kernel (a product is a reduce over the pair); taking the two
    halves of the sum instead realizes the sum first, and the activation costs a kernel of its own."""
    gate_first = Tensor.arange(2).reshape(2, 1) == 0
    return gate_first.where(self.gate(both), self.up(both)).prod(-2)

def _gelu_fp16_table(gate: Tensor) -> Tensor:
  """Tensor.gelu (the tanh approximation) rounded as llama.cpp's CPU backend computes it: looked up in a table indexed by
  the fp16 input and holding fp16 outputs, for -10 < x < 10 (0 below, x above)."""
  g = gate.cast(dtypes.float16).cast(dtypes.float32).gelu().cast(dtypes.float16).cast(dtypes.float32)
  return (gate <= -10).where(0, (gate >= 10).where(gate, g))

CLAMP, ALPHA = 7.0, 1.702

def _clamped_gate(gate: Tensor) -> Tensor:
  gate = gate.minimum(CLAMP)
  return gate * (ALPHA * gate).sigmoid()

swiglu = Gated("swiglu", Tensor.silu)
geglu = Gated("geglu", Tensor.gelu)
geglu_fp16_table = Gated("geglu_fp16_table", _gelu_fp16_table)
# GPT-OSS: the gate is clamped from above only, the up projection on both sides and shifted by one
swiglu_clamped = Gated("swiglu_clamped", _clamped_gate, lambda up: up.clip(-CLAMP, CLAMP) + 1)
