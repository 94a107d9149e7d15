"""The fallback suggestion: the fewest nodes to keep float so that the worst output reaches a target SQNR, and
the config file that says so (`quantize --config FIX.yaml` reads it as it is).

A node's quantizers are its output pairs and its weights. Nodes are ranked by the worst `alone_sqnr_db` of their
quantizers; the search keeps float the first k of that ranking, k = 1, 2, 4, ... until the target is reached,
bisects down to the smallest such k, then tries giving back each chosen node but the first (at most
MAX_PRUNE_TRIALS), keeping it quantized when the target still holds. Every step is measured, since noise from
several quantizers does not add up the way their separate figures suggest: the search on the switchable copy
(variants.switchable, one session), the result on the QDQ model with those quantizers taken out
(variants.without: onnxruntime's own fused kernels), extended by the next ranked node while it misses.
"""
from __future__ import annotations

from typing import Dict, List

import yaml

from qcompiler.progress import bar

MAX_PRUNE_TRIALS = 12
# NOTE: the search aims this far above the target: `quantize --config` re-places and re-calibrates, and its model
# is not exactly the measured one (ppocr_cls, 23 Convs float: 40.23 dB measured, 39.99 dB re-quantized)
MARGIN_DB = 0.5


def _ranked_nodes(res, quants) -> List[str]:
    alone = {(v.kind, v.name): v.alone_sqnr_db for v in res.values}
    worst: Dict[str, float] = {}
    for z in quants:
        if not z.node:
            continue   # a graph input's quantizer: no node to name in a config
        db = alone.get((z.kind, z.name), float("inf"))
        worst[z.node] = min(worst.get(z.node, float("inf")), db)
    return sorted(worst, key=lambda n: worst[n])


def search(res, quants, runner, target: float, progress=None) -> dict:
    """The fallback for `target` dB (see the module docstring): {target_sqnr_db, nodes, sqnr_before_db,
    sqnr_after_db, reached, trials}."""
    by_node: Dict[str, list] = {}
    for z in quants:
        if z.node:
            by_node.setdefault(z.node, []).append(z)
    nodes = _ranked_nodes(res, quants)
    before = min(res.outputs.values()) if res.outputs else float("inf")
    out = {"target_sqnr_db": float(target), "nodes": [], "widened": [],
           "unquantized_outputs": _unquantized(runner, quants), "sqnr_before_db": before, "sqnr_after_db": before,
           "reached": before >= target, "trials": 0}
    if before >= target or not nodes:
        return out
    goal, target = target, target + MARGIN_DB
    cache: Dict[frozenset, float] = {}
    start = runner.trials

    with bar("debug: fallback search", None, progress, unit="trial") as b:
        def measure(chosen) -> float:
            key = frozenset(chosen)
            if key not in cache:
                off = {id(z) for n in chosen for z in by_node[n]}
                cache[key] = runner.switched_db([z for z in quants if id(z) not in off])
                b.update(1)
            return cache[key]

        def measure_wide(chosen, widened) -> float:
            wide = [z for n in widened for z in by_node[n] if z.kind == "activation"]
            off = {id(z) for n in chosen for z in by_node[n]} - {id(z) for n in widened for z in by_node[n]
                                                                  if z.kind == "weight"}
            b.update(1)
            return runner.switched_db([z for z in quants if id(z) not in off], wide=wide)

        lo, k = 0, 1
        while True:
            if measure(nodes[:k]) >= target:
                hi = k
                break
            if k == len(nodes):
                out.update(nodes=list(nodes), sqnr_after_db=measure(nodes), reached=measure(nodes) >= goal,
                           trials=runner.trials - start)
                return out
            lo, k = k, min(2 * k, len(nodes))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if measure(nodes[:mid]) >= target:
                hi = mid
            else:
                lo = mid
        chosen = list(nodes[:hi])
        for n in list(reversed(chosen[1:]))[:MAX_PRUNE_TRIALS]:
            trial = [c for c in chosen if c != n]
            if measure(trial) >= target:
                chosen = trial
        # the real model without those quantizers (onnxruntime's fused kernels, not the switches): while it
        # misses the target, keep the next ranked node float too
        while True:
            after = runner.worst_db([z for n in chosen for z in by_node[n]])
            b.update(1)
            rest = [n for n in nodes if n not in chosen]
            if after >= target or not rest:
                break
            chosen.append(rest[0])
        widened: List[str] = []
        if runner.widen and after >= target:
            widened, after = _widen(chosen, by_node, quants, runner, target, after, measure_wide)
    out.update(nodes=[n for n in chosen if n not in widened], widened=widened, sqnr_after_db=after,
               reached=after >= goal, trials=runner.trials - start)
    return out


