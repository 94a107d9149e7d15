"""The options of the Olive pass: one per switch of `quantize()` (the switch table is their one source; `config`
is `quant_config` here), plus what only Olive has (its data config, its external-data options, its metric config).

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

# the target profile a workflow's execution provider means when the pass's `target` is not given (a provider not
# listed: quantize()'s default, ort_cpu)
PROFILE_OF_PROVIDER = {
    "CPUExecutionProvider": "ort_cpu",
    "TensorrtExecutionProvider": "trt",
    "NvTensorRTRTXExecutionProvider": "trt",
    "QNNExecutionProvider": "qnn_htp",
}

# switches whose value is a live Python object, which a workflow JSON cannot hold: `metric` has an Olive form below
PYTHON_ONLY = ("metric", "executor")

# switches under another name: a workflow's pass entry is {"type": ..., "config": {...}} with the options also
# allowed beside "type", so an option named `config` would be read as the entry's whole config
RENAMED = {"config": "quant_config"}

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
    out = {RENAMED.get(s.name, s.name): PassConfigParam(type_=Any, default_value=s.default, description=s.doc)
           for s in SWITCHES if s.name not in PYTHON_ONLY}
    # NOTE: user_script before `metric`: Olive's check of an object option reads the user_script validated before it
    out.update(get_user_script_data_config())
    out.update(OLIVE_ONLY)
    out.update(get_external_data_config())
    return out


def switch_values(config, provider=None) -> dict:
    """The switches' values in a pass config (an Olive config object), as `quantize()` takes them; `target`
    from the accelerator's execution provider when the config does not name one."""
    out = {s.name: getattr(config, RENAMED.get(s.name, s.name)) for s in SWITCHES if s.name not in PYTHON_ONLY}
    if out["target"] is None and out["config"] is None:   # a config file may name its target
        out["target"] = PROFILE_OF_PROVIDER.get(str(provider) if provider else "")
    return out
