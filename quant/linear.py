"""Matmuls over packed weights, with the strategy (how the blocks are read) as a switch.

- packed_dot: reads the blocks inside the matmul; each part of a block (a nibble plane, ...) is multiplied with the
  matching slice of the activations and everything is summed in one reduce: for Q4_0, sum((nib-8)*x*scale).
- packed_words: packed-dot over the same bits rearranged once at load (quant/words.py: fp16 fields apart, quants as
  32-bit words) so a GPU thread reads a block's quants in one load; Q4_0, Q4_1 and Q8_0 only, other types read as
  packed_dot. The GGUF blocks stay loaded as well.
- fused: the full dequantize expression (nibbles interleaved back into logical order) inside the matmul.
- dequant_cache: an fp16 copy of the weights made once at load, then a plain matmul (costs 2 bytes per weight).
- int8_dot: packed_words against x quantized to 8 bits a block, summed in integers four products at a time (dp4a),
  as llama.cpp's CUDA matvecs do (quant/int8_dot.py); for matmuls (expert ones too) of Q4_0, Q4_1 and Q8_0, whose
  activations it rounds as ggml's Q8_0 does. Other types read as packed_words. On an x86 CPU a matmul of one matrix
  (Q5_0, Q4_K and Q6_K too) is a kernel of its own over the CPU's integer dot product instructions (quant/int8_cpu.py).
- split: the dequantize is made `.contiguous()` on every call, then a plain matmul: two kernels, the second a GEMV
  tinygrad optimizes well, at the price of writing and reading the weights in fp32 (seed 003's "selective split").
"""
from dataclasses import dataclass, field
from math import prod
from gguf import GGMLQuantizationType
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DTypeLike
from ops.cuda import GEMM_INT8_TYPES, GEMMS, gemm_int8_words, gemm_mma, gemm_mma_applies, gemm_mma_blocks, gemm_mma_blocks_applies, \
  gemm_mma_words, gemm_mma_words_applies
from ops.norm import NormedInput
from ops.routing import ExpertGroups
from quant.activations import ROUNDINGS, q8_0_blocks, realized_rounding, round_activations
from quant.blockformat import BlockFormat
from quant import int8_cpu
from quant.int8_dot import INT8_TYPES, Int8Rows, int8_dot
from quant.qtensor import QTensor
from quant.words import WordBlocks

STRATEGIES = ("packed_dot", "packed_words", "int8_dot", "fused", "dequant_cache", "split")
WORD_STRATEGIES = ("packed_words", "int8_dot")   # the strategies that keep a weight's words (quant/words.py)
# how a matmul of many rows (a prompt chunk) reads its weights: by its strategy, or dequantized once into a buffer of
# this dtype for a GEMM (`gemm`)
PREFILL_MATMULS = ("packed", "half", "float")

