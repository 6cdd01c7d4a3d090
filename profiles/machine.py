"""What the machine offers that decides a hint, and what a model's shapes are: the inputs of the hints' built-in rules
(profiles/hints.py, each hint's `rule`) and the key a device profile is tuned for (profiles/device.py, `machine:`).

A CPU is described by the int8 dot-product instructions its kernels can use (quant/int8_cpu.py's paths: avx512_vnni,
avx_vnni, avx2, or none), a CUDA GPU by its compute capability and its multiprocessor count."""
import functools
from dataclasses import dataclass
from tinygrad import Device
from quant.gguf_file import GGUFError, GGUFFile

@dataclass(frozen=True)
class Machine:
  backend: str                          # tinygrad's device name: CPU, CUDA, ...
  cpu_simd: str | None = None           # the CPU's int8 dot-product path (quant/int8_cpu.simd_path), None without AVX2
  compute_capability: str | None = None # a CUDA GPU's, e.g. '9.0'
  multiprocessors: int | None = None    # a GPU's streaming multiprocessors

  @property
  def on_cpu(self) -> bool: return self.backend.split(":")[0] == "CPU"

  def describe(self) -> str:
    if self.on_cpu: return f"CPU, int8 dot products: {self.cpu_simd or 'none'}"
    if self.compute_capability is None: return self.backend
    sms = f", {self.multiprocessors} multiprocessors" if self.multiprocessors else ""
    return f"{self.backend}, compute capability {self.compute_capability}{sms}"

# the features a profile's `machine:` may name, each a Machine field
PROFILE_KEYS = ("cpu_simd", "compute_capability")

def _cuda(device: str) -> tuple[str | None, int | None]:
  """The compute capability and the multiprocessor count of tinygrad's CUDA device, from its driver."""
  from ops.cuda import capability, multiprocessors
  cc = capability(device)
  return (None if cc is None else f"{cc[0]}.{cc[1]}"), multiprocessors(device)

@functools.cache
def this_machine(device: str | None = None) -> Machine:
  """The machine tinygrad's default device (or `device`) runs on."""
  device = device or Device.DEFAULT
  backend = device.split(":")[0]
  if backend == "CPU":
    from quant.int8_cpu import simd_path
    return Machine(backend, cpu_simd=simd_path())
  if backend in ("CUDA", "NV"):
    cc, sms = _cuda(device)
    return Machine(backend, compute_capability=cc, multiprocessors=sms)
  return Machine(backend)

@dataclass(frozen=True)
class Shapes:
  """A model's shapes that the rules read, from its file's metadata."""
  architecture: str
  n_heads: int
  kv_width: int          # the elements of keys and values one position holds in the cache, every kv head's
  experts: int = 0       # a MoE's experts (0: dense), and those each token takes
  experts_used: int = 0

  @staticmethod
  def of(g: GGUFFile) -> "Shapes | None":
    """The file's shapes, read from its metadata as models/config.py reads them; None where it does not give them. A
    latent attention's cache (DeepSeek-style MLA) holds one latent row and its rotated part a position; any other's
    every kv head's key and value."""
    arch = g.architecture
    opt = lambda name, default=None: g.get(f"{arch}.{name}", default)
    try: dim, n_heads = g.require(f"{arch}.embedding_length"), g.require(f"{arch}.attention.head_count")
    except GGUFError: return None
    key_dim = opt("attention.key_length", dim // n_heads)
    if isinstance(latent := opt("attention.kv_lora_rank"), int): width = latent + opt("rope.dimension_count", key_dim)
    else: width = opt("attention.head_count_kv", n_heads) * (key_dim + opt("attention.value_length", key_dim))
    return Shapes(arch, n_heads, width, opt("expert_count", 0), opt("expert_used_count", 0))
