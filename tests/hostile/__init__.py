"""Hostile-input suite: every CLI run on bad input exits 0 or 2 with one line, under limits, changing no input.

- harness.py      run one CLI command in a limited child (RLIMIT_AS 3 GiB, RLIMIT_CPU, wall timeout), hash inputs
                  before/after, and check the promises (`check`, `problems`)
- forkserver.py   imports qcompiler and onnxruntime once and forks a child per run (QC_HOSTILE_FORK=0: plain
                  `python -m qcompiler` per run instead)
- mutants.py      seeded structural protobuf mutants of small built models and the shared corpus
- test_mutants.py each mutant through inspect, run and quantize; `-m slow` for the seeded sweep
                  (QC_HOSTILE_SEEDS=n seeds, QC_SHARD=i/n shards)
- test_cases.py   the issue's hand-written cases, one id per item (`-k 9-fifo`)
- test_kill.py    SIGTERM/SIGINT/SIGKILL during a large write; two writers of one output
- summary.py      `python -m tests.hostile.summary [--seeds 1-3]`: mutant failures grouped by command and cause
"""
