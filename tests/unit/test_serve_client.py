"""serve_client: parsing real Serve REST answers (Ray 2.60, captured on this machine) and the
client's error mapping (httpx MockTransport, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from orchestrator.serve.ray_io.client import (
    ServeApiError,
    ServeClient,
    failure_messages,
    parse_serve_status,
    startup_failures,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "serve"


def _load(name):
    return json.loads((DATA / name).read_text())


def test_parse_a_failed_rollout_beside_a_running_one():
    status = parse_serve_status(_load("applications_deploy_failed.json"))
    assert status.http_port == 28000
    ok, bad = status.app("orch-r2"), status.app("orch-r3")
    assert ok.status == "RUNNING" and ok.route_prefix == "/" and not ok.failed
    server = ok.deployment("LLMServer:tiny")
    assert server.status == "HEALTHY" and server.replica_states() == {"RUNNING": 1}
    rep = server.replicas[0]
    assert rep.log_file_path.startswith("/serve/replica_orch-r2_LLMServer_tiny_") and rep.node_id
    assert bad.status == "DEPLOY_FAILED" and bad.failed and bad.route_prefix == "/_orch/r3"
    messages = failure_messages(bad)
    assert any("/nonexistent/models/tiny" in m for m in messages)
    assert "orch-r3 DEPLOY_FAILED" in bad.summary() and "LLMServer:tiny DEPLOY_FAILED" in bad.summary()


def test_deployed_config_keeps_the_key_for_reapplying_but_to_dict_redacts_it():
    status = parse_serve_status(_load("applications_deploy_failed.json"))
    app = status.app("orch-r2")
    assert app.deployed_config["args"]["llm_configs"][0]["engine_kwargs"]["api_key"] == ["captured-test-key"]
    assert "captured-test-key" not in json.dumps(status.to_dict())


def test_parse_the_moment_after_the_switch():
    status = parse_serve_status(_load("applications_side_by_side.json"))
    assert {n: a.status for n, a in status.applications.items()} == {"orch-r1": "DELETING", "orch-r3": "RUNNING"}


def test_serve_not_started_is_empty():
    assert parse_serve_status({}).applications == {}
    with pytest.raises(ServeApiError):
        parse_serve_status([])


def _client(handler):
    return ServeClient("http://dash", "tok", transport=httpx.MockTransport(handler))


def test_put_sends_the_body_with_the_token():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        seen["method"], seen["path"] = request.method, request.url.path
        seen["body"] = json.loads(request.content)
        return httpx.Response(200)

    _client(handler).apply({"applications": [{"name": "a"}]})
    assert seen == {"auth": "Bearer tok", "method": "PUT", "path": "/api/serve/applications/", "body": {"applications": [{"name": "a"}]}}


def test_refused_config_shows_serves_message():
    client = _client(lambda req: httpx.Response(400, text="1 validation error for ServeDeploySchema\napplications: duplicate route"))
    with pytest.raises(ServeApiError) as err:
        client.apply({"applications": []})
    assert err.value.status_code == 400 and "duplicate route" in err.value.message


def test_wrong_token_and_no_answer():
    with pytest.raises(ServeApiError, match="refused orch's token"):
        _client(lambda req: httpx.Response(401)).status()

    def down(request):
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ServeApiError, match="did not answer") as err:
        _client(down).status()
    assert err.value.status_code is None


def test_a_deployment_that_gave_up_names_its_failed_replica_and_error():
    """Serve's REPLICA_STARTUP_FAILED message (3 failures in a row): no retry left, the replica's
    process as Ray's task error header names it, and the replica's own error after "Error:"."""
    bad = parse_serve_status(_load("applications_deploy_failed.json")).app("orch-r3")
    (failure,) = startup_failures(bad)
    assert (failure.deployment, failure.retries_left, failure.pid, failure.node_ip) == ("LLMServer:tiny", 0, 28768, "192.0.2.2")
    assert failure.error.startswith("\x1b[36mray::ServeReplica:orch-r3:LLMServer:tiny.initialize_and_get_metadata()")
    assert failure.error.rstrip().endswith("'/nonexistent/models/tiny'. Use `repo_type` argument if needed.")
    running = parse_serve_status(_load("applications_deploy_failed.json")).app("orch-r2")
    assert startup_failures(running) == []
