"""What users bring: small models in each exporter's idiom (tests/quant/exporter_models.py) quantized like a new
user would, through the API and the CLI. Each must exit 0, keep its outputs (names and order), run in
onnxruntime with the default session options, quantize its weights, and stay within an 8-bit-sized SQNR of
float on its calibration samples. The idioms that used to fail each have their own test below (before -> after
in the test's docstring)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.calibration.data import load_samples
from tests.helpers import run, sqnr_db
from tests.quant import exporter_models as em

FLOOR_DB = 25.0   # a small W8A8 model of these sizes gets 27-46 dB here (mean over samples)


def weight_dqs(q) -> list:
    return [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].endswith("_quantized")]


def check(proto, res, feeds, floor=FLOOR_DB, min_weight_dqs=1):
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    assert [o.name for o in q.graph.output] == [o.name for o in proto.graph.output]
    # quantized weights: a DQ, or stored on their grid for a float kernel (the callers ask for
    # --optimize accuracy: every quantizer kept)
    assert len(weight_dqs(q)) + len(res.report.get("prefolded_params") or {}) >= min_weight_dqs, "weights left float"
    got = {}
    for feed in feeds[:6]:
        for name, r, g in zip([o.name for o in proto.graph.output], run(proto, feed), run(q, feed)):
            got.setdefault(name, []).append(sqnr_db(r, g))
    for name, v in got.items():   # the mean over samples, as the report measures it
        assert np.mean(v) >= floor, f"{name}: SQNR {np.mean(v):.1f} dB < {floor}"
    return q


def cli(*args):
    return subprocess.run([sys.executable, "-m", "qcompiler", *map(str, args)], capture_output=True, text=True)


def save_npz(path, feeds, rename=lambda k: k):
    np.savez(path, **{rename(k): np.stack([f[k] for f in feeds]) for k in feeds[0]})
    return path


@pytest.mark.parametrize("family", sorted(em.FAMILIES))
def test_family_quantizes_through_the_api(family):
    m, feeds = em.FAMILIES[family]()
    # every quantizer kept (balanced leaves a float kernel's weights exact float: not what this test checks)
    check(m, quantize(m, feeds, progress=False, optimize="accuracy"), feeds)


def test_multi_input_family_through_the_cli(tmp_path):
    """A user's CLI run: optimum's model file + an .npz keyed by its graph input names (int64 ids, past KV)."""
    m, feeds = em.optimum()
    onnx.save(m, tmp_path / "m.onnx")
    calib = save_npz(tmp_path / "c.npz", feeds)
    r = cli("quantize", tmp_path / "m.onnx", "--calib", calib, "-o", tmp_path / "q.onnx", "-q")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    q = onnx.load(tmp_path / "q.onnx")
    assert [o.name for o in q.graph.output] == [o.name for o in m.graph.output]
    assert [i.name for i in q.graph.input] == [i.name for i in m.graph.input]


# --- torch.onnx dynamo: model-local functions --------------------------------------------------------------
def test_dynamo_local_functions_are_inlined_and_quantized():
    """Before: onnxruntime refused the model after convert-opset ('pkg.torch.2.3:torch_nn_modules_linear_Linear_
    fc1_1(-1) is not a registered function/op': onnx's version converter drops model.functions), exit 1 with a
    traceback-free OnnxRuntimeError. After: the calls are inlined first, fc1's MatMul gets a weight quantizer."""
    m, feeds = em.dynamo()
    res = quantize(m, feeds, progress=False)
    q = check(m, res, feeds, min_weight_dqs=2)
    assert not q.functions and not any(n.domain.startswith("pkg.torch") for n in q.graph.node)
    assert "fc1.weight_quantized" in {n.input[0] for n in weight_dqs(q)}


