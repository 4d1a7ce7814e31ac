"""The GPU serving path for real: vLLM's Ray executor, one replica spanning two test hosts.

Four test hosts with one described H100 each (the spanning replica takes two; the other two give
the wrong-interface test's TP=2 candidate room beside it), a second network (``ib0``) on each whose traffic is
dropped by nftables, and the vLLM device-key stand-in (``HostSpec(vllm_gpu=True)``,
tests/testbed/vllm_gpu_standin/): the manifest says ``accelerator: gpu`` and names no interface,
and orch renders and applies its GPU layout unchanged (``distributed_executor_backend: ray``, one
``GPU`` bundle per worker). `orch up` derives the collective interface from the probed NICs;
`orch rollout --tp 2` (explicit: TP across nodes, with the planner's warning) deploys ONE
application for the whole module; the tests read it.

The 4-host bed and the served application are made once per module; the one-host TP=2 test
makes its own 1-host bed first and removes it. The whole module takes about 7-8 minutes on a
quiet 2-core machine (the per-test times of a whole run: benchmarks/results/suite-fresh*.json).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.cli import main
from orchestrator.cli.cluster_apis import open_cluster_apis
from orchestrator.cluster.node_state import current_by_name
from orchestrator.cluster.ray_nodes import node_token_path
from orchestrator.doctor.diagnose import diagnose
from orchestrator.errors import OrchError, RolloutFailed
from orchestrator.manifest.load import load_manifest_file
from orchestrator.remote.connect import open_runners
from orchestrator.serve.desired import RolloutRequest
from orchestrator.serve.ray_io.validate import validate_app
from orchestrator.state import StateStore
from orchestrator.workflows.cluster import UpOptions, up
from orchestrator.workflows.desired import desired_for_model
from orchestrator.workflows.down import down
from orchestrator.workflows.rollout import RolloutOptions
from tests.fixtures.cluster import RayTestbedCluster
from tests.fixtures.cluster import testbed_manifest as manifest_text
from tests.fixtures.serving import MAX_MODEL_LEN, ServedTiny
from tests.integration.test_rollout import STEADY_PAUSE_S, BackgroundClient
from tests.testbed import HostSpec

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]

# vLLM 0.32's Ray executor (ray_executor_v2) runs each rank in a RayWorkerProc actor; Ray titles
# its process "ray::RayWorkerProc..." (seen in the test hosts' logs and `ps`).
WORKER_MARK = "RayWorkerProc"


class Spanning:
    def __init__(self, served: ServedTiny, up_log: list[str]) -> None:
        self.served, self.up_log = served, up_log

    @property
    def cluster(self) -> RayTestbedCluster:
        return self.served.cluster

    @property
    def bed(self):
        return self.served.cluster.bed

    def workers(self) -> dict[str, list[int]]:
        """Host name -> pids of vLLM's Ray worker processes running there (own pid namespace)."""
        out: dict[str, list[int]] = {}
        for h in self.bed.hosts:
            res = self.bed.ns_exec(h, ["ps", "-ww", "-eo", "pid=,args="])
            out[h.name] = [int(line.split(None, 1)[0]) for line in res.stdout.splitlines() if WORKER_MARK in line]
        return out

    def environ(self, host: str, pid: int) -> dict[str, str]:
        res = self.bed.ns_exec(host, ["cat", f"/proc/{pid}/environ"])
        return dict(item.split("=", 1) for item in res.stdout.split("\0") if "=" in item)

    def peers(self, host: str, pid: int) -> set[str]:
        """Remote addresses of the established TCP connections of one process on one host."""
        res = self.bed.ns_exec(host, ["ss", "-Htnp", "state", "established"])
        out = set()
        for line in res.stdout.splitlines():
            if f"pid={pid}," in line:
                peer = line.split()[3]
                out.add(peer.rsplit(":", 1)[0])
        return out


