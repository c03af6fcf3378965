"""Download data sets from their official sources into the cache, verify and unpack them.

* MovieLens archives are checked against the MD5 that GroupLens publishes next to each archive
  (``<archive>.md5``). HetRec Lastfm and Foursquare publish no checksum, so their archives are
  verified by structure instead: the expected files must be present and must load.
* Taobao (Tianchi) needs a login: fetching it only explains where to put the files.
* ML-100K can also be taken from RecBole's wheel (``recbole==1.2.1`` on the package index ships
  ``recbole/dataset_example/ml-100k/ml-100k.{inter,item,user}``, identical row for row to
  ``u.data``): ``pip download`` fetches the wheel into a temporary folder, the three atomic files
  are checked against their SHA-256 and copied into the cache. RecBole is not installed.

Everything is downloaded, unpacked and verified in a hidden staging folder inside the cache
(``.fetch-<name>-*``, removed whatever happens); only a complete, verified copy is moved to
``<cache>/<name>``. Every failure (no network, a corrupt or foreign archive, a checksum or
structure mismatch) raises :class:`FetchError` with one line saying why and leaves the cache as it
was. Network failures are reported fast (short timeout) with the manual alternative.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

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
    """A data set could not be fetched; the message says why and how to place the files by hand.

    Raised before anything is written to the data set's folder (see the module docstring).
    """


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
    """Stream ``url`` to ``destination``; :class:`FetchError` if the host cannot be reached or
    the transfer stops early (fewer bytes than the announced ``Content-Length``)."""
    log(f"downloading {url}")
    request = urllib.request.Request(url, headers={"User-Agent": "fedrec-data-fetch"})
    partial = destination.with_suffix(destination.suffix + ".part")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            expected = response.headers.get("Content-Length")
            total = int(expected) if expected is not None and expected.isdigit() else None
            with partial.open("wb") as out, _progress(total, destination.name) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
                    bar.update(len(block))
            size = partial.stat().st_size
            if expected is not None and expected.isdigit() and int(expected) != size:
                raise FetchError(
                    f"the download of {url} stopped after {size:,} of {int(expected):,} bytes"
                )
            partial.replace(destination)
    except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", error)
        raise FetchError(f"cannot reach {url}: {_one_line(reason)}") from error
    finally:
        partial.unlink(missing_ok=True)
    return destination


def _progress(total: int | None, name: str) -> Any:
    """A byte progress bar with the ETA on stderr, shown on a terminal only (tqdm's ``disable=None``)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="B", unit_scale=True, disable=None, leave=False)


def _one_line(error: object) -> str:
    """``error``'s message on one line (for the one-line reports of the CLI)."""
    return " ".join(str(error).split()) or type(error).__name__


#: What a corrupt or foreign zip file raises while it is opened or read.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    EOFError,
    NotImplementedError,  # zipfile: a compression method it does not support
    RuntimeError,  # zipfile: an encrypted member without a password
)


def _unpack(archive: Path, target: Path) -> None:
    """Unzip, flattening the archive's single top-level folder (``ml-100k/u.data`` -> ``u.data``).

    :raises FetchError: for a file that is not a readable zip archive or holds an unsafe path.
    """
    try:
        with zipfile.ZipFile(archive) as z:
            for member in z.infolist():
                if member.is_dir() or member.filename.startswith("__MACOSX"):
                    continue
                parts = Path(member.filename).parts
                relative = Path(*parts[1:]) if len(parts) > 1 else Path(parts[0])
                if ".." in relative.parts or relative.is_absolute():
                    raise FetchError(
                        f"{archive.name}: unsafe path {member.filename!r} in the archive"
                    )
                out = target / relative
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(member) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
    except _ZIP_ERRORS as error:
        if isinstance(error, FetchError):
            raise
        raise FetchError(
            f"{archive.name} is not a valid zip archive ({_one_line(error)}): the download is "
            "corrupt or incomplete"
        ) from error


@contextlib.contextmanager
def _staging(root: Path, name: str) -> Iterator[Path]:
    """A hidden temporary folder inside ``root`` (same file system, so moves are renames).

    Everything is downloaded, unpacked and verified there; the folder is removed whatever happens,
    and so are the folders up to ``root`` that this call created, if they are still empty.
    """
    created = [p for p in (root, *root.parents) if not p.exists()]
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".fetch-{name}-", dir=root))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in created:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


def _install(staged: Path, target: Path) -> None:
    """Move verified files from ``staged`` into ``target`` (a rename when ``target`` is new).

    Into an existing folder each file is moved with an atomic replace, so the folder never holds
    a partly written file.
    """
    if not target.exists():
        staged.rename(target)
        return
    for path in sorted(staged.rglob("*")):
        if path.is_file():
            destination = target / path.relative_to(staged)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, destination)


