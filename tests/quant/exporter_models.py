"""Small models in the idiom of each exporter users bring (built with onnx.helper, no exporter needed), with
calibration feeds. Each builder returns `(proto, feeds)`: `feeds` a list of `{input name: array}` dicts.

    dynamo        torch.onnx dynamo: model-local functions (a module per function), opset 18 ReduceMean with
                  axes as an input, value_info on every value, names with '::' and '.'
    torchscript   torch.onnx (TorchScript): Constant nodes, Shape -> Gather -> Unsqueeze(axes input) -> Concat
                  -> Reshape flatten chains, 'onnx::Conv_12' names
    tf2onnx       NHWC input 'input_1:0' with an 'unk__' dim, Transpose around every Conv, Identity chains
    paddle        ppocr-style: Conv, then per-channel scale (Mul) and bias (Add) constants, HardSwish decomposed,
                  'p2o.DynamicDimension' dims
    optimum       a BERT-ish block: int64 input_ids/attention_mask, an additive finfo.min mask, Where on a bool
                  mask, past_key_values inputs with dynamic dims, present outputs
    yolo          detector: two Conv heads, Resize (scales input), Split with a split input, Concat, 3 outputs
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

F32_MIN = float(np.finfo(np.float32).min)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _w(rng, *shape, s=0.3):
    return rng.normal(0, s, shape).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset, functions=(), value_info=(), ir=None, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] + list(extra_opsets),
                          functions=list(functions))
    m.ir_version = ir if ir is not None else min(m.ir_version, 10)
    return m


# --- torch.onnx dynamo ----------------------------------------------------------------------------------------
def dynamo(n=8, seed=0, opset=18):
    """Linear -> LayerNorm-ish (ReduceMean axes input) -> GELU, each module a local function, like
    torch.onnx.dynamo_export (torch 2.1-2.4) writes them; weights are graph initializers passed to the function."""
    rng = np.random.default_rng(seed)
    dom = "pkg.torch.2.3"
    lin = helper.make_function(
        dom, "torch_nn_modules_linear_Linear_fc1_1", ["l_x_", "fc1.weight", "fc1.bias"], ["addmm"],
        [helper.make_node("Transpose", ["fc1.weight"], ["t"], name="aten::t_0", perm=[1, 0]),
         helper.make_node("MatMul", ["l_x_", "t"], ["mm"], name="aten::mm_1"),
         helper.make_node("Add", ["mm", "fc1.bias"], ["addmm"], name="aten::add_2")],
        opset_imports=[helper.make_opsetid("", opset)])
    norm = helper.make_function(
        dom, "torch_nn_modules_normalization_LayerNorm_ln_1", ["x"], ["y"],
        [helper.make_node("Constant", [], ["axes"], value=init("axes", np.array([-1], np.int64))),
         helper.make_node("ReduceMean", ["x", "axes"], ["mu"], keepdims=1),
         helper.make_node("Sub", ["x", "mu"], ["d"]),
         helper.make_node("Mul", ["d", "d"], ["d2"]),
         helper.make_node("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
         helper.make_node("Constant", [], ["eps"], value=init("eps", np.array(1e-5, np.float32))),
         helper.make_node("Add", ["var", "eps"], ["ve"]),
         helper.make_node("Sqrt", ["ve"], ["sd"]),
         helper.make_node("Div", ["d", "sd"], ["y"])],
        opset_imports=[helper.make_opsetid("", opset)])
    nodes = [
        helper.make_node("torch_nn_modules_linear_Linear_fc1_1", ["l_x_", "fc1.weight", "fc1.bias"],
                         ["fc1_1"], name="torch_nn_modules_linear_Linear_fc1_1_0", domain=dom),
        helper.make_node("torch_nn_modules_normalization_LayerNorm_ln_1", ["fc1_1"], ["ln_1"],
                         name="torch_nn_modules_normalization_LayerNorm_ln_1_1", domain=dom),
        helper.make_node("Relu", ["ln_1"], ["relu"], name="aten::relu_2"),
        helper.make_node("MatMul", ["relu", "fc2.weight_T"], ["mm2"], name="aten::mm_3"),
        helper.make_node("Constant", [], ["_val_5"], name="Constant_4",
                         value=init("_val_5", np.array([1], np.int64))),
        helper.make_node("ReduceSum", ["mm2", "_val_5"], ["sum_1"], name="aten::sum_5", keepdims=1),
        helper.make_node("Add", ["mm2", "sum_1"], ["add_7"], name="aten::add_6"),
    ]
    inits = [init("fc1.weight", _w(rng, 16, n)), init("fc1.bias", _w(rng, 16, s=0.1)),
             init("fc2.weight_T", _w(rng, 16, 4))]
    vi = [helper.make_tensor_value_info(v, T.FLOAT, ["s0", 16]) for v in ("fc1_1", "ln_1", "relu")]
    vi += [helper.make_tensor_value_info("mm2", T.FLOAT, ["s0", 4]),
           helper.make_tensor_value_info("sum_1", T.FLOAT, ["s0", 1])]
    m = _model(nodes, [helper.make_tensor_value_info("l_x_", T.FLOAT, ["s0", n])],
               [helper.make_tensor_value_info("add_7", T.FLOAT, ["s0", 4])], inits, opset,
               functions=[lin, norm], value_info=vi, extra_opsets=[helper.make_opsetid(dom, 1)])
    feeds = [{"l_x_": rng.normal(0, 1, (4, n)).astype(np.float32)} for _ in range(16)]
    return m, feeds


# --- torch.onnx TorchScript -----------------------------------------------------------------------------------
def torchscript(seed=0, opset=13):
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["input", "onnx::Conv_20", "onnx::Conv_21"], ["/conv1/Conv_output_0"],
                         name="/conv1/Conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["/conv1/Conv_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"),
        helper.make_node("Shape", ["/relu/Relu_output_0"], ["/Shape_output_0"], name="/Shape"),
        helper.make_node("Constant", [], ["/Constant_output_0"], name="/Constant",
                         value=init("c0", np.array(0, np.int64))),
        helper.make_node("Gather", ["/Shape_output_0", "/Constant_output_0"], ["/Gather_output_0"],
                         name="/Gather", axis=0),
        helper.make_node("Constant", [], ["onnx::Unsqueeze_30"], name="Constant_30",
                         value=init("c1", np.array([0], np.int64))),
        helper.make_node("Unsqueeze", ["/Gather_output_0", "onnx::Unsqueeze_30"], ["/Unsqueeze_output_0"],
                         name="/Unsqueeze"),
        helper.make_node("Constant", [], ["/Constant_1_output_0"], name="/Constant_1",
                         value=init("c2", np.array([-1], np.int64))),
        helper.make_node("Concat", ["/Unsqueeze_output_0", "/Constant_1_output_0"], ["/Concat_output_0"],
                         name="/Concat", axis=0),
        helper.make_node("Reshape", ["/relu/Relu_output_0", "/Concat_output_0"], ["/Reshape_output_0"],
                         name="/Reshape"),
        helper.make_node("Gemm", ["/Reshape_output_0", "fc.weight", "fc.bias"], ["output"], name="/fc/Gemm",
                         transB=1),
    ]
    inits = [init("onnx::Conv_20", _w(rng, 4, 3, 3, 3)), init("onnx::Conv_21", _w(rng, 4, s=0.1)),
             init("fc.weight", _w(rng, 5, 4 * 8 * 8, s=0.05)), init("fc.bias", _w(rng, 5, s=0.1))]
    m = _model(nodes, [helper.make_tensor_value_info("input", T.FLOAT, ["batch_size", 3, 8, 8])],
               [helper.make_tensor_value_info("output", T.FLOAT, ["batch_size", 5])], inits, opset)
    feeds = [{"input": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(16)]
    return m, feeds


# --- tf2onnx --------------------------------------------------------------------------------------------------
def tf2onnx(seed=0, opset=13):
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Identity", ["input_1:0"], ["model/input_id:0"], name="model/input_id"),
        helper.make_node("Transpose", ["model/input_id:0"], ["model/conv2d/Conv2D__6:0"],
                         name="model/conv2d/Conv2D__6", perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["model/conv2d/Conv2D__6:0", "model/conv2d/Conv2D/ReadVariableOp:0",
                                  "model/conv2d/BiasAdd/ReadVariableOp:0"], ["model/conv2d/BiasAdd:0"],
                         name="model/conv2d/BiasAdd", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["model/conv2d/BiasAdd:0"], ["model/conv2d/Relu:0"], name="model/conv2d/Relu"),
        helper.make_node("Transpose", ["model/conv2d/Relu:0"], ["model/conv2d/Relu__8:0"],
                         name="model/conv2d/Relu__8", perm=[0, 2, 3, 1]),
        helper.make_node("Identity", ["model/conv2d/Relu__8:0"], ["model/id1:0"], name="model/id1"),
        helper.make_node("Identity", ["model/id1:0"], ["model/id2:0"], name="model/id2"),
        helper.make_node("Transpose", ["model/id2:0"], ["model/conv2d_1/Conv2D__10:0"],
                         name="model/conv2d_1/Conv2D__10", perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["model/conv2d_1/Conv2D__10:0", "model/conv2d_1/Conv2D/ReadVariableOp:0"],
                         ["model/conv2d_1/Conv2D:0"], name="model/conv2d_1/Conv2D", kernel_shape=[1, 1]),
        helper.make_node("Transpose", ["model/conv2d_1/Conv2D:0"], ["model/conv2d_1/Conv2D__12:0"],
                         name="model/conv2d_1/Conv2D__12", perm=[0, 2, 3, 1]),
        helper.make_node("ReduceMean", ["model/conv2d_1/Conv2D__12:0"], ["model/gap/Mean:0"],
                         name="model/gap/Mean", axes=[1, 2], keepdims=0),
        helper.make_node("Identity", ["model/gap/Mean:0"], ["Identity:0"], name="Identity"),
    ]
    inits = [init("model/conv2d/Conv2D/ReadVariableOp:0", _w(rng, 8, 3, 3, 3)),
             init("model/conv2d/BiasAdd/ReadVariableOp:0", _w(rng, 8, s=0.1)),
             init("model/conv2d_1/Conv2D/ReadVariableOp:0", _w(rng, 6, 8, 1, 1))]
    m = _model(nodes, [helper.make_tensor_value_info("input_1:0", T.FLOAT, ["unk__21", 8, 8, 3])],
               [helper.make_tensor_value_info("Identity:0", T.FLOAT, ["unk__22", 6])], inits, opset)
    feeds = [{"input_1:0": rng.normal(0, 1, (1, 8, 8, 3)).astype(np.float32)} for _ in range(16)]
    return m, feeds


# --- paddle2onnx ----------------------------------------------------------------------------------------------
def paddle(seed=0, opset=11):
    rng = np.random.default_rng(seed)
    c = 8
    nodes = [
        helper.make_node("Conv", ["x", "conv2d_0.w_0"], ["conv2d_1.tmp_0"], name="p2o.Conv.0", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("Mul", ["conv2d_1.tmp_0", "p2o.helper.constant.0"], ["batch_norm_0.tmp_s"], name="p2o.Mul.0"),
        helper.make_node("Add", ["batch_norm_0.tmp_s", "p2o.helper.constant.1"], ["batch_norm_0.tmp_2"],
                         name="p2o.Add.0"),
        # hardswish as paddle2onnx writes it at opset < 14: x * Clip(x + 3, 0, 6) / 6
        helper.make_node("Add", ["batch_norm_0.tmp_2", "p2o.helper.constant.2"], ["hs.a"], name="p2o.Add.1"),
        helper.make_node("Clip", ["hs.a", "p2o.helper.constant.3", "p2o.helper.constant.4"], ["hs.c"],
                         name="p2o.Clip.0"),
        helper.make_node("Mul", ["batch_norm_0.tmp_2", "hs.c"], ["hs.m"], name="p2o.Mul.1"),
        helper.make_node("Div", ["hs.m", "p2o.helper.constant.5"], ["hardswish_0.tmp_0"], name="p2o.Div.0"),
        helper.make_node("GlobalAveragePool", ["hardswish_0.tmp_0"], ["pool2d_0.tmp_0"], name="p2o.GAP.0"),
        helper.make_node("Flatten", ["pool2d_0.tmp_0"], ["flatten_0.tmp_0"], name="p2o.Flatten.0", axis=1),
        helper.make_node("MatMul", ["flatten_0.tmp_0", "linear_0.w_0"], ["linear_0.tmp_0"], name="p2o.MatMul.0"),
        helper.make_node("Add", ["linear_0.tmp_0", "linear_0.b_0"], ["linear_0.tmp_1"], name="p2o.Add.2"),
        helper.make_node("Softmax", ["linear_0.tmp_1"], ["softmax_0.tmp_0"], name="p2o.Softmax.0", axis=1),
    ]
    inits = [init("conv2d_0.w_0", _w(rng, c, 3, 3, 3)),
             init("p2o.helper.constant.0", rng.uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32)),
             init("p2o.helper.constant.1", _w(rng, 1, c, 1, 1, s=0.1)),
             init("p2o.helper.constant.2", np.array(3, np.float32)),
             init("p2o.helper.constant.3", np.array(0, np.float32)),
             init("p2o.helper.constant.4", np.array(6, np.float32)),
             init("p2o.helper.constant.5", np.array(6, np.float32)),
             init("linear_0.w_0", _w(rng, c, 2)), init("linear_0.b_0", _w(rng, 2, s=0.1))]
    m = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, ["p2o.DynamicDimension.0", 3, 16, 16])],
               [helper.make_tensor_value_info("softmax_0.tmp_0", T.FLOAT, ["p2o.DynamicDimension.1", 2])],
               inits, opset)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(16)]
    return m, feeds


# --- Hugging Face optimum -------------------------------------------------------------------------------------
def optimum(seed=0, opset=14, vocab=50, d=16, heads=2, with_past=True):
    """Embedding Gather on int64 input_ids, additive mask (1 - mask) * finfo.min, one attention head block with
    past_key_values.0.key/value concatenated, Where on a causal bool mask, logits + present outputs."""
    rng = np.random.default_rng(seed)
    hd = d // heads
    nodes = [
        helper.make_node("Gather", ["model.embed_tokens.weight", "input_ids"], ["/embed/Gather_output_0"],
                         name="/model/embed_tokens/Gather"),
        # q, k, v projections
        helper.make_node("MatMul", ["/embed/Gather_output_0", "onnx::MatMul_q"], ["/q/MatMul_output_0"], name="/q/MatMul"),
        helper.make_node("MatMul", ["/embed/Gather_output_0", "onnx::MatMul_k"], ["/k/MatMul_output_0"], name="/k/MatMul"),
        helper.make_node("MatMul", ["/embed/Gather_output_0", "onnx::MatMul_v"], ["/v/MatMul_output_0"], name="/v/MatMul"),
        helper.make_node("Reshape", ["/q/MatMul_output_0", "shape_bshd"], ["/q/Reshape_output_0"], name="/q/Reshape"),
        helper.make_node("Transpose", ["/q/Reshape_output_0"], ["/q/Transpose_output_0"], name="/q/Transpose",
                         perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["/k/MatMul_output_0", "shape_bshd"], ["/k/Reshape_output_0"], name="/k/Reshape"),
        helper.make_node("Transpose", ["/k/Reshape_output_0"], ["/k/Transpose_output_0"], name="/k/Transpose",
                         perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["/v/MatMul_output_0", "shape_bshd"], ["/v/Reshape_output_0"], name="/v/Reshape"),
        helper.make_node("Transpose", ["/v/Reshape_output_0"], ["/v/Transpose_output_0"], name="/v/Transpose",
                         perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["past_key_values.0.key", "/k/Transpose_output_0"], ["present.0.key"],
                         name="/Concat_k", axis=2),
        helper.make_node("Concat", ["past_key_values.0.value", "/v/Transpose_output_0"], ["present.0.value"],
                         name="/Concat_v", axis=2),
        helper.make_node("Transpose", ["present.0.key"], ["/kT"], name="/kT", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["/q/Transpose_output_0", "/kT"], ["/scores"], name="/attn/MatMul"),
        helper.make_node("Mul", ["/scores", "scale"], ["/scores_s"], name="/attn/Mul"),
        # additive padding mask: (1 - mask.float()) * finfo.min, broadcast [b, 1, 1, total]
        helper.make_node("Cast", ["attention_mask"], ["/mask_f"], name="/Cast", to=T.FLOAT),
        helper.make_node("Sub", ["one", "/mask_f"], ["/inv"], name="/Sub"),
        helper.make_node("Mul", ["/inv", "fmin"], ["/add_mask"], name="/Mul_mask"),
        helper.make_node("Unsqueeze", ["/add_mask", "axes12"], ["/add_mask4"], name="/Unsqueeze_mask"),
        helper.make_node("Add", ["/scores_s", "/add_mask4"], ["/scores_m"], name="/attn/Add"),
        # causal mask via Where on a bool tensor (last query row sees everything: all-True row, fine)
        helper.make_node("Where", ["causal", "/scores_m", "fmin"], ["/scores_c"], name="/attn/Where"),
        helper.make_node("Softmax", ["/scores_c"], ["/probs"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["/probs", "present.0.value"], ["/ctx"], name="/attn/MatMul_1"),
        helper.make_node("Transpose", ["/ctx"], ["/ctx_t"], name="/ctx/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["/ctx_t", "shape_bsd"], ["/ctx_r"], name="/ctx/Reshape"),
        helper.make_node("MatMul", ["/ctx_r", "lm_head.weight"], ["logits"], name="/lm_head/MatMul"),
    ]
    S, P = 4, 3   # sequence, past length (the causal mask is built for them: optimum slices a big constant)
    causal = np.tril(np.ones((S, P + S), bool), k=P)
    inits = [init("model.embed_tokens.weight", _w(rng, vocab, d, s=1.0)),
             init("onnx::MatMul_q", _w(rng, d, d)), init("onnx::MatMul_k", _w(rng, d, d)),
             init("onnx::MatMul_v", _w(rng, d, d)), init("lm_head.weight", _w(rng, d, vocab)),
             init("shape_bshd", np.array([0, 0, heads, hd], np.int64)),
             init("shape_bsd", np.array([0, 0, d], np.int64)),
             init("scale", np.array(1 / np.sqrt(hd), np.float32)), init("one", np.array(1.0, np.float32)),
             init("fmin", np.array(F32_MIN, np.float32)), init("axes12", np.array([1, 2], np.int64)),
             init("causal", causal)]
    inputs = [helper.make_tensor_value_info("input_ids", T.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", T.INT64, ["batch_size", "past_sequence_length + 1"]),
              helper.make_tensor_value_info("past_key_values.0.key", T.FLOAT,
                                            ["batch_size", heads, "past_sequence_length", hd]),
              helper.make_tensor_value_info("past_key_values.0.value", T.FLOAT,
                                            ["batch_size", heads, "past_sequence_length", hd])]
    outputs = [helper.make_tensor_value_info("logits", T.FLOAT, ["batch_size", "sequence_length", vocab]),
               helper.make_tensor_value_info("present.0.key", T.FLOAT,
                                             ["batch_size", heads, "past_sequence_length + 1", hd]),
               helper.make_tensor_value_info("present.0.value", T.FLOAT,
                                             ["batch_size", heads, "past_sequence_length + 1", hd])]
    m = _model(nodes, inputs, outputs, inits, opset)
    feeds = []
    for _ in range(16):
        mask = np.ones((1, P + S), np.int64)
        mask[0, : rng.integers(0, 2)] = 0        # left padding on some samples
        feeds.append({"input_ids": rng.integers(0, vocab, (1, S)).astype(np.int64), "attention_mask": mask,
                      "past_key_values.0.key": rng.normal(0, 1, (1, heads, P, hd)).astype(np.float32),
                      "past_key_values.0.value": rng.normal(0, 1, (1, heads, P, hd)).astype(np.float32)})
    return m, feeds


# --- YOLO-style detector ----------------------------------------------------------------------------------------
def yolo(seed=0, opset=13):
    rng = np.random.default_rng(seed)
    na = 3 * (5 + 2)   # anchors * (xywh, obj, 2 classes)
    nodes = [
        helper.make_node("Conv", ["images", "model.0.conv.weight", "model.0.conv.bias"], ["/model.0/conv/Conv_output_0"],
                         name="/model.0/conv/Conv", pads=[1, 1, 1, 1], strides=[2, 2], kernel_shape=[3, 3]),
        helper.make_node("Sigmoid", ["/model.0/conv/Conv_output_0"], ["/model.0/act/Sigmoid_output_0"], name="/model.0/act/Sigmoid"),
        helper.make_node("Mul", ["/model.0/conv/Conv_output_0", "/model.0/act/Sigmoid_output_0"], ["/model.0/act/Mul_output_0"],
                         name="/model.0/act/Mul"),
        helper.make_node("Conv", ["/model.0/act/Mul_output_0", "model.1.conv.weight"], ["/model.1/conv/Conv_output_0"],
                         name="/model.1/conv/Conv", pads=[1, 1, 1, 1], strides=[2, 2], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["/model.1/conv/Conv_output_0"], ["p4"], name="/model.1/act/Relu"),
        helper.make_node("Resize", ["p4", "", "resize_scales"], ["/model.2/Resize_output_0"], name="/model.2/Resize",
                         mode="nearest"),
        helper.make_node("Concat", ["/model.2/Resize_output_0", "/model.0/act/Mul_output_0"], ["/model.3/Concat_output_0"],
                         name="/model.3/Concat", axis=1),
        helper.make_node("Split", ["/model.3/Concat_output_0", "split_sizes"], ["/model.4/Split_output_0",
                                                                               "/model.4/Split_output_1"],
                         name="/model.4/Split", axis=1),
        helper.make_node("Conv", ["/model.4/Split_output_0", "m.0.weight", "m.0.bias"], ["head0"], name="/model.5/m.0/Conv",
                         kernel_shape=[1, 1]),
        helper.make_node("Conv", ["p4", "m.1.weight", "m.1.bias"], ["head1"], name="/model.5/m.1/Conv", kernel_shape=[1, 1]),
        helper.make_node("Reshape", ["head0", "shape0"], ["h0r"], name="/model.5/Reshape"),
        helper.make_node("Reshape", ["head1", "shape0"], ["h1r"], name="/model.5/Reshape_1"),
        helper.make_node("Concat", ["h0r", "h1r"], ["raw"], name="/model.5/Concat", axis=1),
        # boxes in pixels (0..640) next to scores (0..1) in one output, like YOLOv5's `output0`
        helper.make_node("Split", ["raw", "split_box"], ["xy", "wh", "conf"], name="/model.5/Split_1", axis=2),
        helper.make_node("Sigmoid", ["xy"], ["xy_s"], name="/model.5/Sigmoid"),
        helper.make_node("Mul", ["xy_s", "stride640"], ["xy_p"], name="/model.5/Mul"),
        helper.make_node("Exp", ["wh"], ["wh_e"], name="/model.5/Exp"),
        helper.make_node("Mul", ["wh_e", "anchor"], ["wh_p"], name="/model.5/Mul_1"),
        helper.make_node("Sigmoid", ["conf"], ["conf_s"], name="/model.5/Sigmoid_1"),
        helper.make_node("Concat", ["xy_p", "wh_p", "conf_s"], ["output0"], name="/model.5/Concat_1", axis=2),
    ]
    inits = [init("model.0.conv.weight", _w(rng, 8, 3, 3, 3)), init("model.0.conv.bias", _w(rng, 8, s=0.1)),
             init("model.1.conv.weight", _w(rng, 8, 8, 3, 3, s=0.15)),
             init("resize_scales", np.array([1, 1, 2, 2], np.float32)),
             init("split_sizes", np.array([12, 4], np.int64)),
             init("m.0.weight", _w(rng, na, 12, 1, 1)), init("m.0.bias", _w(rng, na, s=0.1)),
             init("m.1.weight", _w(rng, na, 8, 1, 1)), init("m.1.bias", _w(rng, na, s=0.1)),
             init("shape0", np.array([0, -1, 7], np.int64)),
             init("split_box", np.array([2, 2, 3], np.int64)),
             init("stride640", np.array(640, np.float32)), init("anchor", np.array(30, np.float32))]
    m = _model(nodes, [helper.make_tensor_value_info("images", T.FLOAT, [1, 3, 16, 16])],
               [helper.make_tensor_value_info("output0", T.FLOAT, [1, None, 7]),
                helper.make_tensor_value_info("p4", T.FLOAT, [1, 8, 4, 4]),
                helper.make_tensor_value_info("/model.4/Split_output_1", T.FLOAT, [1, 4, 8, 8])],
               inits, opset)
    feeds = [{"images": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(16)]
    return m, feeds


FAMILIES = {"dynamo": dynamo, "torchscript": torchscript, "tf2onnx": tf2onnx, "paddle": paddle,
            "optimum": optimum, "yolo": yolo}
