"""The switchable copy of a QDQ model and the trials run on it (the safety net's measuring instrument).

One onnxruntime session runs every trial: after each switchable quantizer's DequantizeLinear a
`Where(on[i], DQ, x)` (and, with 16-bit activations, `Where(wide[i], DQ16(Q16(x)), DQ)`) picks the quantized or
the float value, with `on`/`wide` as bool graph inputs; a trial is one setting of the switches on the kept
samples with the largest error. `weights.py` builds the same switches over weight DequantizeLinears.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.core.encoding import compute_encoding
from qcompiler.quant.core.qdq import cast_ends, storage_dtype
from qcompiler.quant.interop.report import OutputError

MAX_WEIGHT_BYTES = 1 << 30   # larger models are not searched (the switchable copy is one protobuf)
TRIAL_SAMPLES = 8          # calibration samples per trial: the kept samples with the largest error
_SWITCH_ON, _SWITCH_WIDE = "qcompiler_safety_net_on", "qcompiler_safety_net_wide"


def worst_sqnr(errors: dict) -> float:
    """Min SQNR (dB) over the outputs of `output_errors()`; +inf when there are none."""
    vals = [e.sqnr_db() for e in (errors or {}).values()]
    return min(vals) if vals else float("inf")


@dataclass
class _Quantizer:
    key: str            # the plan/encodings name of the quantized value
    q: object           # QuantizeLinear node (IR)
    dq: object          # DequantizeLinear node (IR)
    enc: object         # its Encoding


def activation_quantizers(model, acts: Dict[str, object]) -> List[_Quantizer]:
    """Main-graph activation Q→DQ pairs whose encoding is per tensor, in graph order, keyed by their value name."""
    g = model.graph
    found = []
    for q in g.nodes_by_op("QuantizeLinear"):
        x = q.inputs[0]
        if x is None or x.tensor is not None or (x.producer is not None and x.producer.op_type == "Constant"):
            continue
        out = q.outputs[0]
        uses = out.uses()
        if len(uses) != 1 or uses[0].is_graph_output or uses[0].user.op_type != "DequantizeLinear" \
                or uses[0].user.graph is not g:   # read only through bodies' own DQs (qdq.local_dequantizers)
            continue
        dq = uses[0].user
        if dq.outputs[0].is_output_of_any_graph() and not g.can_take_name(x):
            continue   # a graph input (or output) read straight into a graph output: nothing to turn off
        ends = cast_ends(q, dq)    # float16 at opset < 19: Cast -> Q -> DQ -> Cast (qdq.float_route)
        key = next((v.name for v in (dq.outputs[0], x, ends[1], ends[0]) if v.name in acts), x.name)
        enc = acts.get(key)
        if enc is None or enc.per_channel or enc.frozen or not _same_scale(q, enc):
            continue
        found.append(_Quantizer(key, q, dq, enc))
    order = {n: i for i, n in enumerate(g.topological_nodes(("QuantizeLinear",)))}
    found.sort(key=lambda z: order[z.q])
    return found


def reaching(model, quants: List[_Quantizer], outputs) -> List[_Quantizer]:
    """The quantizers whose value reaches one of the graph outputs named in `outputs` (turning the others off
    cannot change those outputs: a trial on them would be wasted)."""
    wanted = set(outputs)
    reached = model.graph.outputs_reached([z.dq.outputs[0] for z in quants])
    return [z for z in quants if any(o.name in wanted for o in reached[z.dq.outputs[0]])]


def _same_scale(q, enc) -> bool:
    """Is `enc` the grid this Q node carries (a per-use Q/DQ has its own, not its value's)?"""
    sv = q.inputs[1] if len(q.inputs) > 1 else None
    arr = sv.const_value() if sv is not None else None
    return arr is not None and np.size(arr) == 1 and np.allclose(np.asarray(arr, np.float64).reshape(()),
                                                                  np.asarray(enc.scale, np.float64).reshape(()))


def _wide_encoding(enc, bits: int):
    e = compute_encoding(enc.min, enc.max, bits=bits, symmetric=enc.symmetric, signed=enc.signed)
    e.meta = dict(enc.meta)
    return e


def _switch_proto(model, quants: List[_Quantizer], wide_bits: Optional[int]):
    """The QDQ model as a ModelProto with a Where switch after each quantizer (see the module docstring)."""
    mp = model_to_proto(model)
    g = mp.graph
    k = len(quants)
    by_dq = {z.dq.name: (i, z) for i, z in enumerate(quants)}
    g.input.append(helper.make_tensor_value_info(_SWITCH_ON, TensorProto.BOOL, [k]))
    if wide_bits:
        g.input.append(helper.make_tensor_value_info(_SWITCH_WIDE, TensorProto.BOOL, [k]))
    nodes = list(g.node)
    del g.node[:]
    p = "qcompiler_sn"
    for n in nodes:
        hit = by_dq.get(n.name) if n.op_type == "DequantizeLinear" else None
        if hit is None:
            g.node.append(n)
            continue
        i, z = hit
        out, x = n.output[0], z.q.inputs[0].name
        dq_out = f"{p}{i}_dq"
        n.output[0] = dq_out
        g.node.append(n)
        g.initializer.append(numpy_helper.from_array(np.asarray(i, np.int64), f"{p}{i}_idx"))
        g.node.append(helper.make_node("Gather", [_SWITCH_ON, f"{p}{i}_idx"], [f"{p}{i}_on"], name=f"{p}{i}_g"))
        chosen = dq_out
        if wide_bits:
            e = _wide_encoding(z.enc, wide_bits)
            s_dtype = np.asarray(z.q.inputs[1].const_value()).dtype      # float16 scales: qdq.float_route
            g.initializer.append(numpy_helper.from_array(np.asarray(e.scale, np.float32).astype(s_dtype),
                                                         f"{p}{i}_s16"))
            g.initializer.append(numpy_helper.from_array(
                np.asarray(e.zero_point).astype(storage_dtype(e)), f"{p}{i}_z16"))
            g.node.append(helper.make_node("QuantizeLinear", [x, f"{p}{i}_s16", f"{p}{i}_z16"], [f"{p}{i}_q16"],
                                           name=f"{p}{i}_q16"))
            g.node.append(helper.make_node("DequantizeLinear", [f"{p}{i}_q16", f"{p}{i}_s16", f"{p}{i}_z16"],
                                           [f"{p}{i}_dq16"], name=f"{p}{i}_dq16"))
            g.node.append(helper.make_node("Gather", [_SWITCH_WIDE, f"{p}{i}_idx"], [f"{p}{i}_w"],
                                           name=f"{p}{i}_gw"))
            g.node.append(helper.make_node("Where", [f"{p}{i}_w", f"{p}{i}_dq16", dq_out], [f"{p}{i}_sel"],
                                           name=f"{p}{i}_ww"))
            chosen = f"{p}{i}_sel"
        g.node.append(helper.make_node("Where", [f"{p}{i}_on", chosen, x], [out], name=f"{p}{i}_where"))
    del mp.graph.value_info[:]   # the DQ outputs were renamed; onnxruntime infers the rest
    return mp


class _Trials:
    """Runs one setting of the switches on the trial samples; harm = max over outputs of noise/signal, scaled so
    that all quantizers on gives the harm over every kept sample (`pick`)."""

    def __init__(self, sess, kept, k: int, wide: bool, max_trials: int, clock=None, on_trial: Callable = None):
        self.sess, self.kept, self.k, self.wide, self.max_trials = sess, kept, k, wide, max_trials
        self.names = [o.name for o in sess.get_outputs()]
        self.count = 0
        self.scale: Dict[str, float] = {}
        self.clock = clock              # budget.Clock (None: no time limit)
        self.on_trial = on_trial        # called after each trial (a progress bar's update)
        self.out_of_time = False

    def left(self) -> int:
        if self.clock is not None and self.clock.out():
            self.out_of_time = True
            return 0
        return self.max_trials - self.count

    def pick(self, samples: int) -> None:
        """All quantizers on, over every kept sample (one trial): keep the `samples` samples with the most noise
        relative to their output (the error is often in a few samples: ppocr_cls, first 8 of 32: 49 dB, all 32:
        24 dB) and the scale from their harm to the harm over all samples."""
        per = self._errors(self.kept, range(self.k), (), per_sample=True)
        total: Dict[str, OutputError] = {}
        for errs in per:
            for n, e in errs.items():
                t = total.setdefault(n, OutputError())
                t.signal, t.noise, t.count = t.signal + e.signal, t.noise + e.noise, t.count + 1
        worst = max(total, key=lambda n: _ratio(total[n]), default=None)
        if worst is None:
            return
        order = sorted(range(len(per)), key=lambda i: -(per[i][worst].noise if worst in per[i] else 0.0))
        self.kept = [self.kept[i] for i in sorted(order[:samples])]
        chosen = [per[i] for i in sorted(order[:samples])]
        for n, t in total.items():
            sig = sum(c[n].signal for c in chosen if n in c)
            noise = sum(c[n].noise for c in chosen if n in c)
            self.scale[n] = (_ratio(t) / (noise / sig)) if noise > 0 and sig > 0 else 1.0

    def _errors(self, kept, on, wide, per_sample: bool = False):
        self.count += 1
        t0 = time.perf_counter()
        flags = np.zeros(self.k, bool)
        flags[list(on)] = True
        feedx = {_SWITCH_ON: flags}
        if self.wide:
            w = np.zeros(self.k, bool)
            w[list(wide)] = True
            feedx[_SWITCH_WIDE] = w
        out = []
        # NOTE: two single-threaded runs in flight, as report._output_errors (a busy 2-core box)
        with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
            runs = pool.map(lambda item: self.sess.run(self.names, {**item[0], **feedx},
                                                       where="a safety-net trial"), kept)
            for (feed, ref), outs in zip(kept, runs):
                errs: Dict[str, OutputError] = {}
                for n, a in zip(self.names, outs):
                    r = ref.get(n)
                    if r is not None and np.issubdtype(np.asarray(r).dtype, np.floating):
                        errs.setdefault(n, OutputError()).update(r, a, feed)
                out.append(errs)
        if self.clock is not None and kept:
            self.clock.observe((time.perf_counter() - t0) / len(kept))
        if self.on_trial is not None:
            self.on_trial()
        if per_sample:
            return out
        total: Dict[str, OutputError] = {}
        for errs in out:
            for n, e in errs.items():
                t = total.setdefault(n, OutputError())
                t.signal, t.noise = t.signal + e.signal, t.noise + e.noise
        return total

    def harm(self, on, wide=()) -> float:
        errs = self._errors(self.kept, on, wide)
        return max((_ratio(e) * self.scale.get(n, 1.0) for n, e in errs.items()), default=0.0)


def _ratio(e) -> float:
    if e.noise == 0.0:
        return 0.0
    return e.noise / e.signal if e.signal > 0 else float("inf")


def db(harm: float) -> float:
    if harm <= 0:
        return float("inf")
    return float(-10 * np.log10(harm)) if np.isfinite(harm) else float("-inf")

