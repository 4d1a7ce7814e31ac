"""ray_cluster: argv/env builders and the parsers of real dashboard JSON (captured from Ray 2.60:
a head + a worker with a placement group holding 3 GPUs, then the worker's raylet killed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cluster.node_state import (
    DashboardFormatError,
    current_by_name,
    node_problems,
    parse_nodes,
    parse_usage,
    with_usage,
)
from orchestrator.cluster.ray_nodes import (
    NODE_DEATH_ENV_DEFAULTS,
    NODE_RESOURCE_AMOUNT,
    SERVE_ENV_DEFAULTS,
    head_start_argv,
    node_address,
    node_gpus,
    node_name_from_resources,
    node_resource,
    node_token_path,
    parse_stop,
    ray_process_env,
    silent_node_death_s,
    stop_argv,
    worker_start_argv,
)
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes.facts import NicAddress, NicInfo, NodeFacts

DATA = Path(__file__).resolve().parents[1] / "data" / "ray_dashboard"
HEAD_ID = "4a51e475b74873aa368577d96ff6ca434bb306068e8ff1632b78d131"
W1_ID = "7f3c9c67a98e5bbbd21e56c2745fe85b823b740b1fe62276c7bb2bc3"

MANIFEST = """
name: tb
python: /opt/venv/bin/python
nodes:
  - {name: head, host: 10.9.0.1, role: head, gpus: 8, interface: eth1, cpus: 16}
  - {name: w1, host: 10.9.0.2, gpus: 8, env: {NCCL_DEBUG: INFO, RAY_SERVE_ENABLE_HA_PROXY: "0"}}
