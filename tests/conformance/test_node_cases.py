"""Every ONNX node conformance case through import -> canonicalize -> verify -> export, checked three ways.

1. Structure: `onnx.checker` passes on the export, and `roundtrip.structural_diff` finds nothing that
   canonicalize is not allowed to change (I/O names and order, opsets, functions, attributes, named nodes).
2. Numerics: onnxruntime's outputs on the export equal the case's expected outputs with the case's rtol/atol
   (as onnx's backend runner compares them).
3. Cases onnxruntime cannot run on the ORIGINAL model are listed in known_failures.txt with the reason. For
   those, the export must still pass (1), and wherever ORT runs the original at all (wrong numbers), the export
   must give ORT's same numbers. A listed case that now passes is reported as a stale entry (warning).

The sweep takes ~15 s on 2 cores, so it runs in full by default. `QC_SHARD=i/n` (1-based) keeps every n-th
case starting at i, for splitting it across CI jobs: `QC_SHARD=1/4 pytest tests/conformance` ... `4/4`.

Regenerate the list after upgrading onnx or onnxruntime:
    python -m tests.conformance.test_node_cases --write-known-failures
"""
from __future__ import annotations

import os
import re
import sys
import warnings

import onnx
import pytest

from tests.conformance.roundtrip import (HarnessUnsupported, assert_similar, roundtrip, run_like_backend,
                                         session, structural_diff)

KNOWN_FAILURES = os.path.join(os.path.dirname(__file__), "known_failures.txt")


def _collect() -> list:
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), open(os.devnull, "w") as null:
        warnings.simplefilter("ignore")
        stdout, sys.stdout = sys.stdout, null
        try:
            cases = collect_testcases(None)   # None = every op; onnx < 1.23 requires the argument
        finally:
            sys.stdout = stdout
    shard = os.environ.get("QC_SHARD", "")
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        cases = cases[i - 1::n]
    return cases


def load_known_failures(path: str = KNOWN_FAILURES) -> dict:
    """name -> reason, from lines `test_name  | stage: reason` (# comments and blank lines ignored)."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition("|")
            out[name.strip()] = reason.strip()
    return out


def _short(e: BaseException) -> str:
    """One line of an ORT/numpy error without source paths, C++ signatures or node names."""
    s = " ".join(str(e).split())
    m = re.search(r"Opset (\d+) is under development.*support for domain (\S+) is till opset (\d+)", s)
    if m:
        return (f"ORT refuses opset {m.group(1)} (under development; ORT supports {m.group(2)} up to opset "
                f"{m.group(3)}) and an op's schema changed after {m.group(3)}")
    s = re.sub(r"\[ONNXRuntimeError\] : \d+ : ", "", s)
    s = re.sub(r"/onnxruntime_src/\S+ [^(]*\((?:[^()]|\([^()]*\))*\)(?: \[with [^\]]*\])? ", "", s)
    s = re.sub(r"(node with name|Name:|node:|node) ?'[^']*'", r"\1", s)
    s = re.sub(r"Op with name \([^)]*\)", "Op", s)
    return s[:160]


def ort_outcome(proto: onnx.ModelProto, case) -> tuple:
    """(stage, detail, outputs-of-first-data-set): stage is pass, load, feed, run or mismatch."""
    try:
        sess = session(proto)
    except Exception as e:
        return "load", _short(e), None
    first = None
    for k, (inputs, expected) in enumerate(case.data_sets):
        try:
            got = run_like_backend(sess, inputs)
        except HarnessUnsupported as e:
            return "feed", _short(e), None
        except Exception as e:
            return "run", _short(e), None
        if first is None:
            first = got
        try:
            assert_similar(expected, got, case.rtol, case.atol, f"data set {k}")
        except AssertionError as e:
            return "mismatch", _short(e)[:120], first
    return "pass", "", first


CASES = _collect()
KNOWN = load_known_failures()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    exported = roundtrip(case.model)
    onnx.checker.check_model(exported)
    diff = structural_diff(case.model, exported)
    assert not diff, f"{case.name}: round trip changed the model: " + "; ".join(diff)

    reason = KNOWN.get(case.name)
    if reason is None:
        stage, detail, _ = ort_outcome(exported, case)
        if stage != "pass":
            o_stage, o_detail, _ = ort_outcome(case.model, case)
            if o_stage != "pass":   # this onnxruntime cannot run the original either (known_failures.txt was
                pytest.skip(f"onnxruntime cannot run the original: {o_stage} {o_detail}")   # written for another)
            pytest.fail(f"{case.name}: exported model {stage}: {detail} (the original passes, so the round trip "
                        f"broke it)")
        return
    o_stage, _, o_out = ort_outcome(case.model, case)
    if o_stage == "pass":
        warnings.warn(f"known_failures.txt: '{case.name}' now passes on the original; remove the stale entry")
    if o_out is not None:  # ORT runs the original (numbers may differ from onnx's): the export must agree with it
        got = run_like_backend(session(exported), case.data_sets[0][0])
        assert_similar(o_out, got, case.rtol, case.atol, f"{case.name} export vs original in ORT")


def write_known_failures(path: str = KNOWN_FAILURES) -> dict:
    """Run every case's ORIGINAL model in onnxruntime and list those that do not pass, with the reason."""
    rows = []
    for c in _collect():
        stage, detail, _ = ort_outcome(c.model, c)
        if stage != "pass":
            rows.append((c.name, f"{stage}: {detail}"))
    from collections import Counter
    by_stage = Counter(r.split(":")[0] for _, r in rows)
    import onnxruntime
    with open(path, "w") as f:
        f.write("# ONNX node conformance cases that onnxruntime cannot run on the ORIGINAL model (not qcompiler bugs).\n"
                f"# Generated by `python -m tests.conformance.test_node_cases --write-known-failures` with onnx "
                f"{onnx.__version__}, onnxruntime {onnxruntime.__version__}.\n"
                "# Stages: load = InferenceSession refuses the model; run = session.run raises; feed = ORT's Python\n"
                "# API cannot pass/return the data type; mismatch = ORT runs it but its numbers differ from onnx's.\n"
                "# Counts: " + ", ".join(f"{k} {v}" for k, v in sorted(by_stage.items())) + f", total {len(rows)}\n")
        for name, reason in rows:
            f.write(f"{name} | {reason}\n")
    return dict(rows)


if __name__ == "__main__":
    if "--write-known-failures" in sys.argv:
        rows = write_known_failures()
        print(f"wrote {len(rows)} entries to {KNOWN_FAILURES}")
    else:
        print(__doc__)
