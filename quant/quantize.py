"""float32 values -> GGML block bytes, for writing GGUF files.

The types gguf-py can quantize (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, MXFP4) go through `gguf.quants.quantize`. The
k-quants are quantized here, vectorized over blocks:

- Q4_K/Q5_K: per 256-element super-block, 8 sub-blocks of 32 are each fitted as `s * q - m` (q in 0..15 or 0..31,
  s >= 0, m >= 0) by least squares over a few starting grids, then s and m become 6-bit multiples of the super-block's
  fp16 `d` and `dmin`, and q is chosen again against those quantized scales.
- Q6_K: 16 sub-blocks of 16 each fitted as `s * q` (q in -32..31) by least squares from a few starting grids, then s
  becomes an int8 multiple of the fp16 `d`, and q is chosen again.
"""
import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES, quants

GGUF_QUANTIZED = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.MXFP4)
CHUNK_BLOCKS = 4096   # super-blocks quantized at a time: bounds the temporaries to a few MB
GRIDS = (-1, -0.5, 0, 0.5, 1)   # starting grids of the k-quant fits: the range split into nmax + g steps

def ggml_type_of(t: "T | str | int") -> T:
  """A GGML type from itself, its name ("Q4_K", case-insensitive) or its number."""
  if isinstance(t, T): return t
  try: return T[t.upper()] if isinstance(t, str) else T(int(t))
  except (KeyError, ValueError): raise ValueError(f"unknown GGML type {t!r}") from None

