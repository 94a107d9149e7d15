"""Calibration data loading: THE RULE for sample axes, validation errors, hostile files, corpus files."""
import os

import numpy as np
import pytest

from qcompiler.errors import DataError
from qcompiler.quant.calibration.data import input_specs, load_samples
from tests.corpus import CORPUS

SPEC = {"x": (np.float32, ("batch", 3, 4)), "ids": (np.int64, ("batch", None))}


def _npz(tmp_path, name="d.npz", **arrays):
    p = str(tmp_path / name)
    np.savez(p, **arrays)
    return p


def _ok_arrays(n=5):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((n, 1, 3, 4)).astype(np.float32), "ids": np.arange(n * 7).reshape(n, 1, 7)}


def test_rank_plus_one_indexes_samples(tmp_path):
    a = _ok_arrays()
    s = load_samples(_npz(tmp_path, **a), SPEC)
    feeds = list(s)
    assert len(s) == 5 and len(feeds) == 5
    assert feeds[2]["x"].shape == (1, 3, 4) and np.array_equal(feeds[2]["x"], a["x"][2])
    assert feeds[4]["ids"].shape == (1, 7)


def test_rank_r_is_sample_and_batch_axis(tmp_path):
    a = _ok_arrays()
    s = load_samples(_npz(tmp_path, x=a["x"][:, 0], ids=a["ids"][:, 0]), SPEC)
    feeds = list(s)
    assert len(feeds) == 5 and feeds[3]["x"].shape == (1, 3, 4)
    assert np.array_equal(feeds[3]["x"], a["x"][3])


def test_rank_r_with_static_batch_above_one_is_refused(tmp_path):
    p = _npz(tmp_path, x=np.zeros((4, 3, 4), np.float32))
    with pytest.raises(DataError, match="batch dim is 4"):
        load_samples(p, {"x": (np.float32, (4, 3, 4))})


def test_folder_sorted_and_limit(tmp_path):
    a, b = _ok_arrays(3), _ok_arrays(4)
    b["x"] += 100
    _npz(tmp_path, "b.npz", **b)
    _npz(tmp_path, "a.npz", **a)
    s = load_samples(str(tmp_path), SPEC)
    feeds = list(s)
    assert len(s) == 7 and np.array_equal(feeds[3]["x"], b["x"][0])
    assert len(load_samples(str(tmp_path), SPEC, limit=2)) == 2
    assert len(list(load_samples(str(tmp_path), SPEC, limit=2))) == 2


def test_iterable_of_dicts_one_feed_each():
    a = _ok_arrays(3)
    dicts = [{"x": a["x"][i][None], "ids": a["ids"][i]} for i in range(3)]  # rank r+1 with 1, and rank r
    s = load_samples(dicts, SPEC)
    feeds = list(s)
    assert len(s) == 3 and feeds[1]["ids"].shape == (1, 7) and feeds[1]["x"].shape == (1, 3, 4)
    gen = load_samples((d for d in dicts), SPEC)
    assert gen.length is None and len(list(gen)) == 3
    with pytest.raises(TypeError):
        len(gen)


def test_labels_ignored_and_safe_casts_noted(tmp_path):
    a = _ok_arrays()
    p = _npz(tmp_path, x=a["x"].astype(np.float64), ids=a["ids"].astype(np.int32), labels=np.arange(5))
    s = load_samples(p, SPEC)
    f = next(iter(s))
    assert f["x"].dtype == np.float32 and f["ids"].dtype == np.int64 and "labels" not in f
    assert any("float64 to float32" in n for n in s.notes) and any("int32 to int64" in n for n in s.notes)


