"""The 256-element super-block formats: Q4_K, Q5_K, Q6_K.

Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins; each 32-byte run of `qs` holds sub-block 2j in its low
nibbles and 2j+1 in its high ones, so the logical layout is (4, 2, 32) and the parts are the two nibble planes.
Q6_K: two halves of 128, each four planes of 32 (low/high nibble of `ql`, first/second 32 bytes) whose top two bits
come from `qh`; int8 scales per 16 elements, so the layout is (2, 4, 2, 16) split on the plane.
"""
from gguf import GGMLQuantizationType as T
from tinygrad import Tensor, dtypes
from quant.blockformat import BlockFormat, Part, f16, lo, hi, bit

def _scales_mins(s: Tensor) -> tuple[Tensor, Tensor]:
  """12 packed bytes -> 6-bit scales and mins of the 8 sub-blocks, each [..., 4, 2] (sub-block 2j+k at [j, k])."""
  s0, s1, s2 = s[..., 0:4], s[..., 4:8], s[..., 8:12]
  sc = s0.bitwise_and(63).cat(lo(s2) | (hi(s0) >> 2 << 4), dim=-1)
  m = s1.bitwise_and(63).cat(hi(s2) | (hi(s1) >> 2 << 4), dim=-1)
  return sc.reshape(*s.shape[:-1], 4, 2).cast(dtypes.float32), m.reshape(*s.shape[:-1], 4, 2).cast(dtypes.float32)

def _k_parts(b: Tensor, planes: list[Tensor]) -> list[Part]:
  d, dmin = f16(b[..., 0:2]).unsqueeze(-1), f16(b[..., 2:4]).unsqueeze(-1)
  sc, m = _scales_mins(b[..., 4:16])
  return [Part(q.cast(dtypes.float32), d * sc[..., k:k+1], -dmin * m[..., k:k+1]) for k, q in enumerate(planes)]

def _q4_k(b: Tensor) -> list[Part]:
  qs = b[..., 16:144].reshape(*b.shape[:-1], 4, 32)
  return _k_parts(b, [lo(qs), hi(qs)])

def _q5_k(b: Tensor) -> list[Part]:
  qh, qs = b[..., 16:48].unsqueeze(-2), b[..., 48:176].reshape(*b.shape[:-1], 4, 32)
  shifts = Tensor.arange(4, dtype=dtypes.uint8).reshape(4, 1) * 2   # sub-block 2j+k takes bit 2j+k of qh
  return _k_parts(b, [lo(qs) | ((qh >> shifts).bitwise_and(1) << 4), hi(qs) | ((qh >> (shifts + 1)).bitwise_and(1) << 4)])

def _q6_k(b: Tensor) -> list[Part]:
  lead = b.shape[:-1]
  ql = b[..., 0:128].reshape(*lead, 2, 2, 2, 16)     # [half, first/second 32 bytes, 16-run, 16]
  qh = b[..., 128:192].reshape(*lead, 2, 2, 16)      # [half, 16-run, 16]
  sc = b[..., 192:208].bitcast(dtypes.int8).cast(dtypes.float32).reshape(*lead, 2, 4, 2, 1)   # [half, plane, 16-run]
  d = f16(b[..., 208:210]).reshape(*lead, 1, 1, 1)
  nibbles = [lo(ql[..., 0, :, :]), lo(ql[..., 1, :, :]), hi(ql[..., 0, :, :]), hi(ql[..., 1, :, :])]
  return [Part((q | (bit(qh, 2 * p, 2) << 4)).cast(dtypes.float32) - 32, d * sc[..., p, :, :]) for p, q in enumerate(nibbles)]

Q4_K = BlockFormat(T.Q4_K, 256, 144, (4, 2, 32), 1, _q4_k, (0, 2))
Q5_K = BlockFormat(T.Q5_K, 256, 176, (4, 2, 32), 1, _q5_k, (0, 2))
Q6_K = BlockFormat(T.Q6_K, 256, 210, (2, 4, 2, 16), 1, _q6_k, (208,))
