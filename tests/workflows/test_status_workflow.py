"""workflows.serving_status over its seams: a real LocalRunner reads a session folder holding the
captured replica worker log and Ray's discovery file; the Serve client, the metrics pages and the
probe are fakes answering with the real captures; the state store is real (tmp)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator import cluster_lock
from orchestrator.errors import UnreachableError
from orchestrator.manifest.load import load_manifest
from orchestrator.remote.fake import FakeRunner
from orchestrator.remote.local import LocalRunner
from orchestrator.serve.ray_io import readiness
from orchestrator.serve.ray_io.client import ServeApiError, parse_serve_status
from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.state import StateStore
from orchestrator.status.serving import ENDPOINT_PROBE_FAILED, ROLLOUT_INTERRUPTED, SERVE_API_ERROR
from orchestrator.status.views import NodeRef
from orchestrator.workflows.status import ServingOptions, StatusDeps, gather_serving, probe_public, start_probe

DATA = Path(__file__).resolve().parent.parent / "data"
NODE_ID = "fb356170c7eeea9b674844e2204ed80ed204358c9e6c6ae6afcb634d"
WORKER = "75162635123ae0a8db74769b596deb3dee4a949905d0622c6b6d7173"
STATUS = json.loads((DATA / "serve/status-running-direct-streaming.json").read_text())
LOGGED = next(ln for ln in (DATA / "logs/engine/ray-serve-llm-cpu-replica-worker.out").read_text().splitlines() if "KV cache size" in ln)


def manifest_for(tmp_path: Path):
    text = f"""
name: local
accelerator: cpu
python: {sys.executable}
nodes:
  - name: head
    host: 127.0.0.1
    role: head
    transport: local
    gpus: 0
ray:
  temp_dir: {tmp_path}/ray
serve:
  http_port: 25043
  api_key_env: TEST_ORCH_KEY
"""
    return load_manifest(text, tmp_path / "cluster.yaml")


@pytest.fixture
def world():
    # Short: the manifest refuses a ray.temp_dir too long for Ray's unix sockets.
    tmp_path = Path(tempfile.mkdtemp(prefix="ssw", dir="/tmp"))
    yield from _world(tmp_path)
    shutil.rmtree(tmp_path, ignore_errors=True)


def _world(tmp_path: Path):
    logs = tmp_path / "ray" / "session_2026-11-29_09-51-44_215430_10506" / "logs"
    logs.mkdir(parents=True)
    (tmp_path / "ray" / "session_latest").symlink_to(logs.parent)
    shutil.copy(DATA / "logs/engine/ray-serve-llm-cpu-replica-worker.out", logs / f"worker-{WORKER}-01000000-14847.out")
    (logs / "worker-772e08fae1da6da7890ca77cc2541374aa99595b84043ed2a027f95d-01000000-13776.out").write_text("router\n")
    shutil.copy(DATA / "serve/prom-metrics-service-discovery.json", tmp_path / "ray" / "prom_metrics_service_discovery.json")
    state = StateStore(tmp_path / "state", clock=lambda: 1000.0)
    rev = state.add_revision("local", "tiny", config=STATUS["applications"]["orch-r1"]["deployed_app_config"])
    state.update_revision("local", rev.number, "ready")
    yield tmp_path, state


class World:
    """The fakes' shared script: pages to serve in order, what was asked."""

    def __init__(self, pages: list[str], now: list[float]) -> None:
        self.pages = pages
        self.fetched: list[str] = []
        self.probes: list[tuple] = []
        self.now = now
        self.serve_opened: list[tuple] = []

    def fetch(self, url: str, timeout: float) -> str:
        self.fetched.append(url)
        if not url.endswith(":25044/metrics"):  # the dashboard's and autoscaler's own pages
            return "# no vllm here\nray_dashboard_up 1\n"
        return self.pages.pop(0)

    def probe(self, url, model, key, timeout):
        self.probes.append((url, model, key))
        return ProbeResult(True, 0.25, 200, None, url + "/v1/completions", model, 1)

    @contextmanager
    def open_serve(self, runner, port, token):
        self.serve_opened.append((runner.node, port, token))
        yield type("C", (), {"status": staticmethod(lambda: parse_serve_status(STATUS))})()


