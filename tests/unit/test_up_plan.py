"""cluster_plan: the up decision and the manifest diff (pure)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster.node_state import NodeState
from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.cluster.up_plan import manifest_diff, plan_up
from orchestrator.manifest.load import load_manifest
from orchestrator.state import ClusterRecord

YAML = """
name: c
nodes:
  - {name: h, host: 10.0.0.1, role: head, gpus: 8}
  - {name: a, host: 10.0.0.2, gpus: 8}
  - {name: b, host: 10.0.0.3, gpus: 8}
"""


def m(text=YAML):
    return load_manifest(text, Path("/x/c.yaml"))


def rec(manifest, state="up"):
    return ClusterRecord(manifest.name, manifest.fingerprint(), "10.0.0.1", 8265,
                         manifest_json=manifest.model_dump_json(exclude={"source_path"}), state=state)  # fmt: skip


def st(name, alive=True, gpus=8.0, t=1):
    return NodeState(f"id-{name}-{t}", name, "10.0.0.9", "ALIVE" if alive else "DEAD", name == "h",
                     {"GPU": gpus, node_resource(name): 1000.0}, start_time_ms=t)  # fmt: skip


GPUS = {"h": 8, "a": 8, "b": 8}


def test_no_record_or_down_starts_everything():
    man = m()
    for record in (None, rec(man, state="down")):
        plan = plan_up(man, record, GPUS, None)
        assert plan.action == "start" and plan.start == ("h", "a", "b") and plan.stop == ("h", "a", "b")


def test_healthy_unchanged_is_nothing():
    man = m()
    plan = plan_up(man, rec(man), GPUS, [st("h"), st("a"), st("b")])
    assert plan.action == "nothing" and not plan.changes_anything and plan.start == ()


def test_dead_missing_and_wrong_gpus_are_healed_alone_in_manifest_order():
    man = m()
    plan = plan_up(man, rec(man), GPUS, [st("h"), st("b", alive=False), st("a", gpus=4.0)])
    assert plan.action == "heal" and plan.start == ("a", "b") and plan.stop == ("a", "b")
    assert plan.problems == {"a": "ALIVE with 4 GPUs, expected 8", "b": "DEAD"}
    plan = plan_up(man, rec(man), GPUS, [st("h"), st("a")])
    assert plan.start == ("b",) and plan.problems["b"] == "not in the Ray cluster"


def test_restarted_node_with_old_dead_record_counts_as_healthy():
    man = m()
    plan = plan_up(man, rec(man), GPUS, [st("h"), st("a"), st("b", alive=False, t=1), st("b", t=2)])
    assert plan.action == "nothing"


def test_sick_head_or_silent_dashboard_restarts_all():
    man = m()
    assert plan_up(man, rec(man), GPUS, [st("h", alive=False), st("a"), st("b")]).action == "restart"
    plan = plan_up(man, rec(man), GPUS, None, dashboard_error="connection refused")
    assert plan.action == "restart" and "connection refused" in plan.reason and plan.start == ("h", "a", "b")


def test_changed_manifest_restarts_with_diff_and_removed_nodes():
    old = m()
    new = m(YAML.replace("  - {name: b, host: 10.0.0.3, gpus: 8}\n", "  - {name: d, host: 10.0.0.4, gpus: 8}\n")
            + "ray: {port: 6380}\nenv: {NCCL_DEBUG: INFO}\n")  # fmt: skip
    plan = plan_up(new, rec(old), GPUS, None)
    assert plan.action == "restart" and plan.removed == ("b",) and plan.start == ("h", "a", "d")
    assert "+ nodes.d: added" in plan.diff and "- nodes.b: removed" in plan.diff
    assert "~ ray.port: 6379 -> 6380" in plan.diff
    # env values are compared redacted, as the state stores them: the diff names the variable only
    assert "~ env.NCCL_DEBUG: (unset) -> <redacted>" in plan.diff


def test_diff_of_a_node_field():
    old = m()
    new = m(YAML.replace("{name: a, host: 10.0.0.2, gpus: 8}", "{name: a, host: 10.0.0.2, gpus: 4, gpu_type: A100-40GB}"))
    lines = manifest_diff(old.model_dump(mode="json"), new.model_dump(mode="json"))
    assert lines == ["~ nodes.a.gpu_type: null -> A100-40GB", "~ nodes.a.gpus: 8 -> 4"]
    assert manifest_diff(None, new.model_dump(mode="json")) == ["(no recorded manifest to compare with)"]
