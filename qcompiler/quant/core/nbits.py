"""onnxruntime's storage of a BlockGrid: com.microsoft MatMulNBits, GatherBlockQuantized, and one tied table for both.

What onnxruntime 1.32 (CPU) accepts, read from its kernels and checked by tests/quant/test_nbits_format.py:

MatMulNBits (Y = A @ W^T for W [N, K] blocked along K; attributes K, N, bits 2/4/8, block_size a power of 2 >= 16,
accuracy_level 0..4):
- B: uint8 [N, nb, blob], blob = block_size * bits / 8, codes packed low bits first (4 bits: element 2i in the low
  nibble, 2i+1 in the high one). Exactly this 3-D shape: a 2-D [N, nb * blob] B is refused at prepack.
- scales: the type of A, [N, nb] or the flat [N * nb]; [N, nb, 1] is refused.
- zero_points: optional. uint8 packed like B along the blocks of a row, [N, ceil(nb * bits / 8)] (each row padded
  to whole bytes), or the scales' float type unpacked [N, nb] (a float zero point; the CPU kernel refuses it with
  8 bits). Absent: 2**(bits-1).
- A partial last block (K not a multiple of block_size): B and the codes are padded to nb * block_size; the
  padding never meets A.
- accuracy_level 4 quantizes A to int8 per block on the fly: a coarser result than level 0.

GatherBlockQuantized (an embedding lookup of E [V, H] blocked along H; gather_axis 0, quantize_axis 1, bits,
block_size): data may be uint8 with `bits` 2/4/8 (packed along the last axis, which must be the quantize axis),
int4 or uint4 (bits 4 only, default zero point 0), or float8/float4 (no zero point). We write uint8: the same
bytes and the same default zero point 2**(bits-1) as MatMulNBits. scales has data's rank: [V, nb]; zero_points
is of data's type only (integer; no float zero points), packed along H like MatMulNBits' ([V, ceil(nb*bits/8)]).
Indices int32 or int64, of any rank; an out-of-range index gives a row of zeros.

Tied embeddings (logits = x @ E^T with the embedding table E): one initializer B [V, nb, blob] feeds MatMulNBits
(N=V, K=H) directly and GatherBlockQuantized through a Reshape to [V, nb * blob] (onnxruntime-genai's model
builder does the same); scales and packed zero points are the same initializers for both. When H is not a
multiple of block_size the lookup comes out nb * block_size wide and a Slice cuts it to H. The tests run this
model and check that it holds one table. Measured once by hand on a [32768, 2048] 4-bit table (not in the
tests): the file is 40 MB instead of 72 for two tables; at session start onnxruntime folds the Reshape into a
second, reshaped initializer and frees B once MatMulNBits has prepacked it, so the session takes 77 MB against
94 MB for two tables. GatherBlockQuantized can also read B as 3-D data (its quantize axis must then be the last,
so scales [V, nb, 1] and an output [..., nb, block_size] to reshape), but MatMulNBits refuses [V, nb, 1] scales
and packed 4-bit zero points would need another layout; that variant took 85 MB.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from qcompiler.quant.core.block_grid import BlockGrid

MS_DOMAIN = "com.microsoft"
STORAGE_BITS = (2, 4, 8)


def pack_codes(codes, bits: int) -> np.ndarray:
    """uint8 codes [..., L] packed along the last axis, low bits first; L padded with zeros to whole bytes."""
    per = 8 // bits
    codes = np.asarray(codes, np.uint8)
    pad = -codes.shape[-1] % per
    if pad:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (pad,), np.uint8)], axis=-1)
    c = codes.reshape(codes.shape[:-1] + (-1, per))
    out = c[..., 0].copy()
    for i in range(1, per):                 # at most 4 sub-byte positions, not a loop over data
        out |= c[..., i] << np.uint8(i * bits)
    return out


def unpack_codes(packed, bits: int, count: int) -> np.ndarray:
    """The first `count` codes of each row of `packed` [..., B] (pack_codes' inverse)."""
    per = 8 // bits
    packed = np.asarray(packed, np.uint8)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    c = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return c.reshape(packed.shape[:-1] + (-1,))[..., :count]


def _check(grid: BlockGrid, what: str) -> None:
    if grid.bits not in STORAGE_BITS:
        raise ValueError(f"{what}: bits must be one of {STORAGE_BITS}, got {grid.bits}")
    bs = grid.block_size
    if bs < 16 or bs & (bs - 1):
        raise ValueError(f"{what}: block_size must be a power of 2 and >= 16, got {bs}")


def _padded_codes(grid: BlockGrid) -> np.ndarray:
    """Codes [N, nb * block_size]; the padding of a partial last block holds the zero point (dequantizes to ~0)."""
    n, k = grid.q.shape
    nb, bs = grid.n_blocks, grid.block_size
    if k == nb * bs:
        return grid.q
    zp = np.clip(np.rint(grid.zero_points[:, -1]), 0, (1 << grid.bits) - 1).astype(np.uint8)
    out = np.repeat(zp[:, None], nb * bs, axis=1)
    out[:, :k] = grid.q
    return out


def _packed_zero_points(grid: BlockGrid) -> Optional[np.ndarray]:
    """None (symmetric: the default 2**(bits-1)), float [N, nb], or uint8 [N, ceil(nb * bits / 8)]."""
    if grid.symmetric:
        return None
    if grid.float_zero_points:
        return np.ascontiguousarray(grid.zero_points, np.float32)
    return pack_codes(grid.zero_points, grid.bits)


def pack_matmul_nbits(grid: BlockGrid) -> dict:
    """MatMulNBits inputs of a grid of W [N, K]: B, scales, zero_points (or None) and attrs (K, N, bits,
    block_size)."""
    _check(grid, "pack_matmul_nbits")
    if grid.bits == 8 and grid.float_zero_points:
        raise ValueError("pack_matmul_nbits: onnxruntime's CPU MatMulNBits refuses 8-bit weights with float zero "
                         "points; use integer zero points")
    n, k = grid.q.shape
    codes = _padded_codes(grid).reshape(n, grid.n_blocks, grid.block_size)
    return {"B": pack_codes(codes, grid.bits), "scales": np.ascontiguousarray(grid.scales, np.float32),
            "zero_points": _packed_zero_points(grid),
            "attrs": {"K": k, "N": n, "bits": grid.bits, "block_size": grid.block_size}}


def matmul_nbits_node(a: str, b: str, scales: str, output: str, attrs: dict, zero_points: Optional[str] = None,
                      bias: Optional[str] = None, accuracy_level: int = 0, name: str = "") -> NodeProto:
    """A com.microsoft MatMulNBits node; accuracy_level 0 (the default) is left out, as onnxruntime's own
    quantizer does, since not every execution provider reads it."""
    inputs = [a, b, scales]
    if zero_points or bias:
        inputs.append(zero_points or "")
    if bias:
        inputs += ["", bias]                # g_idx (deprecated) left empty
    kw = {k: int(attrs[k]) for k in ("K", "N", "bits", "block_size")}
    if accuracy_level:
        kw["accuracy_level"] = int(accuracy_level)
    return helper.make_node("MatMulNBits", inputs, [output], name=name or None, domain=MS_DOMAIN, **kw)


def pack_gather_block_quantized(grid: BlockGrid) -> dict:
    """GatherBlockQuantized inputs of a grid of an embedding E [V, H] blocked along H: data uint8
    [V, H * bits / 8], scales [V, nb], zero_points (packed uint8, or None) and attrs."""
    _check(grid, "pack_gather_block_quantized")
    if grid.float_zero_points:
        raise ValueError("pack_gather_block_quantized: GatherBlockQuantized takes integer zero points only")
    v, h = grid.q.shape
    if h * grid.bits % 8:
        raise ValueError(f"pack_gather_block_quantized: H * bits must fill whole bytes, got H={h}, bits={grid.bits}")
    return {"data": pack_codes(grid.q, grid.bits), "scales": np.ascontiguousarray(grid.scales, np.float32),
            "zero_points": _packed_zero_points(grid),
            "attrs": {"bits": grid.bits, "block_size": grid.block_size, "gather_axis": 0, "quantize_axis": 1}}


def gather_block_quantized_node(data: str, indices: str, scales: str, output: str, attrs: dict,
                                zero_points: Optional[str] = None, name: str = "") -> NodeProto:
    """A com.microsoft GatherBlockQuantized node."""
    inputs = [data, indices, scales] + ([zero_points] if zero_points else [])
    kw = {k: int(attrs[k]) for k in ("bits", "block_size", "gather_axis", "quantize_axis")}
    return helper.make_node("GatherBlockQuantized", inputs, [output], name=name or None, domain=MS_DOMAIN, **kw)


@dataclass
class SharedEmbeddingHead:
    """The nodes and initializers of an embedding lookup and a tied head over one table."""
    nodes: List[NodeProto] = field(default_factory=list)
    initializers: List[TensorProto] = field(default_factory=list)


def shared_embedding_head(grid: BlockGrid, ids: str, hidden: str, embedded: str, logits: str,
                          prefix: str = "embed_tokens", accuracy_level: int = 0) -> SharedEmbeddingHead:
    """embedded = E[ids] (GatherBlockQuantized) and logits = hidden @ E^T (MatMulNBits) over one packed table,
    for the grid of E [V, H] blocked along H (see the module docstring for what onnxruntime does with it)."""
    _check(grid, "shared_embedding_head")
    if grid.float_zero_points:
        raise ValueError("shared_embedding_head: GatherBlockQuantized takes integer zero points only")
    p = pack_matmul_nbits(grid)
    v, h = grid.q.shape
    nb, blob = p["B"].shape[1:]
    names = {k: f"{prefix}.{k}" for k in ("B", "scales", "zero_points", "table_shape", "table", "padded",
                                          "starts", "ends", "axes")}
    zp = names["zero_points"] if p["zero_points"] is not None else None
    inits = [numpy_helper.from_array(p["B"], names["B"]), numpy_helper.from_array(p["scales"], names["scales"]),
             numpy_helper.from_array(np.array([v, nb * blob], np.int64), names["table_shape"])]
    if zp:
        inits.append(numpy_helper.from_array(p["zero_points"], zp))
    sliced = h != nb * grid.block_size
    nodes = [helper.make_node("Reshape", [names["B"], names["table_shape"]], [names["table"]],
                              name=f"{prefix}/TableReshape"),
             gather_block_quantized_node(names["table"], ids, names["scales"], names["padded"] if sliced else embedded,
                                         {"bits": grid.bits, "block_size": grid.block_size, "gather_axis": 0,
                                          "quantize_axis": 1}, zp, name=f"{prefix}/GatherBlockQuantized")]
    if sliced:                              # the lookup is nb * block_size wide: cut it to H
        inits += [numpy_helper.from_array(np.array([x], np.int64), names[n])
                  for x, n in ((0, "starts"), (h, "ends"), (-1, "axes"))]
        nodes.append(helper.make_node("Slice", [names["padded"], names["starts"], names["ends"], names["axes"]],
                                      [embedded], name=f"{prefix}/Slice"))
    nodes.append(matmul_nbits_node(hidden, names["B"], names["scales"], logits, p["attrs"], zp,
                                   accuracy_level=accuracy_level, name=f"{prefix}/HeadMatMulNBits"))
    return SharedEmbeddingHead(nodes, inits)


def dequantize_reference(B, scales, zero_points, K: int, bits: int, block_size: int) -> np.ndarray:
    """W [N, K] float32 decoded from MatMulNBits storage (B [N, nb, blob], scales, packed or float zero points):
    the numpy reference the onnxruntime results are compared with."""
    B = np.asarray(B, np.uint8)
    n, nb, _ = B.shape
    codes = unpack_codes(B, bits, block_size).astype(np.float32)           # [N, nb, block_size]
    s = np.asarray(scales, np.float32).reshape(n, nb)
    if zero_points is None:
        zp = np.full((n, nb), 1 << (bits - 1), np.float32)
    elif np.asarray(zero_points).dtype == np.uint8:
        zp = unpack_codes(np.asarray(zero_points).reshape(n, -1), bits, nb).astype(np.float32)
    else:
        zp = np.asarray(zero_points, np.float32).reshape(n, nb)
    return ((codes - zp[..., None]) * s[..., None]).reshape(n, nb * block_size)[:, :K]


__all__ = ["MS_DOMAIN", "STORAGE_BITS", "pack_codes", "unpack_codes", "pack_matmul_nbits", "matmul_nbits_node",
           "pack_gather_block_quantized", "gather_block_quantized_node", "SharedEmbeddingHead",
           "shared_embedding_head", "dequantize_reference"]