def _check_strategy(strategy: str) -> str:
  if strategy not in STRATEGIES: raise ValueError(f"unknown matmul strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
  return strategy

@dataclass(frozen=True)
class StrategyPlan:
  """Which strategy each matmul uses: `experts` for a MoE's expert weights when set, else `ffn` for the feed-forward
  weights (experts included) when set, else the one for its GGML type, else `default`. Written as a spec: "fused",
  "packed_dot,Q6_K=split", "packed_dot,ffn=split" or "packed_words,experts=int8_dot"."""
  default: str = "packed_dot"
  by_type: dict[GGMLQuantizationType, str] = field(default_factory=dict)
  ffn: str | None = None
  experts: str | None = None

  @staticmethod
  def parse(spec: str) -> "StrategyPlan":
    default, by_type, parts = "packed_dot", {}, {}
    for item in filter(None, (i.strip() for i in spec.split(","))):
      key, _, value = item.rpartition("=")
      if not key: default = _check_strategy(value)
      elif key in ("ffn", "experts"): parts[key] = _check_strategy(value)
      elif key in GGMLQuantizationType.__members__: by_type[GGMLQuantizationType[key]] = _check_strategy(value)
      else: raise ValueError(f"strategy spec {spec!r}: {key!r} is neither a GGML type (Q4_0, Q6_K, ...) nor 'ffn' nor 'experts'")
    return StrategyPlan(default, by_type, **parts)

  def for_weight(self, name: str, ggml_type: GGMLQuantizationType) -> str:
    if self.experts is not None and "_exps" in name: return self.experts
    if self.ffn is not None and ".ffn_" in name: return self.ffn
    return self.by_type.get(ggml_type, self.default)

  def spec(self) -> str:
    return ",".join([self.default, *(f"{t.name}={s}" for t, s in self.by_type.items()),
                     *(f"{key}={s}" for key, s in (("ffn", self.ffn), ("experts", self.experts)) if s)])

def packed_dot(fmt: BlockFormat, blocks: Tensor, x: Tensor, sel: Tensor | None = None) -> Tensor:
  """blocks [..., O, nb, block_bytes], x [..., in] (leading dims broadcast) -> [..., O].
  With sel [..., k], blocks are [experts, O, nb, block_bytes] and only the selected experts are read."""
  weights = [part.value() for part in fmt.parts(blocks)]
  # gather per part: a gather of the blocks themselves, read by every part, would be copied out in a kernel of its own
  if sel is not None: weights = [w[sel] for w in weights]
  acc = sum(w * xk for w, xk in zip(weights, fmt.split(x.unsqueeze(-2))))
  assert isinstance(acc, Tensor)
  return acc.sum(axis=tuple(range(acc.ndim - len(fmt.layout), acc.ndim)))

def dense_dot(w: Tensor, x: Tensor) -> Tensor:
  """w [..., O, in], x [..., in] -> [..., O]"""
  return (x.unsqueeze(-2) @ w.transpose(-1, -2)).squeeze(-2)

def gemm_dtype(prefill: str) -> DTypeLike:
  """The input dtype of a prompt chunk's GEMMs (matmuls, attention's value sums) under a PREFILL_MATMULS choice."""
  return dtypes.float16 if prefill == "half" else dtypes.float32

def gemm(w: Tensor, x: Tensor, dtype: DTypeLike, upcast: bool = True, kernel: str = "tinygrad") -> Tensor:
  """x @ w.T for many rows of x (a prompt chunk): w [..., O, in] realized in `dtype` once, x [..., *w's leading dims, in]
  too, their products summed in float32 (without `upcast`, each sum rounded to `dtype`) -> [..., O]: on a GPU with half
  inputs a tensor-core GEMM, each weight read once for all the rows rather than once for each; `kernel` mma takes one
  matrix's GEMM of half inputs summed in float32 where it applies (ops/cuda: gemm_mma), tinygrad's kernel the rest. A GEMM for each of
  several matrices (w's leading dims: latent attention's heads) is realized in its own shape [*lead, rows, O]: its
  readers take its rows apart by x's leading dims (chunks and positions), which would split the GEMM's axes off the
  tensor cores."""
  lead = w.shape[:-2]
  rows = x.reshape(-1, *lead, x.shape[-1])
  rows = rows.permute(*range(1, len(lead) + 1), 0, len(lead) + 1)   # [*lead, rows, in]
  a, b = rows.cast(dtype).contiguous(), w.cast(dtype).contiguous()
  if kernel != "tinygrad" and not lead and upcast and gemm_mma_applies(a, b): return gemm_mma(a, b).reshape(*x.shape[:-1], w.shape[-2])
  y = a.matmul(b.transpose(-1, -2), dtype=dtypes.float32 if upcast else None)
  if lead: y = y.contiguous()
  return y.permute(len(lead), *range(len(lead)), len(lead) + 1).reshape(*x.shape[:-1], w.shape[-2])

def grouped_gemm(w: Tensor, x: Tensor, experts: Tensor, dtype: DTypeLike, upcast: bool = True) -> Tensor:
  """x @ w[e].T for tiles of x's rows, each tile with its own expert e (experts [tiles, tile]: each row's, constant across
  a tile): w [experts, O, in] realized in `dtype` once, x [tiles * tile, in] too, products summed in float32 (without
  `upcast`, each sum rounded to `dtype`) -> [tiles * tile, O]. On a GPU with half inputs one tensor-core GEMM, each
  tile reading its expert's weights where it loads them: the weights are indexed for each row of a tile, since the
  gather of one matrix per tile, broadcast over its rows, would be copied out first. The output is realized in its
  tiles' shape: a reader of slices of its rows (the activation of gate and up) would otherwise reshape the GEMM's axes
  so that it takes no tensor cores."""
  rows = x.cast(dtype).contiguous().reshape(*experts.shape, 1, x.shape[-1])
  y = (rows * w.cast(dtype).contiguous()[experts]).sum(-1, dtype=dtypes.float32 if upcast else None).contiguous()
  return y.reshape(x.shape[0], w.shape[-2])

def dense_dot_and_squares(w: Tensor, x: Tensor, scale: Tensor | None, sel: Tensor | None = None) -> Tensor:
  """WordBlocks.dot_and_squares over float weights w [..., O, in] (with sel, [experts, O, in]): x [..., in] -> [..., O, 2]."""
  if sel is not None: w = w[sel]
  xr = x.unsqueeze(-2)
  dots = (xr if scale is None else xr * scale) * w
  return dots.unsqueeze(-2).cat(xr.expand(dots.shape).square().unsqueeze(-2), dim=-2).sum(-1)

class _PackedWeight:
  """`prefill` (PREFILL_MATMULS): how a matmul of several rows for each matrix (a prompt chunk) reads the weights; a GEMM
  of fp16 inputs sums their products in float32 unless not `upcast` (gemm)."""
  def __init__(self, weight: QTensor, bias: Tensor | None = None, strategy: str = "packed_dot", rounding: str = "exact",
               prefill: str = "packed", upcast: bool = True, gemm_kernel: str = "tinygrad"):
    _check_strategy(strategy)
    if rounding not in ROUNDINGS: raise ValueError(f"unknown activation rounding {rounding!r} (choose from {', '.join(ROUNDINGS)})")
    if prefill not in PREFILL_MATMULS: raise ValueError(f"unknown prefill matmul {prefill!r} (choose from {', '.join(PREFILL_MATMULS)})")
    if gemm_kernel not in GEMMS: raise ValueError(f"unknown GEMM kernel {gemm_kernel!r} (choose from {', '.join(GEMMS)})")
    self.weight, self.bias, self.strategy, self.rounding, self.prefill, self.upcast = weight, bias, strategy, rounding, prefill, upcast
    self.gemm_kernel = gemm_kernel
    self.cache = weight.dequantize().cast(dtypes.float16).contiguous().realize() if strategy == "dequant_cache" else None
    # int8_dot's CPU kernel reads the GGUF blocks themselves
    self.int8_cpu = strategy == "int8_dot" and int8_cpu.applies(weight)
    self.words = WordBlocks.from_blocks(weight) if strategy in WORD_STRATEGIES and not self.int8_cpu else None
    self.int8 = strategy == "int8_dot" and (weight.ggml_type in INT8_TYPES or self.int8_cpu)   # matmuls that read x in 8 bits

  def gemm_rows(self, x: Tensor | NormedInput) -> bool:
    """Whether x holds several rows for each matrix (a prompt chunk) that a prefill GEMM multiplies."""
    return self.prefill != "packed" and prod(x.shape[:-1]) > prod(self.weight.shape[:-2])

  def _float_weights(self) -> Tensor: return self.weight.dequantize() if self.cache is None else self.cache

  def _gemm_dtype(self) -> DTypeLike:
    """A prefill GEMM's input dtype: half unless the prefill is float or the file keeps the weights in F32 (routers, which
    choose experts)."""
    return dtypes.float32 if self.weight.ggml_type == GGMLQuantizationType.F32 else gemm_dtype(self.prefill)

  def gemm_of(self, x: Tensor) -> Tensor:
    """x @ W.T as a prefill GEMM, x rounded as the activations are, whatever its rows: gemm mma reading the words
    or blocks themselves where it takes them (`_packed_gemm`), else gemm() of the dequantized weights."""
    x = round_activations(x, self.weight.ggml_type, self.rounding)
    if (y := self._packed_gemm(x)) is not None: return y
    return gemm(self._float_weights(), x, self._gemm_dtype(), self.upcast, self.gemm_kernel)

  def _packed_gemm(self, x: Tensor, tile_expert: Tensor | None = None) -> Tensor | None:
    """The GEMM of gemm mma decoding the packed weights as it loads them, with no pass of its own writing them out in fp16:
    their words (ops/cuda gemm_mma_words; under mma_int8 the words' integer products with the rows quantized to 8 bits,
    gemm_int8_words, where it reads their type) or, for a type kept as GGUF's blocks, the blocks (gemm_mma_blocks); one
    matrix's, or with tile_expert (ExpertGroups) each tile's expert's. None where it does not take this weight (another
    kernel or format, several matrices, a sum rounded to half, a tile it is not written for)."""
    if self.gemm_kernel == "tinygrad" or not self.upcast or self._gemm_dtype() != dtypes.float16: return None
    a, t = x.reshape(-1, x.shape[-1]).cast(dtypes.float16), self.weight.ggml_type.name
    if (w := self.words) is not None and gemm_mma_words_applies(a, t, w.words, w.d, tile_expert):
      if self.gemm_kernel == "mma_int8" and t in GEMM_INT8_TYPES:
        q, d = q8_0_blocks(a.float())   # the rows quantized once, as llama.cpp's MMQ quantizes them
        y = gemm_int8_words(q.cast(dtypes.int8).reshape(a.shape), d.reshape(a.shape[0], -1), t, w.words, w.d, tile_expert)
      else: y = gemm_mma_words(a, t, w.words, w.d, tile_expert)
    elif w is None and gemm_mma_blocks_applies(a, t, self.weight.blocks, tile_expert):
      y = gemm_mma_blocks(a, t, self.weight.blocks, tile_expert)
    else: return None
    return y.reshape(*x.shape[:-1], self.weight.shape[-2])

  def transposed_gemm_of(self, x: Tensor) -> Tensor:
    """x @ W (the transposed matmul) as a prefill GEMM of the dequantized weights: x [..., *lead, out] -> [..., *lead, in]."""
    return gemm(self._float_weights().transpose(-1, -2), x, self._gemm_dtype(), self.upcast, self.gemm_kernel)

  @property
  def device_tensors(self) -> list[Tensor]:
    """What the matmul reads on the device."""
    if self.cache is not None: return [self.cache]
    return self.words.tensors if self.words is not None else [self.weight.blocks]

  def _folds(self, n: NormedInput) -> bool:
    """Whether a norm folds in: one row of x, exact activations, and words or float weights read as they are stored."""
    if self.int8: return False
    read_as_stored = self.words is not None or (self.weight.format.block_elems == 1 and self.strategy in ("packed_dot", "packed_words"))
    return read_as_stored and self.rounding == "exact" and prod(n.x.shape[:-1]) == 1

  def _normed_dot(self, n: NormedInput, sel: Tensor | None = None) -> Tensor:
    """The matmul of n's value with its norm folded in (`normed`), in float32 without the bias."""
    x, scale = n.x.cast(dtypes.float32), None if n.weight is None else n.weight.cast(dtypes.float32)
    both = self.words.dot_and_squares(x, scale, sel) if self.words is not None else \
      dense_dot_and_squares(self.weight.dequantize(), x, scale, sel)
    # a product over the pair axis: taking the two halves of the sum would realize it, and its readers (the KV cache
    # write of layout rows, act_in_matmul's product) in kernels of their own
    return (Tensor.arange(2) == 0).where(both, (both / x.shape[-1] + n.eps).rsqrt()).prod(-1)

  def _int8_rows(self, x: Tensor | Int8Rows) -> Int8Rows:
    """x as an int8_dot matmul reads it: quantized already, or quantized here."""
    return x if isinstance(x, Int8Rows) else Int8Rows.quantize(x, self.weight.ggml_type)

  def _matmul(self, x: Tensor | Int8Rows, sel: Tensor | None = None) -> Tensor:
    if isinstance(x, Int8Rows) and not self.int8:
      raise ValueError(f"activations in 8 bits need an int8_dot matmul of {', '.join(t.name for t in INT8_TYPES)}")
    if isinstance(x, Tensor) and sel is None and self.gemm_rows(x): return self.gemm_of(x)
    if self.int8_cpu: return int8_cpu.int8_dot_cpu(self.weight, self._int8_rows(x))
    if self.int8: return int8_dot(self.words, self._int8_rows(x), sel)
    x = realized_rounding(x, self.weight.ggml_type, self.rounding)
    if self.words is not None: return self.words.dot(x, sel)
    if self.strategy in ("packed_dot", "packed_words"): return packed_dot(self.weight.format, self.weight.blocks, x, sel)
    w = self.weight.dequantize() if self.cache is None else self.cache
    if sel is not None: w = w[sel]
    return dense_dot(w.contiguous() if self.strategy == "split" else w, x)

class QuantLinear(_PackedWeight):
  """y = x @ W.T (+ bias) with W [out, in] kept packed. A weight [..., out, in] with leading dims applies one matrix
  per index of them to x [..., in] (its trailing dims before `in` broadcast against them)."""
  def __call__(self, x: Tensor | Int8Rows) -> Tensor:
    """x [..., in], or quantized once for several int8_dot matmuls (Int8Rows.quantize)."""
    y = self._matmul(x)
    return y if self.bias is None else y + self.bias

  def normed(self, n: NormedInput) -> Tensor:
    """self(n.value()), with the norm folded into a matvec (one row of x) where the weights are words or floats read as
    stored and activations exact: each row's dot with x * weight is scaled by 1/rms(x) afterwards, the sum of squares
    coming from the same reduce. A matmul of several rows (a prefill) reads the norm as before: tinygrad's GPU heuristic
    handles its [rows, positions, 2] output badly."""
    if not self._folds(n): return self(n.value())
    y = self._normed_dot(n)
    return (y if self.bias is None else y + self.bias).cast(n.x.dtype)

class QuantExperts(_PackedWeight):
  """Expert-indexed matmul over W [experts, out, in] (bias [experts, out]): only the k selected experts' weights are read."""
  def gemm_rows(self, x: Tensor | NormedInput) -> bool:
    """Whether x holds several rows (a prompt chunk) for a GEMM grouped by expert (`grouped`)."""
    return self.prefill != "packed" and prod(x.shape[:-1]) > 1

  def __call__(self, x: Tensor | Int8Rows, sel: Tensor) -> Tensor:
    """x [..., k or 1, in] (or quantized, for int8_dot), sel [..., k] int -> [..., k, out]"""
    y = self._matmul(x, sel)
    return y if self.bias is None else y + self.bias[sel]

  def normed(self, n: NormedInput, sel: Tensor) -> Tensor:
    """self(n.value(), sel), the norm folded in as QuantLinear.normed does: x [..., 1, in] of one token."""
    if not self._folds(n): return self(n.value(), sel)
    y = self._normed_dot(n, sel)
    return (y if self.bias is None else y + self.bias[sel]).cast(n.x.dtype)

  def grouped(self, x: Tensor, groups: ExpertGroups) -> Tensor:
    """A prompt chunk's rows in slot order (groups.rows) through their experts: x [slots, in] -> [slots, out], one GEMM
    whose tiles each read their expert's weights once (gemm mma's decoding the words, where it takes them)."""
    experts, x = groups.slot_experts, round_activations(x, self.weight.ggml_type, self.rounding)
    if (y := self._packed_gemm(x, groups.tile_expert)) is None: y = grouped_gemm(self._float_weights(), x, experts, self._gemm_dtype(), self.upcast)
    return y if self.bias is None else y + self.bias[experts].reshape(y.shape)

  def mixed(self, x: Tensor | Int8Rows, sel: Tensor, mix: Tensor) -> Tensor:
    """The selected experts' outputs summed with the weights mix [..., k]: x [..., k or 1, in] (or quantized, for int8_dot)
    -> [..., out]."""
    if self.int8: y = int8_dot(self.words, self._int8_rows(x), sel, mix)
    # without words, or given quantized x it cannot read (the matmul says so), each expert's output is weighted apart
    elif self.words is None or isinstance(x, Int8Rows): return (self(x, sel) * mix.unsqueeze(-1)).sum(axis=-2)
    else: y = self.words.dot(realized_rounding(x, self.weight.ggml_type, self.rounding), sel, mix)
    return y if self.bias is None else y + (self.bias[sel] * mix.unsqueeze(-1)).sum(axis=-2)
