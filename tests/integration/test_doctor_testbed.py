"""orch doctor on the test bed: a deliberately broken cluster diagnosed with the right code.

Two hosts (network namespaces with their own sshd and private Ray temp dir). The manifest names
an interface the worker does not have (``eth99``); Ray is started by orch's `up` workflow with
preflight forced off (its check injected as "no findings"), so orch exports
``GLOO_SOCKET_IFNAME=eth99`` / ``NCCL_SOCKET_IFNAME=eth99`` into the worker's Ray processes. A
driver run on the head over SSH then places a vLLM engine (the tiny model) on the worker, as a
rollout would; vLLM's CPU worker initialises torch.distributed with Gloo and dies. ``orch doctor``
must name the worker with ``COLLECTIVE_IFACE_NOT_FOUND`` (from the logs, with file:line) and
``NIC_MISSING`` (from the facts), and exit 1.
"""

from __future__ import annotations

import json
import sys

import pytest

from orchestrator.cli import main
from orchestrator.cluster.ray_nodes import node_resource, node_token_path, ray_process_env
from orchestrator.doctor.diagnose import diagnose
from orchestrator.manifest.load import load_manifest
from orchestrator.remote.connect import open_runners
from orchestrator.state import StateStore
from orchestrator.workflows.cluster import ClusterDeps, UpOptions, up
from orchestrator.workflows.down import down
from tests.testbed import HostSpec

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]

# Runs on the head (over SSH, with the head's Ray environment): put a vLLM engine on the worker.
DRIVER = r"""
import sys, ray
address, resource, model = sys.argv[1:4]
ray.init(address=address)

@ray.remote(num_cpus=1)
class Engine:
    def __init__(self, model):
        from vllm import LLM
        LLM(model=model, max_model_len=256, dtype="bfloat16")

    def ready(self):
        return True

engine = Engine.options(resources={resource: 0.001}).remote(model)
try:
    ray.get(engine.ready.remote(), timeout=600)
    print("ENGINE_STARTED")
except Exception as exc:
    print("ENGINE_FAILED", type(exc).__name__)
"""


def test_wrong_interface_is_diagnosed(make_testbed, tiny_model_dir, tmp_path, capsys):
    bed = make_testbed([HostSpec("none", name="head"), HostSpec("none", name="w1")], name="doctor-iface")
    text = bed.manifest_yaml(
        accelerator="cpu",
        node_overrides={"head": {"cpus": 4}, "w1": {"cpus": 4, "interface": "eth99"}},
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    manifest = load_manifest(text, path)
    deps = ClusterDeps(
        state=StateStore(tmp_path / "state"),
        open_runners=lambda m: open_runners(m, bed.known_hosts),
        check=lambda m, facts: [],  # preflight forced off: NIC_MISSING would have stopped `up`
    )
    try:
        # The collective check would stop `up` on this interface too (it is part of preflight).
        result = up(manifest, deps, UpOptions(timeout=180, collective_check=False))
        assert result.action == "start"

        with open_runners(manifest, bed.known_hosts, nodes=["head"]) as runners:
            head = runners["head"]
            home = head.run(["printenv", "HOME"]).check("head").stdout.strip()
            env = ray_process_env(manifest, manifest.head, None, node_token_path(manifest.name, home))
            ran = head.run(
                [sys.executable, "-c", DRIVER, f"{result.head_address}:{manifest.ray.port}", node_resource("w1"),
                 str(tiny_model_dir)],
                timeout=900,
                env=env,
            )  # fmt: skip
        assert "ENGINE_FAILED" in ran.stdout, ran.stdout + ran.stderr

        with open_runners(manifest, bed.known_hosts) as runners:
            report = diagnose(manifest, runners)
        got = {(f.node, f.code): f for f in report.findings}
        iface = got[("w1", "COLLECTIVE_IFACE_NOT_FOUND")]
        assert "Unable to find address for: eth99" in iface.evidence
        assert iface.line_no is not None and iface.file.startswith("logs/")
        assert got[("w1", "NIC_MISSING")].source == "preflight"
        assert not any(node == "head" and f.severity == "fail" for (node, _), f in got.items())
        assert report.failed

        assert main(["doctor", str(path), "--json"]) == 1
        cli = json.loads(capsys.readouterr().out)
        assert {(f["node"], f["code"]) for f in cli["findings"]} >= {("w1", "COLLECTIVE_IFACE_NOT_FOUND"), ("w1", "NIC_MISSING")}
    finally:
        down(manifest, deps)
