"""`split-outlier-rows`: a MatMul weight with a few outlier rows, on a target whose MatMul weights are per tensor,
becomes two MatMuls: the bulk on a fine grid and the outlier rows on their own (exact in float).

A per-tensor 8-bit grid takes its step from the largest element. One outlier element makes it coarse for every
other: minilm_l6's FFN down_proj weights (1536 x 384) each hold one element of |w| 3.5-7.9 where 99.99 % of them
are below 0.38, so the per-tensor 8-bit grid gives 8-15 dB and qnn_htp (per-tensor MatMul weights, as AIMET's HTP
config) ran them at 16 bits to reach the floor. Rows are the input features (X @ W sums x_k W[k, :]), so

    X @ W  =  X @ W'  +  Gather(X, S, axis=-1) @ W[S, :]

where W' is W with the rows S set to zero (same shape: the MatMul keeps its input) and S the few rows whose
largest element stands far above the rest. W' gets the grid of the bulk (the 1536 x 384 weights above: 24-29 dB
at 8 bits), the small MatMul its own grid, and the added bytes are the |S| x N rows and one index list.

Which rows: sorted by their largest |w|, the first k (k <= MAX_ROWS) are split off, k the fewest whose per-tensor
grids (the bulk's and the rows') give the weight an SQNR within TOLERANCE_DB of the best k's, and only when the
best gains MIN_GAIN_DB or more (grid_sqnr_db: measured on the weight, at the run's bits and symmetry). minilm_l6
on qnn_htp: 7 of its 36 MatMul weights, e.g. layer 0's down_proj 8.1 dB -> 28.8 dB with 3 rows.

Where it applies (profile facts, no target names): the MatMul's weight is quantized per tensor on the target
(`weights` lists MatMul and `per_channel_ops` does not, or the run asked for per-tensor weights) at 8 bits or
less, no config rule keeps the node float, and no encodings are loaded (`--load-encodings`: another tool's grids
for the model as it is). The sum goes after the bias Add of an exported Linear when there
is one (the MatMul + bias pair the target fuses stays as it was), else right after the MatMul.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.placement.options import PlacementOptions, node_settings
from qcompiler.quant.core.encoding import compute_encoding, quantize_dequantize
from qcompiler.quant.runtime.memory import drop_cached

MAX_ROWS = 8              # rows split off one weight at most ("a few")
MIN_ROWS_PER_SPLIT = 16   # the weight keeps at least this many rows per row split off
MIN_GAIN_DB = 6.0         # the split must make the weight grid at least this much better (a bit: SQNR of W)
TOLERANCE_DB = 1.0        # ... and takes the fewest rows within this of the best gain


def grid_sqnr_db(w: np.ndarray, rows, bits: int = 8, symmetric: bool = True) -> float:
    """SQNR of `w` on per-tensor `bits`-bit grids once `rows` are split off (the bulk and the rows each on their
    own grid; every row kept when `rows` is empty)."""
    w = np.asarray(w, np.float64)
    rows = list(rows)
    bulk = w.copy()
    bulk[rows, :] = 0
    err = (bulk - _on_grid(bulk, bits, symmetric)) ** 2
    if rows:
        err[rows, :] = (w[rows, :] - _on_grid(w[rows, :], bits, symmetric)) ** 2
    e = float(err.sum())
    return math.inf if e == 0 else 10.0 * math.log10(float((w * w).sum()) / e)


def _on_grid(w: np.ndarray, bits: int, symmetric: bool) -> np.ndarray:
    """`w` fake-quantized on its own per-tensor grid (the project's one fake-quant)."""
    return quantize_dequantize(w, compute_encoding(w.min(), w.max(), bits, symmetric))


def outlier_rows(w: np.ndarray, bits: int = 8, symmetric: bool = True) -> List[int]:
    """The rows of a 2-D weight to split off (the module docstring's rule), ascending; [] when none."""
    if w.ndim != 2 or w.shape[0] < MIN_ROWS_PER_SPLIT * 2 or not np.isfinite(w).all():
        return []
    r = np.abs(np.asarray(w, np.float64)).max(axis=1)
    order = [int(i) for i in np.argsort(-r, kind="stable")]
    most = min(MAX_ROWS, w.shape[0] // MIN_ROWS_PER_SPLIT)
    db = [grid_sqnr_db(w, order[:k], bits, symmetric) for k in range(most + 1)]
    best = max(db)
    if not best - db[0] >= MIN_GAIN_DB:
        return []
    k = next(k for k in range(most + 1) if db[k] >= best - TOLERANCE_DB)
    return sorted(order[:k])


def _per_tensor_grid(profile, opts: PlacementOptions, node) -> Optional[Tuple[int, bool]]:
    """(bits, symmetric) of `node`'s weight (input 1) when it is quantized per tensor at 8 bits or less on this
    target and run; else None."""
    if 1 not in profile.weights.get(node.op_type, {}):
        return None
    s = node_settings(opts, profile, node)
    if s["keep_float"] or not s["weight_quantized"] or s["precision"] != "int" or s["weight_block"]:
        return None
    if int(s["weight_bits"]) > 8 or (s["weight_per_channel"] and node.op_type in profile.per_channel_ops):
        return None
    return int(s["weight_bits"]), bool(s["weight_symmetric"])


def _bias_add(node):
    """The Add of a constant that alone reads `node`'s output (an exported Linear's bias), or None."""
    out = node.outputs[0]
    uses = out.uses()
    if len(uses) != 1 or uses[0].is_graph_output or uses[0].user.op_type != "Add":
        return None
    add = uses[0].user
    other = [v for v in add.inputs if v is not out]
    return add if len(other) == 1 and other[0] is not None and other[0].const_value() is not None else None


def split(g, node, rows: List[int], written: Optional[dict] = None) -> Optional[str]:
    """Rewrite MatMul `node` as the module docstring says (through the IR's mutation API); the new Add's name.
    `written` gets {name: float array} of the two weights it writes."""
    w = np.asarray(node.inputs[1].const_value())
    x = node.inputs[0]
    idx = g.add_constant(np.asarray(rows, dtype=np.int64), f"{node.name}_outlier_rows")
    w_rows = g.add_constant(np.ascontiguousarray(w[rows, :]), f"{node.inputs[1].name}_outlier_rows")
    gather = g.add_node("Gather", [x, idx], [f"{node.name}_outlier_input"], {"axis": -1},
                        name=f"{node.name}_outlier_gather", before=node)
    side = g.add_node("MatMul", [gather.outputs[0], w_rows], [f"{node.name}_outlier_output"],
                      name=f"{node.name}_outlier", before=node)
    bulk = w.copy()
    bulk[rows, :] = 0
    g.private_constant(node, 1)
    g.set_constant(node.inputs[1], bulk, writer=node)
    if written is not None:
        written[node.inputs[1].name] = bulk
        written[w_rows.name] = np.asarray(w_rows.const_value())
    add = _bias_add(node)
    value = add.outputs[0] if add is not None else node.outputs[0]
    joined = g.insert_after(value, "Add", [side.outputs[0]], name=f"{node.name}_outlier_add")
    return joined.name


@register_pass
class SplitOutlierRows(QuantPass):
    name = "split-outlier-rows"
    description = "per-tensor MatMul weights with a few outlier rows: those rows become a second MatMul on a " \
                  "gathered slice of the input (exact in float), the bulk gets a fine grid"
    preserves_semantics = True

    def run(self, ctx) -> PassResult:
        if getattr(ctx.settings, "load_encodings", None):
            # NOTE: loaded encodings are another tool's grids for the model as it is: its weights stay whole
            return PassResult(False, {"split": {}, "reason": "encodings loaded (--load-encodings)"})
        opts = ctx.options or PlacementOptions()
        g = ctx.model.graph
        done = {}
        for node in list(g.nodes_by_op("MatMul")):
            if len(node.inputs) < 2 or node.inputs[1] is None or node.inputs[0] is None:
                continue
            # NOTE: the target's grid first: a weight is read only where a split could apply (a 2 GB model's
            # weights on a per-channel target are never loaded here), and dropped again unless split
            grid = _per_tensor_grid(ctx.profile, opts, node)
            if grid is None or not node.inputs[1].is_constant():
                continue
            w = node.inputs[1].const_value()
            if w is None or not np.issubdtype(np.asarray(w).dtype, np.floating):
                drop_cached(node.inputs[1])
                continue
            w = np.asarray(w)
            rows = outlier_rows(w, *grid)
            if not rows:
                drop_cached(node.inputs[1])
                continue
            before, after = grid_sqnr_db(w, [], *grid), grid_sqnr_db(w, rows, *grid)
            split(g, node, rows, ctx.prepared_weights)
            done[node.name] = {"rows": rows, "grid_sqnr_db": [round(before, 2), round(after, 2)]}
        if done:
            first = next(iter(done.items()))
            b, a = first[1]["grid_sqnr_db"]
            ctx.notes.append(f"split-outlier-rows: {len(done)} per-tensor MatMul weight(s) had a few outlier rows, "
                             f"now a second MatMul each (e.g. '{first[0][:60]}': {len(first[1]['rows'])} rows, its "
                             f"grid {b:.1f} dB -> {a:.1f} dB)")
        return PassResult(bool(done), {"split": done})
