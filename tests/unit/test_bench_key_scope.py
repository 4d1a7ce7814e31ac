"""`orch bench` scrapes metrics pages: the API key goes only to the serving endpoint it belongs to
(issue 12: it was sent to every metrics URL, including a user-given --metrics-url on another
host). Two real HTTP servers on 127.0.0.1 record the Authorization header they receive."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.bench.session import multi_scraper, origin


class _Recorder(BaseHTTPRequestHandler):

    def do_GET(self) -> None:
        self.server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        body = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def servers() -> Iterator[list[ThreadingHTTPServer]]:
    out = []
    for _ in range(2):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        srv.seen = []  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        out.append(srv)
    yield out
    for srv in out:
        srv.shutdown()
        srv.server_close()


def test_the_key_goes_to_the_serving_endpoint_only(servers):
    serving, elsewhere = servers
    base = f"http://127.0.0.1:{serving.server_port}"
    user_page = f"http://127.0.0.1:{elsewhere.server_port}/metrics"  # a user's --metrics-url
    scrape = multi_scraper([f"{base}/metrics", user_page], "sk-s3cret", key_origin=base)
    text = asyncio.run(scrape())
    assert text.count("vllm:num_requests_running 0") == 2  # both pages were read
    assert serving.seen == ["Bearer sk-s3cret"]  # type: ignore[attr-defined]
    assert elsewhere.seen == [None]  # type: ignore[attr-defined]


def test_without_an_origin_no_page_gets_the_key(servers):
    serving, _ = servers
    asyncio.run(multi_scraper([f"http://127.0.0.1:{serving.server_port}/metrics"], "sk-s3cret")())
    assert serving.seen == [None]  # type: ignore[attr-defined]


def test_origin_spells_out_default_ports():
    assert origin("http://head:80/metrics") == origin("http://head/v1") == ("http", "head", 80)
    assert origin("https://head/x") == ("https", "head", 443)
    assert origin("http://head:8000") != origin("http://head:8080") != origin("https://head:8000")
