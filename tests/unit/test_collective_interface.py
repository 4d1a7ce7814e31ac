"""Which NIC NCCL/Gloo use on a node (``cluster.ray_nodes.collective_interface``), on real
``ip -j addr`` output: a test host with eth0 (the SSH/Ray network) and ib0 (a second network),
captured on this project's test bed (tests/data/probes/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster.ray_nodes import collective_interface, ray_process_env
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes.facts import NodeFacts
from orchestrator.nodes.probes import parse_ip_addr

DATA = Path(__file__).resolve().parents[1] / "data" / "probes"
# The captured host: eth0 10.144.250.11/24, ib0 10.144.251.11/24, lo.
NICS = tuple(parse_ip_addr((DATA / "ip_j_addr_testhost_eth0_ib0.json").read_text()))


def manifest(accelerator: str = "gpu", interface: str | None = None, hosts: int = 2, host1: str = "10.144.250.11"):
    iface = f", interface: {interface}" if interface else ""
    nodes = [f"  - {{name: n0, host: 10.144.250.10, role: head, gpus: 1{iface}}}"]
    if hosts > 1:
        nodes.append(f"  - {{name: n1, host: {host1}, gpus: 1{iface}}}")
    text = f"name: c\naccelerator: {accelerator}\nnodes:\n" + "\n".join(nodes) + "\nray: {token_auth: false}\n"
    if accelerator == "cpu":
        text = text.replace("gpus: 1", "gpus: 0")
    return load_manifest(text, Path("/x/c.yaml"))


def facts(host: str = "10.144.250.11") -> NodeFacts:
    return NodeFacts(node="n1", host=host, nics=NICS)


def test_the_nic_carrying_the_node_address_is_chosen_and_exported():
    m = manifest()
    node = m.node("n1")
    nic = collective_interface(m, node, facts())
    assert (nic.name, nic.source, nic.address) == ("eth0", "derived", "10.144.250.11")
    assert nic.describe("n1") == "n1: NCCL/Gloo interface eth0 (carries the node's address 10.144.250.11; the manifest names none)"
    env = ray_process_env(m, node, facts())
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_a_node_reached_over_its_second_network_gets_that_nic():
    m = manifest(host1="10.144.251.11")
    assert collective_interface(m, m.node("n1"), facts("10.144.251.11")).name == "ib0"


def test_the_manifest_interface_wins():
    m = manifest(interface="ib0")
    nic = collective_interface(m, m.node("n1"), facts())
    assert (nic.name, nic.source) == ("ib0", "manifest")
    assert ray_process_env(m, m.node("n1"), facts())["GLOO_SOCKET_IFNAME"] == "ib0"


def test_nothing_to_choose_on_one_node_a_cpu_cluster_derives_too_and_a_reason_when_no_nic_matches():
    one = manifest(hosts=1)
    assert collective_interface(one, one.head, facts("10.144.250.10")).source == "none"
    cpu = manifest(accelerator="cpu")  # orch up's Gloo check and Gloo in vLLM's CPU workers need it as well
    assert (collective_interface(cpu, cpu.node("n1"), facts()).name, collective_interface(cpu, cpu.node("n1"), facts()).source) == ("eth0", "derived")
    assert ray_process_env(cpu, cpu.node("n1"), facts())["GLOO_SOCKET_IFNAME"] == "eth0"
    elsewhere = manifest(host1="node1.example")  # a host name: no probed address equals it
    nic = collective_interface(elsewhere, elsewhere.node("n1"), facts("node1.example"))
    assert nic.name is None and "no interface carries the node's address node1.example" in nic.describe("n1")
    m = manifest()
    assert "no interfaces were probed" in collective_interface(m, m.node("n1"), None).reason