def deps_for(state, w: World, runners) -> StatusDeps:
    @contextmanager
    def open_runners(_m):
        yield runners

    return StatusDeps(state=state, open_runners=open_runners, open_serve=w.open_serve, fetch=w.fetch, probe=w.probe,
                       environ={"TEST_ORCH_KEY": "k-123"}, wall_clock=lambda: w.now[0])  # fmt: skip


NODES = [NodeRef("head", NODE_ID, "ALIVE")]


def test_gather_reads_capacity_on_the_node_and_windows_metrics(world):
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    pages = [(DATA / f"metrics/ray-serve-llm-0.32-{n}.txt").read_text() for n in ("after", "after2")]
    w = World(pages, now=[5000.0])
    deps = deps_for(state, w, {"head": LocalRunner("head")})

    first = gather_serving(manifest, deps, NODES)
    assert first.healthy, first.problems
    (model,) = first.models
    assert model.capacity.evidence == (LOGGED,)
    assert (model.capacity.tokens, model.capacity.max_concurrency, model.capacity.max_model_len) == (524_288, 512.0, 1024)
    assert model.live.window_s is None and model.live.ttft.count == 33  # nothing kept yet: since start
    assert w.serve_opened == [("head", manifest.ray.dashboard_port, None)]
    assert w.probes == [("http://127.0.0.1:25043", "tiny", "k-123")]
    assert sorted(w.fetched) == sorted(f"http://127.0.0.1:{p}/metrics" for p in (25044, 44217, 44227))
    kept = list((tmp_path / "state/clusters/local/serving-metrics").glob("*.prom"))
    assert [p.name for p in kept] == ["5000000.prom"]

    w.now[0] = 5060.0
    deps.capacity_cache.clear()
    second = gather_serving(manifest, deps, NODES)
    live = second.models[0].live
    assert live.window_s == pytest.approx(60.0) and live.ttft.count == 16  # the 16 requests in between
    assert second.revision.number == 1 and second.app_name == "orch-r1"


def test_capacity_is_read_once_per_replica(world):
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    page = (DATA / "metrics/ray-serve-llm-0.32-after.txt").read_text()
    w = World([page, page], now=[5000.0])
    head = FakeRunner("head", default=None)
    local = LocalRunner("head")
    head.on(lambda argv: True, lambda argv, env: local.run(list(argv), timeout=60))
    deps = deps_for(state, w, {"head": head})
    gather_serving(manifest, deps, NODES)
    gather_serving(manifest, deps, NODES)
    scans = [c for c in head.calls if c.argv[1] == "-c"]
    assert len(scans) == 1
    assert f"worker-{WORKER}-*-14847.out" in scans[0].argv[3]


def test_unreachable_node_and_unreadable_serve_are_reported_not_raised(world):
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    w = World([], now=[5000.0])
    head = FakeRunner("head").on(lambda argv: True, UnreachableError("head: connection refused"))

    @contextmanager
    def failing_serve(runner, port, token):
        raise ServeApiError("the Ray dashboard at http://127.0.0.1:1 did not answer GET /api/serve/applications/: ConnectError",
                            hint="is the cluster up?")  # fmt: skip
        yield

    deps = deps_for(state, w, {"head": head})
    deps.open_serve = failing_serve
    s = gather_serving(manifest, deps, [NodeRef("head", NODE_ID, "UNKNOWN", reachable=False, detail="connection refused")])
    codes = {p.code for p in s.problems}
    assert SERVE_API_ERROR in codes and "NODE_UNREACHABLE" in codes
    # The probe went out before Serve was read (in parallel with the reads); with no application
    # to report it is not shown.
    assert not s.healthy and s.probe is None


def test_log_read_failure_becomes_a_note(world):
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    page = (DATA / "metrics/ray-serve-llm-0.32-after2.txt").read_text()
    w = World([page], now=[5000.0])
    head = FakeRunner("head")
    head.on(lambda argv: argv[:2] == (sys.executable, "-c"), UnreachableError("head: timed out"))
    head.on(lambda argv: argv[0] == "cat", lambda argv, env: LocalRunner("head").run(list(argv), timeout=10))
    head.forward = lambda host, port: port  # a local node: the port itself, as LocalRunner does
    s = gather_serving(manifest, deps_for(state, w, {"head": head}), NODES)
    assert s.models[0].capacity is None  # the info gauge is gone from this later page too
    assert any("capacity unknown" in n and "timed out" in n for n in s.notes)
    assert s.models[0].live.ttft.count == 49


