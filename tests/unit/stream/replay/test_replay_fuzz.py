"""Fuzzed log files into the replay parsers: every data line gives exactly one row or one
clear, line-numbered error; nothing crashes, whatever the bytes.

Lines are drawn from a mix of well-formed rows, near misses (wrong field counts, bad numbers,
out-of-range times) and arbitrary bytes, so both the accept and the reject paths are hit.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stream.replay.formats import read_rows
from stream.replay.runner import ReplayOptions, ReplayReport, ReplaySource, build_plan
from streamrec.settings import DEFAULT_EVENT_WEIGHTS

NOW_MS = 1_750_000_000_000
TYPES = list(DEFAULT_EVENT_WEIGHTS)
FUZZ = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)

#: Bytes that never split a line (the readers split on b"\n" only).
garbage_line = st.binary(max_size=80).map(lambda b: b.replace(b"\n", b""))
text_line = st.text(max_size=60).map(lambda t: t.replace("\n", "").encode("utf-8", "surrogatepass"))
ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r,\t:"),
    min_size=0,
    max_size=140,
)
epoch_s = st.integers(min_value=-10**12, max_value=10**13)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers().map(str), st.text(max_size=8)
)


def _sep_line(sep: str) -> st.SearchStrategy[bytes]:
    row = st.tuples(ids, ids, numbers, st.one_of(epoch_s.map(str), numbers)).map(
        lambda t: sep.join(t).encode("utf-8", "surrogatepass")
    )
    short = st.lists(ids, max_size=6).map(lambda p: sep.join(p).encode())
    return st.one_of(row, short, garbage_line, text_line)


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
event_like = st.fixed_dictionaries(
    {"user_id": st.one_of(ids, json_values), "item_id": st.one_of(ids, json_values)},
    optional={
        "event_type": st.one_of(st.sampled_from(TYPES), st.text(max_size=10)),
        "ts": st.one_of(epoch_s, st.floats(), st.text(max_size=30), json_values),
        "value": json_values,
        "context": json_values,
        "event_id": st.one_of(ids, json_values),
        "extra": json_values,
    },
)
ndjson_line = st.one_of(
    event_like.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    garbage_line,
    text_line,
)
csv_line = st.lists(
    st.one_of(ids, numbers, epoch_s.map(str), st.text(max_size=10).map(lambda t: f'"{t}'))
    , max_size=6
).map(lambda cells: ",".join(c.replace("\n", "") for c in cells).encode("utf-8", "surrogatepass"))

#: (format, file name, header line or None, line strategy, mapping)
CASES: dict[str, tuple[str, bytes | None, st.SearchStrategy[bytes], dict[str, str]]] = {
    "movielens": ("ratings.csv", b"userId,movieId,rating,timestamp", _sep_line(","), {}),
    "ml-1m": ("ratings.dat", None, _sep_line("::"), {}),
    "ml-100k": ("u.data", None, _sep_line("\t"), {}),
    "ndjson": ("events.ndjson", None, ndjson_line, {}),
    "csv": (
        "clicks.csv",
        b"uid,sku,time,val,kind",
        csv_line,
        {"user_id": "uid", "item_id": "sku", "ts": "time", "value": "val", "event_type": "kind"},
    ),
}


def _one_line(raw: bytes) -> bytes:
    return raw.replace(b"\n", b"")


def _data_lines(header: bytes | None, lines: list[bytes]) -> list[int]:
    """1-based numbers of the lines a reader must account for (non-blank, not the header)."""
    first = 2 if header is not None else 1
    return [n for n, line in enumerate(lines, start=first) if line.strip()]


def _write(directory: Path, name: str, header: bytes | None, lines: list[bytes]) -> Path:
    path = directory / name
    path.write_bytes(b"\n".join(([header] if header is not None else []) + lines) + b"\n")
    return path


def _check_rows(fmt: str, path: Path, mapping: dict[str, str], expect: list[int]) -> list[Any]:
    rows = list(read_rows(path, fmt, mapping))
    assert [r.line_no for r in rows] == expect
    for row in rows:
        assert (row.event is None) != (row.error is None), row
        if row.error is not None:
            assert isinstance(row.error, str) and row.error.strip(), row
        else:
            assert isinstance(row.event, dict) and row.event.get("event_id") is not None, row
    return rows


def _check_plan(path: Path, fmt: str, mapping: dict[str, str], rows: list[Any]) -> None:
    report = ReplayReport()
    plan = build_plan([ReplaySource(path, fmt)], ReplayOptions(mapping=mapping), TYPES, NOW_MS,
                      report)
    assert report.planned == len(plan)
    assert report.planned + report.rejected_total + report.filtered == len(rows)
    bad_lines = {r.line_no for r in rows if r.error is not None}
    shown = {m["line"] for m in report.malformed}
    assert len(report.malformed) == min(10, report.rejected_total)
    assert all(m["file"] == path.name and m["reason"].strip() for m in report.malformed)
    assert shown <= {r.line_no for r in rows}
    for ts, _, line_no, key, value in plan:
        event = json.loads(value)
        assert event["ts"] == ts and key == event["user_id"].encode()
        assert line_no not in bad_lines


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_fuzzed_files_give_one_row_or_error_per_line(fmt: str) -> None:
    name, header, line, mapping = CASES[fmt]

    @FUZZ
    @given(lines=st.lists(line.map(_one_line), min_size=1, max_size=20))
    def run(lines: list[bytes]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = _write(Path(tmp), name, header, lines)
            rows = _check_rows(fmt, path, mapping, _data_lines(header, lines))
            _check_plan(path, fmt, mapping, rows)

    run()


def test_fuzz_reaches_both_accepted_and_rejected_rows(tmp_path: Path) -> None:
    """The generators are not all-garbage: a fixed mixed file plans some rows, rejects others."""
    name, header, _, mapping = CASES["movielens"]
    lines = [b"1,31,2.5,1260759144", b"1,31,abc,1260759144", b"\xff\xfe", b"1,2,3", b"2,5,4.5,1e9"]
    path = _write(tmp_path, name, header, lines)
    rows = _check_rows("movielens", path, mapping, _data_lines(header, lines))
    report = ReplayReport()
    plan = build_plan([ReplaySource(path, "movielens")], ReplayOptions(), TYPES, NOW_MS, report)
    assert [p[2] for p in plan] == [6, 2]  # event-time order: 1e9 s comes first
    assert sorted(m["line"] for m in report.malformed) == [3, 4, 5]
    assert {m["line"]: m["reason"] for m in report.malformed}[4] .startswith("not UTF-8")
    assert len(rows) == 5


@pytest.mark.parametrize("fmt", ["ndjson", "csv"])
def test_invalid_utf8_and_nul_bytes_are_per_line_errors(tmp_path: Path, fmt: str) -> None:
    name, header, _, mapping = CASES[fmt]
    good = (b'{"user_id": "u", "item_id": "i", "event_type": "click", "ts": 1700000000}'
            if fmt == "ndjson" else b"u,i,1700000000,1.0,click")
    lines = [good, b"\xc3\x28\xa0\xa1", b"u\x00,i,\x00,,", good]
    path = _write(tmp_path, name, header, lines)
    rows = _check_rows(fmt, path, mapping, _data_lines(header, lines))
    offset = 1 if header is not None else 0
    assert [r.line_no for r in rows if r.event is not None][0] == 1 + offset
    assert rows[1].error and rows[1].line_no == 2 + offset


def test_deeply_nested_ndjson_line_is_a_per_line_error(tmp_path: Path) -> None:
    lines = [b"[" * 100_000 + b"]" * 100_000,
             b'{"user_id": "u", "item_id": "i", "event_type": "click", "ts": 1700000000}']
    path = _write(tmp_path, "deep.ndjson", None, lines)
    rows = list(read_rows(path, "ndjson"))
    assert rows[0].error and rows[1].event is not None


def test_non_utf8_csv_header_is_a_format_error(tmp_path: Path) -> None:
    from stream.replay.formats import ReplayFormatError

    path = _write(tmp_path, "clicks.csv", b"\xffuid,sku,time", [b"u,i,1700000000"])
    with pytest.raises(ReplayFormatError):
        list(read_rows(path, "csv", {"user_id": "uid", "item_id": "sku", "ts": "time"}))


_FLAT_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=6),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(
    members=st.lists(st.tuples(st.sampled_from(["a", "b", "ts", 'q"', "\\", "é"]), _FLAT_VALUES),
                     max_size=5),
    spaces=st.sampled_from(["", " ", "\t"]),
)
@example(members=[("a", -(2**63) - 1)], spaces="")  # beyond 64 bits orjson reads a float
@example(members=[("a", 2**64)], spaces="")
@example(members=[("a", 2**64 - 1)], spaces="")
def test_the_flat_ndjson_fast_path_decodes_as_loads_strict(members: list[Any], spaces: str) -> None:
    """Objects written with duplicate keys, nesting, escapes, NaN and big numbers: the fast
    path returns exactly what ``loads_strict`` returns, or leaves the line to it (None); it
    never accepts a line ``loads_strict`` rejects."""
    from stream.replay.formats import _loads_flat
    from stream.schema import loads_strict

    body = f",{spaces}".join(f"{json.dumps(k)}{spaces}:{spaces}{json.dumps(v)}" for k, v in members)
    raw = ("{" + spaces + body + "}").encode()
    try:
        want: Any = loads_strict(raw)
    except ValueError:
        want = ValueError
    got = _loads_flat(raw)
    if got is not None:
        assert want is not ValueError and got == want
        assert [type(v) for v in got.values()] == [type(v) for v in want.values()]


def test_the_flat_fast_path_takes_the_common_lines() -> None:
    from stream.replay.formats import _loads_flat

    line = b'{"user_id":"u1","item_id":"i9","event_type":"click","ts":1704067200001,"value":4.5}'
    assert _loads_flat(line) == json.loads(line)
    assert _loads_flat(b'{"user_id":"u1","user_id":"u2"}') is None  # duplicate key
    assert _loads_flat(b'{"user_id":"u1","ts":NaN}') is None