@pytest.fixture(scope="module")
def gpu_bed(testbed_factory, tiny_model_dir, tmp_path_factory):
    """Four hosts x 1 described H100 with the stand-in, ib0 cut; no Ray yet. Torn down at the end.
    Four, so that the wrong-interface test's TP=2 candidate has room beside the serving spanning
    replica, which takes two of them (no revision of its own to start for that test)."""
    hosts = [HostSpec("1xH100-80GB", nics=("ib0",), vllm_gpu=True) for _ in range(4)]
    bed = testbed_factory.make(hosts)
    for h in bed.hosts:
        bed.drop_interface(h, "ib0")
    state_dir = tmp_path_factory.mktemp("gpu-path-state")
    path = state_dir.parent / f"{bed.name}.yaml"
    path.write_text(manifest_text(bed, model_store=Path(tiny_model_dir).parent))
    cluster = RayTestbedCluster(bed=bed, manifest_path=path, state_dir=state_dir)
    cluster.up_log = []  # type: ignore[attr-defined]  # what every `orch up` of the module said
    yield cluster
    down(cluster.manifest, cluster.deps())
    bed.close()


def _served(cluster: RayTestbedCluster, path: Path, model_path: Path, api_key: str | None = None) -> ServedTiny:
    return ServedTiny(cluster=cluster, manifest_path=path, api_key=api_key or "orch-test-" + secrets.token_hex(16),
                      model_path=model_path)  # fmt: skip


@pytest.fixture(scope="module")
def spanning(gpu_bed, tiny_model_dir):
    """`orch up` (the bed's manifest) then `orch rollout --tp 2`: the module's one healthy app."""
    cluster = gpu_bed
    up_log: list[str] = cluster.up_log
    cluster.ups.append(up(cluster.manifest, cluster.deps(up_log.append), UpOptions(timeout=240, collective_check=False)))
    served = _served(cluster, cluster.manifest_path, Path(tiny_model_dir))
    t0 = time.monotonic()
    served.first = served.rollout(tp=2)
    served.note(f"spanning rollout took {time.monotonic() - t0:.0f} s")
    return Spanning(served, up_log)


def test_one_host_with_two_gpus_runs_tp2_on_the_same_path(testbed_factory, tiny_model_dir, tmp_path):
    """One test host describing 2 H100s: the automatic plan would use TP 1; --tp 2 stays inside the
    node (STRICT_PACK, no warning) and both workers run on that host. Its own small bed, made and
    torn down before the module's 2-host bed exists (2 cores, memory)."""
    bed = testbed_factory.make([HostSpec("2xH100-80GB", vllm_gpu=True)])
    cluster = None
    try:
        path = tmp_path / "one-host.yaml"
        path.write_text(manifest_text(bed, model_store=Path(tiny_model_dir).parent))
        cluster = RayTestbedCluster(bed=bed, manifest_path=path, state_dir=tmp_path / "state")
        cluster.ensure_up()
        served = _served(cluster, path, Path(tiny_model_dir))
        first = served.rollout(tp=2)
        llm = first.config["args"]["llm_configs"][0]
        assert llm["placement_group_config"] == {"strategy": "STRICT_PACK", "bundles": [{"GPU": 1}, {"GPU": 1}]}
        assert not any(str(r).startswith("warning:") for r in first.plan["reasons"] + first.plan["notes"])
        resp = _complete(served.endpoint, served.api_key)
        assert resp.status_code == 200, resp.text[:500]
        assert "-tp2-" in resp.json().get("system_fingerprint", "")
        ps = bed.ns_exec(bed.hosts[0], ["ps", "-ww", "-eo", "pid=,args="]).stdout
        assert sum(WORKER_MARK in line for line in ps.splitlines()) == 2
    finally:
        if cluster is not None:
            down(cluster.manifest, cluster.deps())
        bed.close()


# Runs on the head with the cluster's environment: create (``create``) the placement group Serve
# LLM would create for the rendered config, detached and named so that it outlives the driver, or
# remove it (``remove``). The test reads it in between through Ray's state API.
PG_DRIVER = r"""
import json, sys, ray
from ray.util.placement_group import get_placement_group, placement_group, remove_placement_group
spec = json.loads(sys.argv[1])
# A named placement group lives in its driver's Ray namespace: both drivers use the same one.
ray.init(address=spec["address"], namespace="orch-test", logging_level="ERROR", log_to_driver=False)
if spec["op"] == "create":
    pg = placement_group(spec["bundles"], strategy=spec["strategy"], name=spec["name"], lifetime="detached")
    print(json.dumps({"ready": pg.wait(timeout_seconds=120), "id": pg.id.hex()}))
else:
    remove_placement_group(get_placement_group(spec["name"]))
    print(json.dumps({"removed": spec["name"]}))
"""
PG_NAME = "orch-test-pp2-placement"


