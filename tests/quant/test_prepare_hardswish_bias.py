"""The HardSwish rules in the quantization pipeline: fuse-hardswish runs right after convert-opset,
so a Paddle-style Conv → Add(+3) → Clip → Mul → Div(6) model leaves quantize() with HardSwish ops when the output
opset has them, and stays decomposed at opset 13; fold-conv-bias-add joins through `--recipe`."""
import numpy as np
import pytest

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.core.pipeline import DEFAULT_PIPELINE, build_pipeline
from tests.helpers import run, sqnr_db
from tests.patterns.builders import Builder

RNG = np.random.default_rng(5)
SHAPE = (1, 4, 6, 6)


def _paddle_model(opset=11):
    b = Builder(shape=SHAPE, opset=opset)
    y = "x"
    for i in range(2):
        w = b.const((RNG.normal(size=(4, 4, 3, 3)) * 0.3).astype(np.float32), f"w{i}")
        y = b.op("Conv", y, w, pads=[1, 1, 1, 1], name=f"conv{i}")
        bias = b.op("Reshape", b.const(RNG.normal(size=4).astype(np.float32) * 0.2, as_node=True),
                    b.const(np.array([1, 4, 1, 1], np.int64), as_node=True))
        y = b.op("Add", y, bias, name=f"bias{i}")
        c = b.op("Clip", b.op("Add", y, b.const(3.0, as_node=True)), b.const(0.0), b.const(6.0))
        y = b.op("Div", b.op("Mul", y, c), b.const(6.0, as_node=True))
    b.output(y)
    return b.proto()


def _calib(n=16):
    return [{"x": RNG.normal(size=SHAPE).astype(np.float32) * 2} for _ in range(n)]


def test_fuse_hardswish_follows_convert_opset_and_recipe_adds_bias_fold():
    names = list(DEFAULT_PIPELINE)
    assert names.index("fuse-hardswish") == names.index("convert-opset") + 1
    r = build_pipeline("fold-conv-bias-add")
    assert r.index("fold-conv-bias-add") == r.index("convert-opset") + 1 < r.index("fuse-hardswish")


@pytest.mark.parametrize("recipe", [None, "fold-conv-bias-add"])
def test_quantized_model_has_hardswish_ops_at_opset21(recipe):
    proto = _paddle_model()
    res = quantize(proto, _calib(), opset=21, recipe=recipe, progress=False)
    q = model_to_proto(res.model)
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("HardSwish") == 2 and "Clip" not in ops and "Div" not in ops
    assert ops.count("Add") == (0 if recipe else 2)
    x = RNG.normal(size=SHAPE).astype(np.float32) * 2
    assert sqnr_db(run(proto, {"x": x})[0], run(q, {"x": x})[0]) > 20


def test_opset13_keeps_the_decomposition():
    res = quantize(_paddle_model(), _calib(), opset=13, progress=False)
    ops = [n.op_type for n in model_to_proto(res.model).graph.node]
    assert "HardSwish" not in ops and ops.count("Clip") == 2
