"""Data-parallel MoE applications on the test bed, through `orch rollout`.

Three test hosts with one described H100 each and the vLLM stand-in (tests/testbed/vllm_gpu_standin:
the GPU path through vLLM's Ray executor, and the variable-size collectives a GPU's communicator
has, which vLLM 0.32's CPU communicator lacks); the tiny Qwen3-MoE-shaped model of
``orchestrator.plan.tinymodel`` (8 experts). `orch rollout --dp 2` renders ``build_dp_openai_app``;
Serve gang-schedules the two ranks, one per host, and each rank's DPServer starts its engine; the
third GPU takes a model of another shape beside the group (C).

Two rollouts, one bed (one `orch up`), in this order:

A. ``--dp 2 --expert-parallel``: the DP x EP layout as a GPU cluster gets it. vLLM 0.32's CPU MoE
   kernel cannot serve expert parallel (``cpu_fused_moe`` ignores the expert map and segfaults on
   the first request, docs/moe.md), so nothing waits for an answer from it. Checked: the ranks as
   Serve and Ray placed them (one per host, the gang's placement group over both nodes, `orch
   status` naming each rank, its group and its node), then the rollout stopped with SIGTERM as a
   user's Ctrl-C would: it removes the DP application it deployed and records the revision failed.
B. ``--dp 2 --no-expert-parallel``: a DP group whose MoE layers gather every rank's tokens (vLLM's
   AllGather + ReduceScatter path, the experts split over the group's GPUs). It serves: the
   rollout passes its gate (a real completion with the key), the group answers on the public
   route, `orch status` shows both ranks RUNNING with their own KV caches; then one rank's replica
   is killed while requests flow: Serve restarts the whole group, `orch status` shows the group
   unhealthy then whole again, and the requests resume. The times are printed (docs/moe.md).
C. Beside B's group, the tiny dense model (TP 1, its own application) on the third GPU: from the
   second model on orch's front takes /v1, and both models answer on the one base URL with the key;
   the group's ranks are not restarted; `orch remove` of the dense model leaves the group alone on /.

Cost: one `orch up` of 3 hosts, three gangs of 2 ranks (A's, B's and B's restart) and one dense
engine; about 6-8 minutes (docs/moe.md has the measured figures).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from orchestrator.cli import main
from orchestrator.plan.tinymodel import build_tiny_moe
from orchestrator.state import StateStore
from orchestrator.workflows.down import down
from tests.fixtures.cluster import RayTestbedCluster
from tests.fixtures.cluster import testbed_manifest as manifest_text
from tests.fixtures.serving import TEST_KV_CACHE_GIB
from tests.testbed import HostSpec

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the moe_testbed benchmark's smoke run
# Generous deadlines for real processes on a loaded 2-core machine (never waited for when the
# state comes earlier): Serve's gang scheduling and the DPServer's first log line; a group's
# restart up to its engines answering.
RANKS_DEADLINE_S = 300.0
# A restart is two engines starting side by side on two cores: 154 s on a quiet machine, 329 s
# with other work beside it, and once over 300 s on CI's 2-core machine.
RESTART_DEADLINE_S = 480.0
ROLLOUT_TIMEOUT_S = 900
# Rollout B is waited for inside the test's setup: its own deadline ends it (rolled back, the lock
# released) well inside pytest's 900 s per test; it took 91-122 s on a quiet machine.
SERVED_ROLLOUT_TIMEOUT_S = 600
GANG_PG_PREFIX = "SERVE_GANG::"  # ray/serve/_private/common.py GANG_PG_NAME_PREFIX
# Serve's controller stopping a gang's other members (ray/serve/_private/deployment_state.py): a
# member that failed during start-up, or one that died or failed its health check while running.
GANG_STOP_MARKS = ("because a gang member failed", "because RESTART_GANG runtime failure policy is enabled")
# Each rank's KV cache: vLLM logged `CPU KV cache size: 524,288 tokens` for this model with 1 GiB
# (docs/moe.md, tests/data/logs/moe/): 2,048 bytes a token, so the tests' 0.25 GiB is 131,072.
RANK_KV_TOKENS = int(524_288 * TEST_KV_CACHE_GIB)
# The client's pause between requests while a rank is killed: a request a second keeps the group
# busy without taking the cores its restart needs (tests/integration/test_rollout.py, STEADY_PAUSE_S).
TRAFFIC_PAUSE_S = 1.0


@dataclass
class DpRollout:
    """One `orch rollout` run as the user runs it (a process), left running while tests read it."""

    cluster: RayTestbedCluster
    api_key: str
    proc: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    first: dict | None = None  # the first `orch status --json` report that showed both ranks
    log: list[str] = field(default_factory=list)

    @staticmethod
    def argv(cluster: RayTestbedCluster, model: Path, *layout: str, timeout_s: int = ROLLOUT_TIMEOUT_S) -> list[str]:
        return [sys.executable, "-m", "orchestrator", "--state-dir", str(cluster.state_dir), "rollout", str(cluster.manifest_path),
                "--model", str(model), "--served-name", "tiny", "--dp", "2", *layout, "--replicas", "1", "--max-model-len", "1024",
                "--enforce-eager", "--kv-cache-gib", str(TEST_KV_CACHE_GIB), "--timeout", str(timeout_s)]  # fmt: skip

    @classmethod
    def start(cls, cluster: RayTestbedCluster, model: Path, api_key: str, *layout: str, timeout_s: int = ROLLOUT_TIMEOUT_S) -> DpRollout:
        argv = cls.argv(cluster, model, *layout, timeout_s=timeout_s)
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "ORCH_API_KEY": api_key},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        return cls(cluster, api_key, proc)

    def status(self, capsys) -> dict:
        """`orch status --json` as the user runs it (the test sets the API key)."""
        capsys.readouterr()
        main(self.cluster.cli("status", self.cluster.manifest_path, "--json"))
        return json.loads(capsys.readouterr().out)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def dp_replicas(report: dict) -> list[dict]:
    """Every DPServer replica of the report, its rank known or not."""
    return [r for d in report["serving"]["deployments"] if d["name"].startswith("DPServer:") for r in d["replicas"]]


def dp_ranks(report: dict) -> list[dict]:
    """The DPServer replicas of the report whose rank is known, by group and rank."""
    return sorted((r for r in dp_replicas(report) if r["dp"]), key=lambda r: (r["dp"]["group"], r["dp"]["rank"]))


def group_problems(report: dict) -> list[dict]:
    return [p for p in report["serving"]["problems"] if p["subject"].startswith("DPServer:tiny group ")]


def complete(endpoint: str, key: str | None, timeout: float = 120) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "tiny", "prompt": "Experts of every rank", "max_tokens": 8, "temperature": 0}
    return httpx.post(f"{endpoint}/v1/completions", json=body, headers=headers, timeout=timeout)


@pytest.fixture(scope="module")
def moe_bed(testbed_factory, tmp_path_factory):
    bed = testbed_factory.make([HostSpec("1xH100-80GB", vllm_gpu=True) for _ in range(3)], name="moe-dp")
    work = tmp_path_factory.mktemp("moe-dp")
    model = build_tiny_moe(work / "models" / "tiny-moe")
    path = work / f"{bed.name}.yaml"
    path.write_text(manifest_text(bed, model_store=model.parent))
    cluster = RayTestbedCluster(bed=bed, manifest_path=path, state_dir=work / "state")
    cluster.ensure_up()
    yield cluster, model, "orch-test-" + secrets.token_hex(16)
    down(cluster.manifest, cluster.deps())
    bed.close()


@pytest.fixture(scope="module")
def dp_ep(moe_bed):
    """A: `orch rollout --dp 2 --expert-parallel`, left running; the SIGTERM test stops it."""
    cluster, model, key = moe_bed
    run = DpRollout.start(cluster, model, key, "--expert-parallel")
    yield run
    run.stop()


@pytest.fixture(scope="module")
def dp_served(moe_bed):
    """B: `orch rollout --dp 2 --no-expert-parallel`, run to its end (after A's application is gone)."""
    cluster, model, key = moe_bed
    run = DpRollout.start(cluster, model, key, "--no-expert-parallel", timeout_s=SERVED_ROLLOUT_TIMEOUT_S)
    try:
        out, err = run.proc.communicate(timeout=SERVED_ROLLOUT_TIMEOUT_S + 60)
    except BaseException:  # pytest-timeout's too: the rollout must not outlive the test holding the cluster's lock
        run.stop()
        raise
    run.log.append(f"rollout done in {time.monotonic() - run.started:.0f} s")
    assert run.proc.returncode == 0, (out[-3000:], err[-3000:])
    yield run


def test_the_ranks_land_one_per_host_and_status_names_each_with_its_node(dp_ep, capsys, monkeypatch):
    attempt = dp_ep
    cluster = attempt.cluster
    monkeypatch.setenv("ORCH_API_KEY", attempt.api_key)

    def both_ranks():
        assert attempt.proc.poll() is None, attempt.proc.communicate()
        report = attempt.status(capsys)
        ranks = dp_ranks(report)
        return report if len(ranks) == 2 else None

    report = cluster.wait_for(both_ranks, timeout=RANKS_DEADLINE_S, interval=3.0)
    assert report is not None, "orch status never showed the two DP ranks"
    attempt.first = report
    r0, r1 = dp_ranks(report)
    assert (r0["dp"]["rank"], r1["dp"]["rank"], r0["dp"]["size"]) == (0, 1, 2)
    assert r0["dp"]["group"] == r1["dp"]["group"]
    # Serve's gang (PACK over one GPU per host) put one rank on each of two hosts.
    assert r0["node"] != r1["node"] and {r0["node"], r1["node"]} <= {h.name for h in cluster.bed.hosts}
    # The application orch deployed is the DP builder with expert parallelism, its key redacted.
    config = StateStore(cluster.state_dir).get_revision(cluster.manifest.name, 1).config
    assert config["import_path"] == "ray.serve.llm:build_dp_openai_app"
    kw = config["args"]["llm_config"]["engine_kwargs"]
    assert (kw["data_parallel_size"], kw["enable_expert_parallel"]) == (2, True) and attempt.api_key not in json.dumps(config)
    # Ray's own record of the gang: one placement group of 2 GPU bundles, one on each node.
    with cluster.dashboard() as dash:
        rows = dash.get_json("/api/v0/placement_groups", {"detail": "true", "limit": "10000"})["data"]["result"]["result"]
        nodes = {n["node_id"]: n for n in dash.get_json("/api/v0/nodes", {"limit": "100"})["data"]["result"]["result"]}
    gangs = [r for r in rows if str(r.get("name", "")).startswith(GANG_PG_PREFIX) and r.get("state") == "CREATED"]
    assert len(gangs) == 1, [(r.get("name"), r.get("state")) for r in rows]
    gpu_bundles = [b for b in gangs[0]["bundles"] if (b.get("unit_resources") or {}).get("GPU")]
    assert len(gpu_bundles) == 2 and len({b["node_id"] for b in gpu_bundles}) == 2
    assert {nodes[b["node_id"]]["node_ip"] for b in gpu_bundles} == {h.address for h in cluster.bed.hosts if h.name in (r0["node"], r1["node"])}
    # Each rank's problem is "starting"; the group's says it does not serve until both run.
    group = group_problems(report)
    assert group and group[0]["code"] == "REPLICA_UNHEALTHY" and "ranks RUNNING" in group[0]["message"]


def test_sigterm_stops_the_rollout_and_removes_the_dp_application(dp_ep):
    cluster = dp_ep.cluster
    proc = dp_ep.proc
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out[-2000:], err[-2000:])
    state = StateStore(cluster.state_dir)
    rev = state.get_revision(cluster.manifest.name, 1)
    assert rev.status == "failed" and state.current_revision(cluster.manifest.name) is None

    def serve_apps():
        with cluster.dashboard() as dash:
            return dash.get_json("/api/serve/applications/").get("applications") or {}

    # The rollout removed it (one PUT without it); Serve deletes it in the background (DELETING).
    assert cluster.wait_for(lambda: serve_apps() == {}, timeout=180, interval=2.0), list(serve_apps())