def quantize(values: np.ndarray, ggml_type: "T | str | int") -> np.ndarray:
  """float values of any shape -> uint8 bytes [*shape[:-1], row_bytes] in `ggml_type`'s GGUF layout."""
  t = ggml_type_of(ggml_type)
  if t not in SUPPORTED: raise ValueError(f"cannot quantize to {t.name} (supported: {', '.join(s.name for s in SUPPORTED)})")
  values = np.asarray(values, dtype=np.float32)
  if values.ndim == 0: raise ValueError("cannot quantize a scalar: values need at least one dimension")
  n, (elems, nbytes) = values.shape[-1], GGML_QUANT_SIZES[t]
  if n % elems: raise ValueError(f"rows of {n} elements are not whole {t.name} blocks of {elems}")
  if elems > 1 and not np.isfinite(values).all(): raise ValueError(f"cannot quantize infinite or NaN values to {t.name}")
  lead = values.shape[:-1]
  if t in GGUF_QUANTIZED: return np.ascontiguousarray(quants.quantize(values, t)).view(np.uint8).reshape(*lead, n // elems * nbytes)
  blocks = values.reshape(-1, elems)
  out = np.empty((len(blocks), nbytes), dtype=np.uint8)
  for i in range(0, len(blocks), CHUNK_BLOCKS): out[i:i + CHUNK_BLOCKS] = _K_QUANTIZERS[t](blocks[i:i + CHUNK_BLOCKS])
  return out.reshape(*lead, n // elems * nbytes)

def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """a / b, 0 where b is 0."""
  dtype = np.result_type(a, b, np.float32)
  return np.divide(a, b, out=np.zeros(np.broadcast_shapes(np.shape(a), np.shape(b)), dtype=dtype), where=b != 0)

def _f16(x: np.ndarray) -> np.ndarray:
  with np.errstate(over="ignore"): return x.astype(np.float16)

# sums over the short last axis (16 or 32) as a BLAS matvec and an einsum: numpy's .sum(-1) there is many times slower
def _sum(a: np.ndarray) -> np.ndarray: return (a @ np.ones(a.shape[-1], dtype=a.dtype))[..., None]
def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray: return np.einsum("...i,...i->...", a, b)[..., None]

def _fold(f: np.ufunc, a: np.ndarray) -> np.ndarray:
  """f reduced over a power-of-two last axis by halving it: numpy's own reduce over a short last axis is slow."""
  while a.shape[-1] > 1: a = f(a[..., :a.shape[-1] // 2], a[..., a.shape[-1] // 2:])
  return a

def _fit_affine(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
  """Sub-blocks x [..., k] -> scale s >= 0 and min m >= 0 (each [..., 1]) so that s * q - m, q = round((x + m) / s)
  clipped to 0..nmax, is close to x in squared error: the best least-squares fit over a few starting grids."""
  k = x.shape[-1]
  lo = np.minimum(_fold(np.minimum, x), 0)
  xl, inv_span = x - lo, _div(np.float32(1), _fold(np.maximum, x) - lo)
  x64 = x.astype(np.float64)   # the fit's sums in float64: its intercept cancels large terms
  sx, sxx = _sum(x64), _dot(x64, x64)
  best_s, best_m, best_err = None, None, None
  for grid in GRIDS:   # q = round((x - lo) * grid / (max - lo))
    q = np.multiply(xl, inv_span * np.float32(nmax + grid))
    np.minimum(np.rint(q, out=q), nmax, out=q)
    sq, sqq, sxq = _sum(q).astype(np.float64), _dot(q, q).astype(np.float64), _dot(x64, q)
    det = k * sqq - sq * sq
    s, m = _div(k * sxq - sq * sx, det), _div(sq * sxq - sqq * sx, det)   # the least-squares fit of x as s * q - m
    clamp = (m < 0) | (det == 0)                                           # m < 0 is not stored: fit s alone with m = 0
    s = np.maximum(np.where(clamp, _div(sxq, sqq), s), 0)
    m = np.where(clamp, np.maximum((s * sq - sx) / k, 0), m)                # then the best m >= 0 for that s
    err = sxx - 2 * s * sxq + 2 * m * sx + s * s * sqq - 2 * s * m * sq + k * m * m
    if best_err is None: best_s, best_m, best_err = s, m, err
    else:
      better = err < best_err
      best_s, best_m, best_err = np.where(better, s, best_s), np.where(better, m, best_m), np.where(better, err, best_err)
  return best_s, best_m

def _k_affine(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Super-blocks x [n, 256] -> fp16 d and dmin [n], 6-bit scales and mins [n, 8] and q [n, 8, 32] in 0..nmax."""
  x = x.reshape(-1, 8, 32)
  s, m = _fit_affine(x, nmax)
  d, dmin = _f16(s.max(1) / 63), _f16(m.max(1) / 63)          # [n, 1], from float64 fits
  sc = np.clip(np.rint(_div(s[..., 0], d.astype(np.float32))), 0, 63).astype(np.uint8)
  mn = np.clip(np.rint(_div(m[..., 0], dmin.astype(np.float32))), 0, 63).astype(np.uint8)
  step, off = (d.astype(np.float32) * sc)[..., None], (dmin.astype(np.float32) * mn)[..., None]
  q = np.clip(np.rint(_div(x + off, step)), 0, nmax).astype(np.uint8)
  return d[:, 0], dmin[:, 0], np.stack([sc, mn]), q

def _k_header(d: np.ndarray, dmin: np.ndarray, sc_mn: np.ndarray) -> np.ndarray:
  """fp16 d, dmin and the 12 packed bytes of 6-bit scales and mins: bytes 0-3 hold scales 0-3 and the top two bits of
  scales 4-7, bytes 4-7 the same for the mins, bytes 8-11 the low nibbles of scales 4-7 and (high nibble) mins 4-7."""
  sc, mn = sc_mn
  packed = np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4 << 6), mn[:, :4] | (mn[:, 4:] >> 4 << 6), (sc[:, 4:] & 15) | (mn[:, 4:] << 4)], axis=1)
  return np.concatenate([d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), packed], axis=1)

def _nibbles(q: np.ndarray) -> np.ndarray:
  """q [n, 8, 32] -> 128 bytes: each 32-byte run j holds sub-block 2j in its low nibbles and 2j+1 in its high ones."""
  q = (q & 15).reshape(-1, 4, 2, 32)
  return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)

def _q4_k(x: np.ndarray) -> np.ndarray:
  d, dmin, sc_mn, q = _k_affine(x, 15)
  return np.concatenate([_k_header(d, dmin, sc_mn), _nibbles(q)], axis=1)

def _q5_k(x: np.ndarray) -> np.ndarray:
  d, dmin, sc_mn, q = _k_affine(x, 31)
  qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(1, dtype=np.uint8)   # bit j of byte i: bit 4 of sub-block j's element i
  return np.concatenate([_k_header(d, dmin, sc_mn), qh, _nibbles(q)], axis=1)

def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
  """Sub-blocks x [..., k] -> signed scale s [..., 1] so that s * q, q = round(x / s) clipped to -nmax..nmax-1, is close
  to x: the largest magnitude maps near -nmax (its sign picks the side with one more step), refined by least squares."""
  inv_amax = _div(np.float32(-1), np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1))
  sxx = _dot(x, x).astype(np.float64)
  best_s, best_err = None, None
  for grid in GRIDS:
    q = np.multiply(x, inv_amax * np.float32(nmax + grid))
    np.clip(np.rint(q, out=q), -nmax, nmax - 1, out=q)
    sxq, sqq = _dot(x, q).astype(np.float64), _dot(q, q).astype(np.float64)
    s = _div(sxq, sqq)
    err = sxx - s * sxq
    if best_err is None: best_s, best_err = s, err
    else:
      better = err < best_err
      best_s, best_err = np.where(better, s, best_s), np.where(better, err, best_err)
  return best_s

def _q6_k(x: np.ndarray) -> np.ndarray:
  x = x.reshape(-1, 16, 16)
  s = _fit_symmetric(x, 32)[..., 0]                                              # [n, 16]
  smax = np.take_along_axis(s, np.abs(s).argmax(-1)[:, None], -1)
  d = _f16(smax / -128)                                                          # [n, 1]
  sc = np.clip(np.rint(_div(s, d.astype(np.float32))), -128, 127).astype(np.int8)
  q = np.clip(np.rint(_div(x, (d.astype(np.float32) * sc)[..., None])), -32, 31).astype(np.int8)
  q = (q + 32).astype(np.uint8).reshape(-1, 2, 4, 32)                             # [n, half, plane, 32]
  lo, hi2 = q & 15, q >> 4
  ql = np.stack([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2).reshape(-1, 128)
  qh = (hi2[:, :, 0] | (hi2[:, :, 1] << 2) | (hi2[:, :, 2] << 4) | (hi2[:, :, 3] << 6)).reshape(-1, 64)
  return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8)], axis=1)

_K_QUANTIZERS = {T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k}
SUPPORTED: tuple[T, ...] = GGUF_QUANTIZED + tuple(_K_QUANTIZERS)
