"""Day-2 node changes on the shared 3-host cluster while the tiny model serves (issue 46).

A client sends a completion every few seconds throughout (test_rollout.BackgroundClient):
- the worker holding the model's replica (host2 when the replica sits on the head, which cannot
  leave: the figures printed say which case a run had) leaves the manifest: `orch up` drains it
  (Serve starts the replacement elsewhere first), then stops Ray there; the other two keep their
  Ray node ids and no request fails;
- it comes back into the manifest: `orch up` starts Ray there only, it joins, the other two keep
  their Ray node ids, no request fails (the shared cluster is then as the session left it);
- a change of the Ray port (a head restart) is refused with exit 2 naming the model, and nothing
  restarts.
A killed worker shown DEAD within 30 s: tests/integration/test_status.py.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.state import StateStore
from orchestrator.status.workers import ACTORS_PARAMS, ACTORS_PATH, parse_actors
from tests.integration.test_rollout import STEADY_PAUSE_S, BackgroundClient

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]


def _ids(c, capsys) -> dict[str, tuple[str, str, str]]:
    capsys.readouterr()
    main(c.cli("status", c.manifest_path, "--json"))
    status = json.loads(capsys.readouterr().out)
    return {n["name"]: (n["ray_state"], n["node_id"], n["started_at"]) for n in status["nodes"]}


def _replica_host(c) -> str:
    with c.dashboard() as d:
        actors = parse_actors(d.get_json(ACTORS_PATH, ACTORS_PARAMS))
        by_id = {s.node_id: s.name for s in d.nodes() if s.alive}
    (replica,) = [a for a in actors if a.state == "ALIVE" and a.class_name.startswith("ServeReplica:") and ":LLMServer" in a.class_name]
    return by_id[replica.node_id]


@pytest.mark.disrupts_serving
def test_remove_and_add_a_worker_while_serving_and_a_head_change_is_refused(served_tiny, tmp_path, capsys, measured):
    c = served_tiny.cluster
    full = c.manifest_path.read_text()
    holder = _replica_host(c)
    victim = holder if holder != c.manifest.head.name else "host2"
    doc = yaml.safe_load(full)
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] != victim]
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(yaml.safe_dump(doc))
    before = _ids(c, capsys)
    stay = [n for n in before if n != victim]

    # the worker leaves: drained first, no request fails, the others keep their Ray node ids
    capsys.readouterr()
    t0 = time.monotonic()
    with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
        rc = main(c.cli("up", smaller, "--json", "--skip-collective-check"))
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    res = json.loads(out.out)
    measured(f"remove {victim} (replica there: {holder == victim}): {time.monotonic() - t0:.0f} s, "
             f"drained {res['drained']}, client {client.ok} ok / {client.fail} failed")  # fmt: skip
    assert res["action"] == "change" and res["started"] == [] and res["plan"]["removed"] == [victim], res
    assert [d["node"] for d in res["drained"]] == [victim] and res["drained"][0]["left"] == {}, res["drained"]
    assert client.fail == 0, client.errors[:5]
    after = _ids(c, capsys)
    assert {n: after[n] for n in stay} == {n: before[n] for n in stay}
    assert _replica_host(c) != victim

    # it comes back: it joins alone, no request fails, the others keep their ids
    t0 = time.monotonic()
    with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
        rc = main(c.cli("up", c.manifest_path, "--json", "--skip-collective-check"))
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    res = json.loads(out.out)
    measured(f"add {victim}: {time.monotonic() - t0:.0f} s, client {client.ok} ok / {client.fail} failed")
    assert res["action"] == "change" and res["started"] == [victim], res
    assert client.fail == 0, client.errors[:5]
    back = _ids(c, capsys)
    assert {n: back[n] for n in stay} == {n: before[n] for n in stay}
    assert back[victim][0] == "ALIVE" and back[victim][1] != before[victim][1]

    # a head change while the model serves: refused, nothing restarted
    doc = yaml.safe_load(full)
    doc["ray"]["port"] = int(doc["ray"].get("port", 6379)) + 1
    moved = tmp_path / "moved.yaml"
    moved.write_text(yaml.safe_dump(doc))
    assert main(c.cli("up", moved, "--skip-collective-check")) == 2
    err = capsys.readouterr().err
    model = StateStore(c.state_dir).current_revision(c.manifest.name).model  # the model as the revision names it
    assert f"error: this change restarts the head, which stops {model} (revision " in err, err
    assert "~ ray.port: " in err and "--allow-downtime" in err, err
    assert _ids(c, capsys) == back