def test_a_dp_group_passes_the_gate_and_answers_with_the_key(dp_served, capsys, monkeypatch):
    cluster = dp_served.cluster
    monkeypatch.setenv("ORCH_API_KEY", dp_served.api_key)
    state = StateStore(cluster.state_dir)
    current = state.current_revision(cluster.manifest.name)
    assert current is not None and current.number == 2 and current.status == "ready", current
    kw = current.config["args"]["llm_config"]["engine_kwargs"]
    assert kw["data_parallel_size"] == 2 and not kw.get("enable_expert_parallel")  # orch leaves vLLM's default (off)
    endpoint = cluster.manifest.serve_url()
    resp = complete(endpoint, dp_served.api_key)
    assert resp.status_code == 200, resp.text[:500]
    assert resp.json()["usage"]["completion_tokens"] > 0
    assert complete(endpoint, None).status_code == 401
    # Both ranks RUNNING, one per host, each with its own KV cache as its engine logged it.

    def both_ranks():
        report = dp_served.status(capsys)
        return report if len(dp_ranks(report)) == 2 else None

    report = cluster.wait_for(both_ranks, timeout=60, interval=3.0)
    assert report is not None, "orch status did not show the two ranks of the serving group"
    ranks = dp_ranks(report)
    assert [r["state"] for r in ranks] == ["RUNNING", "RUNNING"], ranks
    assert len({r["node"] for r in ranks}) == 2 and {r["node"] for r in ranks} <= {h.name for h in cluster.bed.hosts}
    assert [r["kv_cache_tokens"] for r in ranks] == [RANK_KV_TOKENS, RANK_KV_TOKENS], ranks
    assert group_problems(report) == []
    dp_served.first = report


