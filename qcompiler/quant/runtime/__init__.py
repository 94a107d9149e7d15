"""The runtime as measured: which nodes run onnxruntime integer kernels, latency, parallel evaluation and
giving memory back between stages."""
