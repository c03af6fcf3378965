"""Download data sets from their official sources into the cache, verify and unpack them.

* MovieLens archives are checked against the MD5 that GroupLens publishes next to each archive
  (``<archive>.md5``). HetRec Lastfm and Foursquare publish no checksum, so their archives are
  verified by structure instead: the expected files must be present and must load.
* Taobao (Tianchi) needs a login: fetching it only explains where to put the files.
* ML-100K can also be taken from RecBole's wheel (``recbole==1.2.1`` on the package index ships
  ``recbole/dataset_example/ml-100k/ml-100k.{inter,item,user}``, identical row for row to
  ``u.data``): ``pip download`` fetches the wheel into a temporary folder, the three atomic files
  are checked against their SHA-256 and copied into the cache. RecBole is not installed.

Network failures are reported fast (short timeout) with the manual alternative.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from fedrec.envs.datasets.catalog import DatasetSpec, data_root, load, spec_of

RECBOLE_REQUIREMENT = "recbole==1.2.1"
#: SHA-256 of the atomic files inside the recbole 1.2.1 wheel (all three were measured on the
#: wheel; docs/datasets.md, "MovieLens 100K from RecBole's wheel").
RECBOLE_ML100K_SHA256 = {
    "ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
    "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
    "ml-100k.user": "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972",
}
Source = Literal["auto", "official", "recbole"]


class FetchError(RuntimeError):
    """A data set could not be fetched; the message says why and how to place the files by hand."""


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manual(spec: DatasetSpec, target: Path) -> str:
    where = spec.url or spec.homepage
    files = ", ".join(spec.files)
    return (
        f"Download it by hand from {where} (see {spec.homepage}), unpack it and put {files} "
        f"in {target}."
    )


def download(url: str, destination: Path, *, timeout: float = 10.0, log: Callable = print) -> Path:
    """Stream ``url`` to ``destination``; :class:`FetchError` if the host cannot be reached."""
    log(f"downloading {url}")
    request = urllib.request.Request(url, headers={"User-Agent": "fedrec-data-fetch"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            partial = destination.with_suffix(destination.suffix + ".part")
            with partial.open("wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
            partial.replace(destination)
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FetchError(f"cannot reach {url}: {reason}") from error
    return destination


def _unpack(archive: Path, target: Path) -> None:
    """Unzip, flattening the archive's single top-level folder (``ml-100k/u.data`` -> ``u.data``)."""
    with zipfile.ZipFile(archive) as z:
        for member in z.infolist():
            if member.is_dir() or member.filename.startswith("__MACOSX"):
                continue
            parts = Path(member.filename).parts
            relative = Path(*parts[1:]) if len(parts) > 1 else Path(parts[0])
            out = target / relative
            if ".." in relative.parts:
                raise FetchError(f"{archive}: unsafe path {member.filename!r} in the archive")
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(member) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst)


def fetch_official(
    name: str, data_dir: Path | str | None = None, *, timeout: float = 10.0, log: Callable = print
) -> Path:
    """Download, verify (MD5 or structure) and unpack data set ``name``; returns its folder."""
    spec = spec_of(name)
    root = data_root() if data_dir is None else Path(data_dir).expanduser()
    target = root / spec.name
    if spec.url is None:
        raise FetchError(
            f"{spec.title} cannot be downloaded automatically. {spec.manual}; put them in {target}."
        )
    target.mkdir(parents=True, exist_ok=True)
    archive = target / Path(spec.url).name
    try:
        download(spec.url, archive, timeout=timeout, log=log)
    except FetchError as error:
        raise FetchError(f"{error}. {_manual(spec, target)}") from error
    if spec.md5 is not None:
        got = _digest(archive, "md5")
        if got != spec.md5:
            archive.unlink()
            raise FetchError(
                f"{archive.name}: MD5 {got} does not match the published {spec.md5}; the download "
                f"is corrupt or the upstream file changed. {_manual(spec, target)}"
            )
        log(f"MD5 verified ({spec.md5})")
    _unpack(archive, target)
    archive.unlink()
    load(spec.name, target)  # structure check: the files exist and parse
    log(f"{spec.title} is in {target}")
    return target


def fetch_recbole_ml100k(
    data_dir: Path | str | None = None, *, log: Callable = print, wheel: Path | None = None
) -> Path:
    """ML-100K from RecBole's wheel (``pip download --no-deps recbole==1.2.1``), SHA-256-checked."""
    root = data_root() if data_dir is None else Path(data_dir).expanduser()
    target = root / "ml-100k"
    with tempfile.TemporaryDirectory() as tmp:
        if wheel is None:
            command = [
                sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                RECBOLE_REQUIREMENT, "-d", tmp,
            ]  # fmt: skip
            log(f"running {' '.join(command[2:])}")
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            except (OSError, subprocess.TimeoutExpired) as error:
                raise FetchError(
                    f"pip download of {RECBOLE_REQUIREMENT} failed: {error}"
                ) from error
            wheels = sorted(Path(tmp).glob("recbole-*.whl"))
            if done.returncode != 0 or not wheels:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise FetchError(
                    f"pip download of {RECBOLE_REQUIREMENT} failed: {' | '.join(tail)}. Run "
                    f"`pip download --no-deps {RECBOLE_REQUIREMENT}` where the package index is "
                    f"reachable and pass the wheel with `fedrec data fetch ml-100k --wheel FILE`."
                )
            wheel = wheels[0]
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for filename, sha in RECBOLE_ML100K_SHA256.items():
                member = f"recbole/dataset_example/ml-100k/{filename}"
                try:
                    data = z.read(member)
                except KeyError as error:
                    raise FetchError(f"{wheel.name} has no {member}") from error
                got = hashlib.sha256(data).hexdigest()
                if got != sha:
                    raise FetchError(f"{member} in {wheel.name}: SHA-256 {got}, expected {sha}")
                (target / filename).write_bytes(data)
    log(f"SHA-256 verified for {', '.join(RECBOLE_ML100K_SHA256)}")
    load("ml-100k", target)
    log(f"MovieLens 100K (RecBole atomic files) is in {target}")
    return target


def fetch(
    name: str,
    data_dir: Path | str | None = None,
    *,
    source: Source = "auto",
    timeout: float = 10.0,
    wheel: Path | None = None,
    log: Callable = print,
) -> Path:
    """Fetch ``name`` into ``data_dir`` (default: the cache); ``source`` picks official or RecBole.

    ``auto`` tries the official source and, for ML-100K, falls back to RecBole's copy.
    """
    spec = spec_of(name)
    if source not in ("auto", "official", "recbole"):
        raise ValueError(f"source must be 'auto', 'official' or 'recbole', got {source!r}")
    if source == "recbole" or wheel is not None:
        if spec.name != "ml-100k":
            raise ValueError("the RecBole source only provides ml-100k")
        return fetch_recbole_ml100k(data_dir, log=log, wheel=wheel)
    try:
        return fetch_official(spec.name, data_dir, timeout=timeout, log=log)
    except FetchError as error:
        if source == "auto" and spec.name == "ml-100k":
            log(f"{error}\nfalling back to RecBole's copy of ML-100K")
            return fetch_recbole_ml100k(data_dir, log=log)
        raise
