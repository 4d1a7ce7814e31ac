"""gather_facts on nodes whose nvidia-smi prints what old and new drivers print (captures in
tests/data/probes/SOURCES.md), and what preflight makes of it."""

from __future__ import annotations

from pathlib import Path

from orchestrator.nodes import inventory, probes
from orchestrator.preflight.run import run_checks
from orchestrator.remote.fake import Prefix, result
from tests.workflows.test_inventory import gpu_node, manifest, ticking

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"
FULL_QUERY = Prefix("nvidia-smi", "--query-gpu=" + ",".join(probes.GPU_FIELDS))
REFUSED = (DATA / "smi_query_invalid_field_compute_cap_inference_snaps_89.txt").read_text()
HELP_470 = (DATA / "smi_help_query_gpu_470_candle_733_excerpt.txt").read_text()
BANNER_470 = (DATA / "smi_banner_470_cuda_na_ros_docker_gui_12_excerpt.txt").read_text()
# The GPU of the 470.57.02 capture: Quadro P620, 4042 MiB, bus 00000000:01:00.0 (the UUID is a
# placeholder in the style of masked captures).
P620 = {"index": "0", "name": "Quadro P620", "memory.total": "4042", "driver_version": "470.57.02",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000", "pci.bus_id": "00000000:01:00.0", "mig.mode.current": "[N/A]"}  # fmt: skip


def row(fields) -> str:
    return ", ".join(P620[f] for f in fields) + "\n"


def one_gpu_manifest():
    return manifest(nodes=[{"name": "head", "host": "head.example", "role": "head", "gpus": 1, "interface": "eth0"}])


def node_470(first):
    return gpu_node("head", "192.0.2.10", gpus=1, first=[(FULL_QUERY, result(REFUSED, exit_code=2)), *first,
                                                         (("nvidia-smi",), result(BANNER_470))])  # fmt: skip


def test_driver_470_refuses_compute_cap_and_help_says_which_fields_it_knows():
    narrowed = ("name", "driver_version", "uuid", "pci.bus_id")  # what the 470 help excerpt lists of GPU_FIELDS
    r = node_470([(("nvidia-smi", "--help-query-gpu"), result(HELP_470)),
                  (Prefix("nvidia-smi", "--query-gpu=" + ",".join(narrowed)), result(row(narrowed)))])  # fmt: skip
    m = one_gpu_manifest()
    f = inventory.gather_facts(r, m.node("head"), m, clock=ticking())
    assert f.nvidia_smi is True
    assert [(g.name, g.driver_version, g.pci_bus_id, g.compute_cap) for g in f.gpus] == [("Quadro P620", "470.57.02", "00000000:01:00.0", None)]
    assert f.driver_version == "470.57.02" and f.cuda_version is None
    assert "index, memory.total, mig.mode.current, compute_cap" in f.errors["gpu_fields"]
    found = run_checks(m, {"head": f})
    assert "GPU_NOT_FOUND" not in {x.code for x in found}
    notes = [x for x in found if x.code == "PROBE_FAILED" and "gpu_fields" in x.message]
    assert [x.severity for x in notes] == ["info"]


def test_without_help_the_refused_field_is_dropped_and_the_query_retried():
    seven = probes.GPU_FIELDS[:-1]
    r = node_470([(("nvidia-smi", "--help-query-gpu"), result("Invalid combination of input arguments.\n", exit_code=2)),
                  (Prefix("nvidia-smi", "--query-gpu=" + ",".join(seven)), result(row(seven)))])  # fmt: skip
    m = one_gpu_manifest()
    f = inventory.gather_facts(r, m.node("head"), m, clock=ticking())
    (gpu,) = f.gpus
    assert (gpu.index, gpu.name, gpu.memory_total_mib, gpu.mig_mode, gpu.compute_cap) == (0, "Quadro P620", 4042, None, None)
    queries = [c.argv[1] for c in r.ran("nvidia-smi") if c.argv[1:2] and c.argv[1].startswith("--query-gpu=")]
    assert queries == ["--query-gpu=" + ",".join(probes.GPU_FIELDS), "--query-gpu=" + ",".join(seven)]
    assert f.errors["gpu_fields"].endswith("field(s) compute_cap; queried without them")


def test_a_query_nvidia_smi_keeps_refusing_is_a_probe_failure_not_a_missing_driver():
    r = node_470([(("nvidia-smi", "--help-query-gpu"), result("", exit_code=2))])
    r.on(lambda argv: argv[1:2] != () and argv[1].startswith("--query-gpu="), result(REFUSED, exit_code=2))
    m = one_gpu_manifest()
    f = inventory.gather_facts(r, m.node("head"), m, clock=ticking())
    assert f.nvidia_smi is True and f.gpus == ()
    codes = {x.code for x in run_checks(m, {"head": f})}
    assert "PROBE_FAILED" in codes and "GPU_NOT_FOUND" not in codes


def test_an_unreadable_topology_is_reported_with_its_line_never_skipped():
    # 8 GPUs, but the topology output is cut inside the GPU6 row (a real paste).
    cut = (DATA / "topo_8gpu_pcie_deepep_128_excerpt.txt").read_text()
    r = gpu_node("head", "192.0.2.10", first=[(("nvidia-smi", "topo", "-m"), result(cut))])
    m = manifest(nodes=[{"name": "head", "host": "head.example", "role": "head", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"}])
    f = inventory.gather_facts(r, m.node("head"), m, clock=ticking())
    assert f.topology is None
    (finding,) = [x for x in run_checks(m, {"head": f}) if x.code == "PROBE_FAILED"]
    assert finding.severity == "warn"
    assert "nvidia-smi topo -m: line 8: expected one row per GPU column; no row for GPU7" in finding.message
    assert finding.hint.endswith("`orch runbook PROBE_FAILED` or runbooks/PROBE_FAILED.md")


def test_the_ansi_header_of_new_drivers_reaches_the_nvlink_check():
    b300 = (DATA / "topo_8gpu_b300_nv18_ansi_sglang_26039.txt").read_text()
    r = gpu_node("head", "192.0.2.10", first=[(("nvidia-smi", "topo", "-m"), result(b300))])
    m = manifest(nodes=[{"name": "head", "host": "head.example", "role": "head", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"}])
    f = inventory.gather_facts(r, m.node("head"), m, clock=ticking())
    assert "topology" not in f.errors and f.topology.nvlink is True


def test_cuda_na_in_a_container_keeps_the_driver():
    r = gpu_node("head", "192.0.2.10", first=[(("nvidia-smi",), result(BANNER_470))])
    m = manifest(nodes=[{"name": "head", "host": "head.example", "role": "head", "gpus": 8, "gpu_type": "H100-80GB", "interface": "eth0"}])
    f = inventory.gather_facts(r, m.node("head"), m, clock=ticking())
    assert f.cuda_version is None and "CUDA Version: N/A" in f.errors["cuda"]
    assert f.driver_version == "550.90.07"  # from --query-gpu of this node, the banner is not needed for it
