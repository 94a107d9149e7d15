"""Hostile calibration data: FIFOs and devices refused not hung on, samples read one by one.

Every .npz (and every member of a calibration folder) is opened through input_files.open_regular; members are
streamed sample by sample (data._NpzSamples), so `--limit 2` on a member that inflates to 1.6 GB reads two
samples, under an address-space limit smaller than the member.
"""
import os
import subprocess
import time
import zipfile

import numpy as np
import pytest

from qcompiler.errors import DataError
from qcompiler.quant.calibration import data as data_mod
from qcompiler.quant.calibration.data import load_samples

from .hostile_common import assert_one_line, quantize_cli, run_cli_subprocess, sha, tiny_cnn

SPEC = {"image": (np.dtype(np.float32), ("batch", 3, 16, 16))}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_cnn(str(tmp_path_factory.mktemp("calib")))


def _write_member(zf, name, shape, dtype="<f4", fill=None, chunk=1 << 22, fortran=False):
    """Write an .npy member of `shape` chunk by chunk (zeros, or `fill` bytes) without building the array."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, {"descr": dtype, "fortran_order": fortran, "shape": shape})
        left = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if fill is not None:
            f.write(fill)
            return
        zeros = bytes(chunk)
        while left > 0:
            n = min(left, chunk)
            f.write(zeros[:n])
            left -= n


def _child(tiny, tmp_path, calib, *extra, mem=None, timeout=60):
    try:
        return run_cli_subprocess(["quantize", tiny[0], "--calib", calib, "-o", tmp_path / "o.onnx", *extra],
                                  timeout=timeout, mem_bytes=mem)
    except subprocess.TimeoutExpired:
        pytest.fail(f"quantize hung on {calib}")


def test_fifo_member_of_a_folder_is_refused_not_hung_on(tiny, tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    np.savez(folder / "a.npz", image=np.zeros((2, 1, 3, 16, 16), np.float32))
    os.mkfifo(folder / "b.npz")
    code, _, err = _child(tiny, tmp_path, folder)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "b.npz" in lines[0] and "FIFO" in lines[0], err


def test_fifo_as_calib_is_refused_not_hung_on(tiny, tmp_path):
    os.mkfifo(tmp_path / "c.npz")
    code, _, err = _child(tiny, tmp_path, tmp_path / "c.npz")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "c.npz" in lines[0] and "FIFO" in lines[0], err


def test_devices_and_folders_as_members(tiny, tmp_path):
    assert_one_line(quantize_cli(tiny[0], "/dev/zero", tmp_path / "o.onnx"), "/dev/zero", "device")
    folder = tmp_path / "set"
    folder.mkdir()
    np.savez(folder / "a.npz", image=np.zeros((2, 1, 3, 16, 16), np.float32))
    os.symlink("/dev/zero", folder / "b.npz")
    assert_one_line(quantize_cli(tiny[0], folder, tmp_path / "o.onnx"), "b.npz", "device")
    os.unlink(folder / "b.npz")
    (folder / "c.npz").mkdir()
    assert_one_line(quantize_cli(tiny[0], folder, tmp_path / "o.onnx"), "c.npz", "folder")


def test_member_inflating_to_1_6_gb_read_two_samples_under_a_memory_limit(tiny, tmp_path):
    n = (1600 << 20) // (3 * 16 * 16 * 4)              # 1.6 GB of float32 zeros
    big = tmp_path / "big.npz"
    with zipfile.ZipFile(big, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        _write_member(zf, "image", (n, 1, 3, 16, 16))
    assert os.path.getsize(big) < 64 << 20
    before = sha(big)
    t = time.perf_counter()
    code, out, err = _child(tiny, tmp_path, big, "--limit", "2", mem=int(1.5 * (1 << 30)), timeout=120)
    assert code in (0, 3), err   # 3: all-zero samples put the output below the SQNR floor
    assert "wrote" in out and time.perf_counter() - t < 60
    assert sha(big) == before


def test_samples_read_one_by_one_match_numpy(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.random((7, 1, 3, 16, 16)).astype(np.float32)
    for comp in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        p = tmp_path / f"s{comp}.npz"
        with zipfile.ZipFile(p, "w", comp) as zf:
            with zf.open("image.npy", "w") as f:
                np.lib.format.write_array(f, a)
        got = list(load_samples(str(p), SPEC))
        assert len(got) == 7 and all(np.array_equal(g["image"], a[i]) for i, g in enumerate(got))
        got = list(load_samples(str(p), SPEC, limit=2))
        assert len(got) == 2 and got[1]["image"].flags.writeable
    # rank r: samples along the batch axis; Fortran order read whole (small)
    p = tmp_path / "r.npz"
    np.savez(p, image=np.asfortranarray(a[:, 0]))
    got = list(load_samples(str(p), SPEC))
    assert got[3]["image"].shape == (1, 3, 16, 16) and np.array_equal(got[3]["image"][0], a[3, 0])


def test_only_the_needed_bytes_are_read(tmp_path, monkeypatch):
    p = tmp_path / "s.npz"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
        _write_member(zf, "image", (5000, 1, 3, 16, 16))    # 61 MB of zeros
    reads = []
    real = data_mod._NpzSamples._read

    def counting(self, st, key, n):
        reads.append(n)
        return real(self, st, key, n)
    monkeypatch.setattr(data_mod._NpzSamples, "_read", counting)
    assert len(list(load_samples(str(p), SPEC, limit=3))) == 3
    assert sum(reads) == 3 * 3 * 16 * 16 * 4


def test_sample_and_fortran_bounds(tmp_path, monkeypatch):
    p = tmp_path / "s.npz"
    np.savez(p, image=np.zeros((4, 1, 3, 16, 16), np.float32))
    monkeypatch.setattr(data_mod, "MAX_SAMPLE_BYTES", 1000)
    with pytest.raises(DataError, match="s.npz: input 'image': one sample is 3072 bytes"):
        list(load_samples(str(p), SPEC))
    monkeypatch.setattr(data_mod, "MAX_SAMPLE_BYTES", 1 << 30)
    monkeypatch.setattr(data_mod, "MAX_FORTRAN_BYTES", 1000)
    np.savez(p, image=np.asfortranarray(np.zeros((4, 3, 16, 16), np.float32)))
    with pytest.raises(DataError, match="Fortran order"):
        list(load_samples(str(p), SPEC))


def test_truncated_and_corrupt_member_data(tmp_path):
    good = tmp_path / "g.npz"
    with zipfile.ZipFile(good, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("image.npy", "w") as f:
            np.lib.format.write_array(f, np.random.default_rng(0).random((50, 1, 3, 16, 16)).astype(np.float32))
    raw = bytearray(good.read_bytes())
    raw[200:260] = b"\xff" * 60                          # inside the deflated data
    bad = tmp_path / "b.npz"
    bad.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="b.npz") as ei:
        list(load_samples(str(bad), SPEC))
    assert "\n" not in str(ei.value)


def test_no_pickle_ever(tmp_path):
    p = tmp_path / "o.npz"
    with zipfile.ZipFile(p, "w") as zf:
        _write_member(zf, "image", (2,), dtype="|O", fill=b"\x80\x04N." + bytes(12))
    with pytest.raises(DataError, match="object arrays"):
        load_samples(str(p), {"image": (None, None)})
