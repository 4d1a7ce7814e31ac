"""`orch bench` end to end against a small in-process OpenAI-style streaming server (real HTTP on
loopback, no vLLM): flags, progress, table, --json, --out, cross-check wiring, errors and exit
codes. The server answers instantly; its /metrics page is the captured vLLM one."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.cli import main

METRICS = (Path(__file__).resolve().parents[1] / "data" / "metrics" / "vllm-0.32-after.txt").read_text()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict] = []
    models = ["fake-model"]  # what /v1/models lists

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": m} for m in Handler.models]}).encode())
        elif self.path == "/metrics":
            self._send(200, METRICS.encode(), "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.seen.append(body)
        if body.get("max_tokens") == 1:  # token counting probe (no tokenizer given)
            words = len(body["prompt"].split())
            self._send(200, json.dumps({"usage": {"prompt_tokens": 2 * words + 1, "completion_tokens": 1}}).encode())
            return
        n = body["max_tokens"]
        chunks = [json.dumps({"choices": [{"index": 0, "text": f"w{i}", "token_ids": [i]}]}) for i in range(n)]
        chunks.append(json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n}}))
        chunks.append("[DONE]")
        self._send(200, "".join(f"data: {c}\n\n" for c in chunks).encode(), "text/event-stream")


@pytest.fixture
def fake_server():
    Handler.seen, Handler.models = [], ["fake-model"]
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_bench_json_and_report_folder(fake_server, tmp_path, capsys):
    code = main(["bench", "--url", fake_server, "--concurrency", "1,3", "--requests", "5", "--output-tokens", "6",
                 "--prompt-tokens", "41", "--json", "--out", str(tmp_path / "r")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert data["target"]["model"] == "fake-model"  # from /v1/models
    assert [lv["label"] for lv in data["levels"]] == ["concurrency=1", "concurrency=3"]
    assert all(lv["succeeded"] == 5 and lv["output_tokens"] == 30 for lv in data["levels"])
    assert data["config"]["prompt_source"].startswith("approximate, 2.00 tokens/word")  # the server's counts
    # --url without --metrics-url scrapes <url>/metrics; the page never moves here: vLLM saw nothing
    assert data["levels"][0]["crosscheck"]["ttft"]["server_count"] == 0
    assert data["levels"][0]["crosscheck"]["ttft"]["agrees"] is None
    assert (tmp_path / "r" / "tradeoff.png").exists() and (tmp_path / "r" / "results.json").exists()
    streamed = [b for b in Handler.seen if b.get("stream")]
    assert len(streamed) == 2 + 10  # warmup + 2 levels x 5
    assert all(b["ignore_eos"] and b["stream_options"] == {"include_usage": True} for b in streamed)
    assert all(len(b["prompt"].split()) == 20 for b in streamed)  # (41 - 1) / 2 words


def test_bench_table_output(fake_server, capsys):
    assert main(["bench", "--url", fake_server + "/v1", "--model", "fake-model", "--concurrency", "2", "--requests", "3"]) == 0
    out = capsys.readouterr().out
    assert "concurrency=2" in out and "3/3" in out and "cross-check TTFT" in out


def test_api_key_from_the_named_variable_is_sent_and_never_printed(fake_server, capsys, monkeypatch):
    monkeypatch.setenv("MY_KEY", "s3cret-key")
    assert main(["bench", "--url", fake_server, "--api-key-env", "MY_KEY", "--concurrency", "1", "--requests", "1", "--json"]) == 0
    assert "s3cret-key" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench"], "no endpoint"),
        (["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0"], "--concurrency"),
        (["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--rate", "0"], "invalid value for '--rate': 0.0 is not in the range x>0"),
        (["accept"], "needs CLUSTER_YAML"),
    ],
)
def test_usage_errors_exit_2_with_a_hint(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "hint:" in err


def test_unreachable_endpoint_is_an_error_not_a_traceback(capsys):
    code = main(["bench", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--requests", "2"])
    err = capsys.readouterr().err
    assert code == 6  # README's exit codes: 6 is a serving endpoint/API error
    assert err.startswith("error: cannot reach http://127.0.0.1:9/v1/models: ConnectError")
    assert "hint: check the URL" in err and "Traceback" not in err


def test_several_models_listed_need_the_model_named(fake_server, capsys):
    """Behind orch's front /v1/models lists every model: bench measures none of them by chance."""
    Handler.models = ["tiny", "tiny-b", "sql"]
    assert main(["bench", "--url", fake_server, "--requests", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {fake_server} serves 3 models (tiny, tiny-b, sql): name the one to measure")
    assert "hint: pass --model tiny" in err and Handler.seen == []