def _verify(name: str, folder: Path, what: str, manual: str) -> None:
    """Structure check: the files of data set ``name`` are in ``folder`` and load without error."""
    try:
        load(name, folder)
    except (ValueError, FileNotFoundError) as error:
        shown = _one_line(error).replace(str(folder), "<download>")
        raise FetchError(f"{what} failed the structure check: {shown}. {manual}") from error


def fetch_official(
    name: str, data_dir: Path | str | None = None, *, timeout: float = 10.0, log: Callable = print
) -> Path:
    """Download, verify (MD5 and structure) and unpack data set ``name``; returns its folder.

    The archive is downloaded and unpacked in a hidden staging folder of the cache; only a verified
    copy (checksum where one is published, and the files load) is moved to ``<cache>/<name>``.
    On any failure nothing is left behind and :class:`FetchError` says why in one line.
    """
    spec = spec_of(name)
    root = data_root() if data_dir is None else Path(data_dir).expanduser()
    target = root / spec.name
    if spec.url is None:
        raise FetchError(
            f"{spec.title} cannot be downloaded automatically. {spec.manual}; put them in {target}."
        )
    manual = _manual(spec, target)
    with _staging(root, spec.name) as staging:
        archive = staging / Path(spec.url).name
        try:
            download(spec.url, archive, timeout=timeout, log=log)
        except (FetchError, OSError) as error:
            raise FetchError(f"{_one_line(error)}. {manual}") from error
        if spec.md5 is not None:
            got = _digest(archive, "md5")
            if got != spec.md5:
                raise FetchError(
                    f"{archive.name}: MD5 {got} does not match the published {spec.md5}; the "
                    f"download is corrupt or the upstream file changed. {manual}"
                )
            log(f"MD5 verified ({spec.md5})")
        unpacked = staging / "unpacked"
        try:
            _unpack(archive, unpacked)
        except FetchError as error:
            raise FetchError(f"{error}. {manual}") from error
        _verify(spec.name, unpacked, archive.name, manual)
        _install(unpacked, target)
    log(f"{spec.title} is in {target}")
    return target


def fetch_recbole_ml100k(
    data_dir: Path | str | None = None, *, log: Callable = print, wheel: Path | None = None
) -> Path:
    """ML-100K from RecBole's wheel (``pip download --no-deps recbole==1.2.1``), SHA-256-checked.

    The three atomic files are extracted to a staging folder, checked (SHA-256, then they must
    load) and only then moved into ``<cache>/ml-100k``; a failure leaves nothing behind.
    """
    root = data_root() if data_dir is None else Path(data_dir).expanduser()
    target = root / "ml-100k"
    hint = (
        f"Run `pip download --no-deps {RECBOLE_REQUIREMENT}` where the package index is reachable "
        "and pass the wheel with `fedrec data fetch ml-100k --wheel FILE`."
    )
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
                    f"pip download of {RECBOLE_REQUIREMENT} failed: {_one_line(error)}"
                ) from error
            wheels = sorted(Path(tmp).glob("recbole-*.whl"))
            if done.returncode != 0 or not wheels:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise FetchError(
                    f"pip download of {RECBOLE_REQUIREMENT} failed: {' | '.join(tail)}. {hint}"
                )
            wheel = wheels[0]
        wheel = Path(wheel)
        if not wheel.is_file():
            raise FetchError(f"{wheel}: no such file (expected a {RECBOLE_REQUIREMENT} wheel)")
        with _staging(root, "ml-100k") as staging:
            staged = staging / "ml-100k"
            staged.mkdir()
            try:
                with zipfile.ZipFile(wheel) as z:
                    for filename, sha in RECBOLE_ML100K_SHA256.items():
                        member = f"recbole/dataset_example/ml-100k/{filename}"
                        try:
                            data = z.read(member)
                        except KeyError as error:
                            raise FetchError(f"{wheel.name} has no {member}. {hint}") from error
                        got = hashlib.sha256(data).hexdigest()
                        if got != sha:
                            raise FetchError(
                                f"{member} in {wheel.name}: SHA-256 {got}, expected {sha}"
                            )
                        (staged / filename).write_bytes(data)
            except _ZIP_ERRORS as error:
                if isinstance(error, FetchError):
                    raise
                raise FetchError(
                    f"{wheel.name} is not a valid wheel (zip) file ({_one_line(error)}). {hint}"
                ) from error
            log(f"SHA-256 verified for {', '.join(RECBOLE_ML100K_SHA256)}")
            _verify("ml-100k", staged, wheel.name, hint)
            _install(staged, target)
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