def _bundle_nodes(payload: dict, pg_id: str) -> list[str | None]:
    """Node id of each bundle (in bundle index order) of one placement group, from
    ``GET /api/v0/placement_groups?detail=true``."""
    rows = payload["data"]["result"]["result"]
    row = next(r for r in rows if r["placement_group_id"] == pg_id)
    bundles = row["bundles"]
    ordered = sorted(enumerate(bundles), key=lambda ib: int((ib[1].get("bundle_id") or {}).get("bundle_index", ib[0])))
    return [b.get("node_id") for _, b in ordered]


def test_pp2_placement_lands_on_the_pinned_nodes(gpu_bed, tiny_model_dir):
    """PP=2 x TP=1 across the two hosts, placement only: vLLM 0.32's CPU backend cannot run
    pipeline parallelism through Ray (docs/rollout.md). The rendered config passes LLMConfig; the
    placement group Serve LLM would create for it lands, as Ray's state API reports it, with
    stage i's bundle on the node the plan pinned stage i to."""
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve.llm import LLMConfig

    cluster = gpu_bed
    # The module's first `orch up` (the spanning fixture's finds Ray up: nothing to do).
    cluster.ups.append(up(cluster.manifest, cluster.deps(cluster.up_log.append), UpOptions(timeout=240, collective_check=False)))
    manifest = cluster.manifest
    with cluster.dashboard() as dash:
        nodes = dash.nodes_with_usage()
    request = RolloutRequest(model=str(tiny_model_dir), served_name="tiny", tp=1, pp=2, replicas=1, max_model_len=2048, enforce_eager=True)
    desired = desired_for_model(manifest, request)(nodes, None)
    stages = desired.rendered.stage_nodes
    assert stages is not None and sorted(stages) == ["host0", "host1"]
    validate_app(desired.rendered.app)
    options = LLMServer.get_deployment_options(LLMConfig.model_validate(desired.rendered.llm_config))
    ids = {name: s.node_id for name, s in current_by_name(nodes).items()}
    with open_runners(manifest, cluster.bed.known_hosts, nodes=[manifest.head.name]) as runners:
        head = runners[manifest.head.name]
        home = head.run(["printenv", "HOME"], timeout=10).stdout.strip() or "/root"
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": node_token_path(manifest.name, home)}
        spec = {"address": f"{cluster.head_address}:{manifest.ray.port}", "bundles": options["placement_group_bundles"],
                "strategy": options["placement_group_strategy"], "name": PG_NAME}  # fmt: skip

        def driver(op: str) -> dict:
            argv = [manifest.head.python_bin(manifest), "-c", PG_DRIVER, json.dumps({**spec, "op": op})]
            res = head.run(argv, timeout=240, env=env)
            assert res.ok, res.stderr[-2000:]
            return json.loads(res.stdout.strip().splitlines()[-1])

        created = driver("create")
        try:
            assert created["ready"] is True, created
            with cluster.dashboard() as dash:
                placed = _bundle_nodes(dash.get_json("/api/v0/placement_groups", {"detail": "true", "limit": "10000"}), created["id"])
        finally:
            driver("remove")
    assert placed == [ids[stages[0]], ids[stages[1]]], (placed, ids, stages)


def _complete(endpoint: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "tiny", "prompt": "Tensor parallelism across", "max_tokens": 8, "temperature": 0}
    return httpx.post(f"{endpoint}/v1/completions", json=body, headers=headers, timeout=120)


def test_up_derives_the_collective_interface_and_says_so(spanning):
    for h in spanning.bed.hosts:
        assert f"{h.name}: NCCL/Gloo interface eth0 (carries the node's address {h.address}; the manifest names none)" in spanning.up_log


def test_tp2_replica_spans_both_hosts_and_answers_with_the_key(spanning):
    first = spanning.served.first
    assert first.action == "fresh"
    llm = first.config["args"]["llm_configs"][0]
    assert llm["engine_kwargs"]["distributed_executor_backend"] == "ray"
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 2
    assert llm["placement_group_config"] == {"strategy": "PACK", "bundles": [{"GPU": 1}, {"GPU": 1}]}
    assert any(r.startswith("warning: forced TP=2 exceeds the 1 GPU(s) per node") for r in first.plan["reasons"])
    workers = spanning.workers()
    assert sorted(len(p) for p in workers.values()) == [0, 0, 1, 1], workers  # two of the four hosts
    resp = _complete(spanning.served.endpoint, spanning.served.api_key)
    assert resp.status_code == 200, resp.text[:500]
    body = resp.json()
    assert body["usage"]["completion_tokens"] > 0
    assert "-tp2-" in body.get("system_fingerprint", ""), body.get("system_fingerprint")
    assert _complete(spanning.served.endpoint, None).status_code == 401


