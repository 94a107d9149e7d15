"""One list of supergroup kinds (passes/supergroups.py): the annotating pass, placement and the config all read it."""
from __future__ import annotations

import pytest

from qcompiler.passes import supergroups as sg_pass
from qcompiler.errors import ConfigError
from qcompiler.quant import placement
from qcompiler.quant.settings.config import load_config


def test_placement_reads_the_pass_list():
    assert sg_pass.DEFAULT_GROUPS == tuple(sg_pass.SUPERGROUP_KINDS)
    assert placement.SUPERGROUP_KINDS is sg_pass.FLOAT_INTERIOR_KINDS
    assert set(placement.SUPERGROUP_KINDS) == {"layernorm", "rmsnorm", "gelu", "silu", "hardswish"}
    assert set(placement.SUPERGROUP_KINDS) < set(sg_pass.DEFAULT_GROUPS)


def test_config_takes_every_kind_and_names_an_unknown_one(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("supergroups: [" + ", ".join(sg_pass.SUPERGROUP_KINDS) + "]\n")
    assert load_config(str(p)).supergroups == list(sg_pass.SUPERGROUP_KINDS)
    p.write_text("supergroups: [layernorm, bogus]\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    msg = str(e.value)
    assert "\n" not in msg and "supergroups[1]: unknown supergroup 'bogus'" in msg and "hardsigmoid_gate" in msg
