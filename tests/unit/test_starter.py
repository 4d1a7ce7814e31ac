"""The starter manifest of `orch init` (nodes/starter.py), from facts parsed out of real probe
captures (tests/data/probes/SOURCES.md): what each field gets, and that the text is a manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import probes
from orchestrator.nodes.facts import GpuInfo, NodeFacts
from orchestrator.nodes.starter import (
    StarterSettings,
    accelerator_of,
    node_names,
    placeholder_nodes,
    render_starter,
    starter_node,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "probes"
NICS = tuple(probes.parse_ip_addr((DATA / "ip_j_addr_testhost_eth0_ib0.json").read_text()))  # eth0 .250.11, ib0 .251.11
IB = tuple(probes.parse_ibstat((DATA / "ibstat_ib_two_ports_rdmacore_847.txt").read_text()))  # mlx4_0 port 1 Down, 2 Active
(NVL,) = probes.parse_gpu_query((DATA / "gpu_query_h100nvl_akash_91.csv").read_text(), fields=("name", "pci.device_id"))


def facts(gpus=(), nics=NICS, ib=IB, nvidia_smi=True) -> NodeFacts:
    return NodeFacts(node="n", host="h", gpus=tuple(gpus), nvidia_smi=nvidia_smi, nics=nics, ib_devices=ib)


def gpus(n, name=NVL.name):
    return [GpuInfo(index=i, name=name, memory_total_mib=None, driver_version=None) for i in range(n)]


def test_a_probed_node_gets_its_gpus_type_interface_and_active_ib_ports():
    node = starter_node("node0", "10.144.250.11", "head", facts(gpus(4)), "10.144.250.11")
    assert (node.gpus, node.gpu_type, node.interface, node.ib_hca) == (4, "H100-94GB", "eth0", "mlx4_0:2")
    assert node.notes == ()
    # the NIC is the one that carries the address orch reached the node at
    assert starter_node("node0", "ib-side", "head", facts(gpus(4)), "10.144.251.11").interface == "ib0"


def test_what_cannot_be_filled_in_is_said_not_guessed():
    node = starter_node("n", "10.9.9.9", "worker", facts(gpus(2, "NVIDIA GeForce RTX 5090"), ib=IB[:1]), "10.9.9.9")
    assert node.gpu_type is None and node.interface is None and node.ib_hca is None
    assert node.notes == (
        "gpu_type left out: orch has no type for NVIDIA GeForce RTX 5090 (known: docs/manifest.md)",
        "interface left out: no NIC holds 10.9.9.9 (NICs with an address: eth0, ib0); set the one the nodes reach each other on",
        "InfiniBand devices found, none active: mlx4_0:1 Down",
    )


def test_the_accelerator_follows_the_hosts_and_a_mix_is_refused():
    gpu = starter_node("a", "h1", "head", facts(gpus(8)), None)
    cpu = starter_node("b", "h2", "worker", facts(nvidia_smi=False), None)
    assert accelerator_of([gpu]) == "gpu" and accelerator_of([cpu]) == "cpu"
    with pytest.raises(UsageError, match="a have GPUs and b have none"):
        accelerator_of([gpu, cpu])


def test_node_names():
    assert node_names(["10.0.0.1", "gpu-a.example.com", "gpu-a.other.net", "::1"]) == ["node0", "gpu-a", "gpu-a-2", "node3"]


def test_the_text_is_a_manifest_with_what_was_found():
    settings = StarterSettings(name="lab", user="ubuntu", port=2222, identity_file="/keys/id", known_hosts="/keys/kh",
                               python="/opt/vllm/bin/python", temp_dir="/scratch/ray", hosts=("10.144.250.11", "10.144.251.11"))  # fmt: skip
    nodes = [starter_node("node0", "10.144.250.11", "head", facts(gpus(4)), "10.144.250.11"),
             starter_node("node1", "10.144.251.11", "worker", facts(gpus(4)), "10.144.251.11")]  # fmt: skip
    text = render_starter(settings, nodes, accelerator_of(nodes), "2026-12-02 12:00 UTC")
    m = load_manifest(text, Path("/tmp/lab.yaml"))
    assert (m.name, m.accelerator, m.python, m.ssh.user, m.ssh.port) == ("lab", "gpu", "/opt/vllm/bin/python", "ubuntu", 2222)
    assert (str(m.ssh.identity_file), str(m.ssh.known_hosts), m.ray.temp_dir) == ("/keys/id", "/keys/kh", "/scratch/ray")
    assert [(n.name, n.host, n.role, n.gpus, n.gpu_type, n.interface, dict(n.env)) for n in m.nodes] == [
        ("node0", "10.144.250.11", "head", 4, "H100-94GB", "eth0", {"NCCL_IB_HCA": "mlx4_0:2"}),
        ("node1", "10.144.251.11", "worker", 4, "H100-94GB", "ib0", {"NCCL_IB_HCA": "mlx4_0:2"}),
    ]
    assert "gpus: 4                        # nvidia-smi lists 4 x NVIDIA H100 NVL" in text
    assert "written by `orch init` on 2026-12-02 12:00 UTC" in text


def test_without_hosts_the_placeholders_are_a_valid_manifest():
    text = render_starter(StarterSettings(name="c"), placeholder_nodes(), "gpu", "now")
    m = load_manifest(text, Path("/tmp/c.yaml"))
    assert m.summary() == "cluster 'c' - 1 node (1 head), 8 GPUs (H100-80GB), ray :6379"
    assert "`orch init --hosts HOST,... --user USER` fills them by probing" in text