def test_multinode_benchmark_measures_the_spanning_replica(spanning):
    """The smoke run of benchmarks/multinode.py (tests/integration/test_benchmark_smokes.py lists
    it): its measuring part on this module's spanning replica. Its ``tp2_two_hosts`` layout is the
    rollout this module made (TP=2 over two hosts), so the script's rollout is a no-op and only its
    load runs: no bed and no engine start of its own (the script's bed-making part,
    ``bed_serving.served_on_bed``, is run by the prefix_routing smoke)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from multinode import run_layouts

    got = run_layouts(spanning.served, ["tp2_two_hosts"], requests=2, concurrency=1, output_tokens=4, max_model_len=MAX_MODEL_LEN)
    row = got["tp2_two_hosts"]
    assert row["action"] == "noop" and row["ok"] == 2 and row["failed"] == 0 and row["output_tok_s"] > 0, row
    assert "tp1_one_host" not in got


def test_tensor_parallel_traffic_uses_the_chosen_interface(spanning):
    bed = spanning.bed
    workers = spanning.workers()
    for h in bed.hosts:
        for pid in workers[h.name]:
            env = spanning.environ(h.name, pid)
            assert env.get("GLOO_SOCKET_IFNAME") == "eth0" and env.get("NCCL_SOCKET_IFNAME") == "eth0"
    # The worker on one host talks to the other worker's host over its eth0 address, never its ib0 one.
    h0, h1 = [h for h in bed.hosts if workers[h.name]]
    (pid1,) = workers[h1.name]
    peers = spanning.peers(h1.name, pid1)
    assert h0.address in peers, peers
    assert h0.ib_address not in peers
    # ib0 really is cut: something tried it and was dropped, or nothing used it at all; the
    # serving path works either way because it never needs it.
    assert _complete(spanning.served.endpoint, spanning.served.api_key).status_code == 200


def test_status_shows_each_worker_and_its_node(spanning, monkeypatch, capsys):
    served = spanning.served
    monkeypatch.setenv("ORCH_API_KEY", served.api_key)
    capsys.readouterr()
    assert main(spanning.cluster.cli("status", served.manifest_path, "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    replicas = [r for d in report["serving"]["deployments"] for r in d["replicas"]]
    workers = [w for r in replicas for w in r["workers"]]
    assert sorted(w["rank"] for w in workers) == ["TP0", "TP1"], workers
    pids = {host: p for host, p in spanning.workers().items() if p}
    assert sorted(w["node"] for w in workers) == sorted(pids) and {w["state"] for w in workers} == {"ALIVE"}
    assert {w["node"]: [w["pid"]] for w in workers} == pids
    main(spanning.cluster.cli("status", served.manifest_path))
    text = capsys.readouterr().out
    assert "engine workers" in text and "TP1" in text


def test_logs_shows_an_engine_workers_log_by_rank(spanning, monkeypatch, capsys):
    """`orch logs --rank N` (issue 25 item 10) on the replica spanning two hosts: rank 1 is the
    TP1 worker that `orch status` places, its log is that worker's own file (Ray names it after
    the worker's pid) on that worker's host, and the lines shown are the file's; a rank the
    replica does not have is a usage error naming the ranks it has."""
    served = spanning.served
    monkeypatch.setenv("ORCH_API_KEY", served.api_key)
    capsys.readouterr()
    assert main(spanning.cluster.cli("status", served.manifest_path, "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    workers = {w["rank"]: w for d in report["serving"]["deployments"] for r in d["replicas"] for w in r["workers"]}
    tp1 = workers["TP1"]
    assert main(spanning.cluster.cli("logs", served.manifest_path, "--rank", "1", "--tail", "50", "--json")) == 0
    logs = json.loads(capsys.readouterr().out)["logs"]
    # Ray may have written the worker's stdout under two job ids (before and after its job): each
    # file of that pid is shown, and at least one has lines.
    outs = [entry for entry in logs if entry["path"].endswith(".out")]
    assert outs and any(entry["lines"] for entry in outs), logs
    for log in outs:
        assert "engine worker rank 1 (TP1)" in log["source"] and log["source"].endswith(f" on {tp1['node']}"), log["source"]
        assert log["node"] == tp1["node"] and log["path"].endswith(f"-{tp1['pid']}.out"), log
        shown = log["lines"]
        on_host = spanning.bed.ns_exec(tp1["node"], ["cat", log["path"]]).stdout.splitlines()
        assert any(on_host[i : i + len(shown)] == shown for i in range(len(on_host) - len(shown) + 1)), shown[:3]
    assert main(spanning.cluster.cli("logs", served.manifest_path, "--rank", "2")) == 2
    assert "has ranks 0-1" in capsys.readouterr().err


def test_the_cpu_engine_standing_in_for_the_h100s_never_calibrates_them(spanning, tiny_model_dir, monkeypatch, capsys):
    """The rollout recorded what the engine logged under the platform it really ran on (vLLM's
    CPU backend: "CPU KV cache size"), not as an H100 measurement; status shows it measured-only
    and `orch plan --cluster` for the same configuration does not size with it, and says why."""
    served = spanning.served
    rec = served.first.calibration
    assert rec is not None, served.first.calibration_note
    assert (rec["platform"], rec["gpu_type"], rec["planned_gpu_type"]) == ("cpu", "cpu", "H100-80GB"), rec
    assert rec["error"] == {} and rec["measured_reserve_gib"] is None and rec["measured"]["kv_tokens"] > 0
    monkeypatch.setenv("ORCH_API_KEY", served.api_key)
    capsys.readouterr()
    main(spanning.cluster.cli("status", served.manifest_path))
    text = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal's width
    line = text.split("memory (vLLM", 1)[1].split(" note:", 1)[0]
    assert f"KV tokens {rec['measured']['kv_tokens']:,} measured; the engine ran on vLLM's cpu platform, not on H100-80GB" in line
    assert "planned" not in line and "%" not in line
    # the same configuration as the rollout's plan (the fixture's rollout sized for the gpu extra's vLLM)
    assert main(spanning.cluster.cli("plan", "--model", str(tiny_model_dir), "--cluster", str(served.manifest_path), "--tp", "2",
                                     "--max-model-len", str(MAX_MODEL_LEN), "--vllm-version", rec["vllm_version"], "--enforce-eager", "--json")) == 0  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert any(f"not calibrated: the record of revision {served.first.revision} of this configuration is not used "
               "(its engine ran on vLLM's cpu platform, not on H100-80GB)" in r for r in plan["reasons"]), plan["reasons"]  # fmt: skip


# pytest's per-test bound (setup.cfg, 900 s) covers this test's fixtures too: the module's bed, Ray
# cluster and spanning engine when run alone, then the candidate's one attempt bounded at 600 s below. It
# took 886 s in all on a loaded machine (load 15-24): the bound here keeps a hang from running on,
# not the rollout's own deadline, which the test asserts.
@pytest.mark.timeout(1500)
def test_wrong_interface_fails_in_time_while_the_previous_revision_serves(spanning, tiny_model_dir, measured):
    """The module's serving revision (TP=2 on two hosts) serves while a rollout of TP=2 on the
    two other hosts runs with a manifest whose ``interface:`` does not reach the peer (``lo`` on
    every node, as a user naming the wrong NIC would; orch puts a uniform interface in the app's
    runtime env, so no `orch up` is needed for it to apply): Gloo advertises 127.0.0.1, the
    peer's connect is refused and the candidate dies. The rollout fails at that first failed
    start, not after Serve's retries, naming the cause it read in the failed replica's log with
    its runbook; the old revision stays the serving one and answers every request sent
    throughout, no candidate is left (its engine workers gone), and `orch doctor` names the same
    collective failure from the nodes' logs. (Runs after the tests that read the spanning
    replica, before the node-loss test.)"""
    cluster, old = spanning.cluster, spanning.served
    serving_workers = sorted(len(p) for p in spanning.workers().values())
    bad_path = cluster.manifest_path.with_name(cluster.manifest_path.stem + "-wrong-nic.yaml")
    bad_path.write_text(manifest_text(cluster.bed, model_store=Path(tiny_model_dir).parent,
                                         node_overrides={h.name: {"interface": "lo"} for h in cluster.bed.hosts}))  # fmt: skip
    bad_manifest = load_manifest_file(bad_path)
    bad = _served(cluster, bad_path, Path(tiny_model_dir), api_key=old.api_key)
    # The rollout fails at the candidate's first failed start: Serve's message then says it would
    # retry 2 more times. The timeout only has to cover that one attempt (placement, the replica,
    # the model-files task on each node, its EngineCore and the two engine workers starting, then
    # Gloo failing within 2 s), no longer Serve's three; the test ends when the attempt fails.
    # Measured on a loaded machine (beside a TP=1 revision then): 564 s to the failed rollout at
    # load average 15-24, and the capture's first failed attempt at 621 s at load 20-38 (tests/data/serve/start-failures/),
    # which the former 300 s would not have covered. pytest's 900 s per test bounds the whole.
    timeout_s = 600.0
    try:
        with BackgroundClient(old, pause_s=STEADY_PAUSE_S, answers_after=1) as client:
            t0 = time.monotonic()
            with pytest.raises(RolloutFailed) as err:
                bad.rollout(RolloutOptions(timeout_s=timeout_s), tp=2)
            took = time.monotonic() - t0
        measured(f"wrong interface beside a serving revision: rollout failed after {took:.0f} s ({err.value}); "
              f"requests to the old revision ok={client.ok} failed={client.fail}; the rollout: {bad.timeline(0)}")
        message = err.value.message
        assert "failed to start with COLLECTIVE_PEER_LOOPBACK" in message and "(Serve would have tried 2 more time(s))" in message
        assert "remote=[127.0.0.1]" in message and err.value.rolled_back
        assert err.value.hint.endswith("runbooks/COLLECTIVE_PEER_LOOPBACK.md")
        assert client.fail == 0, (client.fail, client.errors[:5])
        assert client.ok > 5
        state = StateStore(cluster.state_dir)
        assert state.current_revision(bad_manifest.name).number == old.first.revision
        assert state.list_revisions(bad_manifest.name)[-1].status == "failed"
        token = state.read_token(bad_manifest.name)
        with open_runners(bad_manifest, cluster.bed.known_hosts) as runners:
            with open_cluster_apis(bad_manifest, runners, token) as apis:
                # orch deleted the failed candidate; Serve reports it DELETING for a moment.
                left = cluster.wait_for(lambda: sorted(apis.serve.status().applications) == [old.first.app_name], timeout=120)
                assert left, sorted(apis.serve.status().applications)
            report = diagnose(bad_manifest, runners)
        found = [f for f in report.findings if f.code == "COLLECTIVE_PEER_LOOPBACK"]
        assert found, [f.to_dict() for f in report.findings]
        assert any("remote=[127.0.0.1]" in f.evidence for f in found), [f.evidence for f in found]
        resp = _complete(old.endpoint, old.api_key)
        assert resp.status_code == 200 and "-tp2-" in resp.json().get("system_fingerprint", ""), resp.text[:300]
        # the candidate's engine workers are gone: only the serving replica's two remain
        settled = cluster.wait_for(lambda: sorted(len(p) for p in spanning.workers().values()) == serving_workers or None, timeout=120)
        assert settled, (serving_workers, spanning.workers())
    except BaseException:
        down(cluster.manifest, cluster.deps())  # a failed test leaves no engine behind for the next ones
        raise


# One generous deadline for `orch status` to show the outage (the issue asks for 30 s; the time it
# took is printed with the suite's measured figures, not asserted: the machine is shared).
OUTAGE_DEADLINE_S = 180.0


def _engine_loss(report: dict, victim: str) -> list[str]:
    """The failures of an `orch status --json` report that name the engine replica's loss of the
    node ``victim``, in the three forms a report can take: the replica (alive elsewhere) lost its
    engine worker there; the replica's own actor sat there (Serve puts it in its placement group's
    first bundle, on one of the two workers' nodes; its line is NODE_HEARTBEAT_LOST); or Serve
    already judged the deployment. Another deployment's trouble on that node is not the engine's:
    a fresh-clone run stopped waiting at a report whose only REPLICA_UNHEALTHY lines were the
    LLMRouter replica's that the dead node had held, and the test then found none of the three."""
    def names_it(m: str) -> bool:
        worker_lost = "lost engine workers: " in m and f" on {victim} (" in m
        actor_lost = f"sits on node {victim}, which is DEAD" in m
        judged = m.startswith("deployment LLMServer:") and "UNHEALTHY" in m
        return (" of LLMServer:" in m and (worker_lost or actor_lost)) or judged

    return [p["message"] for p in report["serving"]["problems"] if p["severity"] == "fail" and names_it(p["message"])]


