"""Import refuses what every later pass would trip over, with one line: an empty name in a slot the op's schema
requires, and a value type whose element type ONNX does not define. Optional inputs left out still import."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from qcompiler.errors import InvalidModelError
from qcompiler.onnx_io import load_model, save_model


def _bn(x_name: str = "x", scale: str = "s"):
    inits = [h.make_tensor(n, T.FLOAT, [2], [1.0, 2.0]) for n in ("s", "b", "mu", "var")]
    g = h.make_graph([h.make_node("BatchNormalization", [x_name, scale, "b", "mu", "var"], ["y"], name="bn")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 3])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 15)])
    m.ir_version = 8
    return m


def _save(tmp_path, m):
    p = str(tmp_path / "m.onnx")
    onnx.save(m, p)
    return p


@pytest.mark.parametrize("x_name,scale,slot", [("", "s", 0), ("x", "", 1)])
def test_empty_required_input_is_one_line(tmp_path, x_name, scale, slot):
    with pytest.raises(InvalidModelError) as ei:
        load_model(_save(tmp_path, _bn(x_name, scale)))
    msg = str(ei.value)
    assert "\n" not in msg and "'bn'" in msg and f"input {slot} is empty" in msg and "requires" in msg


def test_optional_inputs_left_out_still_import_and_run(tmp_path):
    # Clip's min and max are optional: Clip(x, '', max) is valid ONNX
    g = h.make_graph([h.make_node("Clip", ["x", "", "hi"], ["y"], name="clip")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [4])], [h.make_tensor_value_info("y", T.FLOAT, [4])],
                     [h.make_tensor("hi", T.FLOAT, [], [1.0])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    model = load_model(_save(tmp_path, m))
    out = str(tmp_path / "o.onnx")
    save_model(model, out)
    x = np.array([-2, 0.5, 2, 3], np.float32)
    y = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, np.minimum(x, 1.0))


@pytest.mark.parametrize("where", ["input", "output", "value_info"])
def test_undefined_element_type_is_one_line(tmp_path, where):
    m = _bn()
    if where == "input":
        m.graph.input[0].type.tensor_type.elem_type = 99
    elif where == "output":
        m.graph.output[0].type.tensor_type.elem_type = 99
    else:
        m.graph.value_info.append(h.make_tensor_value_info("x", T.FLOAT, [1, 2, 3]))
        m.graph.value_info[0].type.tensor_type.elem_type = 99
    with pytest.raises(InvalidModelError) as ei:
        load_model(_save(tmp_path, m))
    msg = str(ei.value)
    assert "\n" not in msg and "element type 99" in msg and where in msg


@pytest.mark.parametrize("attr", [h.make_attribute("epsilon", [1, 2]), h.make_attribute("epsilon", "x"),
                                  h.make_attribute("momentum", 3)])
def test_attribute_of_a_type_the_op_does_not_define_is_one_line(tmp_path, attr):
    m = _bn()
    m.graph.node[0].attribute.append(attr)
    with pytest.raises(InvalidModelError) as ei:
        load_model(_save(tmp_path, m))
    msg = str(ei.value)
    assert "\n" not in msg and f"'{attr.name}'" in msg and "'bn'" in msg and "defines it as FLOAT" in msg


def test_attributes_of_the_declared_types_and_custom_ops_import(tmp_path):
    m = _bn()
    m.graph.node[0].attribute.append(h.make_attribute("epsilon", 1e-3))
    m.graph.node.append(h.make_node("Mystery", ["y"], ["z"], name="odd", domain="com.example", epsilon=[1, 2]))
    m.graph.output[0].name = "z"
    m.opset_import.append(h.make_opsetid("com.example", 1))
    model = load_model(_save(tmp_path, m))
    bn = next(n for n in model.graph if n.name == "bn")
    assert bn.attr("epsilon") == pytest.approx(1e-3)


@pytest.mark.parametrize("first_domain,first_op", [("com.example", "BatchNormalization"), ("com.example", "Mystery"),
                                                   ("", "Identity")])
def test_attributes_that_passed_on_another_op_are_checked_again(tmp_path, first_domain, first_op):
    """The importer skips the checks of an attribute list it has already passed on the same op; the same bytes on
    a different op (or the same op type in another domain) are checked again, and refused where the op's schema
    says so."""
    m = _bn()
    eps = h.make_attribute("epsilon", [1, 2])   # INTS: fine on a custom op (no schema), refused on BatchNormalization
    first = h.make_node(first_op, ["x"], ["x1"], name="first", domain=first_domain)
    first.attribute.append(eps)   # Identity: an op whose schema has no 'epsilon' at all, so it passes there
    m.graph.node.insert(0, first)
    m.graph.node[1].attribute.append(eps)
    if first_domain:
        m.opset_import.append(h.make_opsetid(first_domain, 1))
    with pytest.raises(InvalidModelError) as ei:
        load_model(_save(tmp_path, m))
    msg = str(ei.value)
    assert "\n" not in msg and "'epsilon'" in msg and "'bn'" in msg and "defines it as FLOAT" in msg


def test_repeated_attribute_lists_import_with_their_values(tmp_path):
    """Nodes sharing an attribute list (checked once) and nodes with lists that differ each keep their own values,
    and the model runs as onnxruntime runs the file."""
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4])
    nodes, prev = [], "x"
    for i, perm in enumerate([[0, 2, 1], [0, 2, 1], [1, 0, 2], [0, 2, 1], [1, 0, 2], [1, 0, 2]]):
        nodes.append(h.make_node("Transpose", [prev], [f"t{i}"], name=f"t{i}", perm=perm))
        prev = f"t{i}"
    nodes.append(h.make_node("Softmax", [prev], ["y"], name="sm", axis=1))
    g = h.make_graph(nodes, "g", [x], [h.make_tensor_value_info("y", T.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    src = _save(tmp_path, m)
    model = load_model(src)
    assert [n.attr("perm") for n in model.graph.nodes if n.op_type == "Transpose"] == \
        [[0, 2, 1], [0, 2, 1], [1, 0, 2], [0, 2, 1], [1, 0, 2], [1, 0, 2]]
    out = str(tmp_path / "o.onnx")
    save_model(model, out)
    xv = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