def test_inline_functions_keeps_uncalled_functions_and_a_plain_model_alone():
    from qcompiler.passes.inline_functions import inline_local_functions
    from qcompiler.onnx_io import model_from_proto
    m, _ = em.torchscript()
    unused = helper.make_function("custom", "Unused", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                  opset_imports=[helper.make_opsetid("", 13)])
    m.functions.append(unused)
    model = model_from_proto(m)
    assert inline_local_functions(model) == 0 and [f.name for f in model.functions] == ["Unused"]


# --- weights behind layout ops ---------------------------------------------------------------------------------
def _transposed_weight_model(op="Transpose"):
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.3, (6, 8)).astype(np.float32)           # torch Linear weight [out, in]
    nodes = [helper.make_node("MatMul", ["x", "w_t"], ["y"], name="aten::mm_0")]
    if op == "Transpose":
        nodes.insert(0, helper.make_node("Transpose", ["fc.weight"], ["w_t"], name="aten::t_0", perm=[1, 0]))
        inits = [em.init("fc.weight", w)]
    else:   # fp16-stored weight cast up, as fp16 exports keep them
        nodes.insert(0, helper.make_node("Cast", ["fc.weight"], ["w_t"], name="Cast_0", to=T.FLOAT))
        inits = [em.init("fc.weight", w.T.astype(np.float16))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 6])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = [{"x": rng.normal(0, 1, (2, 8)).astype(np.float32)} for _ in range(8)]
    return m, feeds


@pytest.mark.parametrize("op", ["Transpose", "Cast"])
def test_weight_behind_a_layout_op_is_quantized_per_channel(op):
    """Before: MatMul(x, Transpose(fc.weight)) (dynamo's aten::t; a Cast of an fp16 weight) kept a float weight and
    no report line said so. After: fold-weight-layout makes it an initializer; it gets a per-channel grid."""
    m, feeds = _transposed_weight_model(op)
    res = quantize(m, feeds, progress=False)
    q = check(m, res, feeds)
    dq = weight_dqs(q)[0]
    assert next(a.i for a in dq.attribute if a.name == "axis") == 1
    assert not any(n.op_type in ("Transpose", "Cast") for n in q.graph.node)


def test_fold_weight_layout_leaves_a_shared_weight_unchanged():
    from qcompiler.passes.fold_weight_layout import FoldWeightLayout
    from qcompiler.onnx_io import model_from_proto
    m, _ = _transposed_weight_model()
    m.graph.node.append(helper.make_node("Identity", ["fc.weight"], ["w_raw"], name="keep"))
    m.graph.output.append(helper.make_tensor_value_info("w_raw", T.FLOAT, [6, 8]))
    model = model_from_proto(m)
    before = model.graph.initializers["fc.weight"].const_value().copy()
    assert FoldWeightLayout().run(model).modified
    assert np.array_equal(model.graph.initializers["fc.weight"].const_value(), before)
    (mm,) = model.graph.nodes_by_op("MatMul")
    assert np.array_equal(mm.inputs[1].const_value(), before.T)


# --- initializers listed as graph inputs ---------------------------------------------------------------------
def _with_initializers_as_inputs(m, ir=None):
    listed = {i.name for i in m.graph.input}
    for t in m.graph.initializer:
        if t.name not in listed:
            m.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    if ir is not None:
        m.ir_version = ir
    return m


@pytest.mark.parametrize("ir", [3, 7])
def test_initializers_listed_as_inputs_are_quantized(ir):
    """Before: every weight of an IR 3 model (or torch's keep_initializers_as_inputs=True) stayed float, silently,
    and the IR 3 output failed onnx.checker ('x_scale in initializer but not in graph input'). After: they are
    taken as constants (a note says so), quantized, and the output is a valid IR >= 4 model."""
    m, feeds = em.paddle(opset=11)
    m = _with_initializers_as_inputs(m, ir)
    res = quantize(m, feeds, progress=False)
    q = check(m, res, feeds, min_weight_dqs=2)
    assert [i.name for i in q.graph.input] == ["x"] and q.ir_version >= 4
    assert any("initializer(s) listed as graph inputs" in n for n in res.report["notes"])


