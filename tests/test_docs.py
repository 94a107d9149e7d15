"""The documentation a user reads: docs/cli.md is exactly what qcompiler/cli_reference.py writes from the commands
(so it cannot drift from the switch table), every file under docs/ is reachable from the README, and the README
stays short enough to read in five minutes."""
from __future__ import annotations

import os
import re

from qcompiler.cli_reference import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_CHARS = 8000      # about five minutes of reading


def _read(*parts) -> str:
    return open(os.path.join(ROOT, *parts), encoding="utf-8").read()


def test_cli_reference_is_generated():
    assert _read("docs", "cli.md") == reference(), \
        "docs/cli.md is stale: run `python -m qcompiler.cli_reference docs/cli.md`"


def test_cli_reference_lists_every_option_with_its_allowed_values():
    from qcompiler.cli import main
    text = reference()
    for name, cmd in main.commands.items():
        assert f"## qcompiler {name}" in text
        for p in cmd.params:
            for opt in (p.opts if p.param_type_name == "option" else []):
                if opt != "--help":
                    assert f"`{opt}" in text or f", {opt}" in text or f"/ {opt}" in text, (name, opt)
    assert "`--weight-bits {4,8,16}`" in text and "--min-sqnr" in text and "--allow-low-sqnr" in text
    assert "--verify-inputs" in text


def test_every_doc_is_linked_from_the_readme():
    readme = _read("README.md")
    docs = sorted(f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    missing = [f for f in docs if f"docs/{f}" not in readme]
    assert not missing, f"README does not link {missing}"


def test_readme_is_short_and_its_local_links_resolve():
    readme = _read("README.md")
    assert len(readme) <= README_MAX_CHARS, len(readme)
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)     # a command line may be long; the text is not
    assert max(len(line) for line in prose.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        if target.startswith("docs/") and not os.path.exists(os.path.join(ROOT, target)):
            # the topic guides other parts of the project add are linked by name before they land
            assert target in PLANNED_DOCS, f"README links {target}, which does not exist"
        elif not target.startswith("docs/"):
            assert os.path.exists(os.path.join(ROOT, target)), target


# topic guides written alongside the features they describe; linked from the README by these names
PLANNED_DOCS = {f"docs/{n}.md" for n in ("weight-only", "optimize", "debug", "safety-net", "html-report", "olive",
                                          "ir-speed")}


def test_every_quantization_pass_is_in_the_quantization_guide():
    """The pipeline tables of docs/quantization.md name every pass `qcompiler list-passes` shows for quantize."""
    from qcompiler.passmanager import available_passes
    from qcompiler.quant.core.pipeline import DEFAULT_PIPELINE
    text = _read("docs", "quantization.md")
    passes = available_passes()
    quant = {n for n, c in passes.items() if "quant-context" in getattr(c, "requires", ()) or getattr(c, "after", "")}
    missing = [n for n in sorted(set(DEFAULT_PIPELINE) | quant) if f"`{n}`" not in text]
    assert not missing, f"docs/quantization.md does not name {missing}"


def test_the_readme_first_run_works(tmp_path):
    """The README's install-and-first-run line, past the venv and pip steps, runs as written (in a fresh folder:
    the example model, its calibration data and the quantized model it writes)."""
    import shlex
    import subprocess
    import sys
    readme = _read("README.md")
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    line = next(b for b in blocks if "make_tiny_cnn.py" in b).strip()
    steps = [s.strip() for s in line.split("&&")]
    steps = [s for s in steps if not s.startswith(("python3 -m venv", ". ", "pip ", "source "))]
    assert any(s.startswith("qcompiler quantize") for s in steps), steps
    for step in steps:
        argv = shlex.split(step)
        if argv[0] == "python":
            argv = [sys.executable, os.path.join(ROOT, argv[1]), *argv[2:]]
        elif argv[0] == "qcompiler":
            argv = [sys.executable, "-m", "qcompiler", *argv[1:]]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, (step, r.stderr[-2000:])
    written = [a for s in steps for a in shlex.split(s) if a.endswith(".qdq.onnx")]
    assert written and all((tmp_path / w).exists() for w in written)
