"""Property-based fuzzing of the data loaders: corrupt a valid file, never get wrong data silently.

For every format a small valid copy is written by ``fedrec.envs.datasets.synthetic``; Hypothesis
then corrupts one of its files (a field replaced by a big, negative, fractional, infinite, NaN,
underscored, empty or non-ASCII value; a separator added or removed; a keyed row duplicated; the
file cut at a byte; a blank line inserted; a byte re-encoded) and the loader must either give
exactly the data of the clean copy (harmless corruptions) or raise a ``ValueError`` naming the
file and the line. Two outcomes are exempt, as docs/datasets.md ("What the loaders check")
documents: a value that is valid for its field (``-7`` as a latitude) and a file cut at a line end
or inside a final field of free width (a price, a genre list) load without error.

``HYPOTHESIS_PROFILE=long`` (see tests/conftest.py) runs the long campaign.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrec.envs.datasets import formats
from fedrec.envs.datasets.synthetic import (
    synthetic_log,
    write_atomic,
    write_foursquare_nyc,
    write_lastfm2k,
    write_ml1m,
    write_ml100k,
    write_ml_csv,
    write_taobao,
)

#: Examples per format under the default ``ci`` profile; ``long`` uses the profile's count.
CI_EXAMPLES = 120


def _examples() -> int:
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
        return CI_EXAMPLES
    return max(CI_EXAMPLES, settings().max_examples)


# ---------------------------------------------------------------------------------------------
# What each field may hold (written independently of the loaders' own rules)

Domain = (
    tuple  # ("int", low, high) | ("float", low, high, step) | ("match", regex) | ("free", used)
)

INT64 = 2**63 - 1
ID: Domain = ("int", 0, INT64)
SECONDS: Domain = ("int", 788_918_400, 4_102_444_799)
UNUSED: Domain = ("free", False)  # parsed but not part of the loaded data (titles, zip codes)
USED_TEXT: Domain = ("free", True)  # any text, used as a categorical code
FLAG: Domain = ("int", 0, 1)
STARS: Domain = ("float", 1, 5, 1)  # a number, a whole one from 1 to 5
_INT = re.compile(r" *-?[0-9]+ *")
_FLOAT = re.compile(r" *[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)? *")


def valid_for(domain: Domain, text: str) -> bool:
    """Whether ``text`` is a valid value of a field with ``domain``."""
    kind = domain[0]
    if kind == "int":
        return bool(_INT.fullmatch(text)) and domain[1] <= int(text) <= domain[2]
    if kind == "float":
        if not _FLOAT.fullmatch(text):
            return False
        value = float(text)
        step = domain[3]
        return (
            value == value
            and abs(value) != float("inf")
            and domain[1] <= value <= domain[2]
            and (step is None or (value / step).is_integer())
        )
    if kind == "match":
        return bool(re.fullmatch(domain[1], text.strip()))
    return True


@dataclass(frozen=True)
class FileCase:
    """One file of a format: its layout and the domain of each field."""

    name: str
    sep: bytes
    domains: tuple[Domain, ...]
    header: int = 0
    keyed: bool = False
    encoding: str = "utf-8"
    #: a cut inside the last line's final field may go unnoticed (a field of free width)
    free_last: bool = False


@dataclass(frozen=True)
class Format:
    id: str
    write: Callable[[Path], object]
    load: Callable[[Path], object]
    files: tuple[FileCase, ...]


LOG = synthetic_log(num_users=7, num_items=30, min_per_user=3, max_per_user=6, sparse_users=1)
OCCUPATIONS = "|".join(formats.ML100K_OCCUPATIONS)
GENRE = "(?:" + "|".join(re.escape(g) for g in formats.ML1M_GENRES) + ")"
HEX24 = ("match", "[0-9a-fA-F]{24}")
LASTFM_MS: Domain = ("int", -2_208_988_800_000, 4_102_444_799_999)

FORMATS = (
    Format(
        "ml-100k",
        lambda d: write_ml100k(d, LOG),
        formats.load_ml100k,
        (
            FileCase("u.data", b"\t", (ID, ID, STARS, SECONDS)),
            FileCase(
                "u.user",
                b"|",
                (ID, ("int", 0, 150), ("match", "M|F"), ("match", OCCUPATIONS), UNUSED),
                keyed=True,
                free_last=True,
            ),
            FileCase(
                "u.item", b"|", (ID, *[UNUSED] * 4, *[FLAG] * 19), keyed=True, encoding="latin-1"
            ),
        ),
    ),
    Format(
        "ml-1m",
        lambda d: write_ml1m(d, LOG),
        formats.load_ml1m,
        (
            FileCase("ratings.dat", b"::", (ID, ID, STARS, SECONDS)),
            FileCase(
                "users.dat",
                b"::",
                (ID, ("match", "M|F"), ("int", 0, 150), ("int", 0, 20), UNUSED),
                keyed=True,
                free_last=True,
            ),
            FileCase(
                "movies.dat",
                b"::",
                (ID, UNUSED, ("match", rf"{GENRE}(?:\|{GENRE})*")),
                keyed=True,
                encoding="latin-1",
                free_last=True,
            ),
        ),
    ),
    Format(
        "ml-20m",
        lambda d: write_ml_csv(d, LOG),
        formats.load_ml_csv,
        (FileCase("ratings.csv", b",", (ID, ID, ("float", 0.5, 5, 0.5), SECONDS), header=1),),
    ),
    Format(
        "lastfm-2k",
        lambda d: write_lastfm2k(d, LOG),
        formats.load_lastfm2k,
        (
            FileCase("user_taggedartists-timestamps.dat", b"\t", (ID, ID, ID, LASTFM_MS), header=1),
            FileCase("user_artists.dat", b"\t", (ID, ID, ID), header=1, keyed=True, free_last=True),
        ),
    ),
    Format(
        "foursquare-nyc",
        lambda d: write_foursquare_nyc(d, synthetic_log(num_users=7, seed=1, start=1_333_476_009)),
        formats.load_foursquare_nyc,
        (
            FileCase(
                "dataset_TSMC2014_NYC.txt",
                b"\t",
                (
                    ID,
                    HEX24,
                    HEX24,
                    UNUSED,
                    ("float", -90, 90, None),
                    ("float", -180, 180, None),
                    ("int", -720, 840),
                    ("match", r"[A-Z][a-z]{2} [A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d \+0000 \d{4}"),
                ),
            ),
        ),
    ),
    Format(
        "atomic",
        lambda d: write_atomic(d, "ml-100k", LOG),
        lambda d: formats.load_atomic(d, "ml-100k", **formats.MOVIELENS_ATOMIC),
        (
            FileCase(
                "ml-100k.inter",
                b"\t",
                (ID, ID, ("float", 0.5, 5, None), ("float", 788_918_400, 4_102_444_799, None)),
                header=1,
            ),
            FileCase(
                "ml-100k.user",
                b"\t",
                (ID, ID, ("match", "M|F"), USED_TEXT, UNUSED),
                header=1,
                keyed=True,
                free_last=True,
            ),
            FileCase(
                "ml-100k.item",
                b"\t",
                (ID, UNUSED, USED_TEXT, USED_TEXT),
                header=1,
                keyed=True,
                free_last=True,
            ),
        ),
    ),
    Format(
        "taobao",
        lambda d: write_taobao(d, num_users=8, num_ads=12, impressions_per_user=(2, 5)),
        formats.load_taobao,
        (
            FileCase(
                "raw_sample.csv",
                b",",
                (ID, SECONDS, ID, ("match", "430548_1007|430539_1007"), FLAG, FLAG),
                header=1,
            ),
            FileCase(
                "ad_feature.csv",
                b",",
                (ID, ID, ID, ID, ("match", "NULL|[0-9]+"), ("float", 0, float("inf"), None)),
                header=1,
                keyed=True,
                free_last=True,
            ),
            FileCase(
                "user_profile.csv",
                b",",
                (ID, *[("match", "[0-9]*")] * 8),
                header=1,
                keyed=True,
                free_last=True,
            ),
        ),
    ),
)

#: Field replacements: out of range for ids, times and most numbers; some are valid elsewhere.
VALUES = (
    "10000000000000000000",
    "9223372036854775808",
    "-10000000000000000000",
    "-7",
    "3.7",
    "1e30",
    "inf",
    "-inf",
    "nan",
    "1_000",
    "",
    " ",
    "é",
    "\u0661\u0662",  # Arabic-Indic digits, which int() accepts
    "0x1F",
    "+5",
)


# ---------------------------------------------------------------------------------------------
# Corruptions


@dataclass
class Outcome:
    """What loading the corrupted copy must do: equal the clean data, raise, or either."""

    expect: str  # "equal" | "raise" | "any"
    lines: tuple[int, ...] = ()  # where the error may be reported (empty: any line)
    what: str = ""


def _split(data: bytes) -> list[bytes]:
    """Lines without their ``\\n`` (a ``\\r`` stays on the line)."""
    return data.split(b"\n")


def _data_rows(case: FileCase, lines: list[bytes]) -> list[int]:
    return [i for i in range(case.header, len(lines)) if lines[i].rstrip(b"\r")]


def _eol(lines: list[bytes]) -> bytes:
    return b"\r" if lines[0].endswith(b"\r") else b""


def corrupt_field(draw, case: FileCase, data: bytes) -> tuple[bytes, Outcome]:
    lines = _split(data)
    index = draw(st.sampled_from(_data_rows(case, lines)))
    eol = _eol(lines)
    parts = lines[index][: len(lines[index]) - len(eol)].split(case.sep)
    column = draw(st.integers(0, len(parts) - 1))
    value = draw(st.sampled_from(VALUES))
    domain = case.domains[column]
    parts[column] = value.encode("utf-8")
    lines[index] = case.sep.join(parts) + eol
    what = f"line {index + 1} field {column} := {value!r}"
    if domain == UNUSED:
        return b"\n".join(lines), Outcome("equal", what=what)
    if domain == USED_TEXT or valid_for(domain, value):
        return b"\n".join(lines), Outcome("any", what=what)
    return b"\n".join(lines), Outcome("raise", (index + 1,), what)


def corrupt_separator(draw, case: FileCase, data: bytes) -> tuple[bytes, Outcome]:
    lines = _split(data)
    index = draw(st.sampled_from(_data_rows(case, lines)))
    eol = _eol(lines)
    body = lines[index][: len(lines[index]) - len(eol)]
    if draw(st.booleans()):
        at = draw(st.integers(0, len(body)))
        body = body[:at] + case.sep + body[at:]
        what = f"line {index + 1}: separator added at {at}"
    else:
        count = body.count(case.sep)
        nth = draw(st.integers(0, count - 1))
        at = -1
        for _ in range(nth + 1):
            at = body.index(case.sep, at + 1)
        body = body[:at] + body[at + len(case.sep) :]
        what = f"line {index + 1}: separator {nth} removed"
    lines[index] = body + eol
    return b"\n".join(lines), Outcome("raise", (index + 1,), what)


def corrupt_duplicate(draw, case: FileCase, data: bytes) -> tuple[bytes, Outcome]:
    lines = _split(data)
    rows = _data_rows(case, lines)
    source = draw(st.sampled_from(rows))
    at = draw(st.integers(case.header, rows[-1] + 1))
    copy = lines[source]
    lines.insert(at, copy)
    first = source if at > source else source + 1
    later = max(at, first)
    return b"\n".join(lines), Outcome(
        "raise", (later + 1,), f"line {source + 1} copied to {at + 1}"
    )


def corrupt_truncate(draw, case: FileCase, data: bytes) -> tuple[bytes, Outcome]:
    cut = draw(st.integers(0, len(data) - 1))
    kept = data[:cut]
    kept_lines = _split(kept)
    number = len(kept_lines)  # the line the cut falls in (1-based)
    partial = kept_lines[-1].rstrip(b"\r")
    full_line = _split(data)[number - 1].rstrip(b"\r")
    what = f"cut at byte {cut} (line {number}: {partial[-30:]!r})"
    if number <= case.header:  # inside the header: a wrong header, or a header without rows
        return kept, Outcome("raise", (1, case.header + 1), what)
    complete = [line for line in kept_lines[case.header : number - 1] if line.rstrip(b"\r")]
    if partial in (b"", full_line):  # cut at a line end: a shorter valid file (documented)
        if not complete and partial == b"":
            return kept, Outcome("raise", (case.header + 1,), what)
        return kept, Outcome("any", what=what)
    fields = partial.split(case.sep)
    if len(fields) == len(case.domains):  # inside the final field
        if case.free_last:
            return kept, Outcome("any", what=what)
        text = fields[-1].decode(case.encoding, errors="replace")
        if not complete and valid_for(case.domains[-1], text):
            return kept, Outcome("any", what=what)  # one row only: no other width to compare
    return kept, Outcome("raise", (number,), what)


def corrupt_blank(draw, case: FileCase, data: bytes) -> tuple[bytes, Outcome]:
    lines = _split(data)
    last = len(lines) - (1 if lines[-1] == b"" else 0)
    at = draw(st.integers(case.header, last))
    lines.insert(at, _eol(lines))
    return b"\n".join(lines), Outcome("equal", what=f"blank line inserted at {at + 1}")


def corrupt_byte(draw, case: FileCase, data: bytes) -> tuple[bytes, Outcome]:
    at = draw(st.integers(0, len(data) - 1))
    new = draw(st.integers(0x80, 0xFF))
    changed = data[:at] + bytes([new]) + data[at + 1 :]
    number = data[:at].count(b"\n") + 1
    what = f"byte {at} (line {number}) := {new:#x}"
    line = _split(data)[number - 1]
    offset = at - (data.rfind(b"\n", 0, at) + 1)
    if number > case.header and data[at] not in b"\r\n" and not line[offset:].startswith(case.sep):
        sep_before = line[:offset].count(case.sep)
        # a byte inside a multi-byte separator ('::') also splits it: covered by 'raise'
        inside_sep = any(
            line[max(0, offset - k) :].startswith(case.sep) for k in range(1, len(case.sep))
        )
        if not inside_sep:
            domain = case.domains[sep_before]
            try:
                changed.decode(case.encoding)
                decodes = True
            except UnicodeDecodeError:
                decodes = False
            latin1_fallback = case.name == "dataset_TSMC2014_NYC.txt"
            if domain == UNUSED and (decodes or latin1_fallback):
                return changed, Outcome("equal", what=what)
            if domain == USED_TEXT and decodes:
                return changed, Outcome("any", what=what)
    return changed, Outcome("raise", (number,), what)


CORRUPTIONS = {
    "field": corrupt_field,
    "separator": corrupt_separator,
    "duplicate": corrupt_duplicate,
    "truncate": corrupt_truncate,
    "blank": corrupt_blank,
    "byte": corrupt_byte,
}


# ---------------------------------------------------------------------------------------------
# The property


def snapshot(loaded: object) -> dict[str, object]:
    if isinstance(loaded, formats.TaobaoLog):
        return {"impressions": loaded.impressions, "ads": loaded.ads, "users": loaded.users}
    assert isinstance(loaded, formats.LoggedDataset)
    return {
        "interactions": loaded.interactions,
        "user_features": loaded.user_features,
        "item_features": loaded.item_features,
        "timestamp_unit": loaded.timestamp_unit,
        "notes": loaded.notes,
    }


def assert_same(got: dict[str, object], want: dict[str, object]) -> None:
    for key, expected in want.items():
        if isinstance(expected, pd.DataFrame):
            pd.testing.assert_frame_equal(got[key], expected, check_exact=True)
        else:
            assert got[key] == expected, key


@pytest.fixture(scope="module")
def clean() -> dict[str, tuple[Path, dict[str, object]]]:
    root = Path(tempfile.mkdtemp(prefix="fedrec-loader-fuzz-"))
    out = {}
    for fmt in FORMATS:
        folder = root / fmt.id
        fmt.write(folder)
        out[fmt.id] = (folder, snapshot(fmt.load(folder)))
    yield out
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.id for f in FORMATS])
@settings(
    deadline=None,
    max_examples=_examples(),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_corrupted_file_loads_identically_or_fails_naming_file_and_line(
    fmt: Format, data: st.DataObject, clean: dict
) -> None:
    folder, want = clean[fmt.id]
    case = data.draw(st.sampled_from(fmt.files), label="file")
    kinds = [k for k in CORRUPTIONS if k != "duplicate" or case.keyed]
    kind = data.draw(st.sampled_from(kinds), label="corruption")
    original = (folder / case.name).read_bytes()
    corrupted, outcome = CORRUPTIONS[kind](data.draw, case, original)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / fmt.id
        shutil.copytree(folder, work)
        (work / case.name).write_bytes(corrupted)
        try:
            loaded = fmt.load(work)
        except ValueError as error:
            message = str(error)
            assert outcome.expect != "equal", f"{kind} {outcome.what}: harmless, but {message}"
            found = re.match(rf"{re.escape(str(work / case.name))}, line (\d+): \S", message)
            assert found, f"{kind} {outcome.what}: no file and line in {message!r}"
            if outcome.lines:
                assert int(found.group(1)) in outcome.lines, (
                    f"{kind} {outcome.what}: expected line {outcome.lines}, got {message!r}"
                )
            return
    assert outcome.expect != "raise", f"{kind} {outcome.what}: loaded without an error"
    if outcome.expect == "equal":
        assert_same(snapshot(loaded), want)