# --- calibration data spellings ------------------------------------------------------------------------------
@pytest.mark.parametrize("family, rename, note", [
    ("tf2onnx", lambda k: k[:-2], "key 'input_1' read as input 'input_1:0'"),
    ("optimum", lambda k: k.replace(".", "_"), "key 'past_key_values_0_key' read as input 'past_key_values.0.key'"),
    ("tf2onnx", lambda k: k.replace(":", "_"), "key 'input_1_0' read as input 'input_1:0'"),
])
def test_npz_keys_spelled_like_their_inputs(tmp_path, family, rename, note):
    """Before: exit 2 'missing input 'input_1:0'' for an .npz keyed without tf2onnx's :0 (or with '_' for '.').
    After: a unique match up to ':0' and punctuation is read, with a note."""
    m, feeds = em.FAMILIES[family]()
    path = save_npz(tmp_path / "c.npz", feeds, rename)
    s = load_samples(str(path), {i.name: (None, None) for i in m.graph.input})
    got = list(s)
    assert len(got) == len(feeds) and set(got[0]) == {i.name for i in m.graph.input}
    assert any(note in n for n in s.notes), s.notes


def test_unnamed_array_for_a_single_input_model_and_wrong_names_still_refused(tmp_path):
    """np.savez(path, X) stores 'arr_0': read for a single-input model; a different name stays one exit-2 line."""
    m, feeds = em.tf2onnx()
    onnx.save(m, tmp_path / "m.onnx")
    x = np.stack([f["input_1:0"] for f in feeds])
    np.savez(tmp_path / "pos.npz", x)
    np.savez(tmp_path / "other.npz", image=x)
    spec = {"input_1:0": (np.dtype(np.float32), (None, 8, 8, 3))}
    s = load_samples(str(tmp_path / "pos.npz"), spec)
    assert len(list(s)) == len(feeds) and any("key 'arr_0' read as input 'input_1:0'" in n for n in s.notes)
    r = cli("quantize", tmp_path / "m.onnx", "--calib", tmp_path / "other.npz", "-o", tmp_path / "q2.onnx", "-q")
    assert r.returncode == 2 and "missing input 'input_1:0'" in r.stderr and len(r.stderr.splitlines()) == 1


def test_two_inputs_spelled_alike_are_not_guessed(tmp_path):
    spec = {"a.b": (np.dtype(np.float32), (1, 2)), "a_b": (np.dtype(np.float32), (1, 2))}
    np.savez(tmp_path / "c.npz", **{"a:b": np.zeros((3, 1, 2), np.float32), "a_b": np.zeros((3, 1, 2), np.float32)})
    from qcompiler.errors import DataError
    with pytest.raises(DataError, match="missing input 'a.b'"):
        load_samples(str(tmp_path / "c.npz"), spec)


def test_folder_of_one_npy_per_input(tmp_path):
    """Before: exit 2 'an .npy file holds one array, but the model has 4 inputs' for input_ids.npy,
    attention_mask.npy, ... After: the folder is read like an .npz with those keys (past_key_values_0_key.npy
    too)."""
    m, feeds = em.optimum()
    onnx.save(m, tmp_path / "m.onnx")
    d = tmp_path / "calib"
    d.mkdir()
    for k in feeds[0]:
        np.save(d / f"{k.replace('.', '_')}.npy", np.stack([f[k] for f in feeds]))
    res = quantize(str(tmp_path / "m.onnx"), str(d), progress=False)
    assert res.report["calibration_samples"] == len(feeds)
    check(m, res, feeds)


