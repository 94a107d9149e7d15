"""`QcompilerQuantization`: qcompiler's `quantize()` as an Olive pass (docs/olive.md).

It takes an ONNX model handler, calibrates on Olive's data config (its calibration dataloader) or on a `calib`
path qcompiler reads, and hands back the QDQ model (or the weight-only one) as an ONNX model handler. Every
switch of `quantize()` is an option of the pass under the same name (params.py); `max_drop` can be scored by an
Olive accuracy metric (metric.py). The model is written by qcompiler's writer, which streams tensors to
`<model>.onnx.data` when asked or past protobuf's 2 GB, under the same name and 1 KB threshold as Olive's
default; other external-data options of Olive go through Olive's own writer.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from olive.common.config_utils import validate_config
from olive.data.config import DataConfig
from olive.model import ONNXModelHandler
from olive.model.utils import resolve_onnx_path
from olive.passes import Pass
from olive.passes.onnx.common import get_external_data_config, model_proto_to_olive_model
from olive.resource_path import LocalFile, LocalFolder

from qcompiler.cli_quantize import warning_line
from qcompiler.errors import ArgumentError, QCompilerError
from qcompiler.olive.metric import olive_metric
from qcompiler.olive.package import PASS_NAME
from qcompiler.olive.params import default_config, switch_values
from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize, resolve_early
from qcompiler.quant.core.switches import check_switches
from qcompiler.quant.interop.report import format_summary
from qcompiler.shorten import one_line, short_text

# a child of Olive's logger: the summary and warnings go where Olive's own log lines go
logger = logging.getLogger("olive.passes.qcompiler")


class BelowFloorError(QCompilerError):
    """An output of the quantized model stays below the SQNR floor (the CLI's exit 3); `allow_low_sqnr` keeps it."""


class QcompilerQuantization(Pass):
    """Quantize an ONNX model with qcompiler: W8A8 static QDQ (or weight-only) for a target profile."""

    @classmethod
    def _default_config(cls, accelerator_spec) -> dict:
        return default_config()

    @staticmethod
    def is_accelerator_agnostic(accelerator_spec) -> bool:
        """No: without a `target` option the execution provider chooses the profile (params.PROFILE_OF_PROVIDER)."""
        return False

    def _run_for_config(self, model: ONNXModelHandler, config, output_model_path: str) -> ONNXModelHandler:
        try:
            return self._quantize(model, config, output_model_path)
        except QCompilerError as e:
            # NOTE: Olive stops a workflow on a ValueError (a user's mistake) and logs any other exception as a
            # failed pass that produced nothing; every QCompilerError is about the user's input, one line
            raise ValueError(f"{PASS_NAME}: {one_line(e)}") from e

    def _quantize(self, model: ONNXModelHandler, config, output_model_path: str) -> ONNXModelHandler:
        given = switch_values(config, self.accelerator_spec.execution_provider)
        # one line naming the option before any data is read; a config may ask for weight-only (no data needed)
        weight_only = resolve_early(check_switches(given), given)["weight_only"]
        given["metric"] = self._metric(config.metric)
        res = quantize(model.model_path, self._calibration(model, config, weight_only), **given)
        for line in format_summary(res.report).splitlines():
            logger.info("%s", line)
        for w in res.report.get("warnings", []):
            logger.warning("%s", warning_line(w))
        low = res.report.get("below_floor") or []
        for b in low:
            logger.warning("output '%s' SQNR %s dB is below the floor %g dB", short_text(b["output"], 80),
                           b["sqnr_db"], b["floor_db"])
        if low and not config.allow_low_sqnr:
            raise BelowFloorError(f"{len(low)} output(s) below the SQNR floor of {low[0]['floor_db']:g} dB "
                                  f"(lower min_sqnr or set allow_low_sqnr to keep the model)")
        out = _save(res, resolve_onnx_path(output_model_path, Path(model.model_path).name), config)
        out.model_attributes = {**(model.model_attributes or {}), "qcompiler": _summary(res.report)}
        return out

    @staticmethod
    def _calibration(model: ONNXModelHandler, config, weight_only: bool):
        """What `quantize()` reads: Olive's calibration dataloader (an object with get_next()), the `calib` path,
        or None (weight-only)."""
        if config.data_config is not None and config.calib is not None:
            raise ArgumentError("calibration data: give data_config or calib, not both")
        if config.data_config is not None:
            data = validate_config(config.data_config, DataConfig)
            return data.to_data_container().create_calibration_dataloader(model_path=model.model_path,
                                                                         io_config=model.io_config)
        if config.calib is None and not weight_only:
            raise ArgumentError("no calibration data: give data_config (an Olive data config) or calib (an .npz/.npy "
                                "path or a folder); only weight_only goes without")
        return config.calib

    def _metric(self, metric):
        """The max_drop search's metric: None (qcompiler's relative output error), a function (or its name in
        user_script), or an Olive metric config."""
        if isinstance(metric, str):
            metric = self._user_module_loader.load_object(metric)
        if metric is None or callable(metric):
            return metric
        return olive_metric(metric)


def _summary(report: dict) -> dict:
    """What the output model's attributes carry of the report (Olive keeps them in its footprints): each output's
    SQNR on the calibration samples, how many values stayed float, the mixed-precision search's outcome."""
    mp = report.get("mixed_precision") or {}
    return {"output_sqnr_db": report.get("output_sqnr_db", {}), "left_float": len(report.get("left_float", ())),
            "below_floor": report.get("below_floor") or [],
            **({"mixed_precision": {k: mp.get(k) for k in ("budget", "metric", "drop")}} if mp else {})}


def _save(res, out: str, config) -> ONNXModelHandler:
    """The QDQ model written to `out` as an ONNX model handler (a folder when it has external data)."""
    params = get_external_data_config()
    options = {k: getattr(config, k) for k in params}
    if any(options[k] != p.default_value for k, p in params.items() if k != "save_as_external_data"):
        # NOTE: names, thresholds or layouts of Olive's own: its writer (the whole model serialized once)
        return model_proto_to_olive_model(model_to_proto(res.model), out, options)
    res.save(out, external_data=True if options["save_as_external_data"] else None)
    if os.path.exists(out + ".data"):
        return ONNXModelHandler(model_path=LocalFolder({"path": str(Path(out).parent)}),
                                onnx_file_name=Path(out).name)
    return ONNXModelHandler(model_path=LocalFile({"path": out}))
