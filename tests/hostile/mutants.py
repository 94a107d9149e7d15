"""Seeded protobuf mutants for the hostile suite: structural field mutations a random byte flip rarely reaches.

Sources are small models built here (a tiny CNN, a MatMul/LayerNorm MLP, If and Loop bodies that capture outer
names, a model with a Constant node, an external-data initializer and a model-local function) plus, when the
shared corpus exists, its models (read in place, never copied into the project). `mutant(source, kind, seed)`
returns the mutated bytes and what to put beside them; the same arguments always give the same bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

WEIGHTS_BIN = "weights.bin"      # every mutant folder holds this external-data file (64 floats, then padding)
OUTSIDE = "outside.bin"          # a "secret" beside the mutant's folder: reading it is an escape
SECRET = np.full(64, 1234.5, np.float32)


@dataclass
class Source:
    name: str
    model: onnx.ModelProto
    calib: "dict | None"          # input name -> (N, ...) array, or None when calib_path is used
    calib_path: "str | None" = None
    weights: bytes = b""          # contents of weights.bin


@dataclass
class Mutant:
    id: str
    data: bytes                   # model.onnx
    what: str                     # the mutation, for the failure message
    must_refuse: bool = False     # run and quantize must exit 2 (an external-data escape)
    dirs: list = field(default_factory=list)    # folders to create beside model.onnx
    fifos: list = field(default_factory=list)   # FIFOs to create beside model.onnx


def _f32(rng, *shape, s=0.3):
    return (rng.standard_normal(shape) * s).astype(np.float32)


def _model(graph, opset=13, ir=8, **kw):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] + kw.pop("extra_opsets", []), **kw)
    m.ir_version = ir
    return m


def tiny_cnn() -> Source:
    rng = np.random.default_rng(0)
    I = numpy_helper.from_array
    inits = [I(_f32(rng, 4, 3, 3, 3), "w1"), I(1 + _f32(rng, 4, s=0.1), "g1"), I(_f32(rng, 4, s=0.1), "b1"),
             I(_f32(rng, 4, s=0.1), "m1"), I((0.5 + rng.random(4)).astype(np.float32), "v1"),
             I(_f32(rng, 8, 4, 3, 3), "w2"), I(_f32(rng, 8, s=0.1), "b2"),
             I(_f32(rng, 5, 8), "fc_w"), I(_f32(rng, 5, s=0.1), "fc_b")]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g1", "b1", "m1", "v1"], ["n1"], name="bn1"),
             helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2],
                              kernel_shape=[3, 3], group=1),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
             helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "tiny_cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])], inits)
    return Source("cnn", _model(g), {"image": rng.random((4, 1, 3, 8, 8)).astype(np.float32)})


def mlp() -> Source:
    rng = np.random.default_rng(1)
    I = numpy_helper.from_array
    inits = [I(_f32(rng, 16, 32), "w1"), I(_f32(rng, 32, s=0.1), "b1"), I(1 + _f32(rng, 32, s=0.1), "gamma"),
             I(_f32(rng, 32, s=0.1), "beta"), I(np.array(1e-5, np.float32), "eps"), I(_f32(rng, 32, 8), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="mm1"),
             helper.make_node("Add", ["h0", "b1"], ["h1"], name="add1"),
             helper.make_node("Relu", ["h1"], ["h"], name="relu"),
             helper.make_node("ReduceMean", ["h"], ["mu"], name="ln_mean", axes=[-1]),
             helper.make_node("Sub", ["h", "mu"], ["d"], name="ln_sub"),
             helper.make_node("Mul", ["d", "d"], ["d2"], name="ln_sq"),
             helper.make_node("ReduceMean", ["d2"], ["var"], name="ln_var", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="ln_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="ln_sqrt"),
             helper.make_node("Div", ["d", "sd"], ["nrm"], name="ln_div"),
             helper.make_node("Mul", ["nrm", "gamma"], ["sc"], name="ln_scale"),
             helper.make_node("Add", ["sc", "beta"], ["ln"], name="ln_shift"),
             helper.make_node("MatMul", ["ln", "w2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], inits,
                          value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 4, 32])])
    return Source("mlp", _model(g), {"x": rng.standard_normal((4, 1, 4, 16)).astype(np.float32)})


def control_flow() -> Source:
    rng = np.random.default_rng(2)
    I = numpy_helper.from_array
    vi = helper.make_tensor_value_info
    then_g = helper.make_graph([helper.make_node("Add", ["x", "c"], ["t_out"], name="then_add")], "then",
                               [], [vi("t_out", TensorProto.FLOAT, [1, 4])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["e_out"], name="else_mul")], "else",
                               [], [vi("e_out", TensorProto.FLOAT, [1, 4])],
                               [I(np.array([0.5], np.float32), "else_k")])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Add", ["v_in", "k"], ["v_out"], name="body_add")], "body",
        [vi("iter", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", TensorProto.FLOAT, [1, 4])],
        [vi("cond_out", TensorProto.BOOL, []), vi("v_out", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["pos"], name="gt"),
             helper.make_node("If", ["pos"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Loop", ["trips", "true", "branch"], ["y"], name="loop", body=body)]
    inits = [I(_f32(rng, 1, 4), "c"), I(_f32(rng, 1, 4), "k"), I(np.array(0, np.float32), "zero"),
             I(np.array(3, np.int64), "trips"), I(np.array(True), "true")]
    g = helper.make_graph(nodes, "control", [vi("x", TensorProto.FLOAT, [1, 4])], [vi("y", TensorProto.FLOAT, [1, 4])],
                          inits)
    return Source("control", _model(g), {"x": rng.standard_normal((4, 1, 4)).astype(np.float32)})


def ext_func() -> Source:
    """A Constant node, an initializer in weights.bin (external data in the model's folder), a local function."""
    rng = np.random.default_rng(3)
    w = _f32(rng, 4, 4)
    wt = numpy_helper.from_array(w, "w")
    wt.ClearField("raw_data")
    wt.data_location = TensorProto.EXTERNAL
    for k, v in (("location", WEIGHTS_BIN), ("offset", "0"), ("length", str(w.nbytes))):
        wt.external_data.add(key=k, value=v)
    fn = helper.make_function("local", "AddMul", ["a", "b"], ["out"],
                              [helper.make_node("Add", ["a", "b"], ["t"], name="fn_add"),
                               helper.make_node("Mul", ["t", "b"], ["out"], name="fn_mul")],
                              [helper.make_opsetid("", 13)])
    nodes = [helper.make_node("Constant", [], ["cst"], name="const",
                              value=numpy_helper.from_array(_f32(rng, 1, 4), "cst_value")),
             helper.make_node("MatMul", ["x", "w"], ["y1"], name="mm"),
             helper.make_node("AddMul", ["y1", "cst"], ["y"], name="addmul", domain="local")]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "ext_func", [vi("x", TensorProto.FLOAT, [1, 4])], [vi("y", TensorProto.FLOAT, [1, 4])],
                          [wt])
    m = _model(g, extra_opsets=[helper.make_opsetid("local", 1)], functions=[fn])
    return Source("extfunc", m, {"x": rng.standard_normal((4, 1, 4)).astype(np.float32)}, weights=w.tobytes())