def test_status_probe_is_the_readiness_probe_against_a_local_server():
    """The status probe is serve.ray_io.readiness's streamed completion, over real HTTP: a tiny server
    streaming like vLLM's completions endpoint (SSE chunks, usage, [DONE]) and refusing a wrong key."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.headers.get("Authorization") != "Bearer good":
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"error": "Unauthorized"}')
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(body["max_tokens"]):
                self.wfile.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": f"t{i}"}]}).encode() + b"\n\n")
            usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": body["max_tokens"]}}
            self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        good = probe_public(base, "tiny", "good", 10)
        bad = probe_public(base, "tiny", "wrong", 10)
    finally:
        server.shutdown()
        server.server_close()
    assert (good.ok, good.status_code, good.output_tokens, good.model) == (True, 200, readiness.PROBE_TOKENS, "tiny")
    assert 0 <= good.first_token_s <= good.latency_s
    assert (bad.ok, bad.status_code) == (False, 401) and "Unauthorized" in bad.error
    down = probe_public(base, "tiny", "good", 2)
    assert not down.ok and down.status_code is None and down.timed_out is False and down.error.startswith("connection")


def test_probe_problem_names_the_missing_key_variable(world):
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    w = World([(DATA / "metrics/ray-serve-llm-0.32-after.txt").read_text()], now=[5000.0])
    w.probe = lambda url, model, key, timeout: ProbeResult(False, 0.01, 401, '{"error":"Unauthorized"}', url, model)
    deps = deps_for(state, w, {"head": LocalRunner("head")})
    deps.environ = {}
    s = gather_serving(manifest, deps, NODES, ServingOptions(keep_scrapes=False))
    (p,) = s.problems
    assert p.code == ENDPOINT_PROBE_FAILED and "$TEST_ORCH_KEY is not set" in p.message
    assert not (tmp_path / "state/clusters/local/serving-metrics").exists()


def test_a_revision_left_pending_is_explained_and_one_in_flight_is_not_a_problem(world):
    """Issue 12: after an interrupted rollout `orch status` says what was left and what repairs
    it; while a rollout holds the cluster's lock, its pending revision is only a note."""
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    page = (DATA / "metrics/ray-serve-llm-0.32-after.txt").read_text()
    w = World([page, page], now=[5000.0])
    deps = deps_for(state, w, {"head": LocalRunner("head")})
    state.add_revision("local", "tiny")
    state.save_revision_meta("local", 2, {"step": "wait for orch-r2 to run"})
    report = gather_serving(manifest, deps, NODES)
    (problem,) = [p for p in report.problems if p.code == ROLLOUT_INTERRUPTED]
    assert problem.subject == "revision 2" and "interrupted at step 'wait for orch-r2 to run'" in problem.message
    assert "puts revision 1 back" in problem.hint and problem.hint.endswith("runbooks/ROLLOUT_INTERRUPTED.md")
    with cluster_lock.hold(state.cluster_dir("local"), "local", "rollout", clock=lambda: 0.0):
        during = gather_serving(manifest, deps, NODES)
    assert not [p for p in during.problems if p.code == ROLLOUT_INTERRUPTED]
    assert any("a rollout is in progress: `orch rollout` (pid" in n and "1970-01-01 00:00:00 UTC" in n for n in during.notes), during.notes


