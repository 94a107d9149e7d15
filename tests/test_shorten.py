"""One source for how untrusted values appear in messages (qcompiler/shorten.py): the modules that had their own
copy use it under their old names, and the formats the hostile suites pin are unchanged."""
import os
import stat

from qcompiler import arguments, cli, input_files, ort_session, shorten
from qcompiler.onnx_io import safe_write, tensor_check
from qcompiler.quant.settings import untrusted


def test_the_old_names_are_the_one_helper():
    assert tensor_check.short is shorten.short_text
    assert untrusted.short is shorten.short_value
    assert arguments.got is shorten.short_argument
    assert safe_write.show is shorten.short_path
    assert cli._one_line is shorten.one_line
    assert input_files.file_kind is safe_write.file_kind is shorten.file_kind


def test_formats():
    assert shorten.short_text("a\x1b[31m" + "x" * 100) == "a\\x1b[31m" + "x" * 74 + "..."
    assert shorten.short_text(b"n\xff") == "n\ufffd"
    assert shorten.short_value("k" * 70) == repr("k" * 60) + "..."
    assert shorten.short_value({"a": 1, "b": 2}) == "a mapping of 2 items"
    assert shorten.short_value(10 ** 40) == "an integer of 133 bits"
    assert shorten.short_argument(8.0) == "8.0" and shorten.short_argument("s" * 41) == "a str of 41 chars"
    assert shorten.short_argument([1]) == "a list"
    p = "/d" * 60 + "/name.onnx"
    shown = shorten.short_path(p)
    assert len(shown) <= 80 and shown.endswith("name.onnx") and "..." in shown
    line = shorten.one_line("first \x1b[0m " + "t" * 500 + "\nsecond")
    assert line.startswith("first \\x1b[0m ") and "second" not in line and len(line) < 220


def test_file_kinds(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    assert shorten.file_kind(os.stat(tmp_path).st_mode) == "a folder"
    assert shorten.file_kind(os.stat(fifo).st_mode) == "a FIFO"
    assert shorten.file_kind(os.stat("/dev/null").st_mode) == "a device"
    assert shorten.file_kind(stat.S_IFBLK) == "a device"
    assert shorten.file_kind(stat.S_IFREG) == "a file"


def test_one_check_for_leftovers_of_dead_processes():
    assert safe_write.pid_alive(os.getpid()) and ort_session._alive(os.getpid())
    assert not safe_write.pid_alive(2 ** 70) and not ort_session._alive(2 ** 70)
