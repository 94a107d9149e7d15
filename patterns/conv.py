"""Conv (+BatchNormalization) (+Relu|Clip): the supergroup that is quantized as one unit (AIMET default
`supergroups: Conv+Relu`, `Conv+BN` folded first). Variants, largest first: Conv→BN→act, Conv→act, Conv→BN.

BN must be in inference form (only its first output used; exclusive use rejects training outputs that are
read). A Clip activation needs constant bounds (a Relu6-like clamp) so it can fold into the output range.
"""
from __future__ import annotations

from qcompiler.patterns.activations import clip_bounds
from qcompiler.patterns.pattern import Pattern


class ConvBnAct(Pattern):
    description = "Conv with optional BatchNormalization and Relu/Clip"

    def __init__(self, bn: bool = True, act: bool = True):
        self.bn, self.act = bn, act
        self.name = "conv" + ("_bn" if bn else "") + ("_act" if act else "")

    def pattern(self, op, x, weight):
        y = op.Conv(x, weight, op.Optional(op.Var("bias")), _name="conv")
        if self.bn:
            y = op.BatchNormalization(y, op.Var("bn_scale"), op.Var("bn_bias"), op.Var("bn_mean"), op.Var("bn_var"),
                                      _name="batchnorm")
        if self.act:
            y = op.node(("Relu", "Clip"), y, op.Optional(op.Scalar("clip_min", structural=False)),
                        op.Optional(op.Scalar("clip_max", structural=False)), _name="activation")
        return y

    def check(self, match):
        act = match.get("activation")
        if act is not None and act.op_type == "Clip" and clip_bounds(act) is None:
            return self.fail("Clip bounds are not constant scalars", act)
        return None


GROUPS = {"conv_bn_act": [ConvBnAct(True, True), ConvBnAct(False, True), ConvBnAct(True, False)]}
