"""Seeded protobuf mutants through `inspect`, `run` and `quantize`: exit 0 or 2 with one line, no traceback, no hang,
within the memory limit, no input changed (Tests).

Default: every mutation kind once (seed 0), on the small models built in mutants.py in turn, and each unmutated
source (a failure there is the source's, not the mutation's). `-m slow`: seeds 1..QC_HOSTILE_SEEDS
(default 4) over those and the shared corpus models, shardable with QC_SHARD=i/n (1-based, every n-th case from i,
as in tests/conformance/test_node_cases.py).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from tests.hostile.harness import problems, run_cli
from tests.hostile.mutants import BUILT, KINDS, OUTSIDE, SECRET, WEIGHTS_BIN, available_sources, mutant, source

PIPELINE = "canonicalize,fold-constants"


def _shard(cases: list) -> list:
    shard = os.environ.get("QC_SHARD", "")
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        cases = cases[i - 1::n]
    return cases


def _default() -> list:
    """Each kind once, on the built sources in turn (the next one where a kind does not apply)."""
    out, names = [], list(BUILT)
    for i, k in enumerate(KINDS):
        for j in range(len(names)):
            s = names[(i + j) % len(names)]
            if mutant(s, k, 0) is not None:
                out.append((s, k, 0))
                break
    return out


DEFAULT = _default()
SLOW = _shard([(s, k, seed) for seed in range(1, 1 + int(os.environ.get("QC_HOSTILE_SEEDS", "4")))
               for s in available_sources() for k in KINDS])


def _valid_output(path: str, cmd: str) -> "str | None":
    if not os.path.isfile(path):
        return f"{cmd} exited 0 but wrote no {os.path.basename(path)}"
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - any failure to parse is the finding
        return f"{cmd} exited 0 but its output does not parse: {type(e).__name__}: {str(e)[:120]}"
    if cmd == "quantize":
        import onnxruntime as ort
        try:
            ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001
            return f"quantize exited 0 but onnxruntime refuses its output: {str(e)[:160]}"
    return None


def run_mutant(tmp_path, src_name: str, kind: str, seed: int):
    """Write mutant (src_name, kind, seed) under tmp_path and run the three commands on it.

    Returns (mutant, [(command, Run, [problems])], [leftover files]); (None, [], []) where the kind does not apply."""
    outside = tmp_path / OUTSIDE
    mut = mutant(src_name, kind, seed, outside_abs=str(outside))
    if mut is None:
        return None, [], []
    src = source(src_name)
    d = tmp_path / "m"
    d.mkdir()
    outside.write_bytes(SECRET.tobytes())
    model = d / "model.onnx"
    model.write_bytes(mut.data)
    (d / WEIGHTS_BIN).write_bytes(src.weights + bytes(range(256)) * 16)
    for name in mut.dirs:
        (d / name).mkdir()
    for name in mut.fifos:
        os.mkfifo(d / name)
    if src.calib is not None:
        calib = tmp_path / "calib.npz"
        np.savez(calib, **src.calib)
    else:
        calib = src.calib_path
    out = tmp_path / "out"
    out.mkdir()
    cwd = tmp_path / "cwd"   # relative paths resolved against the working directory find nothing here
    cwd.mkdir()
    inputs = [d, outside, calib]
    refuse = (2,) if mut.must_refuse else None
    runs = [("inspect", ["inspect", model], None, (0, 2)),
            ("run", ["run", model, "-o", out / "run.onnx", "--pipeline", PIPELINE], out / "run.onnx", refuse or (0, 2)),
            ("quantize", ["quantize", model, "--calib", calib, "-o", out / "q.onnx", "--limit", "2"], out / "q.onnx",
             refuse or (0, 2, 3))]
    results = []
    for cmd, args, output, allowed in runs:
        r = run_cli(args, inputs=inputs, cwd=cwd)
        bad = problems(r, allowed)
        if r.rc == 0 and output is not None and not bad:
            bad += [p for p in [_valid_output(str(output), cmd)] if p]
        results.append((cmd, r, bad))
    wrote = {"run.onnx", "q.onnx"} | ({"run.onnx.data"} if results[1][1].rc == 0 else set())
    leftovers = [n for n in os.listdir(out) if n not in wrote]
    return mut, results, leftovers


def check_mutant(tmp_path, src_name: str, kind: str, seed: int) -> None:
    mut, results, leftovers = run_mutant(tmp_path, src_name, kind, seed)
    if mut is None:
        pytest.skip(f"{kind} does not apply to {src_name}")
    failures = [f"[{cmd}] " + "; ".join(bad) + "\n    " + r.describe().replace("\n", "\n    ")
                for cmd, r, bad in results if bad]
    if leftovers:
        failures.append(f"leftover files beside the outputs: {leftovers}")
    assert not failures, f"mutant {mut.id}: {mut.what}\n" + "\n".join(failures)


@pytest.mark.parametrize("src_name", list(BUILT))
def test_unmutated_source(tmp_path, src_name):
    check_mutant(tmp_path, src_name, "none", 0)


@pytest.mark.parametrize("src_name,kind,seed", DEFAULT, ids=[f"{s}-{k}" for s, k, _ in DEFAULT])
def test_mutant(tmp_path, src_name, kind, seed):
    check_mutant(tmp_path, src_name, kind, seed)


@pytest.mark.slow
@pytest.mark.parametrize("src_name,kind,seed", SLOW, ids=[f"{s}-{k}-s{n}" for s, k, n in SLOW])
def test_mutant_sweep(tmp_path, src_name, kind, seed):
    check_mutant(tmp_path, src_name, kind, seed)
