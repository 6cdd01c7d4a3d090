"""Gated feed-forward activations: each takes the gate and up projections and returns their gated product."""
from tinygrad import Tensor, dtypes

def swiglu(gate: Tensor, up: Tensor) -> Tensor: return gate.silu() * up

def geglu(gate: Tensor, up: Tensor, fp16_table: bool = False) -> Tensor:
  """Tensor.gelu is the tanh approximation. fp16_table rounds it as llama.cpp's CPU backend computes it: looked up in a
  table indexed by the fp16 input and holding fp16 outputs, for -10 < x < 10 (0 below, x above)."""
  if not fp16_table: return gate.gelu() * up
  g = gate.cast(dtypes.float16).cast(dtypes.float32).gelu().cast(dtypes.float16).cast(dtypes.float32)
  return (gate <= -10).where(0, (gate >= 10).where(gate, g)) * up

def swiglu_clamped(gate: Tensor, up: Tensor, limit: float = 7.0, alpha: float = 1.702) -> Tensor:
  """GPT-OSS: the gate is clamped from above only, the up projection on both sides and shifted by one."""
  gate, up = gate.minimum(limit), up.clip(-limit, limit)
  return (up + 1) * gate * (alpha * gate).sigmoid()