def test_status_records_what_the_engine_logged_against_the_plan(world):
    """Calibration on the test bed's CPU engine log: the plan of the revision against the engine's line."""
    from orchestrator.plan.calibration import model_fingerprint
    from orchestrator.plan.capacity import PlanOptions
    from orchestrator.plan.catalog import CATALOG
    from orchestrator.plan.planner import plan_model
    from orchestrator.plan.shape import make_shape
    from orchestrator.workflows.calibration import load_calibrations

    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    plan = plan_model(CATALOG["tiny"], make_shape(gpu_type_name="cpu", gpus_per_node=1, nodes=1), PlanOptions(max_model_len=1024, vllm_version="0.32.0"))
    plan_json = {**plan.to_json(), "model_fingerprint": model_fingerprint(CATALOG["tiny"])}
    rev = state.add_revision("local", "tiny", plan=plan_json, config=STATUS["applications"]["orch-r1"]["deployed_app_config"])
    state.update_revision("local", rev.number, "ready")
    w = World([(DATA / "metrics/ray-serve-llm-0.32-after.txt").read_text()], now=[5000.0])

    report = gather_serving(manifest, deps_for(state, w, {"head": LocalRunner("head")}), NODES)
    assert report.calibration is not None
    assert report.calibration["measured"]["kv_tokens"] == 524_288  # "CPU KV cache size: 524,288 tokens"
    assert report.calibration["predicted"]["kv_tokens"] == plan.kv_cache_tokens
    assert report.calibration["error"]["kv_tokens"] == pytest.approx((plan.kv_cache_tokens - 524_288) / 524_288, abs=1e-4)
    assert report.to_dict()["calibration"]["revision"] == rev.number
    (stored,) = load_calibrations(state, "local").values()
    assert stored["key"] == report.calibration["key"] and stored["vllm_version"] == "0.32.0"
    # the next status shows what is recorded for the revision (the rollout records it first, with
    # the engine workers' lines status does not read again), not a new reading of the log
    from orchestrator.workflows.calibration import save_calibration

    save_calibration(state, "local", {**stored, "measured_reserve_gib": 1.25, "note": "as the rollout recorded it"})
    w2 = World([(DATA / "metrics/ray-serve-llm-0.32-after.txt").read_text()], now=[5100.0])
    again = gather_serving(manifest, deps_for(state, w2, {"head": LocalRunner("head")}), NODES)
    assert again.calibration is not None and again.calibration["note"] == "as the rollout recorded it"


# A generous deadline for the events below: only a broken implementation ever waits it out.
EVENT_DEADLINE_S = 30.0


def test_the_probe_is_sent_first_and_answers_while_serve_is_read(world):
    """The readiness completion overlaps the reads: here it can only answer once Serve's status
    is being read, and Serve's status is read only once the probe was sent."""
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    w = World([(DATA / "metrics/ray-serve-llm-0.32-after.txt").read_text()], now=[5000.0])
    sent, serve_read = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    calls: list[str] = []

    def probe(url, model, key, timeout):
        calls.append(model)
        sent.set()
        seen["answered_after_serve_read"] = serve_read.wait(EVENT_DEADLINE_S)
        return ProbeResult(True, 0.25, 200, None, url + "/v1/completions", model, 1)

    @contextmanager
    def open_serve(runner, port, token):
        seen["probe_sent_before_serve_read"] = sent.wait(EVENT_DEADLINE_S)
        serve_read.set()
        yield type("C", (), {"status": staticmethod(lambda: parse_serve_status(STATUS))})()

    deps = deps_for(state, w, {"head": LocalRunner("head")})
    deps.probe, deps.open_serve = probe, open_serve
    options = ServingOptions(keep_scrapes=False)
    sent_probe = start_probe(manifest, deps, options)
    assert sent_probe is not None and sent_probe.model == "tiny"
    s = gather_serving(manifest, deps, NODES, options, sent_probe)
    assert seen == {"probe_sent_before_serve_read": True, "answered_after_serve_read": True}
    assert calls == ["tiny"]  # one completion: the one sent first is the one reported
    assert s.probe is not None and s.probe.ok and s.probe.status_code == 200


def test_a_hung_probe_is_not_waited_for_when_every_replica_is_failing(world):
    """The replica's node is DEAD (the nodes section said so): the probe, hung like a completion
    to a broken tensor-parallel engine, is reported as unanswered after the grace, not after its
    whole timeout; on a healthy node the same status waits for it."""
    tmp_path, state = world
    manifest = manifest_for(tmp_path)
    release = threading.Event()
    w = World([(DATA / f"metrics/ray-serve-llm-0.32-{n}.txt").read_text() for n in ("after", "after2")], now=[5000.0])

    def hung(url, model, key, timeout):
        release.wait(EVENT_DEADLINE_S)
        return ProbeResult(True, 0.25, 200, None, url + "/v1/completions", model, 1)

    deps = deps_for(state, w, {"head": LocalRunner("head")})
    deps.probe = hung
    options = ServingOptions(keep_scrapes=False, probe_grace_s=0.0)
    try:
        dead = gather_serving(manifest, deps, [NodeRef("head", NODE_ID, "DEAD")], options)
    finally:
        release.set()
    assert dead.probe is not None and dead.probe.timed_out and not dead.probe.ok
    assert "not waited for longer: every engine replica is failing" in (dead.probe.error or "")
    assert ENDPOINT_PROBE_FAILED in {p.code for p in dead.problems}
    # Healthy: the same (now released) probe is waited for and answers.
    alive = gather_serving(manifest, deps, NODES, options)
    assert alive.probe is not None and alive.probe.ok
