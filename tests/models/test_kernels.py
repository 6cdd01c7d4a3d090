"""`tinyzoo hints`' account of the hand-written kernels: what each one a hint chooses takes of a model (the weight types
whose words the GEMM decodes, those it dequantizes first, those left to tinygrad's; the attention kernels' layers or the
reason they stay with tinygrad's), or that it is refused on this device."""
import pytest
from models import kernels
from models.catalog import synthesized
from profiles.hints import resolve
from quant.gguf_file import GGUFFile

ALL = {"gemm": "mma", "decode_attention": "flash", "prefill_attention": "flash", "prefill": "half", "strategy": "packed_words,experts=int8_dot"}

@pytest.fixture
def on_a_gpu(monkeypatch: pytest.MonkeyPatch): monkeypatch.setattr(kernels, "hint_refusal", lambda hint, value, device: None)

def test_what_each_kernel_takes_of_a_latent_attention_moe(on_a_gpu):
  uses = dict(kernels.hand_written(GGUFFile(synthesized("deepseek-v2-lite-tiny")), resolve(ALL), "CUDA"))
  assert uses == {"gemm mma": "Q4_0 words decoded by the kernel; Q4_0 experts' words decoded by the kernel, grouped by tile; F32 (routers): "
                              "tinygrad's",
                  "decode_attention flash": "every layer, from the latent cache (absorbed)",
                  "prefill_attention flash": "every layer, from the latent cache (absorbed)"}
  with_values = dict(kernels.hand_written(GGUFFile(synthesized("deepseek-v2-lite-tiny")), resolve({**ALL, "mla_v_cache": True}), "CUDA"))
  assert with_values["decode_attention flash"] == "tinygrad's: the latent cache's values in a cache of their own (mla_v_cache)"
  expanded = dict(kernels.hand_written(GGUFFile(synthesized("deepseek-v2-lite-tiny")), resolve({**ALL, "mla_prefill": "expanded"}), "CUDA"))
  assert expanded["prefill_attention flash"] == "tinygrad's: the chunk's latent attention expanded to every head (mla_prefill)"

def test_weights_without_words_are_dequantized_first_and_a_float_prefill_takes_no_mma(on_a_gpu):
  g = GGUFFile(synthesized("gpt-oss-20b-tiny"))
  uses = dict(kernels.hand_written(g, resolve({**ALL, "strategy": "packed_dot"}), "CUDA"))
  assert uses["gemm mma"].startswith("Q8_0 dequantized to fp16 first; MXFP4 experts: tinygrad's grouped GEMM")
  assert uses["decode_attention flash"] == uses["prefill_attention flash"] == "every layer"
  assert dict(kernels.hand_written(g, resolve({**ALL, "prefill": "float"}), "CUDA"))["gemm mma"].startswith("tinygrad's for every GEMM")
  assert kernels.hand_written(g, resolve({}), "CUDA") == []   # no hint chooses a hand-written kernel

def test_a_kernel_this_device_cannot_run_is_said_refused():
  uses = kernels.hand_written(GGUFFile(synthesized("llama3.2-1b-tiny")), resolve({"gemm": "mma"}), "CPU")
  assert uses == [("gemm mma", "refused here: gemm mma runs on CUDA GPUs (tinygrad's CUDA backend), not CPU")]

def test_the_integer_gemm_takes_the_words_of_its_types(on_a_gpu):
  """Under mma_int8, Q4_0's and Q8_0's words (a weight's and the experts') in integers; MXFP4's experts decoded as under mma."""
  def gemm(name: str) -> str:
    return dict(kernels.hand_written(GGUFFile(synthesized(name)), resolve({**ALL, "gemm": "mma_int8"}), "CUDA"))["gemm mma_int8"]
  assert gemm("deepseek-v2-lite-tiny") == ("Q4_0 words' int8 products by the kernel, the rows quantized to 8 bits; Q4_0 experts' words' int8 "
                                           "products by the kernel, the rows quantized to 8 bits, grouped by tile; F32 (routers): tinygrad's")
  assert gemm("gpt-oss-20b-tiny").startswith("Q8_0 words' int8 products by the kernel, the rows quantized to 8 bits; MXFP4 experts' words "
                                             "decoded by the kernel, grouped by tile")
