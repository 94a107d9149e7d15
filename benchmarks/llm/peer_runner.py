"""One peer quantization in its own process (started by bench_llm.py through measure.py).

    python peer_runner.py ROW MODEL.onnx CALIB.npz OUT.onnx

ROW (onnxruntime 1.32, project venv unless noted):
  ort_rtn4        MatMulNBitsQuantizer, DefaultWeightOnlyQuantConfig: int4 RTN, block 32, symmetric, MatMul only
                  (onnxruntime's own CLI defaults: --quant_method default --block_size 32 --symmetric True)
  ort_rtn4_asym   the same with zero points
  ort_rtn4_acc4   ort_rtn4 with accuracy_level=4 (int8 activations inside MatMulNBits, as qcompiler's ort_cpu default)
  ort_rtn4_gather ort_rtn4 plus the embedding Gather (op_types MatMul,Gather -> GatherBlockQuantized)
  ort_rtn8        DefaultWeightOnlyQuantConfig bits=8, block 32, symmetric
  ort_kquant4     KQuantWeightOnlyQuantConfig (vendored neural-compressor rtn_quantize, algorithm k_quant), block 32
  ort_gptq4       GPTQWeightOnlyQuantConfig with calib.npz (all samples), group 32, asymmetric (its CLI default)
  ort_gptq4_fixed ort_gptq4 with its one-line bug fixed at run time (NOT onnxruntime as shipped): 1.32's vendored
                  gptq() takes `cholesky(inv(H)).T` (upper factor) but then reads the column below the diagonal
                  (`Hinv1[i:, i]`, `Hinv[i2:, i1:i2]`), which is zero there, so no quantization error is ever
                  propagated and the result is round-to-nearest (asymmetric) to the last bit. Here cholesky() is
                  wrapped to return the upper factor, so the code's `.T` yields the lower one it indexes.
  ort_hqq4        HQQWeightOnlyQuantConfig block 32 bits 4 (needs torch: run with the benchmark venv)
  ort_w8a8        quantize_static, QDQ, per-channel, MinMax, calib.npz
  modelopt_int4   nvidia-modelopt 0.47 modelopt.onnx.quantization.quantize(quantize_mode="int4", rtn_dq), block 32,
                  fp32 elsewhere (ModelOpt venv): blocked int4 DequantizeLinear -> MatMul (QDQ, TensorRT-style)
  modelopt_awq4   the same with awq_lite on the first 32 calib.npz samples. On a machine without CUDA 0.47 fails:
                  int4.py:1330 calls cupy's `.get()` on what is then a numpy array (when it folds the AWQ scale
                  into the producer's initializer, here the RMSNorm weight Mul)
  modelopt_awqclip4 the same with awq_clip (ModelOpt's int4 default method)
  inc_rtn4        onnx-neural-compressor 1.0 MatMulNBitsQuantizer RTN int4 block 32 symmetric (INC venv)
  inc_gptq4       the same with GPTQ (calib.npz)
  inc_awq4        the same with AWQ (calib.npz)
Outputs are saved with external data (OUT.onnx + OUT.onnx.data).
"""
from __future__ import annotations

import os
import sys

import numpy as np


class NpzReader:
    """CalibrationDataReader over calib.npz: one feed per sample; re-iterable (GPTQ deep-copies it)."""

    def __init__(self, path, limit=0):
        ids = np.load(path)["input_ids"]
        self.ids = ids[:limit] if limit else ids
        self.i = 0

    def get_next(self):
        if self.i >= len(self.ids):
            return None
        self.i += 1
        return {"input_ids": self.ids[self.i - 1]}

    def rewind(self):
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        r = self.get_next()
        if r is None:
            raise StopIteration
        return r


def _ort_reader(path):
    from onnxruntime.quantization import CalibrationDataReader

    class R(NpzReader, CalibrationDataReader):
        pass
    return R(path)


def ort_nbits(model, out, bits=4, sym=True, acc=None, op_types=("MatMul",), algo=None):
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )
    if algo is None:
        algo = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=sym, accuracy_level=acc, bits=bits,
                                            op_types_to_quantize=op_types)
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=sym, accuracy_level=acc,
                             op_types_to_quantize=op_types, algo_config=algo)
    q.process()
    q.model.save_model_to_file(out, True)


