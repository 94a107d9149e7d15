"""What leaves qcompiler besides the model: AIMET encodings files (read, write, freeze onto a plan) and the report."""
