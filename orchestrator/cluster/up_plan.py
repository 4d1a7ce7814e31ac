"""What `orch up` must do, decided from the manifest, the recorded state and what Ray reports.
Pure: no I/O (``orchestrator.workflows.cluster`` gathers the inputs and carries the plan out).

Decisions
- nothing recorded (or recorded as down): ``start`` every node (after stopping what the
  cluster may have left there, so a leftover Ray cannot make `ray start` fail);
- recorded with another manifest fingerprint: the change is sorted per node
  (``cluster.node_changes.classify``). A change Ray cannot apply without restarting the head
  (the head, the Ray port, token auth, the temp dir, the Python...) ``restart``s every node and
  stops what Serve runs (``downtime``). Otherwise ``change``: a new worker is started alone and
  joins; a removed worker is drained (Serve moves its replicas first) and stopped; a replaced or
  changed worker is drained and restarted alone; the head and the other workers keep running.
  A change no Ray process sees (SSH settings, orch's serving options) restarts nothing. The plan
  carries a readable diff of the manifests and one line per node (``steps``);
- same fingerprint, head's dashboard not answering or the head not ALIVE: ``restart`` all;
- same fingerprint, some workers DEAD, missing or with the wrong GPU count: ``heal`` them alone;
- same fingerprint, every node ALIVE with its GPUs: ``nothing``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.cluster.node_changes import NodeChanges, classify, flatten_settings, show_setting
from orchestrator.cluster.node_state import NodeState, current_by_name, node_problems
from orchestrator.manifest.model import Manifest
from orchestrator.state import ClusterRecord, redact_manifest

Action = Literal["start", "restart", "heal", "change", "nothing"]
DRAIN_DEADLINE_S = 600.0  # what `orch up` gives Serve to move a drained node's replicas (--drain-timeout)


@dataclass(frozen=True)
class UpPlan:
    action: Action
    reason: str
    start: tuple[str, ...] = ()  # nodes to (re)start, the head first when it is among them
    stop: tuple[str, ...] = ()  # nodes where the cluster's processes are stopped before starting
    removed: tuple[str, ...] = ()  # nodes of the recorded manifest that are no longer in it
    diff: tuple[str, ...] = ()
    problems: dict[str, str] = field(default_factory=dict)  # node -> why it is not healthy
    drain: tuple[str, ...] = ()  # ALIVE workers drained (Serve moves their replicas) before they stop
    steps: tuple[str, ...] = ()  # one line per node: what happens to it, in order
    downtime: tuple[str, ...] = ()  # why the head restarts (everything Serve runs stops), when it does

    @property
    def changes_anything(self) -> bool:
        return self.action != "nothing"

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "reason": self.reason,
            "start": list(self.start),
            "stop": list(self.stop),
            "removed": list(self.removed),
            "diff": list(self.diff),
            "problems": dict(self.problems),
            "drain": list(self.drain),
            "steps": list(self.steps),
            "downtime": list(self.downtime),
        }


def _nodes_by_name(data: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(data)
    out["nodes"] = {n["name"]: {k: v for k, v in n.items() if k != "name"} for n in data.get("nodes", [])}
    return out


def manifest_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """Readable lines of what differs between two manifests (``model_dump(mode="json")``):
    ``+ nodes.w3: added``, ``- nodes.w2: removed``, ``~ ray.port: 6379 -> 6380``."""
    if old is None:
        return ["(no recorded manifest to compare with)"]
    a, b = _nodes_by_name(old), _nodes_by_name(new)
    lines: list[str] = []
    old_nodes, new_nodes = a.pop("nodes"), b.pop("nodes")
    for name in new_nodes:
        if name not in old_nodes:
            lines.append(f"+ nodes.{name}: added")
    for name in old_nodes:
        if name not in new_nodes:
            lines.append(f"- nodes.{name}: removed")
    fa: dict[str, Any] = {}
    fb: dict[str, Any] = {}
    flatten_settings(a, "", fa)
    flatten_settings(b, "", fb)
    for name in new_nodes:
        if name in old_nodes:
            flatten_settings(old_nodes[name], f"nodes.{name}", fa)
            flatten_settings(new_nodes[name], f"nodes.{name}", fb)
    for key in sorted(set(fa) | set(fb)):
        if key.startswith("source_path"):
            continue
        if key not in fa:
            lines.append(f"~ {key}: (unset) -> {show_setting(fb[key])}")
        elif key not in fb:
            lines.append(f"~ {key}: {show_setting(fa[key])} -> (unset)")
        elif fa[key] != fb[key]:
            lines.append(f"~ {key}: {show_setting(fa[key])} -> {show_setting(fb[key])}")
    return lines


def _all(manifest: Manifest) -> tuple[str, ...]:
    return tuple([manifest.head.name] + [w.name for w in manifest.workers])


def plan_up(
    manifest: Manifest,
    record: ClusterRecord | None,
    expected_gpus: Mapping[str, int],
    states: list[NodeState] | None,
    dashboard_error: str | None = None,
    drain_deadline_s: float = DRAIN_DEADLINE_S,
    env_digests: tuple[Mapping[str, str] | None, Mapping[str, str] | None] = (None, None),
) -> UpPlan:
    """Decide the plan (see the module doc). ``states`` is what the head's dashboard listed, or
    None when it was not asked (nothing recorded) or did not answer (``dashboard_error``).
    ``env_digests``: the recorded and the current ``node_changes.env_digests``."""
    everyone = _all(manifest)
    if record is None or record.state != "up":
        why = "no cluster recorded" if record is None else "the cluster was brought down"
        return UpPlan("start", f"{why}: starting Ray on every node", start=everyone, stop=everyone)
    if record.fingerprint != manifest.fingerprint():
        old = json.loads(record.manifest_json) if record.manifest_json else None
        # redacted as the recorded one is: the diff compares like with like and prints no secret
        new = redact_manifest(manifest.model_dump(mode="json", exclude={"source_path"}))
        old_names = [n["name"] for n in (old or {}).get("nodes", [])]
        removed = tuple(n for n in old_names if n not in everyone)
        diff = tuple(manifest_diff(old, new))
        changes = classify(old, new, *env_digests) if old is not None else None
        head_down = states is None or manifest.head.name in node_problems(expected_gpus, states)
        if changes is None or changes.full_restart or head_down:
            full = changes.full_restart if changes is not None else ("(no recorded manifest to compare with)",)
            if changes is not None and not full:  # the head is already down: nothing serves to protect
                why = f"the head is not ALIVE ({dashboard_error or 'not ALIVE in Ray'})"
            else:
                why = "in a way Ray applies only by restarting the head"
            return UpPlan(
                "restart",
                f"the manifest changed since the last `orch up`, {why}: restarting Ray on every node",
                start=everyone, stop=everyone, removed=removed, diff=diff, downtime=tuple(full),
                steps=tuple(f"{n}: restart (full restart)" for n in everyone)
                + tuple(f"{n}: stop Ray (removed from the manifest)" for n in removed),
            )  # fmt: skip
        return _per_node(manifest, changes, expected_gpus, states, diff, drain_deadline_s)
    if states is None:
        detail = f" ({dashboard_error})" if dashboard_error else ""
        return UpPlan(
            "restart", f"the head's Ray dashboard does not answer{detail}: restarting Ray on every node",
            start=everyone, stop=everyone, problems={manifest.head.name: "dashboard not answering"},
        )  # fmt: skip
    problems = node_problems(expected_gpus, states)
    if not problems:
        return UpPlan("nothing", f"all {len(everyone)} nodes are ALIVE with their GPUs and the manifest is unchanged")
    if manifest.head.name in problems:
        return UpPlan(
            "restart",
            f"the head is not healthy ({problems[manifest.head.name]}): restarting Ray on every node",
            start=everyone,
            stop=everyone,
            problems=problems,
        )
    sick = tuple(name for name in everyone if name in problems)
    return UpPlan(
        "heal",
        "restarting only " + ", ".join(f"{n} ({problems[n]})" for n in sick),
        start=sick,
        stop=sick,
        problems=problems,
    )


def _per_node(manifest: Manifest, changes: NodeChanges, expected_gpus: Mapping[str, int], states: list[NodeState],
              diff: tuple[str, ...], drain_deadline_s: float) -> UpPlan:  # fmt: skip
    """The head runs and keeps running: act on the workers the change names (and heal the sick)."""
    current = current_by_name(states)
    problems = node_problems(expected_gpus, states)
    restarted = changes.restarted_workers
    sick = tuple(n for n in problems if n not in restarted and n not in changes.added)
    start = tuple(n for n in _all(manifest) if n in changes.added or n in restarted or n in sick)
    alive = {n for n, s in current.items() if s.alive}
    drain = tuple(n for n in changes.removed + restarted if n in alive)
    deadline = f"{drain_deadline_s:g} s"
    steps: list[str] = []
    for name in _all(manifest):
        s = current.get(name)
        if name in changes.added:
            steps.append(f"{name}: join (new worker: preflight, collective check with the head, Ray started there only)")
        elif name in restarted:
            why = "replaced" if name in changes.replaced else "its settings changed"
            lines = "; ".join(changes.replaced.get(name) or changes.changed.get(name) or ())
            first = f"drain (Serve moves its replicas; deadline {deadline}), " if name in drain else ""
            steps.append(f"{name}: {first}restart alone, rejoin ({why}: {lines})")
        elif name in sick:
            steps.append(f"{name}: restart alone ({problems[name]})")
        else:
            steps.append(f"{name}: keep (Ray node {s.node_id[:12] if s else '?'} keeps running)")
    for name in changes.removed:
        first = f"drain (Serve moves its replicas; deadline {deadline}), then " if name in drain else ""
        steps.append(f"{name}: {first}stop Ray (removed from the manifest)")
    if not start and not changes.removed:
        reason = "the manifest changed in nothing Ray runs with: no node restarted, the new manifest recorded"
    else:
        parts = [f"{verb} {', '.join(names)}" for verb, names in (
            ("adding", changes.added), ("restarting alone", restarted + sick), ("removing", changes.removed)) if names]  # fmt: skip
        reason = "the manifest changed since the last `orch up`: " + "; ".join(parts) + "; the head keeps running"
    return UpPlan("change", reason, start=start, stop=start,
                  removed=changes.removed, diff=diff, problems=problems, drain=drain, steps=tuple(steps))  # fmt: skip
