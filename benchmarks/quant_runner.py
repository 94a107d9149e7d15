"""One quantization run in its own process, so wall time and peak memory are the tool's own.

usage: python benchmarks/quant_runner.py TOOL MODEL_DIR OUT.onnx [--per-tensor]
TOOL: qcompiler | ort. Prints one JSON line: {"seconds", "cpu_seconds", "peak_rss_mb"}
(cpu_seconds: this process's CPU time, all threads; the honest figure on a loaded machine).
"""
import json
import os
import sys
import time

import numpy as np


def run_ort(md, out, per_channel):
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self, path):
            d = np.load(path)
            self.data = {k: d[k] for k in d.files}
            self.n = next(iter(self.data.values())).shape[0]
            self.i = 0

        def get_next(self):
            if self.i >= self.n:
                return None
            feed = {k: v[self.i] for k, v in self.data.items()}
            self.i += 1
            return feed

    quantize_static(os.path.join(md, "model.onnx"), out, Reader(os.path.join(md, "calib.npz")),
                    quant_format=QuantFormat.QDQ, per_channel=per_channel, calibrate_method=CalibrationMethod.MinMax)


def run_qcompiler(md, out, per_channel):
    from qcompiler.onnx_io import save_model
    from qcompiler.quant.api import quantize
    res = quantize(os.path.join(md, "model.onnx"), os.path.join(md, "calib.npz"), per_channel=per_channel)
    save_model(res.model, out)


def peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM). NOTE: not ru_maxrss, which Linux carries across fork+exec from the
    parent, so a big parent made both tools report the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main():
    tool, md, out = sys.argv[1:4]
    per_channel = "--per-tensor" not in sys.argv
    t0, c0 = time.perf_counter(), time.process_time()
    {"ort": run_ort, "qcompiler": run_qcompiler}[tool](md, out, per_channel)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = peak_rss_mb()
    print(json.dumps({"seconds": round(dt, 3), "cpu_seconds": round(cpu, 3), "peak_rss_mb": round(rss, 1)}))


if __name__ == "__main__":
    main()
