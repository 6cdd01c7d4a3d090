"""Gated feed-forward activations: each takes the gate and up projections and returns their gated product."""
from tinygrad import Tensor

def swiglu(gate: Tensor, up: Tensor) -> Tensor: return gate.silu() * up

def geglu(gate: Tensor, up: Tensor) -> Tensor: return gate.gelu() * up  # Tensor.gelu is the tanh approximation

def swiglu_clamped(gate: Tensor, up: Tensor, limit: float = 7.0, alpha: float = 1.702) -> Tensor:
  """GPT-OSS: the gate is clamped from above only, the up projection on both sides and shifted by one."""
  gate, up = gate.minimum(limit), up.clip(-limit, limit)
  return (up + 1) * gate * (alpha * gate).sigmoid()
