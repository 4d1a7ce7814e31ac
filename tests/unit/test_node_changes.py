"""The per-node side of `orch up` (issue 46), pure: which change takes a full restart and which
only touches a worker (cluster/node_changes.py), the `ray drain-node` argv as Ray 2.60's own CLI
parses it, what a node still serves in a real actor list (captured on the two-host test bed with a
TP=2 replica spread over both hosts), and the room check before a drain (cluster/drain.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cluster.drain import drain_argv, room_elsewhere, serving_on
from orchestrator.cluster.node_changes import classify, env_digests
from orchestrator.cluster.node_state import NodeState
from orchestrator.manifest.load import load_manifest
from orchestrator.state import redact_manifest
from orchestrator.status.workers import parse_actors

DATA = Path(__file__).resolve().parents[1] / "data" / "ray_dashboard"
BASE = """
name: c
python: /opt/venv/bin/python
env: {NCCL_DEBUG: WARN}
nodes:
  - {name: head, host: 10.0.0.1, role: head, gpus: 8}
  - {name: w1, host: 10.0.0.2, gpus: 8}
  - {name: w2, host: 10.0.0.3, gpus: 8}
ray: {port: 6379, temp_dir: /tmp/ray-c}
"""


def raw(text: str) -> dict:
    return load_manifest(text, Path("/x/c.yaml")).model_dump(mode="json", exclude={"source_path"})


def dump(text: str) -> dict:
    return redact_manifest(raw(text))  # as the state records it: every env value hidden


def changes(new: str, digests: bool = True):
    if not digests:
        return classify(dump(BASE), dump(new))
    return classify(dump(BASE), dump(new), env_digests(raw(BASE), "k3y"), env_digests(raw(new), "k3y"))


def test_worker_changes_touch_that_worker_only():
    c = changes(BASE.replace("{name: w1, host: 10.0.0.2, gpus: 8}", "{name: w1, host: 10.0.0.2, gpus: 8, cpus: 10}"))
    assert c.full_restart == () and c.changed == {"w1": ("~ nodes.w1.cpus: null -> 10",)} and c.replaced == {}
    c = changes(BASE.replace("{name: w1, host: 10.0.0.2, gpus: 8}", "{name: w1, host: 10.0.0.2, gpus: 8, env: {A: b}}"))
    assert set(c.changed) == {"w1"} and c.restarted_workers == ("w1",)
    c = changes(BASE.replace("host: 10.0.0.3", "host: 10.0.0.9"))
    assert c.replaced == {"w2": ("~ nodes.w2.host: 10.0.0.3 -> 10.0.0.9",)} and c.full_restart == ()
    c = changes(BASE.replace("ray:", "  - {name: w3, host: 10.0.0.4, gpus: 8}\nray:"))
    assert c.added == ("w3",) and c.full_restart == () and c.restarted_workers == ()
    c = changes(BASE.replace("  - {name: w2, host: 10.0.0.3, gpus: 8}\n", ""))
    assert c.removed == ("w2",) and c.full_restart == ()


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        ("port: 6379", "port: 6380", "~ ray.port: 6379 -> 6380"),
        ("temp_dir: /tmp/ray-c", "temp_dir: /tmp/ray-d", "~ ray.temp_dir: /tmp/ray-c -> /tmp/ray-d"),
        ("ray: {", "ray: {token_auth: false, ", "~ ray.token_auth: true -> false"),
        ("python: /opt/venv/bin/python", "python: /opt/v2/bin/python", "~ python: /opt/venv/bin/python -> /opt/v2/bin/python"),
        ("host: 10.0.0.1", "host: 10.0.0.7", "~ nodes.head.host: 10.0.0.1 -> 10.0.0.7"),
        ("NCCL_DEBUG: WARN", "NCCL_DEBUG: INFO", "~ env: (values changed)"),  # in the head's environment too
    ],
)
def test_what_ray_applies_only_by_restarting_the_head(old, new, line):
    c = changes(BASE.replace(old, new))
    assert line in c.full_restart


def test_a_new_head_is_a_full_restart_and_ssh_settings_restart_nothing():
    swapped = BASE.replace("{name: head, host: 10.0.0.1, role: head, gpus: 8}", "{name: head, host: 10.0.0.1, gpus: 8}")
    swapped = swapped.replace("{name: w1, host: 10.0.0.2, gpus: 8}", "{name: w1, host: 10.0.0.2, role: head, gpus: 8}")
    assert changes(swapped).full_restart[0] == "~ head: head -> w1"
    quiet = changes(BASE.replace("{name: w1, host: 10.0.0.2, gpus: 8}", "{name: w1, host: 10.0.0.2, port: 2222, gpus: 8}")
                    .replace("name: c\n", "name: c\nssh: {user: ops}\n"))  # fmt: skip
    assert quiet.full_restart == () and quiet.restarted_workers == () and len(quiet.no_restart) == 2


def test_drain_argv_is_what_ray_260s_cli_accepts():
    from ray.scripts.scripts import drain_node  # the installed Ray's own command and options

    m = load_manifest(BASE, Path("/x/c.yaml"))
    argv = drain_argv(m, m.head, "10.0.0.1", "ab" * 28, 600, "orch up: w2 leaves")
    assert argv[:4] == ["/opt/venv/bin/python", "-m", "ray.scripts.scripts", "drain-node"]
    ctx = drain_node.make_context("drain-node", argv[4:])
    assert ctx.params == {"address": "10.0.0.1:6379", "node_id": "ab" * 28, "reason": "DRAIN_NODE_REASON_PREEMPTION",
                          "reason_message": "orch up: w2 leaves", "deadline_remaining_seconds": 600}  # fmt: skip


def actors():
    return parse_actors(json.loads((DATA / "actors_tp2_two_hosts.json").read_text()))


def test_what_a_node_still_serves_in_a_real_actor_list():
    # 6330...: the LLMServer:tiny replica and its TP0 worker (and a router, not an engine);
    # 8c81...: the TP1 worker of the same replica (same placement group), a router, Serve's own actors
    assert serving_on(actors(), "6330ecf6e3091d310708654fa7b4d7da92b0a1e7d71653d703c11d30") == {"tiny": 2}
    assert serving_on(actors(), "8c8148c33950d8b0c13a703164e08fbb6333b133cf2f0ce5e91ed22a") == {"tiny": 1}
    assert serving_on(actors(), "ff" * 28) == {}


def state(name: str, total: float, used: float, alive: bool = True) -> NodeState:
    return NodeState(f"id-{name}", name, "10.0.0.1", "ALIVE" if alive else "DEAD", False,
                     resources_total={"GPU": total}, resources_used={"GPU": used})  # fmt: skip


def test_room_is_one_staying_node_with_what_the_leaving_one_uses_free():
    leaving = {"w2": state("w2", 8, 4)}
    models = {"w2": {"tiny": 1}}
    assert room_elsewhere(leaving, [state("w1", 8, 4), state("head", 8, 8)], models, "GPU") == []
    (short,) = room_elsewhere(leaving, [state("w1", 8, 6), state("head", 8, 7)], models, "GPU")
    assert short.message() == "tiny on w2 uses 4 GPU; no node that keeps running has that much free (2 free on w1)"
    # free GPUs spread over two nodes are no room for a replica placed whole on one
    assert room_elsewhere(leaving, [state("w1", 8, 6), state("head", 8, 6)], models, "GPU") != []
    assert room_elsewhere(leaving, [state("w1", 8, 0, alive=False)], models, "GPU")[0].most_free_on is None
    assert room_elsewhere(leaving, [], {"w2": {}}, "GPU") == []  # serves nothing: nothing to move


def test_env_values_hidden_in_the_record_are_compared_through_keyed_digests():
    node_env = BASE.replace("{name: w2, host: 10.0.0.3, gpus: 8}", "{name: w2, host: 10.0.0.3, gpus: 8, env: {HF_TOKEN: a}}")
    rotated = node_env.replace("HF_TOKEN: a", "HF_TOKEN: b")
    assert dump(node_env) == dump(rotated)  # the recorded manifests cannot tell them apart
    c = classify(dump(node_env), dump(rotated), env_digests(raw(node_env), "k"), env_digests(raw(rotated), "k"))
    assert c.changed == {"w2": ("~ nodes.w2.env: (values changed)",)} and c.full_restart == ()
    assert env_digests(raw(node_env), "k") != env_digests(raw(node_env), "other key")
    # without recorded digests the change cannot be placed on a node: a full restart, said so
    assert "no digest was recorded" in changes(rotated.replace("NCCL_DEBUG: WARN", "NCCL_DEBUG: INFO"), digests=False).full_restart[0]
