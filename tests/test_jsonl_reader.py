"""The JSONL reader against the obvious reference, line by line: ``json.loads`` of the line,
then the record checks (``get_field``, ``check_text``). The reader parses with orjson where
installed and takes the text of a plain record without those checks; on random records
(nested and dotted keys, duplicate keys, escapes, lone and paired surrogates, encoded
surrogates, invalid UTF-8, big numbers, NaN, deep nesting, non-objects, blank lines) what
it yields, what it skips (line and reason) and the error a user sees must be the
reference's."""

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.errors import PacktoolError
from packtool.sources import InputStats, ReadOptions, iter_documents
from packtool.sources.records import BadRecord, check_text, get_field

KEYS = ["text", "a", "b", "a.b", "meta"]
CHARS = st.one_of(
    st.characters(codec="utf-8", exclude_characters='"\\\n', exclude_categories=["Cs"]),
    st.sampled_from(["\\n", "\\t", '\\"', "\\\\", "\\/", "\\u00e9", "\\u4e2d", "\\ud83d\\ude00",
                     "\\ud800", "\\udfff", "\\ud800x", "\\q", "\t"]))


@st.composite
def json_string(draw) -> bytes:
    body = "".join(draw(st.lists(CHARS, max_size=12))).encode("utf-8")
    extra = draw(st.sampled_from([b"", b"", b"", b"\xed\xa0\x80", b"\xff", b"\xc3"]))
    return b'"' + body + extra + b'"'


SCALARS = st.one_of(
    json_string(),
    st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
    st.sampled_from([b"true", b"false", b"null", b"NaN", b"-Infinity", b"1e400", b"-0.0",
                     b"01", b"1.", b"[1,]"]))


def _obj(pairs) -> bytes:
    return b"{" + b",".join(json.dumps(k).encode() + b": " + v for k, v in pairs) + b"}"


VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: b"[" + b",".join(xs) + b"]"),
        st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=4).map(_obj)),
    max_leaves=12)

LINES = st.one_of(
    st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=5).map(_obj),  # duplicates too
    st.tuples(st.sampled_from(KEYS), json_string()).map(lambda kv: _obj([kv])),
    SCALARS.filter(lambda b: not b.startswith(b"[")),
    st.integers(1020, 1030).map(lambda n: b'{"text": "x", "d": ' + b"[" * n + b"]" * n + b"}"),
    st.sampled_from([b"", b"  ", b" \t\r", b'{"text": "a"', b'{"text": "a"} x']))


def reference(line: bytes, field: str):
    """``"blank"``, ``(text, None)`` or ``(None, BadRecord)`` of one line, by json.loads."""
    if line.isspace() or not line:
        return "blank"
    try:
        obj = json.loads(line)
    except UnicodeDecodeError as e:
        return None, BadRecord("invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})")
    except ValueError as e:
        return None, BadRecord("invalid_json", f"invalid JSON ({e})")
    except RecursionError:
        return None, BadRecord("too_deep", "JSON nested deeper than Python can parse "
                               f"(over {sys.getrecursionlimit():,} levels)")
    try:
        return check_text(get_field(obj, field), field), None
    except BadRecord as bad:
        return None, bad


def read(path, field: str, skip: bool):
    stats = InputStats(path=str(path), kind="jsonl")
    opts = ReadOptions(text_field=field, skip_bad_records=skip)
    return list(iter_documents(path, opts, stats)), stats


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINES, min_size=1, max_size=8), field=st.sampled_from(["text", "a.b"]))
def test_the_reader_is_json_loads_line_by_line(tmp_path_factory, lines, field):
    path = tmp_path_factory.mktemp("j") / "a.jsonl"
    path.write_bytes(b"\n".join([b'{"text": "first"}', *lines]) + b"\n")  # never an array
    # each line as read, with its newline (an error at the end of a line says "line 2")
    want = [reference(line + b"\n", field) for line in [b'{"text": "first"}', *lines]]
    texts, stats = read(path, field, skip=True)
    assert texts == [w[0] for w in want if w != "blank" and w[1] is None]
    bad = [(n, w[1]) for n, w in enumerate(want, 1) if w != "blank" and w[1] is not None]
    assert stats.skipped_records == [n for n, _ in bad]
    reasons: dict[str, int] = {}
    for _, b in bad:
        reasons[b.reason] = reasons.get(b.reason, 0) + 1
    assert stats.skipped == reasons
    assert stats.blank_lines == sum(w == "blank" for w in want)
    if bad:  # without --skip-bad-records: the first bad record, by file and line
        n, b = bad[0]
        with pytest.raises(PacktoolError) as e:
            read(path, field, skip=False)
        assert str(e.value) == f"{path} line {n}: {b.message}{b.hint()}"