ray: {port: 26379, dashboard_port: 28265, temp_dir: /tmp/orch-tb, object_store_memory: 150MB, num_cpus: 6}
env: {VLLM_CPU_KVCACHE_SPACE: "1", NCCL_DEBUG: WARN}
"""


def load(path: str) -> dict:
    return json.loads((DATA / path).read_text())


@pytest.fixture()
def manifest():
    return load_manifest(MANIFEST, Path("/x/tb.yaml"))


def facts_with_nic(name: str, host: str, nic: str, addr: str) -> NodeFacts:
    return NodeFacts(node=name, host=host, nics=(NicInfo(nic, "up", 1500, (NicAddress("inet", addr, 24),)),))


def opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_head_argv_binds_interface_address_and_loopback_dashboard(manifest):
    head = manifest.head
    argv = head_start_argv(manifest, head, facts_with_nic("head", "10.9.0.1", "eth1", "192.168.50.1"))
    assert argv[:5] == ["/opt/venv/bin/python", "-m", "ray.scripts.scripts", "start", "--head"]
    assert opt(argv, "--node-ip-address") == "192.168.50.1"
    assert opt(argv, "--port") == "26379"
    assert opt(argv, "--dashboard-host") == "127.0.0.1"
    assert opt(argv, "--dashboard-port") == "28265"
    assert opt(argv, "--num-gpus") == "8"
    assert opt(argv, "--num-cpus") == "16"  # the node's cpus beat ray.num_cpus
    assert json.loads(opt(argv, "--resources")) == {"orch_node_head": NODE_RESOURCE_AMOUNT}
    assert opt(argv, "--temp-dir") == "/tmp/orch-tb"
    assert opt(argv, "--object-store-memory") == "150000000"
    assert "--disable-usage-stats" in argv and "--block" not in argv


def test_worker_argv_joins_head_and_falls_back_to_host(manifest):
    w1 = manifest.node("w1")
    argv = worker_start_argv(manifest, w1, None, "192.168.50.1")
    assert argv[3:6] == ["start", "--address", "192.168.50.1:26379"]
    assert "--head" not in argv and "--dashboard-host" not in argv
    assert opt(argv, "--node-ip-address") == "10.9.0.2"
    assert opt(argv, "--num-cpus") == "6"
    assert json.loads(opt(argv, "--resources")) == {"orch_node_w1": 1000}


def test_gpus_as_probed_else_manifest(manifest):
    from orchestrator.nodes.facts import GpuInfo

    w1 = manifest.node("w1")
    probed = NodeFacts(node="w1", host="h", nvidia_smi=True, gpus=tuple(GpuInfo(i, "H100", 81559, "550") for i in range(4)))
    assert node_gpus(manifest, w1, probed) == 4
    assert node_gpus(manifest, w1, NodeFacts(node="w1", host="h", nvidia_smi=False)) == 8
    cpu = load_manifest("name: c\naccelerator: cpu\nnodes: [{name: a, host: 1.2.3.4, role: head}]\n", Path("/x/c.yaml"))
    assert node_gpus(cpu, cpu.head, probed) == 0


def test_interface_missing_in_facts_uses_host(manifest):
    assert node_address(manifest.head, NodeFacts(node="head", host="10.9.0.1")) == "10.9.0.1"


def test_process_env_order(manifest):
    head = manifest.head
    env = ray_process_env(manifest, head, facts_with_nic("head", "10.9.0.1", "eth1", "192.168.50.1"), token_path="/root/.orch/t")
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env["VLLM_HOST_IP"] == "192.168.50.1"
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/root/.orch/t"
    assert env["NCCL_DEBUG"] == "WARN" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    for key, value in SERVE_ENV_DEFAULTS.items():
        assert env[key] == value
    w1env = ray_process_env(manifest, manifest.node("w1"), None, token_path="/t")
    assert w1env["NCCL_DEBUG"] == "INFO"  # node env beats cluster env
    assert w1env["RAY_SERVE_ENABLE_HA_PROXY"] == "0"  # and the serving defaults
    assert "NCCL_SOCKET_IFNAME" not in w1env  # no interface named: NCCL chooses
    custom = ray_process_env(manifest, head, None, token_path="/t", serve_env={"RAY_SERVE_ENABLE_HA_PROXY": "1"})
    assert "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING" not in custom


def test_faster_node_death_detection_is_a_default_the_manifest_can_change():
    # Ray reads RAY_<config name> from its processes' environment; the GCS (head) owns the check.
    assert NODE_DEATH_ENV_DEFAULTS == {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "3000"}
    m = load_manifest("name: c\nnodes: [{name: a, host: 1.2.3.4, role: head, gpus: 1}]\n", Path("/x/c.yaml"))
    env = ray_process_env(m, m.head, None, token_path="/t")
    assert env["RAY_health_check_period_ms"] == "1000" and env["RAY_health_check_timeout_ms"] == "3000"
    own = load_manifest("name: c\nenv: {RAY_health_check_period_ms: '3000'}\n"
                        "nodes: [{name: a, host: 1.2.3.4, role: head, gpus: 1}]\n", Path("/x/c.yaml"))  # fmt: skip
    assert ray_process_env(own, own.head, None, token_path="/t")["RAY_health_check_period_ms"] == "3000"


def test_token_auth_cannot_be_overridden_by_manifest_env():
    m = load_manifest(
        "name: c\nnodes: [{name: a, host: 1.2.3.4, role: head, gpus: 1, env: {RAY_AUTH_MODE: disabled}}]\n", Path("/x/c.yaml")
    )
    assert ray_process_env(m, m.head, None, token_path="/t")["RAY_AUTH_MODE"] == "token"
    with pytest.raises(ValueError, match="token_path"):
        ray_process_env(m, m.head, None)
    off = load_manifest("name: c\nnodes: [{name: a, host: 1.2.3.4, role: head, gpus: 1}]\nray: {token_auth: false}\n", Path("/x/c.yaml"))
    assert "RAY_AUTH_MODE" not in ray_process_env(off, off.head, None)


def test_stop_argv_runs_the_scoped_stop_script(manifest):
    argv = stop_argv(manifest, manifest.head, "0123456789abcdef")
    assert argv[:2] == ["/opt/venv/bin/python", "-c"] and argv[3:] == ["0123456789abcdef", "/tmp/orch-tb"]
    assert stop_argv(manifest, manifest.head, None)[3:] == ["-", "/tmp/orch-tb"]  # no id: temp dir only
    assert parse_stop('noise\n{"killed": 2, "alive": [], "names": ["raylet", "VLLM::EngineCore"]}\n') == {
        "killed": 2, "alive": [], "names": ["raylet", "VLLM::EngineCore"], "denied": {}}  # fmt: skip
    assert parse_stop('{"killed": 0, "alive": [], "names": [], "denied": {"7": "not allowed to kill it"}}')["denied"] == {
        7: "not allowed to kill it"}  # fmt: skip
    with pytest.raises(ValueError):
        parse_stop("Traceback ...")


def test_node_token_path_is_under_home():
    assert node_token_path("tb", "/home/ops/") == "/home/ops/.orch/nodes/tb/ray-token"


def test_parse_nodes_two_alive():
    states = parse_nodes(load("nodes_two.json"))
    assert {s.name for s in states} == {"head", "w1"}
    head = next(s for s in states if s.name == "head")
    assert head.node_id == HEAD_ID and head.is_head and head.alive and head.address == "192.0.2.2"
    assert head.gpus_total == 8.0 and head.cpus_total == 4.0


def test_parse_nodes_dead_record_and_usage():
    states = parse_nodes(load("nodes_dead.json"))
    w1 = next(s for s in states if s.name == "w1")
    assert w1.state == "DEAD" and not w1.alive
    assert "heartbeats" in (w1.state_message or "") and w1.end_time_ms > 0
    problems = node_problems({"head": 8, "w1": 8, "w2": 8}, states)
    assert set(problems) == {"w1", "w2"}
    assert problems["w1"].startswith("DEAD") and problems["w2"] == "not in the Ray cluster"


def test_usage_from_cluster_status_counts_placement_group_gpus():
    usage = parse_usage(load("cluster_status_used.json"))
    assert usage[W1_ID]["GPU"] == 3.0 and usage[HEAD_ID]["GPU"] == 0.0
    states = with_usage(parse_nodes(load("nodes_two.json")), usage)
    w1 = next(s for s in states if s.name == "w1")
    assert w1.gpus_used == 3.0 and w1.resources_available["GPU"] == 5.0
    assert parse_usage(load("cluster_status_fresh.json")) == {}


def test_wrong_gpu_count_is_a_problem():
    states = parse_nodes(load("nodes_two.json"))
    assert node_problems({"head": 8, "w1": 8}, states) == {}
    assert node_problems({"head": 8, "w1": 4}, states) == {"w1": "ALIVE with 8 GPUs, expected 4"}


def test_current_by_name_prefers_alive_then_newest():
    dead = parse_nodes(load("nodes_dead.json"))
    alive = parse_nodes(load("nodes_two.json"))
    w1_alive = next(s for s in alive if s.name == "w1")
    from dataclasses import replace

    restarted = replace(w1_alive, node_id="new", start_time_ms=w1_alive.start_time_ms + 1)
    cur = current_by_name(dead + [restarted])
    assert cur["w1"].node_id == "new" and cur["w1"].alive


def test_node_name_ignores_placement_group_resources():
    assert node_name_from_resources({"orch_node_w1_group_0_23c45e835e0e212e5172d5245ae001000000": 1.0, "GPU": 8}) is None
    assert node_name_from_resources({"orch_node_gpu-2.a": 1000.0}) == "gpu-2.a"
    assert node_resource("gpu-2.a") == "orch_node_gpu-2.a"


def test_bad_payloads():
    with pytest.raises(DashboardFormatError):
        parse_nodes({"result": False, "msg": "boom", "data": {}})
    with pytest.raises(DashboardFormatError):
        parse_nodes({"result": True, "data": {"result": {}}})


def test_haproxy_side_ports_follow_the_serve_http_port():
    from orchestrator.cluster.ray_nodes import haproxy_ports

    assert haproxy_ports(8000) == {
        "RAY_SERVE_HAPROXY_METRICS_PORT": "9101",
        "RAY_SERVE_HAPROXY_STATS_PORT": "8404",
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": "8500",
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": "9500",
    }
    assert haproxy_ports(18000)["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] == "18500"


def test_a_silent_node_is_dead_in_ray_within_30_s():
    """Issue 46: a lost node is shown DEAD within 30 s. Ray 2.60's GCS health check (period 3000,
    timeout 10000, threshold 5, printed by ``ray._raylet.Config`` of the installed Ray) leaves a
    host that answers nothing ALIVE for 5 x (10 + 3) + 3 = 68 s; orch's environment must bring it
    to 20 s or so, leaving `orch status` (a few seconds, docs/rollout.md) inside 30 s."""
    assert silent_node_death_s({}) == 68.0
    m = load_manifest("name: c\nnodes: [{name: a, host: 1.2.3.4, role: head, gpus: 1}]\n", Path("/x/c.yaml"))
    assert silent_node_death_s(ray_process_env(m, m.head, None, token_path="/t")) <= 22.0