class Traffic:
    """Completions with the key on the public route, one every ``TRAFFIC_PAUSE_S``, until stopped:
    (monotonic time, answered with tokens) for each."""

    def __init__(self, endpoint: str, key: str) -> None:
        self.endpoint, self.key = endpoint, key
        self.results: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = complete(self.endpoint, self.key, timeout=30)
                good = r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
            except httpx.HTTPError:
                good = False
            self.results.append((time.monotonic(), good))
            self._stop.wait(TRAFFIC_PAUSE_S)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)

    def first_answer_after(self, t: float) -> float | None:
        return next((at for at, good in self.results if at > t and good), None)


def test_moe_testbed_benchmark_measures_the_dp_group(dp_served, moe_bed):
    """The smoke run of benchmarks/moe_testbed.py (tests/integration/test_benchmark_smokes.py lists
    it): its measuring part on this module's serving DP group. Its ``dp2`` layout is rollout B of
    this module (the tiny MoE, DP=2 without EP, the same engine settings); the script's rollout
    goes through `orch rollout` as B did (``CliServed``), so it is a no-op and only its load runs:
    no bed and no engine start of its own."""
    from moe_testbed import run_layouts

    cluster, model, key = moe_bed
    got = run_layouts(CliServed(cluster, model, key), ("dp2",), requests=2, concurrency=1, output_tokens=4)
    row = got["dp2"]
    assert row["served"] is True and row["action"] == "noop" and row["ok"] == 2 and row["failed"] == 0, row
    assert set(got) == {"dp2"}


