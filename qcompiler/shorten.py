"""How an untrusted value appears in a one-line message: the one source of the shortening helpers.

Every message quotes at most ~80 characters of anything taken from the input, with control characters escaped
(a hostile model's names may hold terminal escapes). Each kind of value has its helper here; the modules that
used to carry their own copy re-export the one they use under its old name (`tensor_check.short`,
`untrusted.short`, `arguments.got`, `safe_write.show`), so messages keep their formats (tests/hostile and
tests/io pin them).

- `short_text(s)`: a name or string from a model or file, unquoted: `node 'x...'` (tensor_check.short)
- `short_value(v)`: a value parsed from a config, profile or encodings file, as its repr; containers by type and
  length only, never walked (untrusted.short)
- `short_key(k)`: a key of a config-like file inside a `where` path, unquoted (config._key)
- `short_argument(v)`: what an API caller passed: the type, plus a short repr of scalars and short strings
  (arguments.got)
- `short_path(p)`: a file path, shortened in the middle so both the folder and the file name show
  (safe_write.show)
- `one_line(msg)`: the CLI's last line of defence: the first line of any message, escapes as \\xNN, long tokens
  cut in the middle, at most MESSAGE_CHARS
- `did_you_mean(name, known)`: " (did you mean 'MatMul'?)" for a mistyped name, the nearest known one
- `file_kind(mode)`: what a path is when it is not a regular file ("a folder", "a FIFO", "a device", ...)
"""
from __future__ import annotations

import difflib
import re
import stat

TEXT_CHARS = 80        # short_text, short_path
VALUE_CHARS = 60       # short_value
ARGUMENT_CHARS = 40    # short_argument
MESSAGE_CHARS = 600    # one_line: a safety net: messages cut untrusted values themselves (~80 chars each)
TOKEN_CHARS = 160      # one_line: one run of non-blank characters (a 100k-character node name, a path): head...tail
_LONG_TOKEN = re.compile(r"\S{%d,}" % (TOKEN_CHARS + 1))


def _escaped(s: str) -> str:
    """Non-printable characters as their Python escapes (\\x1b, \\n, \\u200b)."""
    return s if s.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def short_text(s, limit: int = TEXT_CHARS) -> str:
    """At most `limit` characters of an untrusted string, non-printable characters escaped (for messages)."""
    if isinstance(s, bytes):
        s = s.decode("utf-8", "replace")
    s = str(s)
    cut = len(s) > limit
    s = _escaped(s[:limit])
    return s + "..." if cut else s


def short_value(v, n: int = VALUE_CHARS) -> str:
    """At most ~`n` characters describing `v`; containers by type and length only (never walked)."""
    if isinstance(v, (dict, list, tuple, set)):
        kind = {dict: "a mapping", list: "a list", tuple: "a list", set: "a set"}.get(type(v), type(v).__name__)
        return f"{kind} of {len(v)} item{'s' if len(v) != 1 else ''}"
    if isinstance(v, (str, bytes)):
        r = repr(v[:n + 1])
        return r if len(v) <= n else repr(v[:n]) + "..."
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10 ** 30:
        return f"an integer of {v.bit_length()} bits"
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)[:n]
    return type(v).__name__


def short_key(k, n: int = VALUE_CHARS) -> str:
    """A key of a config, profile or encodings file as part of a `where` path (`rules[0].weights.<key>`):
    unquoted when it is a string, at most `n` characters, control characters escaped."""
    return short_text(k, n) if isinstance(k, str) else short_value(k, n)


def short_argument(value) -> str:
    """What the caller passed, in a few words: the type, plus a short repr for scalars and short strings."""
    if isinstance(value, (bool, int, float)) or value is None:
        try:
            text = repr(value)
        except ValueError:   # an int past Python's digit limit for str()
            return "a huge int"
        return text if len(text) <= ARGUMENT_CHARS else f"a number of {len(text)} digits"
    if isinstance(value, str):
        return repr(value) if len(value) <= ARGUMENT_CHARS else f"a str of {len(value)} chars"
    return f"a {type(value).__name__}"


def short_path(path, keep: int = TEXT_CHARS) -> str:
    """A path fit for a one-line message: control characters escaped, long paths shortened in the middle."""
    text = _escaped(str(path))
    return text if len(text) <= keep else text[: keep // 2 - 2] + "..." + text[-(keep // 2 - 1):]


def _cut_token(m) -> str:
    t = m.group(0)
    return f"{t[:TOKEN_CHARS - 50]}...{t[-47:]}"


def one_line(msg) -> str:
    """The first line of `msg`, control characters (terminal escapes from a hostile model's names) shown as
    \\xNN, long tokens cut in the middle, at most MESSAGE_CHARS long."""
    try:
        text = str(msg)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails still gets its line
        text = type(msg).__name__
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    line = "".join(c if c.isprintable() or c == " " else f"\\x{ord(c):02x}" if ord(c) < 256 else "?" for c in line)
    line = _LONG_TOKEN.sub(_cut_token, line)
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 3] + "..."


def did_you_mean(name, known) -> str:
    """` (did you mean 'X'?)` naming the known name nearest to a mistyped `name` (the same letters in another
    case first, then the closest spelling), or "" when none is near."""
    if not isinstance(name, str):
        return ""
    known = [k for k in known if isinstance(k, str)]
    same_case = [k for k in known if k.lower() == name.lower()]
    if same_case:
        return f" (did you mean '{short_text(same_case[0])}'?)"
    lower = {k.lower(): k for k in known}
    near = difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=0.6)
    return f" (did you mean '{short_text(lower[near[0]])}'?)" if near else ""


def file_kind(mode: int) -> str:
    """What a file of this st_mode is, for "is X, not a regular file" messages."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISREG(mode):
        return "a file"
    return "not a regular file"


__all__ = ["short_text", "short_value", "short_key", "short_argument", "short_path", "one_line", "did_you_mean", "file_kind", "MESSAGE_CHARS"]
