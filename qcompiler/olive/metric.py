"""An Olive accuracy metric as the mixed-precision search's `metric(outputs, reference) -> score`.

The search scores the quantized model's outputs on the calibration samples against the float model's outputs on
the same samples (passes/quantize/mixed_precision/search.py); calibration data carries no labels, so the float
model's top-1 class is the label and Olive's evaluator measures the quantized model's predictions against it
(an accuracy of 1.0 is full agreement with float).
"""
from __future__ import annotations

import numpy as np
from olive.common.config_utils import validate_config
from olive.evaluator.metric import Metric
from olive.evaluator.olive_evaluator import OliveEvaluator, OliveModelOutput

from qcompiler.errors import ArgumentError
from qcompiler.shorten import one_line, short_text


def olive_metric(spec):
    """`spec` (an Olive metric config dict) -> metric(outputs, reference) -> the score of its first sub-type of
    highest priority. Only accuracy metrics compare predictions; anything else is one ArgumentError line."""
    try:
        metric = validate_config(spec, Metric)
    except Exception as e:  # noqa: BLE001 - pydantic's report is many lines: keep the first error's field and reason
        errors = e.errors() if callable(getattr(e, "errors", None)) else []
        why = f"{'.'.join(map(str, errors[0]['loc']))}: {errors[0]['msg']}" if errors else str(e)
        raise ArgumentError(f"metric: not an Olive metric config ({one_line(why)})") from None
    if str(metric.type) != "accuracy" or not metric.sub_types:
        raise ArgumentError(f"metric: the max_drop search needs an Olive accuracy metric with sub_types (it scores "
                            f"predictions against the float model's), got type {short_text(str(metric.type), 40)}")
    sub = max(metric.sub_types, key=lambda s: s.priority).name

    def score(outputs: list, reference: list) -> float:
        name = next(iter(reference[0]))   # the first graph output: the logits of a classifier
        logits = np.concatenate([np.asarray(o[name]).reshape(-1, np.shape(o[name])[-1]) for o in outputs])
        labels = np.concatenate([np.asarray(r[name]).reshape(-1, np.shape(r[name])[-1]) for r in reference])
        result = OliveEvaluator.compute_accuracy(metric, OliveModelOutput(preds=logits.argmax(-1), logits=logits),
                                                 labels.argmax(-1))
        return float(result[str(sub)].value)

    score.__name__ = f"Olive {metric.name}: {sub} against float top-1"
    return score
