"""The model of quantization: the plan, encodings and grids, bit widths, schemes, the Q/DQ and fp16 writers,
the output opset, and what every quantization pass shares (context, pipeline, switch table)."""