BUILT = {"cnn": tiny_cnn, "mlp": mlp, "control": control_flow, "extfunc": ext_func}
CORPUS_MODELS = ("digits_cnn", "ppocr_cls", "char_rnn")   # minilm_l6 (90 MB) is too large to mutate by the hundred


def corpus_dir() -> "str | None":
    try:
        from tests.corpus import CORPUS
    except ImportError:
        return None
    return CORPUS if os.path.isdir(CORPUS) else None


def available_sources() -> list:
    c = corpus_dir()
    extra = [n for n in CORPUS_MODELS if c and os.path.isfile(os.path.join(c, n, "model.onnx"))]
    return list(BUILT) + extra


@lru_cache(maxsize=None)
def source(name: str) -> Source:
    if name in BUILT:
        return BUILT[name]()
    d = os.path.join(corpus_dir(), name)
    return Source(name, onnx.load(os.path.join(d, "model.onnx")), None, calib_path=os.path.join(d, "calib.npz"))


# ---------------------------------------------------------------- walking a ModelProto

def graphs(m):
    """Every GraphProto: the main graph and all bodies (recursively, in node attributes of graphs and functions)."""
    out = []

    def walk(g):
        out.append(g)
        for n in g.node:
            walk_nodes(n)

    def walk_nodes(n):
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                walk(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for sg in a.graphs:
                    walk(sg)
    walk(m.graph)
    for f in m.functions:
        for n in f.node:
            walk_nodes(n)
    return out


def nodes(m):
    out = [n for g in graphs(m) for n in g.node]
    out += [n for f in m.functions for n in f.node]
    return out


def tensors(m):
    """Every TensorProto: initializers, Constant values, sparse values, tensor attributes; bodies and functions."""
    out = []
    for g in graphs(m):
        out += list(g.initializer)
        out += [s.values for s in g.sparse_initializer]
    for n in nodes(m):
        for a in n.attribute:
            if a.type == AttributeProto.TENSOR:
                out.append(a.t)
            elif a.type == AttributeProto.SPARSE_TENSOR:
                out.append(a.sparse_tensor.values)
    return out


# ---------------------------------------------------------------- mutations

def _pick(rng, seq):
    seq = list(seq)
    return seq[int(rng.integers(len(seq)))] if seq else None


def _rename_everywhere(m, old, new):
    for g in graphs(m):
        for coll in (g.input, g.output, g.value_info, g.initializer):
            for x in coll:
                if x.name == old:
                    x.name = new
    for n in nodes(m):
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = new
        for i, x in enumerate(n.output):
            if x == old:
                n.output[i] = new


def _set_external(t, location, offset=None, length=None):
    t.ClearField("raw_data")
    for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        t.ClearField(f)
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    t.external_data.add(key="location", value=location)
    if offset is not None:
        t.external_data.add(key="offset", value=str(offset))
    if length is not None:
        t.external_data.add(key="length", value=str(length))


def _dims(v):
    def f(m, rng):
        t = _pick(rng, [t for t in tensors(m) if len(t.dims)])
        if t is None:
            return None
        i = int(rng.integers(len(t.dims)))
        t.dims[i] = v
        return f"tensor {t.name!r} dims[{i}] = {v}"
    return f


def _io_dims(v):
    def f(m, rng):
        vi = _pick(rng, [x for x in list(m.graph.input) + list(m.graph.output) if x.type.tensor_type.shape.dim])
        if vi is None:
            return None
        d = _pick(rng, vi.type.tensor_type.shape.dim)
        d.dim_value = v
        return f"graph value {vi.name!r} dim = {v}"
    return f


def _dtype(v):
    def f(m, rng):
        t = _pick(rng, tensors(m))
        if t is None:
            return None
        new = v if v is not None else _pick(rng, [x for x in (1, 2, 3, 6, 7, 8, 9, 10, 11, 16, 17) if x != t.data_type])
        t.data_type = new
        return f"tensor {t.name!r} data_type = {new}"
    return f


def _has_data(t):
    return bool(t.raw_data or t.float_data or t.int64_data or t.int32_data or t.double_data)


def _to_raw(t):
    """Store `t`'s typed-field data as raw_data (Paddle's Constant nodes use float_data)."""
    if not t.raw_data and _has_data(t) and t.data_location != TensorProto.EXTERNAL:
        try:
            arr = numpy_helper.to_array(t)
        except Exception:
            return
        for f in ("float_data", "int32_data", "int64_data", "double_data"):
            t.ClearField(f)
        t.raw_data = arr.tobytes()


def _raw(how):
    def f(m, rng):
        t = _pick(rng, [t for t in tensors(m) if _has_data(t) and t.data_type != TensorProto.STRING])
        if t is None:
            return None
        _to_raw(t)
        n = len(t.raw_data)
        t.raw_data = {"truncate": t.raw_data[: n // 2], "extend": t.raw_data + b"\x07" * 7, "empty": b"",
                      "one-short": t.raw_data[:-1]}[how]
        return f"tensor {t.name!r} raw_data {how} ({n} -> {len(t.raw_data)} bytes)"
    return f


def _typed_count(m, rng):
    t = _pick(rng, [t for t in tensors(m) if _has_data(t) and t.data_type == TensorProto.FLOAT])
    if t is None:
        return None
    n = int(np.prod(t.dims)) if len(t.dims) else 1
    k = max(0, n + _pick(rng, (-3, -1, 1, 5)))
    t.ClearField("raw_data")
    t.float_data.extend([0.25] * k)
    return f"tensor {t.name!r} float_data of {k} values for {n} elements"


_LOCATIONS = {"parent": "../" + OUTSIDE, "etc-passwd": "/etc/passwd", "nul": "a\x00b", "folder": "sub",
              "dev-zero": "/dev/zero", "fifo": "fifo.bin", "dot": ".", "abs-outside": None}


def _ext_location(key):
    def f(m, rng, mutant):
        t = _pick(rng, [t for t in tensors(m) if t.data_type == TensorProto.FLOAT and (_has_data(t) or
                                                                                       t.data_location == 1)])
        if t is None:
            return None
        loc = _LOCATIONS[key]
        if key == "folder":
            mutant.dirs.append("sub")
        if key == "fifo":
            mutant.fifos.append("fifo.bin")
        if loc is None:   # the real outside file, spelled absolute: filled in by the test (it knows tmp_path)
            loc = "@OUTSIDE_ABS@"
        n = 4 * (int(np.prod(t.dims)) if len(t.dims) else 1)
        _set_external(t, loc, 0, n if key in ("parent", "abs-outside", "etc-passwd") else None)
        mutant.must_refuse = True
        return f"tensor {t.name!r} external location {loc!r}"
    return f


def _ext_range(offset, length):
    def f(m, rng, mutant):
        t = _pick(rng, [t for t in tensors(m) if t.data_type == TensorProto.FLOAT and (_has_data(t) or
                                                                                       t.data_location == 1)])
        if t is None:
            return None
        _set_external(t, WEIGHTS_BIN, offset, length)
        return f"tensor {t.name!r} external {WEIGHTS_BIN} offset={offset} length={length}"
    return f


def _opset(v):
    def f(m, rng):
        m.opset_import[0].version = v
        return f"opset_import[0] ({m.opset_import[0].domain!r}) version = {v}"
    return f


def _ir(v):
    def f(m, rng):
        m.ir_version = v
        return f"ir_version = {v}"
    return f


def _op(field_name, v):
    def f(m, rng):
        n = _pick(rng, nodes(m))
        old = getattr(n, field_name)
        setattr(n, field_name, v)
        return f"node {n.name!r} {field_name} {old!r} -> {v!r}"
    return f


def _attr(how):
    def f(m, rng):
        cands = [(n, a) for n in nodes(m) for a in n.attribute if a.type in {
            "int-to-string": (AttributeProto.INT,), "ints-to-floats": (AttributeProto.INTS,),
            "float-to-ints": (AttributeProto.FLOAT,), "remove": tuple(range(1, 15)), "type-0": tuple(range(1, 15)),
            "negative": (AttributeProto.INT, AttributeProto.INTS), "zero": (AttributeProto.INT, AttributeProto.INTS),
            "huge": (AttributeProto.INT, AttributeProto.INTS)}[how]]
        pick = _pick(rng, cands)
        if pick is None:
            return None
        n, a = pick
        if how == "int-to-string":
            a.type, a.s = AttributeProto.STRING, str(a.i).encode() + b"px"
            a.ClearField("i")
        elif how == "ints-to-floats":
            vals = list(a.ints)
            a.ClearField("ints")
            a.type = AttributeProto.FLOATS
            a.floats.extend([v + 0.5 for v in vals] or [0.5])
        elif how == "float-to-ints":
            a.ClearField("f")
            a.type = AttributeProto.INTS
            a.ints.extend([1, 2])
        elif how == "remove":
            n.attribute.remove(a)
        elif how == "type-0":
            a.type = 0
        else:
            v = {"negative": -3, "zero": 0, "huge": 2 ** 40}[how]
            if a.type == AttributeProto.INT:
                a.i = v
            else:
                for i in range(len(a.ints)):
                    a.ints[i] = v
        return f"node {n.name!r} attribute {a.name!r} {how}"
    return f


def _input_missing(m, rng):
    n = _pick(rng, [n for n in nodes(m) if n.input])
    i = int(rng.integers(len(n.input)))
    n.input[i] = "no_such_value"
    return f"node {n.name!r} input[{i}] -> 'no_such_value'"


def _output_dup(m, rng):
    g = m.graph
    if len(g.node) < 2:
        return None
    a, b = (g.node[int(i)] for i in rng.choice(len(g.node), 2, replace=False))
    b.output[0] = a.output[0]
    return f"nodes {a.name!r} and {b.name!r} both produce {a.output[0]!r}"


def _graph_outputs(how):
    def f(m, rng):
        g = m.graph
        if how == "remove-all":
            del g.output[:]
        elif how == "dup":
            g.output.append(g.output[0])
        elif how == "input-remove":
            del g.input[:]
        elif how == "output-is-input":
            g.output[0].name = g.input[0].name
        return f"graph outputs {how}"
    return f


def _value_info(how):
    def f(m, rng):
        vi = _pick(rng, list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info))
        tt = vi.type.tensor_type
        if how == "elem-type":
            tt.elem_type = TensorProto.INT8 if tt.elem_type != TensorProto.INT8 else TensorProto.FLOAT
        elif how == "rank":
            tt.shape.dim.add().dim_value = 3
        elif how == "no-type":
            vi.ClearField("type")
        elif how == "elem-99":
            tt.elem_type = 99
        return f"value_info {vi.name!r} {how}"
    return f


def _cycle(m, rng):
    g = m.graph
    a = next((n for n in g.node if n.input), None)
    b = g.node[len(g.node) - 1]
    if a is None or a is b:
        return None
    a.input[0] = b.output[0]
    return f"node {a.name!r} reads {b.output[0]!r} (produced downstream): a cycle"


def _body(how):
    def f(m, rng):
        bodies = [(n, a) for g in graphs(m) for n in g.node for a in n.attribute if a.type == AttributeProto.GRAPH]
        pick = _pick(rng, bodies)
        if pick is None:
            return None
        n, a = pick
        if how == "captured-removed":
            local = {x.name for x in a.g.input} | {x.name for x in a.g.initializer} | {o for bn in a.g.node for o in bn.output}
            cands = [(bn, i) for bn in a.g.node for i, x in enumerate(bn.input) if x and x not in local]
            if not cands:
                return None
            bn, i = _pick(rng, cands)
            old = bn.input[i]
            bn.input[i] = old + "_gone"
            return f"body {a.name} of {n.name!r}: captured {old!r} renamed to a missing name"
        if how == "remove-attr":
            n.attribute.remove(a)
            return f"node {n.name!r}: body attribute {a.name!r} removed"
        if how == "outputs-removed":
            del a.g.output[:]
            return f"body {a.name} of {n.name!r}: outputs removed"
        if how == "inputs-removed":
            del a.g.input[:]
            return f"body {a.name} of {n.name!r}: inputs removed"
        return None
    return f


def _function(how):
    def f(m, rng):
        if not m.functions:
            return None
        fn = m.functions[0]
        if how == "recursive":
            fn.node[0].op_type, fn.node[0].domain = fn.name, fn.domain
            return f"function {fn.domain}.{fn.name} calls itself"
        if how == "missing-output":
            fn.output[0] = "nowhere"
            return f"function {fn.name} output renamed to a missing name"
        if how == "no-opset":
            del fn.opset_import[:]
            del m.opset_import[1:]
            return f"function {fn.name} domain has no opset import"
        return None
    return f


def _constant(how):
    def f(m, rng):
        n = _pick(rng, [n for n in nodes(m) if n.op_type == "Constant"])
        if n is None:
            return None
        if how == "two-values":
            n.attribute.append(helper.make_attribute("value_float", 1.5))
        elif how == "no-value":
            del n.attribute[:]
        elif how == "value-ints":
            del n.attribute[:]
            n.attribute.append(helper.make_attribute("value_ints", [1, 2, 3]))
        return f"Constant {n.name!r} {how}"
    return f


def _name(how):
    def f(m, rng):
        vi = m.graph.input[0] if m.graph.input else None
        if vi is None:
            return None
        if how == "newline":
            new = vi.name + "\nqcompiler: error: injected"
            _rename_everywhere(m, vi.name, new)
            return f"graph input {vi.name!r} renamed to hold a newline"
        if how == "huge-missing":
            n = _pick(rng, [n for n in m.graph.node if n.input])
            n.input[0] = "y" * 100_000
            return f"node {n.name!r} input[0] -> a missing 100k-character name"
        if how == "empty-input-name":
            n = _pick(rng, [n for n in m.graph.node if n.input])
            n.input[0] = ""
            return f"node {n.name!r} input[0] -> '' (optional input left out)"
        if how == "dup-initializer":
            if not m.graph.initializer:
                return None
            m.graph.initializer.append(m.graph.initializer[0])
            return f"initializer {m.graph.initializer[0].name!r} twice"
        return None
    return f


def _sparse(m, rng):
    t = _pick(rng, [t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims)])
    if t is None:
        return None
    sp = m.graph.sparse_initializer.add()
    sp.values.CopyFrom(numpy_helper.from_array(np.ones(3, np.float32), t.name + "_sp"))
    sp.indices.CopyFrom(numpy_helper.from_array(np.array([0, 99, 2 ** 40], np.int64), ""))
    sp.dims.extend(list(t.dims))
    return f"sparse initializer {t.name + '_sp'!r} with out-of-range indices"


