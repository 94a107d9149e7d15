"""Calibration: the samples (data files, readers), the streaming onnxruntime run, observers and histograms,
the probes inside If/Loop/Scan bodies, and the layer-by-layer input capture the weight optimisers share."""
