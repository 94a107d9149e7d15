"""The options of the Olive pass: one per switch of `quantize()` (the switch table is their one source), plus what
only Olive has (its data config, its external-data options, its metric config).

Each switch keeps its name, default and documentation; its value is checked by the same `check_switches` as the
API's and the CLI's, so a bad value reads the same one line from each door.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

from olive.common.config_utils import ParamCategory
from olive.data.config import DataConfig
from olive.passes.onnx.common import get_external_data_config
from olive.passes.pass_config import PassConfigParam, get_user_script_data_config

from qcompiler.quant.core.switches import SWITCHES

# switches whose value is a live Python object, which a workflow JSON cannot hold: `metric` has an Olive form below
PYTHON_ONLY = ("metric", "executor")

OLIVE_ONLY = {
    "data_config": PassConfigParam(
        type_=Optional[Union[DataConfig, dict]], default_value=None,
        description="calibration data: an Olive data config, read through its calibration dataloader (one feed "
                    "dict per sample, in order); or give `calib`. Weight-only quantization may go without."),
    "calib": PassConfigParam(
        type_=Optional[str], default_value=None, category=ParamCategory.PATH,
        description="calibration data qcompiler reads itself: an .npz (one key per graph input, samples along "
                    "axis 0), an .npy (single-input model) or a folder of them; instead of `data_config`."),
    "metric": PassConfigParam(
        type_=Optional[Union[dict, str, Callable]], default_value=None, category=ParamCategory.OBJECT,
        description="the max_drop search's score: an Olive accuracy metric config ({'name', 'type': 'accuracy', "
                    "'sub_types': [...]}) measured against the float model's top-1 on the calibration samples, "
                    "or the name of a function metric(outputs, reference) -> score in `user_script`; default: "
                    "qcompiler's relative output error (an output SQNR)."),
    "allow_low_sqnr": PassConfigParam(
        type_=bool, default_value=False,
        description="keep the model when an output stays below the SQNR floor (min_sqnr): a warning instead of "
                    "a failed pass."),
}


def default_config() -> dict:
    """name -> PassConfigParam: the switches (in table order), then Olive's own options."""
    out = {s.name: PassConfigParam(type_=Any, default_value=s.default, description=s.doc)
           for s in SWITCHES if s.name not in PYTHON_ONLY}
    # NOTE: user_script before `metric`: Olive's check of an object option reads the user_script validated before it
    out.update(get_user_script_data_config())
    out.update(OLIVE_ONLY)
    out.update(get_external_data_config())
    return out


def switch_values(config) -> dict:
    """The switches' values in a pass config (an Olive config object), as `quantize()` takes them."""
    return {s.name: getattr(config, s.name) for s in SWITCHES if s.name not in PYTHON_ONLY}
