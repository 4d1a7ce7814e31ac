"""The collective check for real: Gloo between 3 test hosts over real SSH (`orch up --check-only`),
then the two faults it exists for, each named by node: a firewall that lets only Ray's port
through between the head and one worker, and an interface whose address the peers cannot reach.
One bed of 3 hosts (CPU manifest: Gloo) for the module; faults are cleared between tests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.collective.plan import DEADLINE_S, JOB_MARK, RUNNER_GRACE_S
from orchestrator.manifest.load import load_manifest
from orchestrator.remote.connect import open_runners
from orchestrator.state import StateStore
from orchestrator.workflows.cluster import ClusterDeps, PreflightStopped, UpOptions, up
from tests.testbed import HostSpec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(testbed_factory) -> Iterator:
    bed = testbed_factory.make([HostSpec("none", name=f"c{i}") for i in range(3)], name="collective")
    yield bed
    bed.close()


def manifest_for(bed, tmp_path, node_overrides=None, **overrides):
    # Every node names its interface: without one Gloo binds the address the host name resolves
    # to, which is not the test network here (the stack notes; the check fails such a manifest).
    nodes = {h.name: {"interface": "eth0"} for h in bed.hosts}
    nodes.update(node_overrides or {})
    doc = bed.manifest_dict(accelerator="cpu", node_overrides=nodes, **overrides)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, load_manifest(path.read_text(), path)


def check_only(bed, manifest, state_dir):
    deps = ClusterDeps(state=StateStore(state_dir), open_runners=lambda m: open_runners(m, bed.known_hosts))
    return up(manifest, deps, UpOptions(check_only=True))


def leftovers(bed, port: int) -> dict[str, list[str]]:
    """Per host: processes of the check still running, and listeners on the rendezvous port."""
    out = {}
    for h in bed.hosts:
        procs = [ln for ln in bed.ns_exec(h, ["ps", "-ww", "-eo", "args="]).stdout.splitlines() if JOB_MARK in ln]
        listen = [ln for ln in bed.ns_exec(h, ["ss", "-Hltn"]).stdout.splitlines() if f":{port} " in ln]
        out[h.name] = procs + listen
    return out


def test_three_hosts_pass_with_measured_figures(bed, tmp_path, capsys):
    path, _ = manifest_for(bed, tmp_path)
    state = tmp_path / "state"
    assert main(["--state-dir", str(state), "up", str(path), "--check-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    coll = out["collective"]
    assert out["ok"] is True and coll["ok"] is True and coll["backend"] == "gloo" and coll["ranks"] == ["c0", "c1", "c2"]
    assert [p["nodes"] for p in coll["pairs"]] == [["c0", "c1"], ["c0", "c2"]]
    for group in [*coll["pairs"], coll["all"]]:
        assert group["ok"] is True and [s["bytes"] for s in group["sizes"]] == [8 << 10, 1 << 20, 16 << 20]
        assert group["busbw_gbps"] > 0 and group["latency_us"] > 0
        assert group["link_gbps"] == 10000 / 8000  # the veth's /sys/class/net/eth0/speed, read on the host
    assert not [f for f in out["findings"] if f["code"].startswith("COLLECTIVE")]
    assert leftovers(bed, coll["port"]) == {"c0": [], "c1": [], "c2": []}
    # Recorded: `orch status --json` shows the figures (the cluster itself is not up).
    main(["--state-dir", str(state), "status", str(path), "--json"])
    status = json.loads(capsys.readouterr().out)
    assert status["collective"]["all"]["busbw_gbps"] == coll["all"]["busbw_gbps"]


def test_firewall_between_head_and_one_worker_names_that_worker(bed, tmp_path):
    path, manifest = manifest_for(bed, tmp_path)
    head, w1, _ = bed.hosts
    # Only Ray's port open from c1 to the head: preflight's TCP test passes, nothing else does.
    bed.block_all_but(w1, head.address, manifest.ray.port)
    t0 = time.monotonic()
    try:
        with pytest.raises(PreflightStopped) as caught:
            check_only(bed, manifest, tmp_path / "state")
    finally:
        bed.clear_faults(w1)
    elapsed = time.monotonic() - t0
    found = [(f.code, f.node) for f in caught.value.findings if f.severity == "fail"]
    assert found == [("COLLECTIVE_INIT_FAILED", "c1")], caught.value.findings
    message = caught.value.findings[-1].message
    assert "c1: could not join the rendezvous on c0" in message and "timed out" in message  # torch's own line
    report = caught.value.collective
    assert [p.ok for p in report.pairs] == [False, True] and report.all.skipped
    # Bounded: the jobs give up at their deadline; orch waits at most the runner's grace more.
    assert report.seconds < DEADLINE_S + RUNNER_GRACE_S and elapsed < DEADLINE_S + RUNNER_GRACE_S + 60
    assert leftovers(bed, report.port) == {"c0": [], "c1": [], "c2": []}


def test_interface_unreachable_from_peers_names_the_workers(bed, tmp_path):
    head, w1, w2 = bed.hosts
    prefix = head.address.rsplit(".", 1)[0]
    for h in (w1, w2):  # on the shared subnet, so preflight's NIC and subnet checks pass
        bed.add_unroutable_nic(h, "nr0", f"{prefix}.{100 + h.index}/24")
    path, manifest = manifest_for(bed, tmp_path, node_overrides={"c0": {"interface": "eth0"}, "c1": {"interface": "nr0"},
                                                                 "c2": {"interface": "nr0"}})  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(PreflightStopped) as caught:
        check_only(bed, manifest, tmp_path / "state")
    fails = [f for f in caught.value.findings if f.severity == "fail"]
    # Seen here: each worker's connection to the head works (the head learns the worker's
    # address from the worker's own ARP request), the workers cannot reach each other, so the
    # all-nodes group fails, named by the addresses in Gloo's lines or for the cluster.
    assert fails and {f.code for f in fails} == {"COLLECTIVE_INIT_FAILED"}, fails
    assert {f.node for f in fails} <= {"c1", "c2", None}, fails
    assert not [f for f in caught.value.findings if f.code.startswith("NIC_") or f.code == "HEAD_PORT_UNREACHABLE"]
    assert time.monotonic() - t0 < DEADLINE_S + RUNNER_GRACE_S + 60
    assert leftovers(bed, caught.value.collective.port) == {"c0": [], "c1": [], "c2": []}
