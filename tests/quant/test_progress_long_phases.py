"""Long phases (seq-mse, adaround, the mixed-precision search, the safety net) show a progress bar: in a log
each is whole lines (qcompiler/progress.py), with -q nothing."""
import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from qcompiler.cli import main
from tests.quant.test_safety_net_regions import outlier_weight_model


@pytest.fixture()
def files(tmp_path):
    m, x = outlier_weight_model()
    mp, dp = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(m, str(mp))
    np.savez(str(dp), x=x)
    return ["quantize", str(mp), "--calib", str(dp), "-o", str(tmp_path / "q.onnx"), "--allow-low-sqnr"]


@pytest.mark.parametrize("flags,bars", [(["--recipe", "seq-mse,adaround"], ["seq-mse: 100%", "adaround: 2layer"]),
                                        (["--max-drop", "5%"], ["mixed precision: "])])
def test_long_phases_show_bars_in_a_log_and_nothing_with_q(files, flags, bars):
    r = CliRunner().invoke(main, files + flags + ["--progress"])
    assert r.exit_code == 0, r.stderr
    for b in bars:
        assert any(line.startswith(b) for line in r.stderr.splitlines()), r.stderr
    assert "\r" not in r.stderr
    r = CliRunner().invoke(main, files + flags + ["--progress", "-q"])
    assert r.exit_code == 0 and r.stderr == ""
