"""Targets as data: backend profiles (which ops carry quantizers, grids, ties) and each runtime's fusion table
(fusion_tables/*.yaml: which DQ -> op -> Q units become integer kernels)."""