# operators written after placement (their names do not exist when a config is matched) and Q/DQ themselves
_NOT_PLACED = frozenset({"QuantizeLinear", "DequantizeLinear", "MatMulNBits", "GatherBlockQuantized", "Constant"})


def _unquantized(runner, quants) -> List[str]:
    """The QDQ model's main-graph nodes whose outputs have no quantizer: the config pins them so
    (`output_quantized: false`), since keeping other nodes float changes what placement would choose around them
    (a Conv left float ends an integer island; ppocr_cls re-quantized with 23 Convs float gained two new 17 dB
    quantizers and missed the target by 3 dB)."""
    quantized = {z.node for z in quants if z.kind == "activation"}
    return [n.name for n in runner.idx.nodes if n.name and n.op_type not in _NOT_PLACED and n.name not in quantized]


def _widen(chosen, by_node, quants, runner, target, after, measure):
    """Of the nodes to keep float, those whose activations on 16-bit grids (their weights quantized) still reach
    the target, one at a time on the switches, then checked together on the real model; (widened, SQNR)."""
    widened: List[str] = []
    for n in chosen:
        if not any(z.kind == "activation" for z in by_node[n]):
            continue
        if measure(chosen, widened + [n]) >= target:
            widened.append(n)
    if not widened:
        return [], after
    acts = [z for n in widened for z in by_node[n] if z.kind == "activation"]
    off = [z for n in chosen if n not in widened for z in by_node[n]]
    wide_db = runner.worst_db(off, acts)
    return (widened, wide_db) if wide_db >= target else ([], after)


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(text))


def config_text(fallback: dict, float_path: str = "", quant_path: str = "") -> str:
    """The YAML config that keeps the fallback's nodes float (qcompiler/quant/settings/config.py's format)."""
    head = (f"# written by qcompiler debug: keeping {len(fallback['nodes'])} node(s) float and widening "
            f"{len(fallback.get('widened', []))} to 16-bit activations measured "
            f"{fallback['sqnr_after_db']:.2f} dB worst output SQNR (target {fallback['target_sqnr_db']:g} dB, "
            f"{fallback['sqnr_before_db']:.2f} dB with every quantizer)\n")
    for what, path in (("float model", float_path), ("quantized model", quant_path)):
        if path:
            head += f"# {what}: {_one_line(path)}\n"
    head += ("# use: qcompiler quantize MODEL --calib DATA --config THIS_FILE (with your other flags)\n"
             "# the first rule keeps unquantized the outputs the quantized model left unquantized, so that placement\n"
             "# does not add quantizers around the nodes kept float\n")
    rules = []
    if fallback.get("unquantized_outputs") and (fallback["nodes"] or fallback.get("widened")):
        rules.append({"match": {"name": list(fallback["unquantized_outputs"])}, "output_quantized": False})
    if fallback.get("widened"):
        rules.append({"match": {"name": list(fallback["widened"])}, "activations": {"bits": 16}})
    if fallback["nodes"]:
        rules.append({"match": {"name": list(fallback["nodes"])}, "keep_float": True})
    body = {"rules": rules}
    return head + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=1000)