# kind -> (mutation, takes the Mutant). Structural kinds run on the parsed proto; "bytes-*" on its serialization.
KINDS = {
    "dims-0": _dims(0), "dims-neg": _dims(-1), "dims-2**40": _dims(2 ** 40),
    "io-dims-0": _io_dims(0), "io-dims-2**40": _io_dims(2 ** 40),
    "dtype-0": _dtype(0), "dtype-99": _dtype(99), "dtype-other": _dtype(None),
    "raw-truncate": _raw("truncate"), "raw-extend": _raw("extend"), "raw-empty": _raw("empty"),
    "raw-one-short": _raw("one-short"), "typed-count": _typed_count,
    **{f"ext-{k}": _ext_location(k) for k in _LOCATIONS},
    "ext-offset-huge": _ext_range(2 ** 62, 64), "ext-offset-neg": _ext_range(-64, 64),
    "ext-length-huge": _ext_range(0, 2 ** 62), "ext-length-neg": _ext_range(0, -1),
    "ext-past-end": _ext_range(4000, 4096),
    "opset-0": _opset(0), "opset-99": _opset(99), "opset-2**62": _opset(2 ** 62),
    "ir-0": _ir(0), "ir-99": _ir(99),
    "op-empty": _op("op_type", ""), "op-unknown": _op("op_type", "NoSuchOp"), "domain-unknown": _op("domain", "com.evil"),
    **{f"attr-{h}": _attr(h) for h in ("int-to-string", "ints-to-floats", "float-to-ints", "remove", "type-0",
                                      "negative", "zero", "huge")},
    "input-missing": _input_missing, "output-dup": _output_dup,
    **{f"graph-{h}": _graph_outputs(h) for h in ("remove-all", "dup", "input-remove", "output-is-input")},
    **{f"vi-{h}": _value_info(h) for h in ("elem-type", "rank", "no-type", "elem-99")},
    "cycle": _cycle,
    **{f"body-{h}": _body(h) for h in ("captured-removed", "remove-attr", "outputs-removed", "inputs-removed")},
    **{f"func-{h}": _function(h) for h in ("recursive", "missing-output", "no-opset")},
    **{f"const-{h}": _constant(h) for h in ("two-values", "no-value", "value-ints")},
    **{f"name-{h}": _name(h) for h in ("newline", "huge-missing", "empty-input-name", "dup-initializer")},
    "sparse-bad-indices": _sparse,
    "bytes-flip": None, "bytes-truncate": None,
}
_TAKES_MUTANT = {k for k in KINDS if k.startswith("ext-")}


