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
    bert          optimum encoder: int64 ids/mask/token types with two sequence lengths, Where(Equal(mask, 0),
                  finfo.min, 0), decomposed LayerNorm, Erf GELU, pooler output
    zoo           an old model-zoo file: opset 8, IR 3, initializers listed as inputs, Upsample, Dropout, Sum
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


# --- Hugging Face optimum, encoder (BERT-style) ------------------------------------------------------------------
def bert(seed=0, opset=14, vocab=40, d=16, ff=32, seq=6):
    """input_ids / token_type_ids / attention_mask (int64, dynamic batch and sequence), position ids from
    Shape -> Gather -> Range -> Unsqueeze, embeddings summed, decomposed LayerNorm (ReduceMean), the mask as
    optimum writes it for BERT: Where(Equal(mask, 0), finfo.min, 0) unsqueezed to [b, 1, 1, s], Erf GELU,
    last_hidden_state and pooler_output outputs."""
    rng = np.random.default_rng(seed)

    def ln(x, y, p):
        return [helper.make_node("ReduceMean", [x], [f"{p}/mu"], axes=[-1], name=f"{p}/ReduceMean"),
                helper.make_node("Sub", [x, f"{p}/mu"], [f"{p}/d"], name=f"{p}/Sub"),
                helper.make_node("Pow", [f"{p}/d", "two"], [f"{p}/d2"], name=f"{p}/Pow"),
                helper.make_node("ReduceMean", [f"{p}/d2"], [f"{p}/var"], axes=[-1], name=f"{p}/ReduceMean_1"),
                helper.make_node("Add", [f"{p}/var", "eps"], [f"{p}/ve"], name=f"{p}/Add"),
                helper.make_node("Sqrt", [f"{p}/ve"], [f"{p}/sd"], name=f"{p}/Sqrt"),
                helper.make_node("Div", [f"{p}/d", f"{p}/sd"], [f"{p}/n"], name=f"{p}/Div"),
                helper.make_node("Mul", [f"{p}/n", f"{p}.weight"], [f"{p}/m"], name=f"{p}/Mul"),
                helper.make_node("Add", [f"{p}/m", f"{p}.bias"], [y], name=f"{p}/Add_1")]

    nodes = [
        helper.make_node("Shape", ["input_ids"], ["/emb/Shape"], name="/emb/Shape"),
        helper.make_node("Gather", ["/emb/Shape", "i1"], ["/emb/len"], name="/emb/Gather", axis=0),
        helper.make_node("Range", ["i0", "/emb/len", "i1"], ["/emb/pos"], name="/emb/Range"),
        helper.make_node("Unsqueeze", ["/emb/pos", "ax0"], ["position_ids"], name="/emb/Unsqueeze"),
        helper.make_node("Gather", ["embeddings.word_embeddings.weight", "input_ids"], ["/emb/w"], name="/emb/word"),
        helper.make_node("Gather", ["embeddings.token_type_embeddings.weight", "token_type_ids"], ["/emb/t"],
                         name="/emb/type"),
        helper.make_node("Gather", ["embeddings.position_embeddings.weight", "position_ids"], ["/emb/p"],
                         name="/emb/pos_emb"),
        helper.make_node("Add", ["/emb/w", "/emb/t"], ["/emb/wt"], name="/emb/Add"),
        helper.make_node("Add", ["/emb/wt", "/emb/p"], ["/emb/sum"], name="/emb/Add_1"),
        *ln("/emb/sum", "/emb/out", "embeddings.LayerNorm"),
        # mask: Where(mask == 0, finfo.min, 0) -> [b, 1, 1, s]
        helper.make_node("Equal", ["attention_mask", "i0"], ["/mask/eq"], name="/mask/Equal"),
        helper.make_node("Where", ["/mask/eq", "fmin", "zero"], ["/mask/add"], name="/mask/Where"),
        helper.make_node("Unsqueeze", ["/mask/add", "ax12"], ["/mask/add4"], name="/mask/Unsqueeze"),
        helper.make_node("MatMul", ["/emb/out", "q.weight"], ["/q"], name="/attn/q/MatMul"),
        helper.make_node("Add", ["/q", "q.bias"], ["/qb"], name="/attn/q/Add"),
        helper.make_node("MatMul", ["/emb/out", "k.weight"], ["/k"], name="/attn/k/MatMul"),
        helper.make_node("MatMul", ["/emb/out", "v.weight"], ["/v"], name="/attn/v/MatMul"),
        helper.make_node("Unsqueeze", ["/qb", "ax1"], ["/q4"], name="/attn/q/Unsqueeze"),
        helper.make_node("Unsqueeze", ["/k", "ax1"], ["/k4"], name="/attn/k/Unsqueeze"),
        helper.make_node("Unsqueeze", ["/v", "ax1"], ["/v4"], name="/attn/v/Unsqueeze"),
        helper.make_node("Transpose", ["/k4"], ["/kT"], name="/attn/k/Transpose", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["/q4", "/kT"], ["/s"], name="/attn/MatMul"),
        helper.make_node("Div", ["/s", "sqrt_d"], ["/sd"], name="/attn/Div"),
        helper.make_node("Add", ["/sd", "/mask/add4"], ["/sm"], name="/attn/Add"),
        helper.make_node("Softmax", ["/sm"], ["/p"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["/p", "/v4"], ["/c4"], name="/attn/MatMul_1"),
        helper.make_node("Squeeze", ["/c4", "ax1"], ["/c"], name="/attn/Squeeze"),
        helper.make_node("MatMul", ["/c", "o.weight"], ["/o"], name="/attn/o/MatMul"),
        helper.make_node("Add", ["/o", "/emb/out"], ["/res"], name="/attn/Add_res"),
        *ln("/res", "/h1", "attention.output.LayerNorm"),
        helper.make_node("MatMul", ["/h1", "fc1.weight"], ["/f1"], name="/ffn/fc1/MatMul"),
        helper.make_node("Div", ["/f1", "sqrt2"], ["/g1"], name="/ffn/gelu/Div"),
        helper.make_node("Erf", ["/g1"], ["/g2"], name="/ffn/gelu/Erf"),
        helper.make_node("Add", ["/g2", "one"], ["/g3"], name="/ffn/gelu/Add"),
        helper.make_node("Mul", ["/f1", "/g3"], ["/g4"], name="/ffn/gelu/Mul"),
        helper.make_node("Mul", ["/g4", "half"], ["/g5"], name="/ffn/gelu/Mul_1"),
        helper.make_node("MatMul", ["/g5", "fc2.weight"], ["/f2"], name="/ffn/fc2/MatMul"),
        helper.make_node("Add", ["/f2", "/h1"], ["/res2"], name="/ffn/Add"),
        *ln("/res2", "last_hidden_state", "output.LayerNorm"),
        helper.make_node("Gather", ["last_hidden_state", "i0"], ["/cls"], name="/pooler/Gather", axis=1),
        helper.make_node("Gemm", ["/cls", "pooler.dense.weight", "pooler.dense.bias"], ["/pd"], name="/pooler/Gemm",
                         transB=1),
        helper.make_node("Tanh", ["/pd"], ["pooler_output"], name="/pooler/Tanh"),
    ]
    inits = [init("embeddings.word_embeddings.weight", _w(rng, vocab, d, s=1.0)),
             init("embeddings.token_type_embeddings.weight", _w(rng, 2, d, s=0.3)),
             init("embeddings.position_embeddings.weight", _w(rng, 32, d, s=0.3)),
             init("i0", np.array(0, np.int64)), init("i1", np.array(1, np.int64)),
             init("ax0", np.array([0], np.int64)), init("ax1", np.array([1], np.int64)),
             init("ax12", np.array([1, 2], np.int64)),
             init("two", np.array(2.0, np.float32)), init("eps", np.array(1e-12, np.float32)),
             init("fmin", np.array(F32_MIN, np.float32)), init("zero", np.array(0.0, np.float32)),
             init("sqrt_d", np.array(np.sqrt(d), np.float32)), init("sqrt2", np.array(np.sqrt(2), np.float32)),
             init("one", np.array(1.0, np.float32)), init("half", np.array(0.5, np.float32)),
             init("q.weight", _w(rng, d, d)), init("q.bias", _w(rng, d, s=0.1)), init("k.weight", _w(rng, d, d)),
             init("v.weight", _w(rng, d, d)), init("o.weight", _w(rng, d, d)),
             init("fc1.weight", _w(rng, d, ff)), init("fc2.weight", _w(rng, ff, d, s=0.2)),
             init("pooler.dense.weight", _w(rng, d, d)), init("pooler.dense.bias", _w(rng, d, s=0.1))]
    for p in ("embeddings.LayerNorm", "attention.output.LayerNorm", "output.LayerNorm"):
        inits += [init(f"{p}.weight", rng.uniform(0.8, 1.2, d).astype(np.float32)),
                  init(f"{p}.bias", _w(rng, d, s=0.05))]
    ids = ["batch_size", "sequence_length"]
    inputs = [helper.make_tensor_value_info(n, T.INT64, ids) for n in ("input_ids", "attention_mask",
                                                                        "token_type_ids")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", T.FLOAT, ids + [d]),
               helper.make_tensor_value_info("pooler_output", T.FLOAT, ["batch_size", d])]
    m = _model(nodes, inputs, outputs, inits, opset)
    feeds = []
    for i in range(16):
        s = seq if i % 2 else seq - 2            # two sequence lengths: a dynamic dim really varies
        mask = np.ones((1, s), np.int64)
        mask[0, s - rng.integers(0, 3):] = 0      # right padding
        feeds.append({"input_ids": rng.integers(0, vocab, (1, s)).astype(np.int64), "attention_mask": mask,
                      "token_type_ids": (np.arange(s) >= s // 2).astype(np.int64)[None]})
    return m, feeds


FAMILIES["bert"] = bert


# --- an old model-zoo file: opset 8, IR 3 (every initializer also a graph input), Upsample, Dropout, Sum ---------
def zoo(seed=0, opset=8):
    rng = np.random.default_rng(seed)
    up = helper.make_node("Upsample", ["relu0"], ["up0"], mode="nearest", name="up0", scales=[1.0, 1.0, 2.0, 2.0]) \
        if opset < 9 else helper.make_node("Upsample", ["relu0", "up_scales"], ["up0"], mode="nearest", name="up0")
    nodes = [helper.make_node("Conv", ["data", "conv0_weight"], ["conv0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              name="conv0"),
             helper.make_node("BatchNormalization", ["conv0", "bn_gamma", "bn_beta", "bn_mean", "bn_var"], ["bn0"],
                              epsilon=1e-5, name="bn0"),
             helper.make_node("Relu", ["bn0"], ["relu0"], name="relu0"), up,
             helper.make_node("MaxPool", ["up0"], ["pool0"], kernel_shape=[2, 2], strides=[2, 2], name="pool0"),
             helper.make_node("Dropout", ["pool0"], ["drop0"], name="drop0"),
             helper.make_node("Sum", ["drop0", "relu0"], ["sum0"], name="sum0"),
             helper.make_node("GlobalAveragePool", ["sum0"], ["gap"], name="gap"),
             helper.make_node("Reshape", ["gap", "shape"], ["flat"], name="flat"),
             helper.make_node("Gemm", ["flat", "fc_weight", "fc_bias"], ["fc"], transB=1, name="fc"),
             helper.make_node("Softmax", ["fc"], ["prob"], name="softmax")]
    inits = [init("conv0_weight", _w(rng, 8, 3, 3, 3)), init("bn_gamma", rng.uniform(.5, 1.5, 8).astype(np.float32)),
             init("bn_beta", _w(rng, 8, s=0.1)), init("bn_mean", _w(rng, 8, s=0.1)),
             init("bn_var", rng.uniform(.5, 1.5, 8).astype(np.float32)), init("shape", np.array([1, -1], np.int64)),
             init("fc_weight", _w(rng, 10, 8)), init("fc_bias", _w(rng, 10, s=0.1))]
    if opset >= 9:
        inits.append(init("up_scales", np.array([1, 1, 2, 2], np.float32)))
    inputs = [helper.make_tensor_value_info("data", T.FLOAT, [1, 3, 8, 8])] + \
        [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    m = _model(nodes, inputs, [helper.make_tensor_value_info("prob", T.FLOAT, [1, 10])], inits, opset, ir=3)
    feeds = [{"data": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(16)]
    return m, feeds


FAMILIES["zoo"] = zoo
