"""``fetch.download`` streams a file from a (loopback) HTTP server, and refuses a transfer that
stops before its announced length, leaving no partial file."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedrec.envs.datasets.fetch import FetchError, download

PAYLOAD = bytes(range(256)) * 12_000  # about 3 MB: several blocks of the 1 MiB stream


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        short = self.path.endswith("short")
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD) + (10 if short else 0)))
        self.end_headers()
        self.wfile.write(PAYLOAD)

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_download_streams_the_whole_file(server: str, tmp_path: Path) -> None:
    target = download(f"{server}/data.zip", tmp_path / "data.zip", log=lambda *_: None)
    assert target.read_bytes() == PAYLOAD
    assert not list(tmp_path.glob("*.part"))


def test_a_transfer_shorter_than_announced_is_refused(server: str, tmp_path: Path) -> None:
    with pytest.raises(FetchError):
        download(f"{server}/short", tmp_path / "data.zip", log=lambda *_: None, timeout=5)
    assert not list(tmp_path.iterdir())
