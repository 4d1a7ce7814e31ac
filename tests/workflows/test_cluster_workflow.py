"""The cluster workflows (up/down/status) against FakeRunners over a simulated Ray world
(tests/workflows/cluster_world.py). The clock is fake: waits never sleep for real."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from orchestrator import cluster_lock
from orchestrator.cluster_lock import ClusterBusy
from orchestrator.errors import ClusterError, UsageError
from orchestrator.manifest.load import load_manifest
from orchestrator.preflight.findings import finding
from orchestrator.remote.local import LocalRunner
from orchestrator.state import StateStore
from orchestrator.workflows.cluster import (
    ClusterDeps,
    PreflightStopped,
    UpOptions,
    up,
)
from orchestrator.workflows.down import down
from orchestrator.workflows.node_files import install_token, node_home, remove_token
from orchestrator.workflows.status_nodes import status_nodes
from tests.workflows.cluster_world import GCS_UNREACHABLE_SAID, MACHINE_ADDRESS, PY, YAML, Clock, World, manifest_of


@pytest.fixture()
def env(tmp_path):
    manifest = manifest_of()
    world = World(manifest)
    clock = Clock()
    store = StateStore(tmp_path / "state", clock=clock)
    messages: list[str] = []
    deps = ClusterDeps(
        state=store, open_runners=world.open_runners, gather=world.gather, check=lambda m, f: [],
        open_dashboard=world.open_dashboard, clock=clock, sleep=clock.sleep, token_factory=lambda: "t0k3n",
        progress=messages.append,
    )  # fmt: skip
    return manifest, world, deps, messages


def test_fresh_up_starts_every_node_and_records(env):
    manifest, world, deps, messages = env
    res = up(manifest, deps)
    assert res.action == "start" and res.started == ["head", "w1", "w2"]
    assert set(world.running) == {"head", "w1", "w2"}
    assert sum(s.gpus_total for s in world.running.values()) == 24
    starts = [c for c in world.ray_calls(verb="start")]
    assert "--head" in starts[0].argv and starts[0].argv[starts[0].argv.index("--node-ip-address") + 1] == "192.168.7.1"
    w1 = world.ray_calls("w1", "start")[0].argv
    assert w1[w1.index("--address") + 1] == "192.168.7.1:26379"
    assert w1[w1.index("--node-ip-address") + 1] == "192.168.7.2"
    # on every node: the cluster's leftovers stopped (none here), then Ray started
    for name in ("head", "w1", "w2"):
        assert world.verbs(name) == ["stop", "start"]
        f = world.runners[name].files["/home/ops/.orch/nodes/tb/ray-token"]
        assert f.content == b"t0k3n\n" and f.mode == 0o600
        # the Serve LLM callback module the rendered applications name (readable by Ray's workers)
        hooks = world.runners[name].files["/home/ops/.orch/nodes/tb/python/orch_serve_hooks.py"]
        assert b"class SkipNodeInit(CallbackBase)" in hooks.content and hooks.mode == 0o644
    assert ("mkdir", "-p", "-m", "700", "--", "/home/ops/.orch/nodes/tb") in world.dirs
    token_file = deps.state.token_path("tb")
    assert token_file.read_text() == "t0k3n\n" and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    rec = deps.state.get_cluster("tb")
    assert rec.state == "up" and rec.fingerprint == manifest.fingerprint() and rec.head_address == "192.168.7.1"
    assert rec.node_ids == {"head": "id-head-1", "w1": world.running["w1"].node_id, "w2": world.running["w2"].node_id}
    assert rec.ray_version == "2.60.0" and json.loads(rec.manifest_json)["name"] == "tb"
    assert any("3/3 nodes ALIVE" in m for m in messages)
    assert all(t == "t0k3n" for _, _, t in world.dashboard_opens)
    assert "t0k3n" not in json.dumps(res.to_dict()) and all("t0k3n" not in m for m in messages)


def test_a_loopback_head_is_shown_and_recorded_at_the_address_ray_uses(tmp_path):
    """Issue 44: `orch up` printed `head local at 127.0.0.1:6379` and then a table with another
    address (Ray replaces a loopback --node-ip-address with the machine's own). One address, the
    one Ray reports, in the progress, the result and the record."""
    manifest = manifest_of(f"name: tb\npython: {PY}\nnodes:\n  - {{name: head, host: 127.0.0.1, role: head, gpus: 8}}\n")
    world, clock, messages = World(manifest), Clock(), []
    deps = ClusterDeps(state=StateStore(tmp_path / "state", clock=clock), open_runners=world.open_runners,
                       gather=world.gather, check=lambda m, f: [], open_dashboard=world.open_dashboard, clock=clock,
                       sleep=clock.sleep, token_factory=lambda: "t0k3n", progress=messages.append)  # fmt: skip
    res = up(manifest, deps)
    assert [s.address for s in res.nodes] == [MACHINE_ADDRESS]
    shown = [m for m in messages if "127.0.0.1" in m or MACHINE_ADDRESS in m]
    assert shown == [f"head head at {MACHINE_ADDRESS}:6379 (Ray's own address for 127.0.0.1)"], messages
    assert res.head_address == MACHINE_ADDRESS and deps.state.get_cluster("tb").head_address == MACHINE_ADDRESS


def test_head_and_workers_start_at_the_same_time(env):
    """Structural, not timed: each `ray start` waits at a barrier until all three are running;
    a bring-up that started the nodes one after another would break the barrier."""
    manifest, world, deps, _ = env
    world.start_barrier = threading.Barrier(3)
    assert up(manifest, deps).action == "start"
    assert not world.start_barrier.broken


def test_fresh_up_stops_a_leftover_ray_first(env):
    manifest, world, deps, _ = env
    world.leftovers.add("w1")  # e.g. the state folder was lost while the cluster ran
    assert up(manifest, deps).action == "start"
    assert world.verbs("w1") == ["stop", "start"] and "w1" in world.running


def test_second_up_does_nothing_and_says_so(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    before = {n: len(r.calls) for n, r in world.runners.items()}
    res = up(manifest, deps)
    assert res.action == "nothing" and res.started == []
    assert res.message.startswith("nothing to do: all 3 nodes are ALIVE")
    assert {n: len(r.calls) for n, r in world.runners.items()} == before  # not one command ran


def test_dead_worker_is_restarted_alone(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    head_id = world.running["head"].node_id
    world.kill_raylet("w2")
    res = up(manifest, deps)
    assert res.action == "heal" and res.started == ["w2"]
    assert "w2 (DEAD" in res.plan.reason
    assert world.verbs("w2") == ["stop", "start", "stop", "start"]
    assert world.verbs("head") == ["stop", "start"]
    assert world.verbs("w1") == ["stop", "start"]
    assert world.running["head"].node_id == head_id
    assert deps.state.get_cluster("tb").node_ids["w2"] == world.running["w2"].node_id


def test_head_down_restarts_everything(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    world.head_gone()
    res = up(manifest, deps)
    assert res.action == "restart" and "dashboard does not answer" in res.plan.reason
    assert set(world.running) == {"head", "w1", "w2"}


def test_changed_manifest_dry_run_prints_diff_and_changes_nothing(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    calls = {n: len(r.calls) for n, r in world.runners.items()}
    changed = manifest_of(YAML.replace("dashboard_port: 28265", "dashboard_port: 28266").replace(
        "  - {name: w2, host: 10.0.0.3, gpus: 8, interface: eth1}\n", ""))  # fmt: skip
    res = up(changed, deps, UpOptions(dry_run=True))
    assert res.dry_run and res.action == "restart" and res.started == []
    assert "- nodes.w2: removed" in res.plan.diff
    assert "~ ray.dashboard_port: 28265 -> 28266" in res.plan.diff
    assert res.plan.removed == ("w2",)
    assert {n: len(r.calls) for n, r in world.runners.items()} == calls
    assert deps.state.get_cluster("tb").fingerprint == manifest.fingerprint()


def test_a_removed_worker_is_drained_then_stopped_and_the_others_keep_running(env):
    manifest, world, deps, messages = env
    up(manifest, deps)
    ids = {n: s.node_id for n, s in world.running.items()}
    deps.state.add_revision("tb", "tiny", status="ready")
    world.engines = [("w2", "tiny")]
    world.used = {"w2": {"GPU": 8.0}}  # the replica's GPUs; w1 has its 8 free
    changed = manifest_of(YAML.replace("  - {name: w2, host: 10.0.0.3, gpus: 8, interface: eth1}\n", ""))
    res = up(changed, deps)
    assert res.action == "change" and res.started == [] and res.plan.removed == ("w2",) and res.plan.drain == ("w2",)
    assert set(world.running) == {"head", "w1"}  # w2 was stopped although it left the manifest
    assert {n: s.node_id for n, s in world.running.items()} == {"head": ids["head"], "w1": ids["w1"]}
    assert world.verbs("head") == ["stop", "start"] and world.verbs("w1") == ["stop", "start"]  # only the first up
    (drain,) = world.drains
    assert drain[0] == "head" and drain[1][:5] == ("drain-node", "--address", "192.168.7.1:26379", "--node-id", ids["w2"])
    assert drain[1][drain[1].index("--reason") + 1] == "DRAIN_NODE_REASON_PREEMPTION"
    assert drain[1][drain[1].index("--deadline-remaining-seconds") + 1] == "600"
    assert drain[2]["RAY_AUTH_MODE"] == "token"
    assert world.engines == [("head", "tiny")]  # Serve moved the replica before w2 stopped
    assert [d.node for d in res.drained] == ["w2"] and res.drained[0].left == {}
    assert any(m.startswith("w2 drained after") for m in messages)
    assert deps.state.get_cluster("tb").fingerprint == changed.fingerprint()
    assert "removed w2" in res.message


def test_a_drain_past_its_deadline_is_said_and_the_worker_still_stops(env):
    manifest, world, deps, messages = env
    up(manifest, deps)
    deps.state.add_revision("tb", "tiny", status="ready")
    world.engines, world.stuck = [("w2", "tiny")], {"w2"}
    changed = manifest_of(YAML.replace("  - {name: w2, host: 10.0.0.3, gpus: 8, interface: eth1}\n", ""))
    res = up(changed, deps, UpOptions(drain_timeout=30))
    assert res.drained[0].left == {"tiny": 1} and res.drained[0].seconds >= 30
    assert any("after the 30 s drain deadline" in m for m in messages)
    assert "w2" not in world.running


def test_removing_the_worker_whose_model_has_no_room_elsewhere_is_refused(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    deps.state.add_revision("tb", "tiny", status="ready")
    world.engines = [("w2", "tiny")]
    world.used = {"w2": {"GPU": 8.0}, "w1": {"GPU": 4.0}, "head": {"GPU": 8.0}}
    changed = manifest_of(YAML.replace("  - {name: w2, host: 10.0.0.3, gpus: 8, interface: eth1}\n", ""))
    with pytest.raises(UsageError) as err:
        up(changed, deps)
    assert err.value.exit_code == 2
    assert err.value.message.endswith("tiny on w2 uses 8 GPU; no node that keeps running has that much free (4 free on w1)")
    assert "--allow-downtime" in err.value.hint
    assert "w2" in world.running and world.drains == []  # nothing was touched
    assert deps.state.get_cluster("tb").fingerprint == manifest.fingerprint()
    res = up(changed, deps, UpOptions(allow_downtime=True))
    assert res.action == "change" and "w2" not in world.running


def test_a_new_worker_joins_and_nobody_else_restarts(env):
    manifest, world, deps, _ = env
    two = manifest_of(YAML.replace("  - {name: w2, host: 10.0.0.3, gpus: 8, interface: eth1}\n", ""))
    up(two, deps)
    ids = {n: s.node_id for n, s in world.running.items()}
    dry = up(manifest, deps, UpOptions(dry_run=True))
    assert dry.action == "change" and dry.plan.steps[2].startswith("w2: join (new worker")
    assert dry.plan.steps[0] == f"head: keep (Ray node {ids['head'][:12]} keeps running)"
    res = up(manifest, deps)
    assert res.action == "change" and res.started == ["w2"] and world.verbs("w2") == ["stop", "start"]
    assert {n: world.running[n].node_id for n in ("head", "w1")} == ids
    w2 = world.ray_calls("w2", "start")[0].argv
    assert w2[w2.index("--address") + 1] == "192.168.7.1:26379"


def test_a_worker_whose_settings_changed_is_drained_and_restarted_alone(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    ids = {n: s.node_id for n, s in world.running.items()}
    world.engines = [("w1", "tiny")]
    deps.state.add_revision("tb", "tiny", status="ready")
    changed = manifest_of(YAML.replace("{name: w1, host: 10.0.0.2, gpus: 8, interface: eth1}",
                                       "{name: w1, host: 10.0.0.2, gpus: 8, interface: eth1, cpus: 10}"))  # fmt: skip
    dry = up(changed, deps, UpOptions(dry_run=True))
    assert dry.plan.steps[1] == ("w1: drain (Serve moves its replicas; deadline 600 s), restart alone, rejoin "
                                 "(its settings changed: ~ nodes.w1.cpus: null -> 10)")  # fmt: skip
    res = up(changed, deps)
    assert res.action == "change" and res.started == ["w1"] and res.plan.drain == ("w1",)
    assert world.verbs("w1") == ["stop", "start", "stop", "start"]
    assert world.running["w1"].node_id != ids["w1"]
    assert {n: world.running[n].node_id for n in ("head", "w2")} == {"head": ids["head"], "w2": ids["w2"]}
    w1 = world.ray_calls("w1", "start")[-1].argv
    assert w1[w1.index("--num-cpus") + 1] == "10"


def test_a_replaced_worker_is_drained_stopped_at_its_old_address_and_started_at_the_new(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    ids = {n: s.node_id for n, s in world.running.items()}
    opened: list[tuple[str, str]] = []
    open_runners = world.open_runners

    def recording(m):  # which address each opened runner stands for
        opened.extend((n.name, n.host) for n in m.nodes)
        return open_runners(m)

    deps.open_runners = recording
    changed = manifest_of(YAML.replace("host: 10.0.0.3", "host: 10.0.0.9"))
    res = up(changed, deps)
    assert res.action == "change" and res.started == ["w2"] and res.plan.drain == ("w2",)
    assert ("w2", "10.0.0.3") in opened  # the old address was reached to stop Ray there
    assert world.verbs("w2") == ["stop", "start", "stop", "stop", "start"]
    assert {n: world.running[n].node_id for n in ("head", "w1")} == {"head": ids["head"], "w1": ids["w1"]}


def test_a_head_change_is_refused_while_a_model_serves_unless_downtime_is_allowed(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    deps.state.add_revision("tb", "tiny", status="ready")
    changed = manifest_of(YAML.replace("port: 26379", "port: 26380"))
    dry = up(changed, deps, UpOptions(dry_run=True))
    assert dry.action == "restart" and dry.plan.downtime == ("~ ray.port: 26379 -> 26380",)
    assert dry.message.endswith("stops tiny (revision 1), so it needs --allow-downtime")
    with pytest.raises(UsageError) as err:
        up(changed, deps)
    assert err.value.exit_code == 2 and "stops tiny (revision 1, serving now): ~ ray.port: 26379 -> 26380" in err.value.message
    assert world.verbs("head") == ["stop", "start"]  # untouched
    res = up(changed, deps, UpOptions(allow_downtime=True))
    assert res.action == "restart" and "tiny (revision 1) is NOT served after the full restart" in res.message


def test_preflight_failure_stops_before_anything_starts(env):
    manifest, world, deps, _ = env
    fail = finding("fail", "GPU_COUNT_MISMATCH", "w1", "w1 has 4 GPUs, the manifest says 8", "fix gpus")
    deps.check = lambda m, f: [fail]
    with pytest.raises(PreflightStopped) as err:
        up(manifest, deps)
    assert err.value.findings == [fail] and err.value.exit_code == 3
    assert "GPU_COUNT_MISMATCH@w1" in err.value.message
    assert world.ray_calls() == [] and deps.state.get_cluster("tb") is None
    assert not deps.state.token_path("tb").exists()


def test_warnings_need_force(env):
    manifest, world, deps, _ = env
    warn = finding("warn", "NO_NVLINK", "w1", "GPUs of w1 are joined by PCIe", "prefer pipeline parallel")
    deps.check = lambda m, f: [warn]
    with pytest.raises(PreflightStopped, match="warning"):
        up(manifest, deps)
    assert world.ray_calls() == []
    res = up(manifest, deps, UpOptions(force=True))
    assert res.action == "start" and res.findings == [warn]


def test_check_only_runs_no_ray_command(env):
    manifest, world, deps, _ = env
    res = up(manifest, deps, UpOptions(check_only=True))
    assert res.action == "checked" and world.ray_calls() == [] and deps.state.get_cluster("tb") is None


def test_unreachable_node_fails_preflight_with_real_checks(tmp_path):
    from orchestrator.preflight.run import run_checks

    manifest = manifest_of()
    world = World(manifest, unreachable={"w2"})
    deps = ClusterDeps(state=StateStore(tmp_path / "s"), open_runners=world.open_runners, gather=world.gather,
                       check=run_checks, open_dashboard=world.open_dashboard)  # fmt: skip
    with pytest.raises(PreflightStopped) as err:
        up(manifest, deps)
    codes = {(f.code, f.node) for f in err.value.findings if f.severity == "fail"}
    assert ("NODE_UNREACHABLE", "w2") in codes
    assert world.ray_calls() == []


def _deps_for(world, tmp_path, messages=None):
    clock = Clock()
    return ClusterDeps(state=StateStore(tmp_path / "s"), open_runners=world.open_runners, gather=world.gather,
                       check=lambda m, f: [], open_dashboard=world.open_dashboard, clock=clock, sleep=clock.sleep,
                       progress=(messages.append if messages is not None else (lambda _m: None)))  # fmt: skip


def test_worker_start_timing_out_three_times_names_every_failed_node(tmp_path):
    manifest = manifest_of()
    world = World(manifest, start_fails={"w1", "w2"})
    deps = _deps_for(world, tmp_path)
    with pytest.raises(ClusterError) as err:
        up(manifest, deps)
    assert "`ray start` failed 3 times on w1" in err.value.message and "failed 3 times on w2" in err.value.message
    assert "timed out during startup" in err.value.message
    assert world.verbs("w1") == ["stop", "start", "stop", "start", "stop", "start"]
    assert deps.state.get_cluster("tb") is None


def test_a_start_failing_otherwise_is_tried_twice(tmp_path):
    manifest = manifest_of()
    world = World(manifest, start_fails={"w1"}, start_error=GCS_UNREACHABLE_SAID)
    with pytest.raises(ClusterError) as err:
        up(manifest, _deps_for(world, tmp_path))
    assert "`ray start` failed twice on w1" in err.value.message and "Failed to connect to GCS" in err.value.message
    assert world.verbs("w1") == ["stop", "start", "stop", "start"]


def test_a_start_that_times_out_twice_is_stopped_and_retried(tmp_path):
    manifest = manifest_of()
    world = World(manifest, start_fails={"w2": 2})
    messages: list[str] = []
    res = up(manifest, _deps_for(world, tmp_path, messages))
    assert res.action == "start" and set(world.running) == {"head", "w1", "w2"}
    assert world.verbs("w2") == ["stop", "start", "stop", "start", "stop", "start"]
    assert world.verbs("w1") == ["stop", "start"]
    assert any("failed on w2 (exit 1); stopping it and trying again (2 of 3)" in m for m in messages)
    assert any("failed on w2 (exit 1); stopping it and trying again (3 of 3)" in m for m in messages)


def test_head_start_failure_is_the_error_and_workers_are_not_retried(tmp_path):
    manifest = manifest_of()
    world = World(manifest, start_fails={"head"})
    deps = _deps_for(world, tmp_path)
    with pytest.raises(ClusterError) as err:
        up(manifest, deps)
    assert err.value.message.startswith("`ray start` failed 3 times on head")
    assert world.verbs("head") == ["stop", "start", "stop", "start", "stop", "start"]
    assert world.verbs("w1") == ["stop", "start"]  # no second try: the head is gone
    assert deps.state.get_cluster("tb") is None


def test_node_that_never_joins_times_out_naming_it(tmp_path):
    manifest = manifest_of()
    world = World(manifest, never_joins={"w2"})
    clock = Clock()
    deps = ClusterDeps(state=StateStore(tmp_path / "s"), open_runners=world.open_runners, gather=world.gather,
                       check=lambda m, f: [], open_dashboard=world.open_dashboard, clock=clock, sleep=clock.sleep)  # fmt: skip
    with pytest.raises(ClusterError, match=r"waiting for Ray nodes w2 \(w2: not in the Ray cluster\)"):
        up(manifest, deps, UpOptions(timeout=30))
    assert 30 <= clock.now - 100.0 < 32


def test_down_reports_unreachable_node_and_stops_the_others(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    world.unreachable.add("w1")
    world.vllm.add("head")  # an engine left behind by a Serve replica
    res = down(manifest, deps)
    by = {n.node: n for n in res.nodes}
    assert by["head"].ok and by["w2"].ok and not by["w1"].ok and by["w1"].unreachable
    assert "connection refused" in by["w1"].detail
    assert set(world.running) == {"w1"}
    assert by["head"].detail == "stopped 3 processes (vLLM: VLLM::EngineCore); token removed"
    for name in ("head", "w2"):
        assert world.runners[name].files == {}  # the node's token copy and the hook module are gone
        calls = [c.argv for c in world.runners[name].calls]
        assert ("rmdir", "--ignore-fail-on-non-empty", "--", "/home/ops/.orch/nodes/tb") in calls
        assert ("rmdir", "--ignore-fail-on-non-empty", "--", "/home/ops/.orch/nodes/tb/python", "/home/ops/.orch/nodes/tb") in calls
        # the LoRA adapters the callback downloaded from S3 go first, or the cluster's folder stays
        lora = ("rm", "-rf", "--", "/home/ops/.orch/nodes/tb/lora")
        assert calls.index(lora) < calls.index(("rmdir", "--ignore-fail-on-non-empty", "--", "/home/ops/.orch/nodes/tb/python", "/home/ops/.orch/nodes/tb"))
    assert "/home/ops/.orch/nodes/tb/ray-token" in world.runners["w1"].files
    # w1 did not confirm: the cluster is not recorded as down (its Ray may still run there)
    assert not res.recorded_down and deps.state.get_cluster("tb").state == "up"
    world.unreachable.clear()
    again = down(manifest, deps)
    assert again.ok and again.recorded_down and deps.state.get_cluster("tb").state == "down"
    assert set(world.running) == set()
    # after down, up starts everything again, with the same cluster id
    assert up(manifest, deps).action == "start"


def test_down_with_a_process_out_of_reach_is_not_recorded_as_down(env):
    """The stop script reports a process it may not inspect (AccessDenied): the node failed,
    the state still says up."""
    manifest, world, deps, _ = env
    up(manifest, deps)
    world.denied.add("w2")
    res = down(manifest, deps)
    by = {n.node: n for n in res.nodes}
    assert by["head"].ok and by["w1"].ok and not by["w2"].ok and not by["w2"].unreachable
    assert "access denied to processes 4242 (cannot read its environment)" in by["w2"].detail
    assert not res.recorded_down and deps.state.get_cluster("tb").state == "up"


def test_up_tags_processes_with_a_random_cluster_id_kept_in_state(env, tmp_path):
    """Two clusters of the same name (two control machines: two state dirs) get different ids;
    each keeps its own across `up`s; HAProxy's folder is made private on every node first."""
    manifest, world, deps, _ = env
    up(manifest, deps)
    first = deps.state.read_cluster_id("tb")
    assert first == world.cluster_id
    assert sorted(world.private_dirs) == [(n, manifest.ray.temp_dir + "/hap") for n in ("head", "w1", "w2")]
    down(manifest, deps)
    up(manifest, deps)
    assert world.cluster_id == first == deps.state.read_cluster_id("tb")
    other = StateStore(tmp_path / "other-control-machine")
    assert other.ensure_cluster_id("tb", ClusterDeps(state=other, open_runners=world.open_runners).cluster_id_factory) != first


def test_status_shows_dead_and_unreachable_nodes(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    world.kill_raylet("w2")
    world.unreachable.add("w2")
    report = status_nodes(manifest, deps)
    rows = {r.name: r for r in report.nodes.rows}
    assert rows["head"].ray_state == "ALIVE" and rows["head"].gpus_total == 8 and rows["head"].versions.ray == "2.60.0"
    assert rows["w2"].ray_state == "DEAD" and not rows["w2"].reachable
    assert "unreachable over SSH" in rows["w2"].detail and "heartbeats" in rows["w2"].detail
    d = report.to_dict()
    assert d["totals"] == {"nodes": 3, "alive": 2, "gpus_total": 16.0, "gpus_used": 0.0, "gpus_expected": 24}
    assert d["healthy"] is False and d["serving"] is None and d["recorded"]["head_address"] == "192.168.7.1"


def test_status_is_not_healthy_while_the_model_recorded_as_ready_is_not_served(env):
    """Issue 46: every node ALIVE, a revision recorded as ready, no serving section (the restart
    took the Serve application with it): the top level says not healthy, and names the model."""
    manifest, world, deps, _ = env
    up(manifest, deps)
    deps.state.add_revision("tb", "tiny", status="ready")
    report = status_nodes(manifest, deps)
    d = report.to_dict()
    assert d["nodes_healthy"] is True and d["expected_model"] == "tiny"
    assert d["healthy"] is False and d["serving_healthy"] is False
    ids = {r["name"]: (r["node_id"], r["start_time_ms"]) for r in d["nodes"]}
    assert ids["w1"] == (world.running["w1"].node_id, world.running["w1"].start_time_ms)
    deps.state.set_cluster_state("tb", "down")  # `orch down`: nothing is expected any more
    assert status_nodes(manifest, deps).expected_model is None


def test_status_when_head_unreachable(env):
    manifest, world, deps, _ = env
    up(manifest, deps)
    world.unreachable.add("head")
    report = status_nodes(manifest, deps)
    # the head's SSH error is told once, on its row; the dashboard and the other rows do not repeat it
    assert report.nodes.dashboard_error == "not read: the head does not answer over SSH"
    assert all(r.ray_state == "UNKNOWN" for r in report.nodes.rows)
    assert {r.name for r in report.nodes.rows if r.reachable} == {"w1", "w2"}
    assert report.nodes.unreachable == ["head"]
    (head,) = [r for r in report.nodes.rows if r.name == "head"]
    assert head.detail.startswith("unreachable over SSH: ") and not head.detail.startswith("unreachable over SSH: head: ")
    assert [r.detail for r in report.nodes.rows if r.reachable] == [None, None]


def test_planning_shape_uses_the_gpus_up_probed_only_for_the_manifest_that_is_up(tmp_path):
    """`orch up` keeps what nvidia-smi reported; the planner sizes on it while that manifest is up."""
    from orchestrator.manifest.load import load_manifest
    from orchestrator.plan.shape import shape_from_manifest
    from orchestrator.state import StateStore
    from orchestrator.workflows.plan import planning_shape

    text = (
        "name: c\nnodes:\n"
        "  - {name: h, host: 192.0.2.10, role: head, gpus: 8, gpu_type: H100-80GB}\n"
        "  - {name: w, host: 192.0.2.11, gpus: 8, gpu_type: H100-80GB}\n"
    )
    manifest = load_manifest(text, tmp_path / "cluster.yaml")
    state = StateStore(tmp_path / "state")
    assert planning_shape(manifest, state) == shape_from_manifest(manifest)  # nothing up yet

    pcie = {"name": "NVIDIA H100 PCIe", "memory_total_mib": 81559}
    probed = {n: {"gpus": [dict(pcie, index=i) for i in range(8)], "topology": {"nvlink": False}} for n in ("h", "w")}
    state.save_facts("c", probed)
    state.record_cluster("c", manifest.fingerprint(), "192.0.2.10", 8265)
    shape = planning_shape(manifest, state)
    assert shape.gpus_per_node == 8 and shape.nodes == 2
    assert shape.nvlink is False  # as probed (the manifest's H100-80GB alone says SXM/NVLink)
    assert any("probed" in note for note in shape.notes)

    changed = load_manifest(text.replace("name: c", "name: c\nenv: {X: '1'}"), tmp_path / "cluster.yaml")
    assert changed.fingerprint() != manifest.fingerprint()
    assert not any("probed" in note for note in planning_shape(changed, state).notes)


def test_up_and_down_are_refused_while_another_command_holds_the_cluster(env):
    """Issue 12 item 6: `orch up/down/rollout` of one cluster never interleave."""
    manifest, world, deps, _ = env
    with cluster_lock.hold(deps.state.cluster_dir(manifest.name), manifest.name, "rollout"):
        with pytest.raises(ClusterBusy, match=r"is busy: `orch rollout` \(pid"):
            up(manifest, deps)
        with pytest.raises(ClusterBusy, match=r"is busy: `orch rollout` \(pid"):
            down(manifest, deps)
        assert up(manifest, deps, UpOptions(check_only=True)).action == "checked"  # looking needs no lock
    assert world.running == {} and deps.state.get_cluster(manifest.name) is None
    assert up(manifest, deps).action == "start"  # the lock went with its holder
def test_local_node_token_is_not_the_state_token(tmp_path):
    """A ``transport: local`` node under the default state dir (~/.orch): its token copy is
    another file than orch's own, and `orch down` removing the node's copy keeps orch's
    (before, both were ~/.orch/clusters/NAME/ray-token and down deleted the state's token)."""
    home = tmp_path / "home"
    home.mkdir()
    state = StateStore(home / ".orch")  # the default --state-dir of a user whose HOME is home
    token = state.ensure_token("tb", lambda: "s3cr3t")
    manifest = load_manifest("name: tb\naccelerator: cpu\nnodes: [{name: a, host: 127.0.0.1, role: head, transport: local}]\n",
                             Path("/x/c.yaml"))  # fmt: skip
    runner = LocalRunner("a", base_env={"HOME": str(home), "PATH": os.environ["PATH"]})
    node_copy = install_token(runner, manifest, token, node_home(runner))
    assert node_copy != str(state.token_path("tb"))
    remove_token(runner, manifest, node_home(runner), keep=str(state.token_path("tb")))
    assert not Path(node_copy).exists()
    assert state.read_token("tb") == "s3cr3t"


def test_down_that_cannot_remove_the_hook_module_still_stops_and_records_down(env):
    """The Serve hook module is a small file of orch's: a node where it cannot be deleted (here
    a read-only home) is still stopped, and the cluster is recorded down, with the file named."""
    from orchestrator.remote.fake import Prefix, result

    manifest, world, deps, _ = env
    up(manifest, deps)
    path = "/home/ops/.orch/nodes/tb/python/orch_serve_hooks.py"
    world.runners["w2"].on(Prefix("rm", "-f", "--", path), result(exit_code=1, stderr="rm: cannot remove: Read-only file system"))
    res = down(manifest, deps)
    by = {n.node: n for n in res.nodes}
    assert res.ok and res.recorded_down and set(world.running) == set()
    assert "orch's Serve hook module left in place" in by["w2"].detail and "Read-only file system" in by["w2"].detail
    assert "left in place" not in by["w1"].detail
