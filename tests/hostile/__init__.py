"""Hostile-input suite (issue 10): every CLI run on bad input exits 0 or 2 with one line, under limits, changing no input."""
