"""Which kernels a decode step is made of: the elementwise ones are only the results that must be buffers."""
from experiments.kernels import jit_kernels
from models.runtime import Runtime
from models.synth import synthesize

def test_llama_decode_realizes_no_rotated_query(tmp_path):
  """A Llama decode step's elementwise kernels are the embedding row and, per block, the KV cache write and the FFN
  activation (act_break): q is rotated where the attention logits read it, in no kernel of its own."""
  rt = Runtime(synthesize("llama3.2-1b-tiny", tmp_path / "llama.gguf", quant="Q8_0"), max_context=32, progress=False)
  rt.prefill([5, 6, 7])
  for pos in range(3, 6): rt.decode(8, pos)   # eager, capture, replay
  elementwise = [k.name for k in jit_kernels(rt._decode) if k.name.startswith("E_")]
  assert len(elementwise) == 1 + 2 * rt.cfg.n_layers, elementwise
