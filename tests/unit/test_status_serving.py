"""serving_status: the serving section built from real Serve status JSON, the replica's real worker
log and real metrics pages (tests/data/serve/SOURCES-status.md); failure cases are those captures
with one fact changed (a node dead, a replica unhealthy, a probe failed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator import engine_metrics as prom
from orchestrator.serve.ray_io.client import parse_serve_status
from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.status.serving import (
    ENDPOINT_PROBE_FAILED,
    NODE_HEARTBEAT_LOST,
    NODE_UNREACHABLE,
    REPLICA_UNHEALTHY,
    SERVE_API_ERROR,
    SERVE_APP_NOT_RUNNING,
    build_serving_status,
    model_of_deployment,
    revision_app,
)
from orchestrator.status.views import NodeRef

DATA = Path(__file__).resolve().parent.parent / "data"
REPO = DATA.parent.parent
NODE_ID = "fb356170c7eeea9b674844e2204ed80ed204358c9e6c6ae6afcb634d"
ENGINE_REPLICA = "75z13c9r"
LOG = (DATA / "logs/engine/ray-serve-llm-cpu-replica-worker.out").read_text().splitlines()
LOGGED = next(line for line in LOG if "KV cache size" in line)


def payload(name: str = "running-direct-streaming") -> dict:
    return json.loads((DATA / f"serve/status-{name}.json").read_text())


def page(name: str) -> list[prom.Sample]:
    return prom.parse_text((DATA / f"metrics/ray-serve-llm-0.32-{name}.txt").read_text())


def revision(number: int = 1, app: dict | None = None):
    config = app if app is not None else payload()["applications"]["orch-r1"]["deployed_app_config"]
    return SimpleNamespace(number=number, model="tiny", status="ready", config_fingerprint="ab" * 32,
                           config=config, created_at=1.0, finished_at=2.0)  # fmt: skip


HEAD = NodeRef("head", NODE_ID, "ALIVE")
OK_PROBE = ProbeResult(True, 0.201, 200, None, "http://10.0.0.1:8000/v1/completions", "tiny", 1)


def build(serve_payload=None, **kw):
    args = dict(
        revision=revision(), probe=OK_PROBE, engine_logs={ENGINE_REPLICA: LOG}, metrics_now=page("after2"),
        metrics_before=page("after"), window_s=42.0, nodes=[HEAD], endpoint="http://10.0.0.1:8000",
    )  # fmt: skip
    args.update(kw)
    return build_serving_status(parse_serve_status(serve_payload or payload()), **args)


def test_running_application_shows_logged_capacity_and_live_figures():
    s = build()
    assert s.healthy and s.problems == ()
    assert (s.app_name, s.app_status, s.route_prefix) == ("orch-r1", "RUNNING", "/")
    assert s.revision.number == 1
    assert [d.name for d in s.deployments] == ["LLMServer:tiny", "LLMRouter"]
    engine = s.deployments[0].replicas[0]
    assert (engine.replica_id, engine.state, engine.node, engine.node_state, engine.pid) == (ENGINE_REPLICA, "RUNNING", "head", "ALIVE", 14847)
    (model,) = s.models
    assert model.model_id == "tiny" and model.max_model_len == 1024  # from the revision's config
    # Exactly what the engine logged.
    assert f"{model.capacity.tokens:,} tokens" in LOGGED
    assert f"for {model.capacity.max_model_len:,} tokens per request: {model.capacity.max_concurrency:.2f}x" in LOGGED
    assert model.capacity.evidence == (LOGGED,)
    assert model.live.ttft.count == 16 and model.live.window_s == 42.0


def test_capacity_falls_back_to_metrics_info_when_the_log_is_unread():
    s = build(engine_logs={}, log_errors={ENGINE_REPLICA: "head: unreachable"}, metrics_now=page("idle"), metrics_before=None)
    cap = s.models[0].capacity
    assert (cap.tokens, cap.max_concurrency, cap.source) == (524_288, 512.0, "metrics")
    s = build(engine_logs={}, log_errors={ENGINE_REPLICA: "head: unreachable"})
    assert s.models[0].capacity is None
    assert any("capacity unknown (head: unreachable)" in n for n in s.notes)


def test_dead_node_under_a_replica_is_a_failure_with_its_runbook():
    s = build(nodes=[NodeRef("head", NODE_ID, "DEAD", reachable=False, detail="heartbeat lost")])
    codes = [(p.severity, p.code, p.subject) for p in s.problems]
    assert ("fail", NODE_HEARTBEAT_LOST, "head") in codes  # the node itself
    assert ("fail", NODE_HEARTBEAT_LOST, ENGINE_REPLICA) in codes  # the replica on it
    assert not s.healthy
    assert all(p.hint.endswith(f"runbooks/{p.code}.md") for p in s.problems)
    assert s.deployments[0].replicas[0].node_state == "DEAD"


def test_unreachable_node_is_a_warning_while_ray_sees_it_alive():
    s = build(nodes=[HEAD, NodeRef("w1", "ffff", "ALIVE", reachable=False, detail="timed out")])
    (p,) = s.problems
    assert (p.severity, p.code, p.subject) == ("warn", NODE_UNREACHABLE, "w1") and s.healthy


def test_unhealthy_replica_and_deployment_are_shown_with_hint():
    # Captured 30 s after the replica's EngineCore was killed (SIGKILL): Serve's health check
    # failed, the old replica stopped and a new one is STARTING (tests/data/serve/SOURCES-status.md).
    s = build(payload("unhealthy-engine-killed"), engine_logs={}, metrics_now=None, metrics_before=None,
              nodes=[NodeRef("head", "ed6cceb3" + "0" * 48, "ALIVE")],
              probe=ProbeResult(False, None, None, "ReadTimeout after 20 s", "http://10.0.0.1:8000/v1/completions", "tiny", timed_out=True))  # fmt: skip
    got = {(p.severity, p.code, p.subject) for p in s.problems}
    assert got == {
        ("fail", SERVE_APP_NOT_RUNNING, "orch-r1"),
        ("fail", REPLICA_UNHEALTHY, "LLMServer:tiny"),
        ("warn", REPLICA_UNHEALTHY, "gz59mfrk"),  # the replacement is on its way
        ("fail", ENDPOINT_PROBE_FAILED, "endpoint"),
    }
    assert not s.healthy
    msg = next(p.message for p in s.problems if p.subject == "LLMServer:tiny")
    assert "A replica's health check failed" in msg
    probe = next(p for p in s.problems if p.code == ENDPOINT_PROBE_FAILED)
    assert "no answer in time" in probe.hint
    assert all(p.hint.endswith(f"runbooks/{p.code}.md") for p in s.problems)


def test_engine_dead_while_serve_says_healthy_is_caught_by_the_probe():
    # Captured 0.3 s after the kill: Serve still reported RUNNING/HEALTHY, the completion got 500.
    body = '{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}'
    s = build(probe=ProbeResult(False, 0.073, 500, body, "http://10.0.0.1:8000/v1/completions", "tiny"))
    assert s.app_status == "RUNNING" and all(d.status == "HEALTHY" for d in s.deployments)
    (p,) = s.problems
    assert p.code == ENDPOINT_PROBE_FAILED and "runbooks/ENGINE_DEAD.md" in p.hint and "HTTP 500" in p.message
    assert not s.healthy


def test_starting_replicas_are_warnings_not_failures():
    s = build(payload("deploying-starting"), engine_logs={}, metrics_now=None, metrics_before=None, probe=None)
    sev = {(p.code, p.severity) for p in s.problems}
    assert sev == {(REPLICA_UNHEALTHY, "warn"), (SERVE_APP_NOT_RUNNING, "warn")}
    assert s.app_status == "DEPLOYING" and not s.healthy  # not RUNNING yet


def test_failed_probe_is_shown_with_cause_and_hint():
    for code, words in ((401, "API key"), (503, "no replica"), (None, "nothing answered")):
        probe = ProbeResult(False, 0.01 if code else None, code, "Unauthorized" if code == 401 else "ConnectError",
                            "http://10.0.0.1:8000/v1/completions", "tiny")  # fmt: skip
        s = build(probe=probe)
        (p,) = s.problems
        assert (p.severity, p.code, p.subject) == ("fail", ENDPOINT_PROBE_FAILED, "endpoint")
        assert words in p.hint and p.hint.endswith(f"runbooks/{ENDPOINT_PROBE_FAILED}.md")
        assert not s.healthy


def test_application_missing_from_serve_and_serve_unreadable():
    empty = {"applications": {}, "http_options": {"port": 8000}}
    s = build(empty, engine_logs={}, metrics_now=None, metrics_before=None, probe=None)
    (p,) = s.problems
    assert (p.code, p.subject, p.severity) == (SERVE_APP_NOT_RUNNING, "orch-r1", "fail")
    s = build_serving_status(None, revision=revision(), serve_error=("cannot read Serve's status: ConnectError", "is the cluster up?"))
    (p,) = s.problems
    assert p.code == SERVE_API_ERROR and p.hint.startswith("is the cluster up?") and p.hint.endswith(f"runbooks/{SERVE_API_ERROR}.md")
    assert s.app_name == "orch-r1" and s.app_status is None


def test_other_applications_are_listed_and_revision_picks_the_app():
    data = copy.deepcopy(payload())
    candidate = copy.deepcopy(data["applications"]["orch-r1"])
    candidate["name"], candidate["route_prefix"], candidate["status"] = "orch-r2", "/_orch/r2", "DEPLOYING"
    data["applications"]["orch-r2"] = candidate
    s = build(data)
    assert s.app_name == "orch-r1" and s.other_apps == (("orch-r2", "DEPLOYING"),)
    # Without a revision: the application on the public route.
    s = build(data, revision=None)
    assert s.app_name == "orch-r1" and any("no revision" in n for n in s.notes)


def test_revision_app_reads_the_stored_config():
    name, models, lens = revision_app(revision())
    assert (name, models, lens) == ("orch-r1", ["tiny"], {"tiny": 1024})
    bare = SimpleNamespace(number=7, model="llama", config={})
    # No name recorded: none is made up from the number (the public application's name says no
    # revision); pick_app then reports the application on route "/".
    assert revision_app(bare) == (None, ["llama"], {})
    assert model_of_deployment("LLMServer:tiny") == "tiny" and model_of_deployment("LLMRouter") is None


def test_the_cap_and_batch_as_deployed_and_configured():
    # The capture's LLMServer:tiny was deployed with max_ongoing_requests 64 (its deployment_config
    # in Serve's status) and no max_num_seqs in its engine_kwargs (vLLM's default then applies);
    # LLMRouter carries Ray Serve LLM's own 1000 (ray/llm core/ingress/builder.py).
    s = build()
    assert [(d.name, d.max_ongoing_requests) for d in s.deployments] == [("LLMServer:tiny", 64), ("LLMRouter", 1000)]
    (model,) = s.models
    assert (model.max_ongoing_requests, model.max_num_seqs) == (64, None)
    # A revision rendered by orch now carries the plan's max_num_seqs in engine_kwargs.
    app = copy.deepcopy(payload()["applications"]["orch-r1"]["deployed_app_config"])
    app["args"]["llm_configs"][0]["engine_kwargs"]["max_num_seqs"] = 128
    (model,) = build(revision=revision(app=app)).models
    assert (model.max_ongoing_requests, model.max_num_seqs) == (64, 128)
    assert build().to_dict()["models"][0]["max_ongoing_requests"] == 64


def test_json_shape():
    d = json.loads(json.dumps(build().to_dict()))
    assert set(d) == {"healthy", "application", "endpoint", "revision", "deployments", "models", "probe",
                      "problems", "other_applications", "notes", "calibration", "served_models"}  # fmt: skip
    assert d["application"] == {"name": "orch-r1", "status": "RUNNING", "message": "", "route_prefix": "/"}
    model = d["models"][0]
    assert model["kv_cache"]["tokens"] == 524_288 and model["kv_cache"]["max_concurrency"] == 512.0
    assert model["kv_cache"]["source"] == "log" and model["kv_cache"]["evidence"] == [LOGGED]
    assert set(model["live"]) == {"kv_cache_usage", "running", "waiting", "ttft", "tpot", "window_s", "since_start", "engines"}
    assert set(model["live"]["ttft"]) == {"count", "p50_ms", "p95_ms", "mean_ms"}
    assert d["probe"]["latency_ms"] == 201.0 and d["probe"]["ok"] is True
    assert d["deployments"][0]["replicas"][0]["kv_cache_tokens"] == 524_288
    bad = build(probe=ProbeResult(False, None, None, "ConnectError", "u", "tiny")).to_dict()
    assert set(bad["problems"][0]) == {"severity", "code", "subject", "message", "hint"}
    assert set(d["probe"]) == {"ok", "timed_out", "latency_ms", "first_token_ms", "status_code", "error", "url", "model", "output_tokens"}


@pytest.mark.parametrize("code", [REPLICA_UNHEALTHY, SERVE_APP_NOT_RUNNING, ENDPOINT_PROBE_FAILED, NODE_HEARTBEAT_LOST, NODE_UNREACHABLE])
def test_each_problem_code_has_a_runbook(code):
    text = (REPO / "runbooks" / f"{code}.md").read_text()
    assert text.startswith(f"# {code}")


def test_live_ttft_p95_against_the_slo_and_each_replicas_prefix_cache():
    from orchestrator.manifest.sections import Slo

    # The window's TTFT histogram (after2 - after): 16 requests; cumulative 15 up to 80 ms and 16 up
    # to 100 ms, so the p95 rank 15.2 interpolates to 80 + 20 * 0.2 = 84 ms.
    tight = build(objective=Slo(ttft_p95_ms=80.0)).models[0].slo
    assert tight.live_ttft_p95_ms == pytest.approx(84.0) and tight.met is False
    assert tight.misses == ("TTFT p95 84 ms > 80 ms",)
    loose = build(objective=Slo(ttft_p95_ms=100.0)).models[0].slo
    assert loose.met is True and loose.misses == ()
    assert build().models[0].slo is None  # no objective in the manifest: nothing to judge
    # No request finished in the window: nothing to judge either.
    idle = build(objective=Slo(ttft_p95_ms=100.0), metrics_before=page("after2")).models[0].slo
    assert idle.met is None and idle.live_ttft_p95_ms is None
    # The replica's engine looked up 534 prompt tokens since it started (every prompt of the capture
    # was different) and the page has no hits series: a 0% hit rate, not an unknown one.
    engine = build().deployments[0].replicas[0]
    assert (engine.prefix_cache.queries, engine.prefix_cache.hits, engine.prefix_cache.hit_rate) == (534.0, 0.0, 0.0)
    assert build().deployments[1].replicas[0].prefix_cache is None  # LLMRouter runs no engine


def test_each_replica_carries_the_start_time_serve_reports_so_a_restart_is_visible():
    # The capture after the EngineCore kill: the replacement engine replica started 219.9 s after
    # the router replica that was not restarted (start_time_s in Serve's ReplicaDetails).
    s = build(payload("unhealthy-engine-killed"), engine_logs={}, metrics_now=None, metrics_before=None,
              nodes=[NodeRef("head", "ed6cceb3" + "0" * 48, "ALIVE")], probe=None)  # fmt: skip
    started = {r["replica_id"]: r["start_time_s"] for d in s.to_dict()["deployments"] for r in d["replicas"]}
    assert started == {"gz59mfrk": 1795946508.3449278, "3mumdgai": 1795946288.470463}
    # an absent or non-numeric value is None, not an error
    broken = payload("unhealthy-engine-killed")
    for dep in broken["applications"]["orch-r1"]["deployments"].values():
        for r in dep["replicas"]:
            r["start_time_s"] = "soon"
    (rep,) = parse_serve_status(broken).applications["orch-r1"].deployments[0].replicas[:1]
    assert rep.start_time_s is None


def test_every_served_model_is_listed_with_its_revision_application_and_engine_replicas():
    """Several models: each its own application; the ids and start times of its engine replicas
    come from Serve's own status (a captured payload: one LLMServer replica and the router)."""
    data = payload()
    second = copy.deepcopy(data["applications"]["orch-r1"])
    second.update(name="orch-m-b", route_prefix="/_orch/m/b", status="DEPLOYING")
    data["applications"]["orch-m-b"] = second
    report = build(data, served={"tiny": (3, "orch-r1"), "b": (5, "orch-m-b"), "gone": (6, "orch-m-gone")})
    by = {m.served_name: m.to_dict() for m in report.served_models}
    assert list(by) == ["b", "gone", "tiny"]
    assert by["tiny"] == {"served_name": "tiny", "revision": 3, "application": "orch-r1", "status": "RUNNING", "route_prefix": "/",
                          "replicas": [{"replica_id": "75z13c9r", "state": "RUNNING", "node": "head",
                                        "start_time_s": 1795945954.4387853}]}  # fmt: skip  # the router is no engine
    assert (by["b"]["status"], by["b"]["route_prefix"], len(by["b"]["replicas"])) == ("DEPLOYING", "/_orch/m/b", 1)
    assert by["gone"] == {"served_name": "gone", "revision": 6, "application": "orch-m-gone", "status": None, "route_prefix": None,
                          "replicas": []}  # fmt: skip
    assert report.to_dict()["served_models"] == [by["b"], by["gone"], by["tiny"]]
    assert build().served_models == ()