def test_node_loss_while_serving_shows_dead_then_up_and_serve_restore_it(spanning, monkeypatch, capsys, measured):
    """The raylet of the host carrying the second TP worker is killed while requests flow; the
    user's `orch status` (API key set, as a user has it) shows the node DEAD and the replica
    unhealthy in one report. It disrupts only this module's application, so it runs last in this
    file (not among the session's ``disrupts_serving`` tests, which would rebuild this module's
    bed later)."""
    served, cluster = spanning.served, spanning.cluster
    monkeypatch.setenv("ORCH_API_KEY", served.api_key)
    workers = spanning.workers()
    victim = next(name for name, pids in workers.items() if pids and name != served.manifest.head.name)
    with BackgroundClient(served, pause_s=STEADY_PAUSE_S, answers_after=1) as client:
        killed_at = time.monotonic()
        cluster.bed.ns_exec(victim, ["kill", "-KILL", str(cluster.raylet_pid(victim))])
        calls: list[float] = []

        def outage_shown():
            t0 = time.monotonic()
            capsys.readouterr()
            assert main(cluster.cli("status", served.manifest_path, "--json")) == 0
            report = json.loads(capsys.readouterr().out)
            calls.append(time.monotonic() - t0)
            dead = {r["name"]: r["ray_state"] for r in report["nodes"]}.get(victim) == "DEAD"
            return report if dead and _engine_loss(report, victim) else None

        report = cluster.wait_for(outage_shown, timeout=OUTAGE_DEADLINE_S, interval=0.5)
        shown_after = time.monotonic() - killed_at
        assert report is not None, f"orch status never showed {victim} DEAD and the replica unhealthy"
        assert report["healthy"] is False and report["serving"]["healthy"] is False
        lost = _engine_loss(report, victim)
        every = [p["message"] for p in report["serving"]["problems"]]  # for the failure's message
        replicas = [r for d in report["serving"]["deployments"] if d["name"].startswith("LLMServer:") for r in d["replicas"]]
        carried = [r for r in replicas if any(w["node"] == victim for w in r["workers"])]
        if carried:  # the replica is alive elsewhere and its engine worker on the dead node is named
            assert any(f"replica {r['replica_id']} of " in m and "lost engine workers" in m for r in carried for m in lost), every
        elif any(r["node"] == victim for r in replicas):  # the replica's own actor was on the dead node
            assert any(f"sits on node {victim}, which is DEAD" in m for m in lost), every
        else:  # Serve already replaced it (a slow status call on a busy machine): its health verdict
            assert any(m.startswith("deployment LLMServer:") and "UNHEALTHY" in m for m in lost), every

        heal_log: list[str] = []
        try:
            healed = up(served.manifest, cluster.deps(heal_log.append), UpOptions(timeout=240, collective_check=False))
        except OrchError as exc:  # said first, so that a shortened CI log keeps what went wrong
            pytest.fail(f"orch up did not heal {victim}: {exc.message} (hint: {exc.hint}); it said: {heal_log}", pytrace=False)
        assert healed.action == "heal" and healed.started == [victim]

        def answers():
            try:
                return _complete(served.endpoint, served.api_key).status_code == 200 or None
            except httpx.HTTPError:
                return None

        restored_by = "serve"
        if not cluster.wait_for(answers, timeout=420, interval=5.0):
            restored_by = "orch rollout"
            served.rollout(tp=2)
        recovered_after = time.monotonic() - killed_at
    measured(f"node loss: orch status showed {victim} DEAD and the replica unhealthy {shown_after:.1f} s after the kill "
          f"(status calls took {', '.join(f'{c:.1f}' for c in calls)} s); answering again after {recovered_after:.0f} s "
          f"(restored by {restored_by}); background requests ok={client.ok} failed={client.fail}")
    assert _complete(served.endpoint, served.api_key).status_code == 200
    after = spanning.workers()
    assert sorted(len(p) for p in after.values()) == [0, 0, 1, 1], after
