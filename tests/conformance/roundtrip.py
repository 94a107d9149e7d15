"""Round-trip helpers shared by the conformance tests: import -> canonicalize -> verify -> export, a structural
diff of the export against the original that allows exactly what canonicalize may change, and ORT runs.

What canonicalize may change (and nothing else): Identity nodes removed, dead nodes (no path to a graph or
body output) and unused initializers removed, unnamed nodes given names. Graph input/output names and order,
opset imports, IR version, functions, attributes (with their types) and named nodes' names must all survive.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

import hashlib

import numpy as np
import onnx
import onnxruntime as ort

import qcompiler
from qcompiler.passmanager import run_pipeline

AT = onnx.AttributeProto


def roundtrip(proto: onnx.ModelProto, base_dir: Optional[str] = None) -> onnx.ModelProto:
    """import -> verify -> canonicalize -> verify -> export (the path every conformance case takes)."""
    model = qcompiler.model_from_proto(proto, base_dir)
    qcompiler.verify(model.graph)
    run_pipeline(model, "canonicalize")
    qcompiler.verify(model.graph)
    return qcompiler.model_to_proto(model)


# --- structure -------------------------------------------------------------------------------------------------
def _body_free_names(gp: onnx.GraphProto) -> set:
    """Names a body reads from enclosing scopes (captures), recursively."""
    defined = {v.name for v in gp.input} | {t.name for t in gp.initializer} | {t.values.name for t in gp.sparse_initializer}
    for n in gp.node:
        defined.update(o for o in n.output if o)
    used = set()
    for n in gp.node:
        used.update(_node_reads(n))
    used.update(o.name for o in gp.output)
    return {u for u in used if u and u not in defined}


def _node_reads(n: onnx.NodeProto) -> set:
    out = {i for i in n.input if i}
    for a in n.attribute:
        for g in ([a.g] if a.type == AT.GRAPH else list(a.graphs) if a.type == AT.GRAPHS else []):
            out |= _body_free_names(g)
    return out


def live_nodes(gp: onnx.GraphProto) -> list:
    """Nodes of `gp` with a path to one of its outputs (what dead-code elimination keeps)."""
    needed = {o.name for o in gp.output}
    keep = [False] * len(gp.node)
    changed = True
    while changed:
        changed = False
        for i, n in enumerate(gp.node):
            if not keep[i] and any(o and o in needed for o in n.output):
                keep[i] = True
                needed |= _node_reads(n)
                changed = True
    return [n for i, n in enumerate(gp.node) if keep[i]]


def _h(*parts) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def _graph_sig(gp: onnx.GraphProto, outer: dict, where: str) -> tuple:
    """A rename-proof description of a graph: every value is hashed from its producer's op, attributes and
    input hashes (graph inputs and initializers by name, Identity transparent), so rewiring an input,
    changing an op or attribute, or reordering outputs changes the signature, while the renames,
    Identity removal, node naming and node reordering that canonicalize may do do not.
    Returns (input names, output hashes, Counter of live node hashes)."""
    env = dict(outer)
    for v in gp.input:
        env[v.name] = _h("in", v.name)
    for t in gp.initializer:
        env[t.name] = _h("init", t.name)
    pending = live_nodes(gp)
    nodes = Counter()
    while pending:
        rest = []
        for n in pending:
            if any(i and i not in env for i in n.input) or not _captures_ready(n, env):
                rest.append(n)
                continue
            ins = tuple(env[i] if i else "" for i in n.input)
            if n.op_type == "Identity" and n.domain in ("", "ai.onnx") and len(ins) == 1 and ins[0]:
                env[n.output[0]] = ins[0]
                continue
            attrs = tuple(_attr_sig(a, env, where) for a in n.attribute)
            h = _h(n.domain, n.op_type, ins, attrs, tuple(bool(o) for o in n.output))
            nodes[(n.op_type, h)] += 1
            for k, o in enumerate(n.output):
                if o:
                    env[o] = _h(h, k)
        if len(rest) == len(pending):
            raise AssertionError(f"{where}: cannot order nodes {[n.op_type for n in rest][:5]} (dangling input?)")
        pending = rest
    return (tuple(v.name for v in gp.input), tuple(env.get(o.name, "?" + o.name) for o in gp.output), nodes)


def _captures_ready(n: onnx.NodeProto, env: dict) -> bool:
    for a in n.attribute:
        for g in ([a.g] if a.type == AT.GRAPH else list(a.graphs) if a.type == AT.GRAPHS else []):
            if any(name not in env for name in _body_free_names(g)):
                return False
    return True


def _attr_sig(a: onnx.AttributeProto, env: dict, where: str):
    if a.type == AT.GRAPH:
        return (a.name, a.type, _body_sig(a.g, env, f"{where}/{a.name}"))
    if a.type == AT.GRAPHS:
        return (a.name, a.type, tuple(_body_sig(g, env, f"{where}/{a.name}") for g in a.graphs))
    return (a.name, a.type, _h(a.SerializeToString(deterministic=True)))


def _body_sig(g: onnx.GraphProto, env: dict, where: str):
    ins, outs, nodes = _graph_sig(g, env, where)
    return (ins, outs, tuple(sorted(nodes.items())))


def structural_diff(orig: onnx.ModelProto, exp: onnx.ModelProto) -> list:
    """Differences between the original and the exported model that canonicalize is not allowed to cause."""
    out = []
    if orig.ir_version != exp.ir_version:
        out.append(f"ir_version {orig.ir_version} -> {exp.ir_version}")
    if {o.domain: o.version for o in orig.opset_import} != {o.domain: o.version for o in exp.opset_import}:
        out.append(f"opset imports {orig.opset_import} -> {exp.opset_import}")
    if [f.SerializeToString(deterministic=True) for f in orig.functions] != \
            [f.SerializeToString(deterministic=True) for f in exp.functions]:
        out.append("model-local functions changed")
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        if getattr(orig, field) != getattr(exp, field):
            out.append(f"{field} {getattr(orig, field)!r} -> {getattr(exp, field)!r}")
    if {p.key: p.value for p in orig.metadata_props} != {p.key: p.value for p in exp.metadata_props}:
        out.append("metadata_props changed")
    og, eg = orig.graph, exp.graph
    for label, a, b in (("input", og.input, eg.input), ("output", og.output, eg.output)):
        if [v.name for v in a] != [v.name for v in b]:
            out.append(f"graph {label} names {[v.name for v in a]} -> {[v.name for v in b]}")
        for va, vb in zip(a, b):
            if va.HasField("type") and va.type != vb.type:
                out.append(f"graph {label} '{va.name}' type changed")
    live_inits = set()
    for n in live_nodes(og):
        live_inits |= _node_reads(n)
    live_inits |= {o.name for o in og.output} | {i.name for i in og.input}
    want_inits = {t.name: t for t in og.initializer if t.name in live_inits}
    got_inits = {t.name: t for t in eg.initializer}
    if set(want_inits) != set(got_inits):
        out.append(f"initializers {sorted(want_inits)} -> {sorted(got_inits)}")
    for name, t in want_inits.items():
        if name in got_inits and t.SerializeToString(deterministic=True) != got_inits[name].SerializeToString(deterministic=True):
            out.append(f"initializer '{name}' contents changed")
    sa, sb = _graph_sig(og, {}, "main"), _graph_sig(eg, {}, "main")
    if sa[2] != sb[2]:
        miss, extra = sa[2] - sb[2], sb[2] - sa[2]
        out.append(f"live nodes differ (op, attributes, wiring, bodies): missing {[k[0] for k in miss][:5]}, "
                   f"extra {[k[0] for k in extra][:5]}")
    elif sa[1] != sb[1]:
        out.append("graph outputs are computed differently (output wiring or order changed)")
    ids_a = sum(1 for n in og.node if n.op_type == "Identity")
    ids_b = sum(1 for n in eg.node if n.op_type == "Identity")
    if ids_b > ids_a:
        out.append(f"Identity count grew {ids_a} -> {ids_b}")
    named = {n.name for n in live_nodes(og) if n.name and n.op_type != "Identity"}
    got_names = [n.name for n in eg.node]
    if not named <= set(got_names):
        out.append(f"node names lost: {sorted(named - set(got_names))[:5]}")
    if "" in got_names or len(set(got_names)) != len(got_names):
        out.append("exported node names are not all set and unique")
    return out


# --- running ---------------------------------------------------------------------------------------------------
ORT_MAX_IR_VERSION = 13   # onnxruntime 1.31 refuses newer IR versions although the ops themselves are supported


class HarnessUnsupported(Exception):
    """onnxruntime's Python API cannot take or return this data (e.g. packed int4 inputs, bfloat16 outputs)."""