def mutant(src_name: str, kind: str, seed: int, outside_abs: str = "/nonexistent/" + OUTSIDE) -> "Mutant | None":
    """The mutant `kind` of source `src_name` under `seed`, or None where the kind does not apply.

    `outside_abs` is the absolute path of the file beside the mutant's folder (for `ext-abs-outside`)."""
    src = source(src_name)
    rng = np.random.default_rng([seed, sum(map(ord, src_name)), sum(map(ord, kind)) * 7919])
    mid = f"{src_name}-{kind}-s{seed}"
    if kind == "none":
        return Mutant(mid, src.model.SerializeToString(), "unmutated")
    if kind.startswith("bytes-"):
        data = bytearray(src.model.SerializeToString())
        if kind == "bytes-flip":
            k = int(rng.integers(1, 9))
            for pos in rng.integers(0, len(data), k):
                data[pos] ^= int(rng.integers(1, 256))
            return Mutant(mid, bytes(data), f"{k} random byte flips")
        cut = int(rng.integers(1, len(data)))
        return Mutant(mid, bytes(data[:cut]), f"truncated to {cut} of {len(data)} bytes")
    m = onnx.ModelProto()
    m.CopyFrom(src.model)
    mut = Mutant(mid, b"", "")
    fn = KINDS[kind]
    try:
        what = fn(m, rng, mut) if kind in _TAKES_MUTANT else fn(m, rng)
    except (IndexError, ValueError):
        what = None
    if what is None:
        return None
    if kind == "ext-abs-outside":
        for t in tensors(m):
            for e in t.external_data:
                if e.value == "@OUTSIDE_ABS@":
                    e.value = outside_abs
        what = what.replace("@OUTSIDE_ABS@", outside_abs)
    mut.what = what
    mut.data = m.SerializeToString()
    return mut
