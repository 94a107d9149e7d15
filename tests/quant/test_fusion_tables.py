"""the fusion-table shape holds TensorRT's and QNN HTP's rules as data files, loaded by the same
loader as ort_cpu's; placement on trt and qnn_htp does not change."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.targets.fusions import FUSIONS_DIR, FusionTable, builtin_tables, load_fusions
from qcompiler.quant.targets.profiles import get_profile
from tests.helpers import make_model, tinfo


def test_trt_and_qnn_htp_tables_load_through_the_one_loader():
    assert {"ort_cpu", "trt", "qnn_htp"} <= set(builtin_tables())
    trt, qnn = load_fusions("trt"), load_fusions("qnn_htp")
    assert isinstance(trt, FusionTable) and isinstance(qnn, FusionTable)
    assert trt.runtime == "tensorrt" and qnn.runtime == "qnn"
    # TensorRT: weighted ops fuse with their DQs and the pointwise ops / residual Add before the Q
    (w,) = trt.for_op("Conv")
    assert w.action == "replace" and {"Relu", "Add", "BatchNormalization"} <= set(w.absorbs)
    assert w.act_dtypes == ("int8",) and trt.for_op("MaxPool")[0].kernel_for("MaxPool") == "int8 MaxPool"
    assert trt.for_op("Transpose")[0].action == "drop_qdq"
    # QNN HTP: AIMET's v75 supergroups, 16-bit activations, data movement passes its input's grid through
    (c,) = qnn.for_op("Conv")
    assert {"BatchNormalization", "Relu", "HardSwish", "PRelu", "Clip"} <= set(c.absorbs) and c.allows_16bit
    assert qnn.for_op("Gather")[0].output_q == "none"
    assert qnn.for_op("Gemm")[0].absorbs == ("Relu",)
    # the same file loads by path, as a user's own backend would
    import os
    assert load_fusions(os.path.join(FUSIONS_DIR, "trt.yaml")).fusions == trt.fusions


def _model():
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal((4, 8)) * 0.2).astype(np.float32), "wf")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"], name="hs1"),
             helper.make_node("Softplus", ["h1"], ["s1"], name="sp"),
             helper.make_node("Conv", ["s1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1)]
    return make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 4])], inits, opset=17)


@pytest.mark.parametrize("target", ["trt", "qnn_htp"])
def test_placement_on_trt_and_qnn_htp_does_not_change(target):
    assert get_profile(target).fusions is None      # the table is data for the report, not for placement
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)]
    got = {opt: model_to_proto(quantize(_model(), calib, target=target, optimize=opt).model).SerializeToString()
           for opt in ("accuracy", "balanced", "latency")}
    assert got["accuracy"] == got["balanced"] == got["latency"]