@pytest.mark.parametrize("change, match", [
    (lambda a: a.pop("ids"), "missing input 'ids'"),
    (lambda a: a.update(extra=np.zeros(5)), "unknown key 'extra'.*model inputs: x, ids"),
    (lambda a: a.update(x=a["x"].astype(np.float16)), "input 'x': dtype float16, the model expects float32"),
    (lambda a: a.update(ids=a["ids"].astype(np.uint8)), "input 'ids': dtype uint8"),
    (lambda a: a.update(x=np.zeros((5, 1, 3, 5), np.float32)), "input 'x': dim 2 is 5, the model expects 4"),
    (lambda a: a.update(x=np.zeros((5, 1, 1, 3, 4), np.float32)), "input 'x': rank 5"),
    (lambda a: a.update(ids=a["ids"][:4]), r"different sample counts \('x': 5, 'ids': 4\)"),
    (lambda a: a.update(x=np.zeros((0, 1, 3, 4), np.float32), ids=a["ids"][:0]), "empty sample set"),
])
def test_validation_errors_are_one_line(tmp_path, change, match):
    a = _ok_arrays()
    change(a)
    p = _npz(tmp_path, **a)
    with pytest.raises(DataError, match=match) as ei:
        load_samples(p, SPEC)
    assert "\n" not in str(ei.value) and "d.npz" in str(ei.value)


def test_nan_and_inf_name_the_sample(tmp_path):
    a = _ok_arrays()
    a["x"][3, 0, 1, 2] = np.nan
    s = load_samples(_npz(tmp_path, **a), SPEC)
    it = iter(s)
    for _ in range(3):
        next(it)
    with pytest.raises(DataError, match="input 'x' sample 3: contains NaN"):
        next(it)
    b = _ok_arrays()
    b["x"][1, 0, 0, 0] = np.inf
    with pytest.raises(DataError, match="sample 1: contains Inf"):
        list(load_samples(_npz(tmp_path, "e.npz", **b), SPEC))


def test_hostile_files(tmp_path):
    a = _ok_arrays()
    p = str(tmp_path / "obj.npz")
    np.savez(p, x=np.array([None] * 5, dtype=object), ids=a["ids"])
    with pytest.raises(DataError, match="object arrays"):
        load_samples(p, SPEC)
    good = _npz(tmp_path, "good.npz", **a)
    data = open(good, "rb").read()
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="trunc.npz: not a readable .npz"):
        load_samples(str(trunc), SPEC)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match="junk.npz"):
        load_samples(str(junk), SPEC)
    with pytest.raises(DataError, match="no such file"):
        load_samples(str(tmp_path / "nope.npz"), SPEC)
    os.mkdir(tmp_path / "empty")
    with pytest.raises(DataError, match="no .npz files"):
        load_samples(str(tmp_path / "empty"), SPEC)


def test_corrupted_member_data_is_a_data_error(tmp_path):
    a = {"x": np.ones((5, 1, 3, 4), np.float32), "ids": np.ones((5, 1, 7), np.int64)}
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, **a)
    raw = bytearray(open(p, "rb").read())
    mid = len(raw) // 3
    raw[mid:mid + 8] = b"\xff" * 8  # corrupt deflate data / CRC, keep the zip directory intact
    (tmp_path / "c.npz").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="c.npz"):
        s = load_samples(p, SPEC)
        list(s)


def test_empty_iterable():
    with pytest.raises(DataError, match="empty sample set"):
        list(load_samples([], SPEC))


@pytest.mark.parametrize("name", ["minilm_l6", "digits_cnn", "char_rnn", "ppocr_cls"])
def test_corpus_calibration_files(name):
    folder = os.path.join(CORPUS, name)
    if not os.path.exists(f"{folder}/model.onnx"):
        pytest.skip("corpus not available")
    import qcompiler
    model = qcompiler.load_model(f"{folder}/model.onnx")
    specs = input_specs(model.graph)
    s = load_samples(f"{folder}/calib.npz", specs, limit=4)
    feeds = list(s)
    assert len(feeds) == 4
    from tests.helpers import run
    out = run(model, feeds[0])
    assert np.all(np.isfinite(out[0]))


def test_npz_header_claiming_a_huge_shape_is_refused_before_allocating(tmp_path):
    import io
    import zipfile
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 6, 10 ** 6)})
    buf.write(b"\0" * 64)
    path = tmp_path / "hostile.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", buf.getvalue())
    with pytest.raises(DataError, match=r"hostile.npz: key 'x': header claims shape"):
        load_samples(str(path), {"x": (np.float32, ("batch", 4))})
