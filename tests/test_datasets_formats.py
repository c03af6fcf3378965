"""Loaders of every real file format, on synthetic files: parsing, quirks and malformed inputs."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedrec.envs.datasets import formats
from fedrec.envs.datasets.catalog import DatasetNotFoundError, load, load_prepared, locate
from fedrec.envs.datasets.fetch import FetchError, fetch, fetch_recbole_ml100k
from fedrec.envs.datasets.formats import FormatError
from fedrec.envs.datasets.preprocess import prepare
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

LOG = synthetic_log(seed=3)

MOVIE_FORMATS = [
    (write_ml100k, formats.load_ml100k),
    (write_ml1m, formats.load_ml1m),
    (write_ml_csv, formats.load_ml_csv),
    (lambda d, log: write_atomic(d, "ml-100k", log), lambda d: formats.load_atomic(d, "ml-100k")),
]


@pytest.mark.parametrize(
    ("write", "read"), MOVIE_FORMATS, ids=["u.data", "ratings.dat", "ratings.csv", "atomic"]
)
def test_rating_formats_parse_every_row_in_file_order(tmp_path: Path, write, read) -> None:
    write(tmp_path, LOG)
    frame = read(tmp_path).interactions
    assert len(frame) == len(LOG.users)
    np.testing.assert_array_equal(frame["user"].to_numpy(), LOG.users)
    np.testing.assert_array_equal(frame["item"].to_numpy(), LOG.items)
    np.testing.assert_array_equal(frame["timestamp"].to_numpy(), LOG.timestamps)
    assert np.all(np.abs(frame["rating"].to_numpy() - LOG.ratings) <= 0.5)


def test_side_files_give_user_and_item_features(tmp_path: Path) -> None:
    write_ml100k(tmp_path / "a", LOG)
    write_ml1m(tmp_path / "b", LOG)
    a, b = formats.load_ml100k(tmp_path / "a"), formats.load_ml1m(tmp_path / "b")
    assert list(a.user_features.columns) == ["age", "gender", "occupation"]
    assert a.item_features.shape[1] == 19 and b.item_features.shape[1] == 18
    assert set(np.unique(a.item_features.to_numpy())) <= {0.0, 1.0}
    assert (a.item_features.sum(axis=1) >= 1).all()  # every movie has a genre


def test_recbole_atomic_and_u_data_give_identical_preprocessing(tmp_path: Path) -> None:
    write_ml100k(tmp_path / "orig", LOG)
    write_atomic(tmp_path / "atomic", "ml-100k", LOG)
    a = prepare(formats.load_ml100k(tmp_path / "orig"))
    b = prepare(formats.load_atomic(tmp_path / "atomic", "ml-100k"))
    np.testing.assert_array_equal(a.items, b.items)
    np.testing.assert_array_equal(a.user_ids, b.user_ids)
    np.testing.assert_array_equal(a.eval_candidates, b.eval_candidates)


def test_lastfm_crlf_with_and_without_header(tmp_path: Path) -> None:
    write_lastfm2k(tmp_path, LOG)
    with_header = formats.load_lastfm2k(tmp_path)
    path = tmp_path / "user_taggedartists-timestamps.dat"
    assert path.read_bytes().count(b"\r\n") == len(with_header.interactions) + 1
    path.write_bytes(path.read_bytes().split(b"\r\n", 1)[1])  # a copy without the header
    without = formats.load_lastfm2k(tmp_path)
    assert len(without.interactions) == len(with_header.interactions)
    assert with_header.timestamp_unit == "ms" and "tag assignments" in with_header.notes[0]
    report = prepare(with_header).report
    assert report[1].name == "deduplicate" and report[1].rows_removed > 0


def test_foursquare_times_become_unix_seconds(tmp_path: Path) -> None:
    log = synthetic_log(seed=4, start=1_333_476_009)
    write_foursquare_nyc(tmp_path, log)
    data = formats.load_foursquare_nyc(tmp_path)
    np.testing.assert_array_equal(data.interactions["timestamp"].to_numpy(), log.timestamps)
    assert formats.parse_foursquare_time("Tue Apr 03 18:00:09 +0000 2012") == 1_333_476_009
    assert data.interactions["item"].str.len().eq(24).all()


def test_taobao_headers_quirks_and_joins(tmp_path: Path) -> None:
    write_taobao(tmp_path)
    head = (tmp_path / "user_profile.csv").read_text().splitlines()[0]
    assert head.endswith("new_user_class_level ")  # the published trailing space
    log = formats.load_taobao(tmp_path)
    assert list(log.users.columns) == list(formats.TAOBAO_USER_PROFILE_HEADER)
    assert (log.ads["brand"] == "NULL").any()
    assert (log.users["pvalue_level"] == "").any()
    assert set(log.impressions["pid"]) == {"430548_1007", "430539_1007"}
    assert (log.impressions["nonclk"] == 1 - log.impressions["clk"]).all()


# ---------------------------------------------------------------------------------------------
# Malformed inputs: the error names the file, the line and the expectation


def _rewrite_line(path: Path, number: int, text: str, encoding: str = "utf-8") -> None:
    lines = path.read_text(encoding).splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n", encoding)


def test_truncated_u_data_names_file_and_line(tmp_path: Path) -> None:
    write_ml100k(tmp_path, LOG)
    path = tmp_path / "u.data"
    data = path.read_bytes()
    path.write_bytes(data[: data.rstrip(b"\n").rfind(b"\t")])  # cut inside the last row
    with pytest.raises(
        FormatError,
        match=rf"u\.data, line {len(LOG.users)}: expected 4 tab-separated fields .* got 3 \(truncated file\?\)",
    ):
        formats.load_ml100k(tmp_path)


def test_non_numeric_field_names_field_and_line(tmp_path: Path) -> None:
    write_ml1m(tmp_path, LOG)
    _rewrite_line(tmp_path / "ratings.dat", 7, "1::abc::3::978300760")
    with pytest.raises(
        FormatError, match=r"ratings\.dat, line 7: field 'item' must be an integer, got 'abc'"
    ):
        formats.load_ml1m(tmp_path)


def test_empty_field_and_bad_side_file(tmp_path: Path) -> None:
    write_ml100k(tmp_path, LOG)
    _rewrite_line(tmp_path / "u.data", 3, "1\t2\t\t881250949")
    with pytest.raises(FormatError, match=r"u\.data, line 3: field 'rating' must be a number"):
        formats.load_ml100k(tmp_path)
    write_ml100k(tmp_path, LOG)
    _rewrite_line(tmp_path / "u.user", 2, "2|53|F|other")
    with pytest.raises(FormatError, match=r"u\.user, line 2: expected 5 '\|'-separated fields"):
        formats.load_ml100k(tmp_path)


def test_wrong_headers_are_reported(tmp_path: Path) -> None:
    write_ml_csv(tmp_path, LOG)
    _rewrite_line(tmp_path / "ratings.csv", 1, "user,movie,rating,timestamp")
    with pytest.raises(
        FormatError,
        match=r"ratings\.csv, line 1: expected the header 'userId,movieId,rating,timestamp'",
    ):
        formats.load_ml_csv(tmp_path)
    write_atomic(tmp_path, "ml-100k", LOG)
    _rewrite_line(
        tmp_path / "ml-100k.inter", 1, "user_id\titem_id:token\trating:float\ttimestamp:float"
    )
    with pytest.raises(
        FormatError, match=r"ml-100k\.inter, line 1: header field 1 must be 'name:type'"
    ):
        formats.load_atomic(tmp_path, "ml-100k")


def test_taobao_inconsistent_click_and_empty_file(tmp_path: Path) -> None:
    write_taobao(tmp_path)
    _rewrite_line(tmp_path / "raw_sample.csv", 5, "13,1494000100,107,430548_1007,1,1")
    with pytest.raises(
        FormatError, match=r"raw_sample\.csv, line 5: expected clk in \{0, 1\} and nonclk = 1 - clk"
    ):
        formats.load_taobao(tmp_path)
    (tmp_path / "raw_sample.csv").write_text(",".join(formats.TAOBAO_RAW_SAMPLE_HEADER) + "\n")
    with pytest.raises(FormatError, match="no data rows"):
        formats.load_taobao(tmp_path)


def test_foursquare_bad_time(tmp_path: Path) -> None:
    write_foursquare_nyc(tmp_path, LOG)
    path = tmp_path / "dataset_TSMC2014_NYC.txt"
    fields = path.read_text().splitlines()[9].split("\t")
    fields[-1] = "2012-04-03 18:00:09"
    _rewrite_line(path, 10, "\t".join(fields))
    with pytest.raises(FormatError, match=r"NYC\.txt, line 10: field 'utc_time' must look like"):
        formats.load_foursquare_nyc(tmp_path)


def test_missing_data_set_names_the_fetch_command(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"fedrec data fetch ml-1m --dir"):
        load("ml-1m", tmp_path)
    with pytest.raises(DatasetNotFoundError, match=r"tianchi\.aliyun\.com/dataset/56"):
        locate("taobao-ads", tmp_path)


def test_locate_accepts_root_dataset_folder_and_unpacked_subfolder(tmp_path: Path) -> None:
    write_ml100k(tmp_path / "ml-100k" / "ml-100k", LOG)  # as an archive unpacks
    assert locate("ml-100k", tmp_path)[0] == tmp_path / "ml-100k" / "ml-100k"
    assert locate("ml-100k", tmp_path / "ml-100k")[0] == tmp_path / "ml-100k" / "ml-100k"
    assert load_prepared("ml-100k", tmp_path).num_users == 38


# ---------------------------------------------------------------------------------------------
# Fetching (no network: the paths that need none)


def test_taobao_fetch_explains_manual_placement(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"cannot be downloaded automatically.*raw_sample\.csv"):
        fetch("taobao-ads", tmp_path, log=lambda *_: None)


def test_recbole_wheel_is_checksummed(tmp_path: Path) -> None:
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    write_atomic(tmp_path / "fake", "ml-100k", LOG)
    with zipfile.ZipFile(wheel, "w") as z:
        for ext in ("inter", "item", "user"):
            z.write(
                tmp_path / "fake" / f"ml-100k.{ext}",
                f"recbole/dataset_example/ml-100k/ml-100k.{ext}",
            )
    with pytest.raises(
        FetchError, match=r"ml-100k\.inter in recbole-1\.2\.1-py3-none-any\.whl: SHA-256"
    ):
        fetch_recbole_ml100k(tmp_path / "cache", wheel=wheel, log=lambda *_: None)


# ---------------------------------------------------------------------------------------------
# Regressions found by fuzzing (tests/test_loader_fuzz.py): nothing is corrupted silently

BIG = "10000000000000000000"  # beyond int64: it used to become -9223372036854775808


def _replace_field(path: Path, line: int, column: int, value: str, sep: str) -> None:
    data = path.read_bytes().decode("latin-1")
    lines = data.split("\n")
    eol = "\r" if lines[line - 1].endswith("\r") else ""
    fields = lines[line - 1].removesuffix(eol).split(sep)
    fields[column] = value
    lines[line - 1] = sep.join(fields) + eol
    path.write_bytes("\n".join(lines).encode("latin-1"))


SIX_FORMATS = [
    ("u.data", write_ml100k, formats.load_ml100k, "\t", 1, "user"),
    ("ratings.dat", write_ml1m, formats.load_ml1m, "::", 1, "user"),
    (
        "ml-100k.inter",
        lambda d, log: write_atomic(d, "ml-100k", log),
        lambda d: formats.load_atomic(d, "ml-100k", **formats.MOVIELENS_ATOMIC),
        "\t",
        2,
        "user_id",
    ),
    ("user_taggedartists-timestamps.dat", write_lastfm2k, formats.load_lastfm2k, "\t", 2, "userID"),
    (
        "dataset_TSMC2014_NYC.txt",
        write_foursquare_nyc,
        formats.load_foursquare_nyc,
        "\t",
        1,
        "user",
    ),
    ("raw_sample.csv", lambda d, log: write_taobao(d), formats.load_taobao, ",", 2, "user"),
]


@pytest.mark.parametrize(
    ("name", "write", "read", "sep", "line", "field"), SIX_FORMATS, ids=[f[0] for f in SIX_FORMATS]
)
def test_ids_beyond_int64_or_negative_are_errors_in_every_format(
    tmp_path: Path, name, write, read, sep, line, field
) -> None:
    for value in (BIG, "-5", "1_000"):
        write(tmp_path, LOG)
        _replace_field(tmp_path / name, line, 0, value, sep)
        with pytest.raises(FormatError, match=rf"{re.escape(name)}, line {line}: field '{field}'"):
            read(tmp_path)


def test_atomic_ids_beyond_int64_are_errors_even_without_movielens_rules(tmp_path: Path) -> None:
    write_atomic(tmp_path, "ml-100k", LOG)
    _replace_field(tmp_path / "ml-100k.inter", 2, 0, BIG, "\t")
    # generic rules: exact text ids (never wrapped), which the integer ids of .user cannot match
    with pytest.raises(FormatError, match=r"ml-100k\.user, line 2: field 'user_id' holds integers"):
        formats.load_atomic(tmp_path, "ml-100k")
    (tmp_path / "ml-100k.user").unlink()
    (tmp_path / "ml-100k.item").unlink()
    users = formats.load_atomic(tmp_path, "ml-100k").interactions["user"]
    assert users.iloc[0] == BIG and users.iloc[1] == str(LOG.users[1])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e30", r"field 'timestamp' must be Unix seconds from 788918400"),
        ("inf", r"field 'timestamp' must be a number \(finite"),
        ("nan", r"field 'timestamp' must be a number \(finite"),
        ("1_000", r"field 'timestamp' must be a number \(finite"),
    ],
)
def test_atomic_timestamps_are_finite_and_in_range(tmp_path: Path, value: str, message) -> None:
    write_atomic(tmp_path, "ml-100k", LOG)
    _replace_field(tmp_path / "ml-100k.inter", 5, 3, value, "\t")
    with pytest.raises(FormatError, match=rf"ml-100k\.inter, line 5: {message}"):
        formats.load_atomic(tmp_path, "ml-100k", **formats.MOVIELENS_ATOMIC)
    if value == "1e30":  # without a plausible range: still never wrapped beyond int64
        with pytest.raises(FormatError, match=r"line 5: field 'timestamp' must fit in int64"):
            formats.load_atomic(tmp_path, "ml-100k")


def test_atomic_fractional_timestamps_are_milliseconds(tmp_path: Path) -> None:
    write_atomic(tmp_path, "ml-100k", LOG)
    _replace_field(tmp_path / "ml-100k.inter", 2, 3, f"{LOG.timestamps[0]}.25", "\t")
    data = formats.load_atomic(tmp_path, "ml-100k")
    assert data.timestamp_unit == "ms"
    assert data.interactions["timestamp"].iloc[0] == LOG.timestamps[0] * 1000 + 250
    _replace_field(tmp_path / "ml-100k.inter", 2, 3, f"{LOG.timestamps[0]}.0001", "\t")
    with pytest.raises(FormatError, match=r"line 2: field 'timestamp' has more than millisecond"):
        formats.load_atomic(tmp_path, "ml-100k")


def test_last_line_cut_inside_its_final_field_is_detected(tmp_path: Path) -> None:
    write_lastfm2k(tmp_path, LOG)
    path = tmp_path / "user_taggedartists-timestamps.dat"
    data = path.read_bytes().rstrip(b"\r\n")
    lines = data.count(b"\n") + 1
    path.write_bytes(data[: data.rfind(b"\t") + 2])  # 884717243000 -> 8: a valid but cut value
    with pytest.raises(
        FormatError,
        match=rf"timestamps\.dat, line {lines}: the file does not end with a newline .* "
        r"'timestamp' has 1 characters, fewer than on any other line \(at least 12\)",
    ):
        formats.load_lastfm2k(tmp_path)
    write_ml100k(tmp_path, LOG)  # a cut seconds timestamp is also out of the plausible range
    path = tmp_path / "u.data"
    data = path.read_bytes().rstrip(b"\n")
    path.write_bytes(data[:-4] + b"\n")
    with pytest.raises(
        FormatError, match=r"u\.data, line \d+: field 'timestamp' must be an integer from"
    ):
        formats.load_ml100k(tmp_path)


def test_file_without_final_newline_loads_identically(tmp_path: Path) -> None:
    write_ml1m(tmp_path / "a", LOG)
    write_ml1m(tmp_path / "b", LOG)
    for name in ("ratings.dat", "users.dat", "movies.dat"):
        path = tmp_path / "b" / name
        path.write_bytes(path.read_bytes().rstrip(b"\n"))
    a, b = formats.load_ml1m(tmp_path / "a"), formats.load_ml1m(tmp_path / "b")
    pd.testing.assert_frame_equal(a.interactions, b.interactions)
    pd.testing.assert_frame_equal(a.item_features, b.item_features)


def test_underscored_integers_and_duplicated_keys_name_file_and_line(tmp_path: Path) -> None:
    write_ml100k(tmp_path, LOG)
    _replace_field(tmp_path / "u.data", 4, 1, "1_000", "\t")  # int() accepts it, pandas did not
    with pytest.raises(FormatError, match=r"u\.data, line 4: field 'item' must be an integer"):
        formats.load_ml100k(tmp_path)
    write_ml100k(tmp_path, LOG)
    path = tmp_path / "u.user"
    rows = path.read_text().splitlines()
    path.write_text("\n".join([*rows, rows[2]]) + "\n")  # used to fail in pandas' reindex
    with pytest.raises(
        FormatError, match=rf"u\.user, line {len(rows) + 1}: duplicate user 3 \(already on line 3\)"
    ):
        formats.load_ml100k(tmp_path)
    write_taobao(tmp_path)
    path = tmp_path / "user_profile.csv"
    rows = path.read_text().splitlines()
    path.write_text("\n".join([*rows[:3], rows[1], *rows[3:]]) + "\n")
    with pytest.raises(FormatError, match=r"user_profile\.csv, line 4: duplicate userid"):
        formats.load_taobao(tmp_path)


def test_foursquare_impossible_date_and_bad_venue(tmp_path: Path) -> None:
    write_foursquare_nyc(tmp_path, LOG)
    path = tmp_path / "dataset_TSMC2014_NYC.txt"
    _replace_field(path, 3, 7, "Tue Feb 30 18:00:09 +0000 2012", "\t")
    with pytest.raises(
        FormatError, match=r"NYC\.txt, line 3: field 'utc_time' must be a valid date"
    ):
        formats.load_foursquare_nyc(tmp_path)
    write_foursquare_nyc(tmp_path, LOG)
    _replace_field(path, 2, 1, "not-a-venue", "\t")
    with pytest.raises(FormatError, match=r"line 2: field 'venue' must be a 24-hex-digit"):
        formats.load_foursquare_nyc(tmp_path)


# ---------------------------------------------------------------------------------------------
# Fetch failures leave nothing behind (no network: the downloader is replaced)


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_fetch_of_a_corrupt_archive_without_checksum_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedrec.cli import main
    from fedrec.envs.datasets import fetch as fetch_module

    def corrupt(url: str, destination: Path, **_: object) -> Path:
        destination.write_bytes(b"<html>not a zip</html>")
        return destination

    monkeypatch.setattr(fetch_module, "download", corrupt)
    for name in ("lastfm-2k", "foursquare-nyc"):
        with pytest.raises(FetchError, match=r"\.zip is not a valid zip archive"):
            fetch(name, tmp_path / "cache", log=lambda *_: None)
        assert _leftovers(tmp_path) == []
    assert main(["data", "fetch", "lastfm-2k", "--dir", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "not a valid zip archive" in err
    assert _leftovers(tmp_path) == []


def test_fetch_without_network_leaves_no_empty_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedrec.envs.datasets import fetch as fetch_module

    def offline(*_: object, **__: object) -> None:
        raise OSError(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(fetch_module.urllib.request, "urlopen", offline)
    (tmp_path / "cache").mkdir()
    with pytest.raises(FetchError, match=r"cannot reach .*name resolution\. Download it by hand"):
        fetch("lastfm-2k", tmp_path / "cache", log=lambda *_: None)
    assert _leftovers(tmp_path) == ["cache"]

    def refuse(*_: object, **__: object) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(fetch_module, "download", refuse)  # a raw OSError from the downloader
    with pytest.raises(FetchError, match=r"Connection refused\. Download it by hand"):
        fetch("ml-1m", tmp_path / "cache", source="official", log=lambda *_: None)
    assert _leftovers(tmp_path) == ["cache"]


def test_fetch_verifies_structure_before_moving_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedrec.envs.datasets import fetch as fetch_module

    source = write_lastfm2k(tmp_path / "src", LOG)

    def archive(url: str, destination: Path, **_: object) -> Path:
        with zipfile.ZipFile(destination, "w") as z:
            for path in sorted(source.iterdir()):
                z.write(path, f"hetrec2011-lastfm-2k/{path.name}")
        return destination

    monkeypatch.setattr(fetch_module, "download", archive)
    bad = source / "user_artists.dat"
    good_bytes = bad.read_bytes()
    bad.write_bytes(good_bytes + bad.read_bytes().splitlines(keepends=True)[1])  # duplicate pair
    with pytest.raises(FetchError, match=r"failed the structure check: .*duplicate"):
        fetch("lastfm-2k", tmp_path / "cache", log=lambda *_: None)
    assert _leftovers(tmp_path / "cache") == []
    bad.write_bytes(good_bytes)
    target = fetch("lastfm-2k", tmp_path / "cache", log=lambda *_: None)
    assert target == tmp_path / "cache" / "lastfm-2k"
    assert _leftovers(tmp_path / "cache") == [
        "lastfm-2k",
        "lastfm-2k/user_artists.dat",
        "lastfm-2k/user_taggedartists-timestamps.dat",
    ]
    assert len(load("lastfm-2k", tmp_path / "cache").interactions) > 0


def test_fetch_with_a_wheel_that_is_not_a_zip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedrec.cli import main

    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    wheel.write_bytes(b"truncated download")
    with pytest.raises(FetchError, match=r"recbole-1\.2\.1-py3-none-any\.whl is not a valid wheel"):
        fetch_recbole_ml100k(tmp_path / "cache", wheel=wheel, log=lambda *_: None)
    assert (
        main(["data", "fetch", "ml-100k", "--wheel", str(wheel), "--dir", str(tmp_path / "c")]) == 1
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert _leftovers(tmp_path) == [wheel.name]