def run(row, model, calib, out):
    if row == "ort_rtn4":
        ort_nbits(model, out)
    elif row == "ort_rtn4_asym":
        ort_nbits(model, out, sym=False)
    elif row == "ort_rtn4_acc4":
        ort_nbits(model, out, acc=4)
    elif row == "ort_rtn4_gather":
        ort_nbits(model, out, op_types=("MatMul", "Gather"))
    elif row == "ort_rtn8":
        ort_nbits(model, out, bits=8)
    elif row == "ort_kquant4":
        # k_quant and GPTQ go through the vendored neural-compressor code, which given a PATH keeps references to
        # the input's external data file (k_quant: the output points at a model.onnx.data beside it that does not
        # exist; GPTQ: its InferenceSession from bytes cannot resolve the relative path). Given the ModelProto with
        # its weights loaded both work (GPTQ serializes it, so only below protobuf's 2 GB).
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            KQuantWeightOnlyQuantConfig,
        )
        ort_nbits(onnx.load(model), out, sym=False, algo=KQuantWeightOnlyQuantConfig())
    elif row == "ort_gptq4":
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            GPTQWeightOnlyQuantConfig,
        )
        ort_nbits(onnx.load(model), out, sym=False,
                  algo=GPTQWeightOnlyQuantConfig(calibration_data_reader=_ort_reader(calib)))
    elif row == "ort_gptq4_fixed":
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            GPTQWeightOnlyQuantConfig,
        )
        chol = np.linalg.cholesky
        np.linalg.cholesky = lambda a, *k, **kw: chol(a, *k, **kw).T  # see the row's note above
        try:
            ort_nbits(onnx.load(model), out, sym=False,
                      algo=GPTQWeightOnlyQuantConfig(calibration_data_reader=_ort_reader(calib)))
        finally:
            np.linalg.cholesky = chol
    elif row == "ort_hqq4":
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            HQQWeightOnlyQuantConfig,
        )
        ort_nbits(model, out, sym=False, algo=HQQWeightOnlyQuantConfig(block_size=32, bits=4))
    elif row == "ort_w8a8":
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            quantize_static,
        )
        big = os.path.getsize(model) + (os.path.getsize(model + ".data") if os.path.exists(model + ".data") else 0)
        quantize_static(model, out, _ort_reader(calib), quant_format=QuantFormat.QDQ, per_channel=True,
                        calibrate_method=CalibrationMethod.MinMax, use_external_data_format=big > 1.8e9)
    elif row in ("modelopt_int4", "modelopt_awq4", "modelopt_awqclip4"):
        # the public entry (modelopt.onnx.quantization.quantize): it raises the opset to 21 for int4
        # DequantizeLinear; int4.quantize() called directly keeps opset 18 and writes an invalid model.
        # high_precision_dtype fp32: its default fp16 turns the float parts of the graph to fp16 (a TensorRT
        # choice; onnxruntime's CPU provider has few fp16 kernels). Calibration: the first 32 calib.npz samples.
        from modelopt.onnx.quantization import quantize as mo_quantize
        method = {"modelopt_int4": "rtn_dq", "modelopt_awq4": "awq_lite", "modelopt_awqclip4": "awq_clip"}[row]
        mo_quantize(model, quantize_mode="int4", calibration_method=method,
                    calibration_data_reader=NpzReader(calib, limit=32), calibration_eps=["cpu"], block_size=32,
                    output_path=out, use_external_data_format=True, high_precision_dtype="fp32", log_level="WARNING")
    elif row.startswith("inc_"):
        run_inc(row, model, calib, out)
    else:
        raise SystemExit(f"unknown row {row}")


def run_inc(row, model, calib, out):
    """onnx-neural-compressor 1.0 (Intel's ONNX-only INC): MatMulNBitsQuantizer, int4, block 32, symmetric."""
    import onnx
    from onnx_neural_compressor import data_reader
    from onnx_neural_compressor.quantization import matmul_nbits_quantizer as inc_q

    class Reader(NpzReader, data_reader.CalibrationDataReader):
        pass

    if row == "inc_rtn4":
        algo = inc_q.RTNWeightOnlyQuantConfig()
    elif row == "inc_gptq4":
        algo = inc_q.GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(calib))
    else:
        algo = inc_q.AWQWeightOnlyQuantConfig(calibration_data_reader=Reader(calib))
    q = inc_q.MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True, n_bits=4, algo_config=algo)
    q.process()
    m = q.model
    if not isinstance(m, onnx.ModelProto):
        m = m.model
    onnx.save_model(m, out, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(out) + ".data")


if __name__ == "__main__":
    row, model, calib, out = sys.argv[1:5]
    for p in (out, out + ".data"):
        if os.path.exists(p):
            os.remove(p)
    run(row, model, calib, out)
    print(f"{row}: wrote {out}")