ORT_MAX_OPSET = 26        # newest ai.onnx opset whose schemas onnxruntime 1.31 registers


def _ops(gp: onnx.GraphProto):
    for n in gp.node:
        yield n
        for a in n.attribute:
            for g in ([a.g] if a.type == AT.GRAPH else list(a.graphs) if a.type == AT.GRAPHS else []):
                yield from _ops(g)


def _same_schemas_at(proto: onnx.ModelProto, old: int, new: int) -> bool:
    """True if every default-domain op resolves to the same schema at opset `old` as at `new`."""
    nodes = list(_ops(proto.graph))
    for f in proto.functions:
        nodes.extend(f.node)
    for n in nodes:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            if onnx.defs.get_schema(n.op_type, old, "").since_version > new:
                return False
        except onnx.defs.SchemaError:
            pass  # a model-local function of that name; its body is checked above
    return True


def for_ort(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The copy handed to onnxruntime, with the same clamp applied to original and export.

    NOTE: onnx stamps its newest cases with IR version 14 and opset 28, which ORT 1.31 refuses although every
    op in them resolves to a schema ORT knows. Lowering the IR version, and the default-domain opset when no op's
    schema changed between ORT's newest opset and the stamped one, changes nothing about what is computed.
    """
    opset = {o.domain: o.version for o in proto.opset_import}.get("", 0)
    lower_opset = opset > ORT_MAX_OPSET and _same_schemas_at(proto, opset, ORT_MAX_OPSET)
    if proto.ir_version <= ORT_MAX_IR_VERSION and not lower_opset:
        return proto
    p = onnx.ModelProto()
    p.CopyFrom(proto)
    p.ir_version = min(p.ir_version, ORT_MAX_IR_VERSION)
    if lower_opset:
        for o in list(p.opset_import) + [o for f in p.functions for o in f.opset_import]:
            if o.domain in ("", "ai.onnx") and o.version > ORT_MAX_OPSET:
                o.version = ORT_MAX_OPSET
    return p


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(for_ort(proto).SerializeToString(), so, providers=["CPUExecutionProvider"])


_BIT_VIEW = {1: np.uint8, 2: np.uint16}
_PACKED = ("int4", "uint4", "int2", "uint2", "float4")


def _is_ml_float(dt: np.dtype) -> bool:
    return dt.name.startswith(("bfloat16", "float8"))


def to_feed(x):
    """A data-set input as onnxruntime takes it (TensorProto decoded; ml_dtypes floats passed bit-exact)."""
    if isinstance(x, onnx.TensorProto):
        x = onnx.numpy_helper.to_array(x)
    if isinstance(x, (list, tuple)):
        return [to_feed(e) for e in x]
    if x is None:
        return None
    x = np.asarray(x) if isinstance(x, np.generic) else x
    if isinstance(x, np.ndarray):
        if x.dtype.name.startswith(_PACKED):
            raise HarnessUnsupported(f"onnxruntime's Python API cannot feed packed {x.dtype.name} inputs")
        if _is_ml_float(x.dtype):
            t = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(x).view(_BIT_VIEW[x.dtype.itemsize]), t)
    return x


def run_like_backend(sess: ort.InferenceSession, inputs: list) -> list:
    """Feed `inputs` by the session's input order, as onnxruntime's backend (and onnx's runner) do."""
    feeds = {}
    for i, inp in enumerate(sess.get_inputs()):
        if i < len(inputs):
            feeds[inp.name] = to_feed(inputs[i])
    try:
        return sess.run(None, feeds)
    except Exception as e:
        if "No corresponding Numpy type" in str(e):
            raise HarnessUnsupported(f"onnxruntime's Python API cannot return this output type: {e}") from None
        raise


def _ref(x):
    if isinstance(x, onnx.TensorProto):
        return onnx.numpy_helper.to_array(x)
    if isinstance(x, onnx.SequenceProto):
        return onnx.numpy_helper.to_list(x)
    if isinstance(x, onnx.OptionalProto):
        return onnx.numpy_helper.to_optional(x)
    return x


def assert_similar(ref, got, rtol: float, atol: float, where: str = "") -> None:
    """onnx's backend-runner comparison (shape, dtype, allclose; strings exact; sequences element-wise)."""
    assert len(got) == len(ref), f"{where}: {len(got)} outputs, expected {len(ref)}"
    for i, (r, g) in enumerate(zip(ref, got)):
        w = f"{where} output {i}".strip()
        r = _ref(r)
        if isinstance(g, (list, tuple)) or isinstance(r, (list, tuple)):
            assert isinstance(g, (list, tuple)) and isinstance(r, (list, tuple)), f"{w}: sequence vs tensor"
            assert_similar(list(r), list(g), rtol, atol, w)
            continue
        if r is None or g is None:
            assert r is None and g is None, f"{w}: optional presence differs ({r is None} vs {g is None})"
            continue
        r, g = np.asarray(r), np.asarray(g)
        if _is_ml_float(r.dtype) and g.dtype.itemsize == r.dtype.itemsize and g.dtype.kind == "u":
            g = g.view(r.dtype)   # ORT hands float8 back as raw uint8
        np.testing.assert_array_equal(g.shape, r.shape, err_msg=f"{w}: shape")
        if r.dtype == object:
            np.testing.assert_array_equal(g, r, err_msg=w)
            continue
        assert g.dtype == r.dtype, f"{w}: dtype {g.dtype} != {r.dtype}"
        tol = rtol
        if _is_ml_float(g.dtype):
            tol = max(rtol, 2 ** -6) if g.dtype.name == "bfloat16" else rtol
            g, r = g.astype(np.float32), r.astype(np.float32)
        np.testing.assert_allclose(g, r, rtol=tol, atol=atol, err_msg=w)
