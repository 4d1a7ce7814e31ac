"""`orch up/down/status` through the CLI boundary, with the workflows' dependencies replaced by
the simulated Ray world (tests/workflows/cluster_world.py): output, JSON and exit codes."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.preflight.findings import finding
from orchestrator.state import StateStore
from orchestrator.workflows.cluster import ClusterDeps
from tests.workflows.cluster_world import YAML, Clock, World, manifest_of


@pytest.fixture()
def cli_env(tmp_path, monkeypatch):
    state_dir = tmp_path / "state"
    monkeypatch.setenv("ORCH_STATE_DIR", str(state_dir))
    path = tmp_path / "tb.yaml"
    path.write_text(YAML)
    world = World(manifest_of())
    clock = Clock()
    box = {"check": lambda m, f: []}

    def make_deps(manifest, sd, accept, progress):
        assert sd == state_dir
        return ClusterDeps(state=StateStore(sd, clock=clock), open_runners=world.open_runners, gather=world.gather,
                           check=lambda m, f: box["check"](m, f), open_dashboard=world.open_dashboard, clock=clock,
                           sleep=clock.sleep, progress=progress)  # fmt: skip

    monkeypatch.setattr("orchestrator.cli.cluster.cluster_deps", make_deps)
    monkeypatch.setattr("orchestrator.cli.status.cluster_deps", make_deps)
    return path, world, box, state_dir


def test_up_json_then_nothing_to_do(cli_env, capsys):
    path, world, _, _ = cli_env
    assert main(["up", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["action"] == "start" and out["started"] == ["head", "w1", "w2"]
    assert sum(n["gpus_total"] for n in out["nodes"]) == 24
    assert main(["up", str(path)]) == 0
    captured = capsys.readouterr()
    assert "nothing to do" in captured.out
    assert "reading the Ray cluster's state" in captured.err  # progress goes to stderr


def test_up_preflight_failure_prints_table_and_exits_3(cli_env, capsys):
    path, world, box, _ = cli_env
    box["check"] = lambda m, f: [
        finding("fail", "GPU_COUNT_MISMATCH", "w1", "w1 has 4 GPUs; the manifest says 8", "fix nodes[1].gpus"),
        finding("warn", "NO_NVLINK", "w2", "w2's GPUs are joined by PCIe", "prefer pipeline parallel"),
    ]
    assert main(["up", str(path)]) == 3
    captured = capsys.readouterr()
    assert "GPU_COUNT_MISMATCH" in captured.out and "NO_NVLINK" in captured.out
    assert "error: preflight found 1 failure(s) on w1" in captured.err
    assert "hint: nothing was started" in captured.err
    assert world.ray_calls() == []


def test_up_check_only_json(cli_env, capsys):
    path, world, box, _ = cli_env
    box["check"] = lambda m, f: [finding("info", "NO_NVLINK", "w2", "PCIe", "ok")]
    assert main(["up", str(path), "--check-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["findings"][0]["code"] == "NO_NVLINK" and set(out["nodes"]) == {"head", "w1", "w2"}
    assert world.ray_calls() == []


def test_up_dry_run_shows_diff(cli_env, capsys, tmp_path):
    path, world, _, _ = cli_env
    assert main(["up", str(path)]) == 0
    path.write_text(YAML.replace("dashboard_port: 28265", "dashboard_port: 28266"))
    capsys.readouterr()
    assert main(["up", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "~ ray.dashboard_port: 28265 -> 28266" in out and "would restart" in out


def test_down_with_unreachable_node_stops_the_others_and_exits_4(cli_env, capsys):
    path, world, _, state_dir = cli_env
    assert main(["up", str(path)]) == 0
    world.unreachable.add("w2")
    capsys.readouterr()
    assert main(["down", str(path), "--json"]) == 4  # an unreachable node: 4 for every command
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    by = {n["node"]: n for n in out["nodes"]}
    assert by["head"]["ok"] and by["w2"]["unreachable"] and not out["ok"]
    assert "error: not reached: w2; Ray may still run there" in captured.err
    # w2 did not confirm its stop: the cluster stays recorded as up, and orch says so
    assert not out["recorded_down"] and StateStore(state_dir).get_cluster("tb").state == "up"
    assert "stays recorded as up until every node confirms" in captured.err


def test_down_of_a_cluster_never_started_says_so_not_that_it_stays_up(cli_env, capsys):
    """Issue 25 item 7: a never-started, unreachable cluster was said to "stay recorded as up"."""
    path, world, _, state_dir = cli_env
    world.unreachable.update({"head", "w1", "w2"})
    assert main(["down", str(path)]) == 4
    err = capsys.readouterr().err
    assert "stays recorded as up" not in err
    assert "error: not reached: head, w1, w2; cluster tb is not recorded as up (never started by orch, or already down)" in err
    assert StateStore(state_dir).get_cluster("tb") is None


def test_status_finds_the_recorded_cluster(cli_env, capsys):
    path, world, _, state_dir = cli_env
    assert main(["up", str(path)]) == 0
    world.kill_raylet("w1")
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"] == "tb" and out["totals"]["alive"] == 2 and out["healthy"] is False
    assert {n["name"]: n["ray_state"] for n in out["nodes"]} == {"head": "ALIVE", "w1": "DEAD", "w2": "ALIVE"}
    assert main(["status", str(path)]) == 0
    text = capsys.readouterr().out
    assert "DEAD" in text and "2/3 nodes ALIVE" in text and "heartbeats" in text
    # HAProxy's stats/metrics ports, which Ray 2.60 binds to every address (8404/9101 at Serve's
    # 8000: stack notes), are named in the report every time
    assert out["warnings"] == [HAPROXY_8000]
    assert "warning: HAProxy (Ray Serve) on head, w1, w2" in " ".join(text.split())


HAPROXY_8000 = ("HAProxy (Ray Serve) on head, w1, w2 serves its stats page on port 8404 and Prometheus metrics on port 9101 "
                "to every address, without auth: Ray 2.60 has no setting for their bind address; allow them only from "
                "trusted hosts (docs/cluster.md)")  # fmt: skip


def test_up_warns_about_the_ports_orch_cannot_close(cli_env, capsys):
    path, _, _, _ = cli_env
    assert main(["up", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["warnings"] == [HAPROXY_8000]
    assert f"warning: {HAPROXY_8000}" in captured.err
    off = path.with_name("off.yaml")
    off.write_text(YAML + "env: {RAY_SERVE_ENABLE_HA_PROXY: '0'}\n")
    assert main(["up", str(off), "--check-only", "--json"]) == 0
    assert "HAProxy" not in capsys.readouterr().err


def test_status_without_any_cluster_or_with_two(cli_env, capsys):
    _, _, _, state_dir = cli_env
    assert main(["status"]) == 0  # nothing up is an answer (issue 25 item 2)
    assert capsys.readouterr().out.startswith(f"no cluster is up in {state_dir};")
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"cluster": None, "up": False, "message": f"no cluster is up in {state_dir}", "clusters": []}
    store = StateStore(state_dir)
    for name in ("a", "b"):
        store.record_cluster(name, "f", "h", 1, manifest_json=manifest_of().model_dump_json())
    assert main(["status"]) == 2
    assert "2 clusters are up (a, b)" in capsys.readouterr().err


def _render_text(renderable) -> str:
    from rich.console import Console

    console = Console(width=100, record=True, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


def test_status_versions_column_only_when_nodes_differ():
    from orchestrator.cli.status import render_nodes
    from orchestrator.nodes.facts import Versions
    from orchestrator.status.nodes import NodeRow, NodesSection

    def row(name, ray):
        return NodeRow(name, "worker", "10.0.0.1", "10.0.0.1", "ALIVE", True, 8, 8.0, 2.0, "H100-80GB",
                       versions=Versions(python="3.11.7", ray=ray, vllm="0.32.0", torch="2.13.0"))  # fmt: skip

    same = _render_text(render_nodes(NodesSection([row("a", "2.60.0"), row("b", "2.60.0")])))
    assert "versions (every reachable node): python 3.11.7, ray 2.60.0" in same and "python/ray" not in same
    assert "2/8" in same and "4 used of 16" in same
    differ = _render_text(render_nodes(NodesSection([row("a", "2.60.0"), row("b", "2.59.0")])))
    assert "python/ray/vllm/torch" in differ and "2.59.0" in differ and "every reachable node" not in differ
