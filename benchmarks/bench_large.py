"""Quantizing a model over 2 GB: qcompiler against onnxruntime's quantize_static, same model, same run.

The model (benchmarks/large_model.py): a chain of 4 MatMuls with 2.25 GiB of float32 weights in one external-data
file, 4 calibration samples of 8 rows. Each quantizer runs W8A8 (int8 per-channel weights, uint8 activations, QDQ,
min/max) in its own child process; wall time and peak RSS (wait4) are the child's.
    Q  qcompiler quantize MODEL --calib calib.npz -o q.onnx
    P  onnxruntime.quantization.quantize_static(..., quant_format=QDQ, per_channel=True,
       use_external_data_format=True) with a CalibrationDataReader over the same samples
Targets: Q peak RSS <= 1.5x the weights' bytes; Q time <= P time. Output SQNR of each quantized
model against the float model (numpy, one sample) is printed too. Exit status 0 even when a target is missed
(this measures, it does not test); a missed target is printed as MISSED. The last line is JSON.
The issue's second figure (a 0.5 B decoder from torch's dynamo exporter) needs a model not available offline.

    python benchmarks/bench_large.py [--dir DIR] [--no-peer]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks.large_model import float_reference, sqnr_db, write_chain  # noqa: E402

PEER = r'''
import sys, numpy as np
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quantize_static)
model, calib, out = sys.argv[1:4]

class Reader(CalibrationDataReader):
    def __init__(self):
        self.it = iter([{"x": a} for a in np.load(calib)["x"]])
    def get_next(self):
        return next(self.it, None)

quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True)
'''


def run_child(argv, cwd) -> dict:
    """Run one child; its wall time, peak RSS (bytes, from wait4), exit code and the tail of its stderr."""
    err = tempfile.TemporaryFile()
    t = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    tail = err.read().decode(errors="replace")[-600:]
    return {"seconds": round(wall, 2), "peak_rss": usage.ru_maxrss * 1024, "exit": p.returncode, "stderr": tail}


def output_sqnr(info, path) -> float:
    import onnxruntime as ort
    x = np.load(info["calib"])["x"][0]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    del sess
    return round(sqnr_db(float_reference(info, x), got), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="work folder (default: a temporary folder, removed after)")
    ap.add_argument("--no-peer", action="store_true", help="skip onnxruntime's quantize_static")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="bench-large-")
    os.makedirs(work, exist_ok=True)
    free = shutil.disk_usage(work).free
    if free < 8 << 30:
        sys.exit(f"{work}: {free / 2 ** 30:.1f} GiB free; the model, its copies and outputs need about 8 GiB")
    try:
        t = time.perf_counter()
        info = write_chain(work)
        wb = info["weight_bytes"]
        print(f"model: {len(info['widths']) - 1} MatMuls, {wb / 2 ** 30:.2f} GiB of float32 weights in external "
              f"data (written in {time.perf_counter() - t:.1f} s)")
        q_out = os.path.join(work, "q.onnx")
        q = run_child([sys.executable, "-m", "qcompiler", "quantize", info["model"], "--calib", info["calib"],
                       "-o", q_out, "--report", os.path.join(work, "q.json")], ROOT)
        if q["exit"] == 0:
            q["sqnr_db"] = output_sqnr(info, q_out)
        rows = {"Q": q}
        if not args.no_peer:
            p_out = os.path.join(work, "p.onnx")
            p = run_child([sys.executable, "-c", PEER, info["model"], info["calib"], p_out], work)
            if p["exit"] == 0:
                p["sqnr_db"] = output_sqnr(info, p_out)
            rows["P"] = p
        for k, r in rows.items():
            what = "qcompiler" if k == "Q" else "onnxruntime quantize_static"
            status = "" if r["exit"] == 0 else f"  FAILED (exit {r['exit']}): {r['stderr'].strip()[-300:]}"
            print(f"{k} {what:28s} {r['seconds']:8.1f} s  peak RSS {r['peak_rss'] / 2 ** 30:5.2f} GiB "
                  f"({r['peak_rss'] / wb:.2f}x weights)  output SQNR {r.get('sqnr_db', '-')} dB{status}")
        ratio_rss = q["peak_rss"] / wb
        result = {"weight_bytes": wb, "Q": {k: v for k, v in q.items() if k != "stderr"},
                  "Q_rss_over_weights": round(ratio_rss, 3)}
        print(f"Q peak RSS / weights = {ratio_rss:.2f} (target <= 1.5){'' if ratio_rss <= 1.5 else '  MISSED'}")
        if "P" in rows and rows["P"]["exit"] == 0 and q["exit"] == 0:
            p = rows["P"]
            rt, rr = q["seconds"] / p["seconds"], q["peak_rss"] / p["peak_rss"]
            print(f"Q/P time = {rt:.2f} (target <= 1.0){'' if rt <= 1.0 else '  MISSED'}; Q/P peak RSS = {rr:.2f}")
            result.update({"P": {k: v for k, v in p.items() if k != "stderr"}, "Q_over_P_time": round(rt, 3),
                           "Q_over_P_rss": round(rr, 3)})
        print(json.dumps(result))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