# --- outputs that are graph inputs --------------------------------------------------------------------------------
def test_graph_input_passed_through_to_an_output_keeps_its_name_and_value():
    """Before: an input that is also a graph output (optimum passes encoder_hidden_states through; a tf2onnx
    Identity output once canonicalize drops the Identity) came out renamed 'input_quantizelinear' and quantized
    (42 dB instead of exact); an input only passed through got a dangling Q/DQ. After: the output is the input,
    by name and bit for bit, and the rest of the model is quantized as before."""
    m, feeds = em.torchscript()
    m.graph.output.append(helper.make_tensor_value_info("input", T.FLOAT, ["batch_size", 3, 8, 8]))
    m.graph.input.append(helper.make_tensor_value_info("extra", T.FLOAT, [1, 4]))
    m.graph.output.append(helper.make_tensor_value_info("extra", T.FLOAT, [1, 4]))
    feeds = [dict(f, extra=np.full((1, 4), i, np.float32)) for i, f in enumerate(feeds)]
    res = quantize(m, feeds, progress=False)
    q = model_to_proto(res.model)
    assert [o.name for o in q.graph.output] == ["output", "input", "extra"]
    got = run(q, feeds[0])
    assert np.array_equal(got[1], feeds[0]["input"]) and np.array_equal(got[2], feeds[0]["extra"])
    assert not any("extra" in n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear")
    assert sqnr_db(run(m, feeds[0])[0], got[0]) >= FLOOR_DB


# --- half-precision exports and double islands -------------------------------------------------------------------
def _to_float16(m, feeds):
    from onnx import numpy_helper
    for t in m.graph.initializer:
        if t.data_type == T.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if vi.type.tensor_type.elem_type == T.FLOAT:
            vi.type.tensor_type.elem_type = T.FLOAT16
    return m, [{k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in f.items()} for f in feeds]


@pytest.mark.parametrize("family", ["torchscript", "bert"])
def test_float16_model_is_quantized_with_a_float16_interface(family):
    """Before: exit 1, 'onnxruntime refuses the quantized model: Type parameter (T1) of QuantizeLinear bound to
    different types (tensor(float16) and tensor(float))' (a ProducedModelError after all the work). After:
    float32 inside (upcast-float16, a note says so), float16 inputs and outputs as before, weights quantized."""
    m, feeds = em.FAMILIES[family]()
    if family == "bert":   # finfo(float32).min overflows float16: half exports use float16's own min
        for t in m.graph.initializer:
            if t.name == "fmin":
                t.CopyFrom(em.init("fmin", np.array(np.finfo(np.float16).min, np.float32)))
    m, feeds = _to_float16(m, feeds)
    res = quantize(m, feeds, progress=False, optimize="accuracy")
    q = check(m, res, feeds, min_weight_dqs=2)
    assert [(i.name, i.type.tensor_type.elem_type) for i in q.graph.input] == \
        [(i.name, i.type.tensor_type.elem_type) for i in m.graph.input]
    assert all(o.type.tensor_type.elem_type == T.FLOAT16 for o in q.graph.output)
    assert run(q, feeds[0])[0].dtype == np.float16
    assert any(n.startswith("float16 model") for n in res.report["notes"])


def test_a_double_island_stays_float():
    """A float64 value (a Cast to double around a reduction, as some exporters write for numerics) is left float:
    QuantizeLinear takes no double input (before: a quantizer on it, so exit 1: 'onnxruntime refuses the
    quantized model ... a bug in qcompiler')."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Cast", ["h"], ["h64"], to=T.DOUBLE, name="to64"),
             helper.make_node("Mul", ["h64", "h64"], ["sq64"], name="sq"),
             helper.make_node("Cast", ["sq64"], ["sq"], to=T.FLOAT, name="to32"),
             helper.make_node("Add", ["sq", "h"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 4])],
                          [em.init("w", rng.normal(0, 0.3, (8, 4)).astype(np.float32))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = [{"x": rng.normal(0, 1, (1, 8)).astype(np.float32)} for _ in range(8)]
    res = quantize(m, feeds, progress=False)
    q = check(m, res, feeds)
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in ("h64", "sq64") for n in q.graph.node)


# --- opsets and external data ------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, opset", [("tf2onnx", 11), ("paddle", 11), ("tf2onnx", 17), ("torchscript", 17),
                                           ("paddle", 21), ("yolo", 21), ("dynamo", 21), ("zoo", 7), ("zoo", 9)])
def test_family_at_other_opsets(family, opset):
    m, feeds = em.FAMILIES[family](opset=opset)
    onnx.checker.check_model(m)
    check(m, quantize(m, feeds, progress=False, optimize="accuracy"), feeds, min_weight_dqs=2)


def test_external_data_in_the_model_folder(tmp_path):
    """A model saved with its weights beside it (torch > 2 GB habit, optimum's model.onnx_data): quantized from
    its folder, written elsewhere; the float files are untouched."""
    import hashlib
    m, feeds = em.yolo()
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(m, src / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx_data", size_threshold=64)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()}
    res = quantize(str(src / "model.onnx"), feeds, progress=False)
    res.save(str(tmp_path / "q.onnx"))
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()} == before
    q = onnx.load(tmp_path / "q.onnx")
    ref = onnx.load(src / "model.onnx")
    for feed in feeds[:2]:
        for r, g in zip(run(ref, feed), run(q, feed)):
            assert sqnr_db(r, g) >= FLOOR_DB


# --- a model onnxruntime's default session options fail on ---------------------------------------------------------
def test_default_session_refusal_is_a_warning_not_silent(monkeypatch):
    """Before: when onnxruntime's default graph fusions failed on the quantized model, the SQNR pass quietly
    measured it at ORT_ENABLE_BASIC and quantize exited 0: the user's first InferenceSession failed (seen with
    ORT 1.32 on optimum's decoder for --target qnn_htp: QDQPropagation + QDQS8ToU8 write a QuantizeLinear
    '/kT_q' whose output_dtype INT8 does not match its uint8 zero point). After: report['warnings'] says so
    (a `qcompiler: warning:` line on the CLI)."""
    import qcompiler.quant.calibration.calibrate as cal
    from qcompiler.errors import OnnxRuntimeError
    real = cal.make_session

    def failing_default(model, *a, **kw):
        if kw.get("role") == "quantized" and kw.get("opt_level") is None:
            raise OnnxRuntimeError("onnxruntime refuses the quantized model: Node (/kT_q) Op (QuantizeLinear) "
                                   "output_dtype INT8 does not match y_zero_point type UINT8")
        return real(model, *a, **kw)

    import qcompiler.quant.interop.report as report_module   # the report pass makes its sessions there
    monkeypatch.setattr(report_module, "make_session", failing_default)
    m, feeds = em.torchscript()
    res = quantize(m, feeds[:4], progress=False)
    (w,) = [w for w in res.report["warnings"] if w["kind"] == "onnxruntime"]
    assert "output_dtype INT8" in w["problem"] and "ORT_ENABLE_BASIC" in w["problem"]
    assert res.report["output_sqnr_db"]["output"] > FLOOR_DB


def test_folder_of_per_sample_files_without_the_batch_dim(tmp_path):
    """Before: exit 2 'rank 3 array (8, 8, 3), expected rank 5 ... or rank 4' for a folder holding one
    np.save(chw) per image (the usual preprocessing dump). After: a rank r-1 array is one sample (a batch dim of
    1 added, one note); a static batch of 2 still refuses it with one line."""
    m, feeds = em.tf2onnx()
    d = tmp_path / "imgs"
    d.mkdir()
    for i, f in enumerate(feeds):
        np.save(d / f"img_{i:03d}.npy", f["input_1:0"][0])
    spec = {"input_1:0": (np.dtype(np.float32), ("unk__21", 8, 8, 3))}
    s = load_samples(str(d), spec)
    got = list(s)
    assert len(got) == len(feeds) and np.array_equal(got[3]["input_1:0"], feeds[3]["input_1:0"])
    assert s.notes == ["input 'input_1:0': a rank-3 array is one sample (batch dim of 1 added)"]
    from qcompiler.errors import DataError
    with pytest.raises(DataError, match="rank 3 array"):
        load_samples(str(d), {"input_1:0": (np.dtype(np.float32), (2, 8, 8, 3))})