@dataclass
class CliServed:
    """What benchmarks/moe_testbed.py's ``run_layouts`` rolls out with, as `orch rollout` (the
    process B ran): a layout's rollout has the same flags as B's, so the same layout is a no-op."""

    cluster: RayTestbedCluster
    model: Path
    api_key: str

    @property
    def endpoint(self) -> str:
        return self.cluster.manifest.serve_url()

    def rollout(self, options, replicas: int, max_model_len: int, dp: int = 1, expert_parallel: bool = False, **rest):
        assert (replicas, max_model_len, dp, rest) == (1, 1024, 2, {}), "only B's layout runs here"
        argv = DpRollout.argv(self.cluster, self.model, "--expert-parallel" if expert_parallel else "--no-expert-parallel",
                              timeout_s=int(options.timeout_s))  # fmt: skip
        argv += ["--json"] + (["--allow-downtime"] if options.allow_downtime else [])
        done = subprocess.run(argv, cwd=REPO, env={**os.environ, "ORCH_API_KEY": self.api_key}, capture_output=True, text=True,
                              timeout=options.timeout_s + 60)  # fmt: skip
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        return SimpleNamespace(**json.loads(done.stdout))


def test_killing_one_rank_restarts_the_whole_group_and_requests_resume(dp_served, capsys, monkeypatch, measured):
    cluster = dp_served.cluster
    monkeypatch.setenv("ORCH_API_KEY", dp_served.api_key)
    assert dp_served.first is not None, "the serving group was never seen"
    r0, r1 = dp_ranks(dp_served.first)
    old_ids, old_group = {r0["replica_id"], r1["replica_id"]}, r0["dp"]["group"]
    host = next(h for h in cluster.bed.hosts if h.name == r1["node"])
    seen_unhealthy: list[str] = []
    last: list[dict] = []

    def whole_again():
        report = dp_served.status(capsys)
        last[:] = [report]
        ranks = dp_ranks(report)
        problems = group_problems(report)
        if problems:
            seen_unhealthy.append(problems[0]["message"])
        ids = {r["replica_id"] for r in dp_replicas(report)}
        fresh = [r for r in ranks if r["dp"]["group"] != old_group and r["state"] == "RUNNING"]
        return report if not (ids & old_ids) and len(fresh) == 2 and not problems else None

    with Traffic(cluster.manifest.serve_url(), dp_served.api_key) as traffic:
        cluster.wait_for(lambda: traffic.first_answer_after(0.0), timeout=60, interval=0.5)
        assert traffic.results and traffic.results[-1][1], "the group did not answer before the kill"
        killed_at, killed_wall = time.monotonic(), time.time()
        cluster.bed.ns_exec(host, ["kill", "-KILL", str(r1["pid"])])
        report = cluster.wait_for(whole_again, timeout=RESTART_DEADLINE_S, interval=2.0)
        whole = time.monotonic() - killed_at
        if report is None:  # what a cut CI log should still say: the group's state and Serve's own steps
            stopped, added = _controller_times(cluster, killed_wall)
            seen = [(r["dp"] and r["dp"]["group"], r["dp"] and r["dp"]["rank"], r["state"], r["node"], r["replica_id"] in old_ids)
                    for r in dp_replicas(last[0])] if last else None  # fmt: skip
            pytest.fail(f"orch status did not show a new whole group within {RESTART_DEADLINE_S:.0f} s of the kill; "
                        f"last seen (group, rank, state, node, old replica): {seen}; problems: {seen_unhealthy[-1:]}; "
                        f"Serve stopped the other rank {_after(stopped, killed_wall)} and added a gang "
                        f"{_after(added, killed_wall)} after the kill")  # fmt: skip
        resumed = cluster.wait_for(lambda: traffic.first_answer_after(killed_at), timeout=120, interval=0.5)
    assert resumed is not None, f"no request was answered after the restart: {traffic.results[-5:]}"
    # Between the kill and the new group's first answer, the group did not serve: requests failed.
    assert any(not good for at, good in traffic.results if killed_at < at < resumed), traffic.results
    # The group went through unhealthy (orch status said so) before it was whole again.
    assert seen_unhealthy and "does not serve" in seen_unhealthy[0], seen_unhealthy
    # Both old replicas are gone, the rank that was not killed too: the gang restarted as one.
    ranks = dp_ranks(report)
    assert {r["dp"]["rank"] for r in ranks} == {0, 1} and len({r["dp"]["group"] for r in ranks}) == 1
    assert len({r["node"] for r in ranks}) == 2 and {r["node"] for r in ranks} <= {h.name for h in cluster.bed.hosts}
    stopped, added = _controller_times(cluster, killed_wall)
    measured(f"{dp_served.log[0]}; after killing rank 1: Serve stopped the other rank {_after(stopped, killed_wall)} and started a new "
             f"gang {_after(added, killed_wall)} later; orch status showed the new group whole {whole:.1f} s and the first request "
             f"was answered {resumed - killed_at:.1f} s after the kill")  # fmt: skip


