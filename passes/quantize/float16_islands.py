"""`float16-islands`: nodes a config marks `precision: float16` compute in fp16 between Casts
(qcompiler/quant/core/float16.py); `place` chose them, on the float model's names."""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.float16 import apply_float16


@register_pass
class Float16Islands(QuantPass):
    name = "float16-islands"
    description = "run the nodes a config marks `precision: float16` in fp16 between Casts"
    preserves_semantics = False
    requires = ("quant-context", "plan", "qdq")

    def run(self, ctx) -> PassResult:
        if not ctx.float16:
            return PassResult(False)
        done = apply_float16(ctx.model, ctx.float16, probe_ort=ctx.profile.name.startswith("ort"))
        for name, what in done.items():
            ctx.layers.setdefault(name, {})["float16"] = what
        n16 = sum(w.startswith("float16") for w in done.values())
        ctx.notes.append(f"{n16} of {len(done)} nodes marked precision: float16 run in fp16 (see report 'layers')")
        return PassResult(n16 > 0, {"float16_nodes": n16, "kept_float32": len(done) - n16})
