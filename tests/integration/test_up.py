"""`orch up` on the test bed: real sshd hosts, real Ray.

- 3 hosts x 8 described GPUs become a 3-node Ray cluster with 24 GPUs; `orch status --json`
  shows them; a second `orch up` does nothing (no Ray process restarted).
- The Ray processes run with token auth, the NIC/host variables and the node's resource; a
  worker started without the token is refused by the head's GCS and joins nothing.
- Each preflight fault (4 GPUs where the manifest says 8, a missing interface, another ray
  version on one host, the model path missing on one host, the head's port blocked from one
  worker) stops `orch up` with exit 3 and the right code naming the right node, before anything
  starts (no Ray process on any host, nothing recorded, no token written).
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.cluster.ray_nodes import ray_argv
from orchestrator.state import StateStore
from tests.fixtures.cluster import RAY_PROCESS_MARKERS
from tests.testbed import HostSpec

pytestmark = [pytest.mark.integration]


@pytest.mark.ray
def test_up_brings_up_24_gpus_status_shows_them_and_second_up_does_nothing(ray_testbed_cluster, capsys):
    c = ray_testbed_cluster
    # The session's first `orch up` (fresh bed, fresh state dir) started Ray on every host.
    first = c.ups[0]
    assert (first.action, sorted(first.started)) == ("start", ["host0", "host1", "host2"]), first

    capsys.readouterr()
    assert main(c.cli("status", c.manifest_path, "--json")) == 0
    status = json.loads(capsys.readouterr().out)
    # The nodes' health: the top-level "healthy" also covers the shared served model, which the
    # serving tests before this one restart and redeploy (tests/integration/test_status.py kills a
    # worker's raylet), so it is asserted where it is the subject (test_node_changes.py, status tests).
    assert status["nodes_healthy"] is True, status
    assert status["healthy"] == (status["serving_healthy"] is not False), status
    assert status["totals"]["alive"] == 3 and status["totals"]["gpus_total"] == 24.0
    by_name = {n["name"]: n for n in status["nodes"]}
    for h in c.bed.hosts:
        row = by_name[h.name]
        assert (row["ray_state"], row["reachable"], row["gpus_total"]) == ("ALIVE", True, 8.0)
        assert row["address"] == h.address and row["gpu_type"] == "H100-80GB"
        assert row["versions"]["ray"] == "2.60.0"

    raylets = {h.name: c.raylet_pid(h.name) for h in c.bed.hosts}
    assert all(raylets.values()), raylets
    recorded = StateStore(c.state_dir).get_cluster(c.manifest.name)
    assert main(c.cli("up", c.manifest_path, "--json")) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["action"] == "nothing" and again["started"] == []
    assert again["message"].startswith("nothing to do")
    assert {h.name: c.raylet_pid(h.name) for h in c.bed.hosts} == raylets
    assert StateStore(c.state_dir).get_cluster(c.manifest.name).node_ids == recorded.node_ids


@pytest.mark.ray
def test_ray_runs_with_token_auth_and_node_settings(ray_testbed_cluster):
    c = ray_testbed_cluster
    name = c.manifest.name
    token_path = f"/root/.orch/nodes/{name}/ray-token"
    local = StateStore(c.state_dir).token_path(name)
    assert stat.S_IMODE(local.stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(token_path).stat().st_mode) == 0o600  # the hosts share /root
    assert stat.S_IMODE(Path(token_path).parent.stat().st_mode) == 0o700
    assert Path(token_path).read_text() == local.read_text()
    for h in c.bed.hosts:
        pid = c.raylet_pid(h.name)
        environ = c.bed.ns_exec(h, ["cat", f"/proc/{pid}/environ"]).stdout.split("\0")
        env = dict(item.split("=", 1) for item in environ if "=" in item)
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == token_path
        assert env["VLLM_HOST_IP"] == h.address
        assert env["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] == "1"
        assert env["ORCH_CLUSTER_ID"] == StateStore(c.state_dir).read_cluster_id(name)  # what `orch down` kills by
        args = c.ray_pids(h.name)[pid]
        assert f"orch_node_{h.name},1000" in args and "GPU,8" in args and "CPU,8" in args
        assert f"--node_ip_address={h.address}" in args


@pytest.mark.ray
def test_a_worker_without_the_token_is_refused_by_the_gcs(ray_testbed_cluster, tmp_path):
    c = ray_testbed_cluster
    m = c.manifest
    host = c.bed.hosts[2]
    node = next(n for n in m.nodes if n.name == host.name)
    temp = f"/tmp/orch-no-token-{c.bed.run_id}"  # its own temp dir: the host's real node is not touched
    argv = ray_argv(m, node, "start", "--address", f"{c.head_address}:{m.ray.port}", "--node-ip-address", host.address,
                    "--temp-dir", temp, "--num-cpus", "0", "--num-gpus", "0", "--disable-usage-stats")  # fmt: skip
    # No RAY_AUTH_TOKEN_PATH, auth off on this side, and a HOME without ~/.ray/auth_token.
    env = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", f"HOME={tmp_path}", "RAY_AUTH_MODE=disabled"]
    try:
        joined = c.bed.ns_exec(host, env + argv, check=False, timeout=180)
    finally:
        c.bed.ns_exec(host, ["pkill", "-KILL", "-f", temp], check=False)  # whatever it may have left
    output = joined.stdout + joined.stderr
    assert joined.returncode == 1 and "InvalidAuthToken" in output, output[-3000:]
    with c.dashboard() as d:
        alive = [n for n in d.nodes() if n.state == "ALIVE"]
    assert sorted(n.address for n in alive) == sorted(h.address for h in c.bed.hosts)  # nobody joined


# ------------------------------------------------------------------------------ preflight stops


@pytest.fixture(scope="module")
def preflight_bed(testbed_factory, tiny_model_dir):
    bed = testbed_factory.make(
        [
            HostSpec("8xH100-80GB", name="head"),
            HostSpec("4xH100-80GB", name="w1", expected_gpus=4),
            HostSpec("8xH100-80GB", name="w2"),
            HostSpec("8xH100-80GB", name="w3", versions={"ray": "2.59.0"}),  # only in one variant
        ],
        name="upstops",
    )
    # One path, private contents per host (each host bind-mounts its own dir there): the model
    # exists on head and w1 only.
    for name in ("head", "w1"):
        shutil.copytree(tiny_model_dir, bed.host(name).ray_dir / "models" / "tiny")
    yield bed
    bed.close()


def _manifest(bed, variant: str) -> str:
    doc = bed.manifest_dict(name="upstops")
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] != "w3" or variant == "ray_version"]
    nodes = {n["name"]: n for n in doc["nodes"]}
    if variant == "gpu_count":
        nodes["w1"]["gpus"] = 8  # the host describes 4
    elif variant == "interface":
        nodes["w2"]["interface"] = "ib0"  # w2 has no ib0
    elif variant == "model_path":
        doc["model_store"] = str(bed.ray_temp_dir / "models" / "tiny")
    return yaml.safe_dump(doc)


VARIANTS = {
    "gpu_count": ("GPU_COUNT_MISMATCH", "w1"),
    "interface": ("NIC_MISSING", "w2"),
    "ray_version": ("VERSION_MISMATCH", "w3"),
    "model_path": ("MODEL_PATH_MISSING", "w2"),
    "head_port": ("HEAD_PORT_UNREACHABLE", "w1"),
}


def _no_ray_anywhere(bed) -> dict[str, list[str]]:
    found = {}
    for h in bed.hosts:
        ps = bed.ns_exec(h, ["ps", "-ww", "-eo", "args="]).stdout.splitlines()
        hits = [line for line in ps if any(m in line for m in RAY_PROCESS_MARKERS)]
        if hits:
            found[h.name] = hits
    return found


def test_clean_manifest_passes_preflight(preflight_bed, tmp_path, capsys):
    path = tmp_path / "clean.yaml"
    path.write_text(_manifest(preflight_bed, "clean"))
    # The hosts' GPUs are stand-ins and torch is a CPU build: NCCL cannot run, so the collective
    # check (tests/integration/test_collective_testbed.py) is skipped here.
    assert main(["--state-dir", str(tmp_path / "s"), "up", str(path), "--check-only", "--json", "--skip-collective-check"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and not [f for f in report["findings"] if f["severity"] != "info"], report["findings"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_preflight_fault_stops_up_before_anything_starts(preflight_bed, variant, tmp_path, capsys):
    bed = preflight_bed
    path = tmp_path / f"{variant}.yaml"
    path.write_text(_manifest(bed, variant))
    state_dir = tmp_path / "state"
    if variant == "head_port":
        bed.block_port("w1", bed.host("head").address, 6379)
    try:
        rc = main(["--state-dir", str(state_dir), "up", str(path), "--json"])
    finally:
        bed.clear_faults("w1")
    captured = capsys.readouterr()
    assert rc == 3, captured.err
    report = json.loads(captured.out)
    fails = {(f["code"], f["node"]) for f in report["findings"] if f["severity"] == "fail"}
    assert fails == {VARIANTS[variant]}, report["findings"]
    code, node = VARIANTS[variant]
    assert f"error: preflight found 1 failure(s) on {node}: {code}@{node}" in captured.err
    assert "hint: nothing was started" in captured.err
    assert _no_ray_anywhere(bed) == {}
    assert StateStore(state_dir).list_clusters() == []
    assert not StateStore(state_dir).token_path("upstops").exists()