def _after(t: float | None, since: float) -> str:
    return "?" if t is None else f"{t - since:.1f} s"


def _controller_times(cluster: RayTestbedCluster, since: float) -> tuple[float | None, float | None]:
    """(other member stopped, new gang's replicas added): the first of each line of Serve's controller
    log at or after ``since`` (its lines start with a local timestamp, ``%Y-%m-%d %H:%M:%S,%f``)."""
    head = cluster.bed.hosts[0]
    logs = sorted(Path(head.ray_dir).glob("session_*/logs/serve/controller_*.log"))
    stopped = added = None
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) < 4:
                continue
            try:
                t = datetime.strptime(f"{parts[1]} {parts[2]}", "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if t < since - 1:
                continue
            if stopped is None and any(m in line for m in GANG_STOP_MARKS):
                stopped = t
            if added is None and "using gang scheduling" in line:
                added = t
    return stopped, added


def test_a_dense_model_beside_the_dp_group_answers_on_the_same_endpoint_and_leaves_it_alone(dp_served, tiny_model_dir, capsys,
                                                                                              monkeypatch, measured):  # fmt: skip
    """C (issue 45: a model of another shape beside the others): the tiny dense model (TP 1) on
    the third GPU, its own application, while the DP group serves. orch's front takes /v1: both
    models answer on the one base URL with the key, /v1/models lists them, an unknown model gets
    404 naming them, no key gets 401; the group's ranks (ids) are the ones serving before. `orch
    remove dense` leaves the group answering alone on /, its ranks still the same."""
    cluster = dp_served.cluster
    key = dp_served.api_key
    monkeypatch.setenv("ORCH_API_KEY", key)
    endpoint = cluster.manifest.serve_url()

    def ranks_now() -> list[tuple[str, float]]:
        """The group's replicas (id, start time) as `orch status --json` lists the served models."""
        (group,) = [m for m in dp_served.status(capsys)["serving"]["served_models"] if m["served_name"] == "tiny"]
        return sorted((r["replica_id"], r["start_time_s"]) for r in group["replicas"])

    def ask(model: str, with_key: bool = True) -> httpx.Response:
        body = {"model": model, "prompt": "Experts of every rank", "max_tokens": 4, "temperature": 0}
        headers = {"Authorization": f"Bearer {key}"} if with_key else {}
        return httpx.post(f"{endpoint}/v1/completions", json=body, headers=headers, timeout=120)

    ranks = ranks_now()
    assert len(ranks) == 2, ranks
    t0 = time.monotonic()
    capsys.readouterr()
    code = main(cluster.cli("rollout", cluster.manifest_path, "--model", tiny_model_dir, "--served-name", "dense", "--replicas", "1",
                            "--max-model-len", "1024", "--enforce-eager", "--kv-cache-gib", TEST_KV_CACHE_GIB, "--timeout", "600"))  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, (out.out[-3000:], out.err[-3000:])
    took = time.monotonic() - t0
    for model in ("tiny", "dense"):
        resp = ask(model)
        assert resp.status_code == 200 and resp.json()["model"] == model and resp.json()["usage"]["completion_tokens"] > 0, resp.text[:300]
    assert ask("dense", with_key=False).status_code == 401
    unknown = ask("nope")
    assert unknown.status_code == 404 and "served: dense, tiny" in unknown.text, unknown.text[:300]
    listed = httpx.get(f"{endpoint}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    assert {m["id"] for m in listed["data"]} == {"tiny", "dense"}, listed
    assert ranks_now() == ranks  # the group was not restarted by the model beside it

    capsys.readouterr()
    assert main(cluster.cli("remove", "dense", cluster.manifest_path, "--json")) == 0
    removed = json.loads(capsys.readouterr().out)
    assert removed["apps"] == ["orch-front", "orch-m-dense"] and removed["kept"] == ["orch"], removed  # the group takes /v1 back
    assert ask("tiny").status_code == 200 and ask("dense").status_code == 404
    assert ranks_now() == ranks
    measured(f"a dense model beside the DP group: rolled out and answering through the front in {took:.0f} s; removed, the group serving alone")
