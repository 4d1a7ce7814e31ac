"""`orch down` on the test bed: no Ray process is left on any host; a host whose sshd is down
is reported as unreachable, the others are stopped, and the command exits 4 (an unreachable
node, README's exit codes). Ends the shared cluster, so these
tests run last (marker ``ends_cluster``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from orchestrator.cli import main
from orchestrator.manifest.load import load_manifest_file
from orchestrator.serve import node_hooks
from orchestrator.serve.lora import LoraAdapter
from orchestrator.state import StateStore
from tests.fixtures.cluster import TESTBED_ENV, testbed_manifest
from tests.integration.test_rollout import STEADY_PAUSE_S, BackgroundClient
from tests.lora_store import S3Store, make_adapter

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.ends_cluster]


SLEEP = "import time; time.sleep(600)"


def _start_decoys(c, host: str, temp: str, cluster_id: str) -> dict[str, str]:
    """Processes on ``host`` that look like another cluster's: same name, another id; a temp dir
    that only starts with ours; another user's process carrying our very tag and temp dir. Each
    has a unique marker on its command line; returns label -> marker."""
    other_id = uuid.uuid4().hex[:16]
    decoys = {
        "same name, other id": ([], {"ORCH_CLUSTER": c.manifest.name, "ORCH_CLUSTER_ID": other_id}, None),
        "similar temp dir": ([f"--temp-dir={temp}-overhead-1"], {}, None),
        "similar session dir": ([f"--session_dir={temp}-overhead-1/session_2026"], {}, None),
        "another user's, our tag": ([f"--temp-dir={temp}"], {"ORCH_CLUSTER_ID": cluster_id}, "nobody"),
    }
    markers = {}
    for label, (args, env, user) in decoys.items():
        marker = f"decoy-{uuid.uuid4().hex[:8]}"
        argv = ["/usr/bin/python3", "-c", SLEEP, marker, *args]  # runnable by nobody too
        if user:
            argv = ["runuser", "-u", user, "--", *argv]
        env_args = [f"{k}={v}" for k, v in env.items()]
        # detached, its output away from ns_exec's pipes (which would otherwise wait for it)
        c.bed.ns_exec(host, ["sh", "-c", 'setsid -f "$@" </dev/null >/dev/null 2>&1', "sh", "env", *env_args, *argv])
        markers[label] = marker
    return markers


def _gone(c, host: str) -> bool:
    return c.ray_pids(host) == {}


def _alive(c, host: str, marker: str) -> bool:
    return c.bed.ns_exec(host, ["pgrep", "-f", marker], check=False).returncode == 0


def _replicas_of(served, capsys, model: str) -> list[tuple[str, float]]:
    """(id, start time) of ``model``'s engine replicas, as `orch status --json` lists them."""
    capsys.readouterr()
    assert main(served.cluster.cli("status", served.manifest_path, "--json", "--no-probe")) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    (entry,) = [m for m in report["serving"]["served_models"] if m["served_name"] == model]
    return sorted((r["replica_id"], r["start_time_s"]) for r in entry["replicas"])


def _complete(served, model: str, key: str | None, stream: bool = False, logprobs: bool = False) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body: dict = {"model": model, "prompt": "orch deploys vLLM on", "max_tokens": 4, "stream": stream, "temperature": 0}
    if logprobs:
        body["logprobs"] = 1
    return httpx.post(f"{served.endpoint}/v1/completions", json=body, headers=headers, timeout=60)


def _both_models_and_adapters_answer(served_tiny, key: str, disk: Path) -> None:
    """Every model and adapter through the one base URL with the key (the front), streaming
    too; /v1/models lists them; vLLM's own listing on the model's route shows the adapters'
    parent and where they were loaded from; 401 without the key; 404 naming the served ones."""
    c, host = served_tiny.cluster, served_tiny.cluster.bed.hosts[0]
    first_logprobs = {}
    for model in ("tiny", "tiny-b", "sql", "terse"):
        resp = _complete(served_tiny, model, key, logprobs=True)
        assert resp.status_code == 200 and resp.json()["model"] == model and resp.json()["usage"]["completion_tokens"] > 0, resp.text[:300]
        first_logprobs[model] = resp.json()["choices"][0]["logprobs"]["top_logprobs"][0]
    # each adapter's weights take part: its first token's distribution differs from the base's and the other's
    assert len({json.dumps(first_logprobs[m], sort_keys=True) for m in ("tiny-b", "sql", "terse")}) == 3, first_logprobs
    streamed = _complete(served_tiny, "tiny-b", key, stream=True)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]"), streamed.text[-300:]
    headers = {"Authorization": f"Bearer {key}"}
    listed = httpx.get(f"{served_tiny.endpoint}/v1/models", headers=headers, timeout=30)
    assert sorted(m["id"] for m in listed.json()["data"]) == ["sql", "terse", "tiny", "tiny-b"], listed.text[:300]
    own = httpx.get(f"{served_tiny.endpoint}/_orch/m/tiny-b/v1/models", headers=headers, timeout=30).json()["data"]
    cards = {card["id"]: card for card in own}
    assert cards["sql"]["parent"] == cards["terse"]["parent"] == "tiny-b" and cards["terse"]["root"] == str(disk), cards
    home = c.bed.ns_exec(host, ["printenv", "HOME"]).stdout.strip() or "/root"
    assert cards["sql"]["root"].startswith(str(Path(node_hooks.hooks_dir(c.manifest.name, home)).parent / "lora") + "/sql-"), cards
    assert _complete(served_tiny, "tiny", None).status_code == 401
    assert _complete(served_tiny, "sql", "wrong-key").status_code == 401
    unknown = _complete(served_tiny, "nope", key)
    assert unknown.status_code == 404 and "'nope' is not served here; served: sql, terse, tiny, tiny-b" in unknown.text, unknown.text[:300]


def test_a_second_model_with_lora_adapters_serves_behind_one_endpoint_and_the_first_is_never_disturbed(
        served_tiny, monkeypatch, capsys, measured, tmp_path):  # fmt: skip
    """A second model (the tiny model as 'tiny-b') with two LoRA adapters comes up beside the
    session's 'tiny' while a client sends 'tiny' requests: one adapter from an S3-compatible store
    (moto's real server, started in host0's namespaces), one from the hosts' disk, both random
    rank-8 adapters made on the spot (tests/lora_store.py). A third model that does not fit is
    refused naming what each holds. 'tiny-b' gets a new revision (without the adapters), is rolled
    back (they come back), then removed. 'tiny' never fails a request and keeps its replicas (ids
    and start times in `orch status --json`)."""
    c = served_tiny.cluster
    key = served_tiny.api_key
    monkeypatch.setenv(served_tiny.manifest.serve.api_key_env, key)
    before = _replicas_of(served_tiny, capsys, "tiny")
    assert before
    host = c.bed.hosts[0]
    with S3Store(host=host.address, prefix=host.ns_exec) as store:
        s3_uri = store.upload(make_adapter(tmp_path / "upload" / "sql", served_tiny.model_path, seed=1), "adapters", "tiny/sql")
        disk = make_adapter(tmp_path / "adapters" / "terse", served_tiny.model_path, seed=2)  # the hosts share this filesystem
        # the store's endpoint and credentials in the manifest's env, as a user's would be
        variant = served_tiny.manifest_path.with_name(served_tiny.manifest_path.stem + "-lora.yaml")
        variant.write_text(testbed_manifest(c.bed, model_store=served_tiny.model_path.parent, accelerator="cpu",
                                            env={**TESTBED_ENV, **store.env}))  # fmt: skip
        adapters = (LoraAdapter("sql", s3_uri), LoraAdapter("terse", str(disk)))
        with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
            added = served_tiny.rollout(manifest=load_manifest_file(variant), served_name="tiny-b", adapters=adapters)
        assert added.action == "fresh" and added.app_name == "orch-m-tiny-b", added.steps
        assert client.fail == 0, client.errors[:5]
        assert _replicas_of(served_tiny, capsys, "tiny") == before
        _both_models_and_adapters_answer(served_tiny, key, disk)

        # a third model that does not fit is refused, naming what each model holds
        capsys.readouterr()
        rc = main(c.cli("rollout", served_tiny.manifest_path, "--model", str(served_tiny.model_path), "--served-name", "tiny-c",
                        "--replicas", "40", "--max-model-len", "1024", "--enforce-eager", "--json"))  # fmt: skip
        refused = capsys.readouterr().err
        assert rc == 2 and "'tiny-c' does not fit beside the models this cluster serves" in refused, refused[-800:]
        assert "'tiny' (orch) holds CPU" in refused and "'tiny-b' (orch-m-tiny-b) holds CPU" in refused, refused[-800:]

        # a new revision of the second model (its adapters gone), then its rollback (they come back):
        # the first keeps serving throughout, its replicas the same
        with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
            again = served_tiny.rollout(served_name="tiny-b", max_model_len=2048)
        assert again.revision > added.revision and again.app_name == "orch-m-tiny-b", again.steps
        assert client.fail == 0, client.errors[:5]
        assert _complete(served_tiny, "tiny-b", key).status_code == 200
        assert _complete(served_tiny, "sql", key).status_code == 404  # the front forgot the adapters with their engine
        with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
            capsys.readouterr()
            assert main(c.cli("rollback", variant, "--model", "tiny-b", "--json")) == 0
            back = json.loads(capsys.readouterr().out)
        assert back["model"] == "tiny-b" and back["revision"] > again.revision and back["app_name"] == "orch-m-tiny-b", back["steps"]
        assert client.fail == 0, client.errors[:5]
        assert _complete(served_tiny, "sql", key).status_code == 200  # the adapters are back, the S3 one downloaded again
    assert _replicas_of(served_tiny, capsys, "tiny") == before
    measured(f"second model with 2 LoRA adapters: fresh beside the first in {added.cold_load_s} s; its new revision "
             f"({again.action}) in {again.cold_load_s} s; its rollback ({back['action']}) in {back['cold_load_s']} s; "
             f"the first answered every request throughout, its replicas unchanged")

    # removing it leaves the first serving through the same base URL
    capsys.readouterr()
    assert main(c.cli("remove", "tiny-b", served_tiny.manifest_path, "--json")) == 0
    removed = json.loads(capsys.readouterr().out)
    assert removed["apps"] == ["orch-m-tiny-b"] and "orch" in removed["kept"], removed
    assert _complete(served_tiny, "tiny", key).status_code == 200
    assert _complete(served_tiny, "tiny-b", key).status_code == 404
    assert _replicas_of(served_tiny, capsys, "tiny") == before


def test_remove_stops_serving_the_model_and_ray_stays_up(served_tiny, monkeypatch, capsys, measured):
    """`orch remove tiny` on the shared cluster (before `orch down` ends it): Serve deletes the
    model's application, the revision is recorded removed, the public route answers no
    completion, and Ray keeps running on every host."""
    c = served_tiny.cluster
    monkeypatch.setenv(served_tiny.manifest.serve.api_key_env, served_tiny.api_key)
    capsys.readouterr()
    assert main(c.cli("remove", "tiny", served_tiny.manifest_path, "--json")) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["action"] == "removed" and "orch" in res["apps"], res
    measured(f"orch remove: Serve deleted {', '.join(res['apps'])} {res['seconds']} s after the PUT")
    with c.dashboard() as dash:
        left = dash.get_json("/api/serve/applications/").get("applications") or {}
    assert not set(res["apps"]) & set(left), sorted(left)
    state = StateStore(c.state_dir)
    assert state.current_revision(served_tiny.manifest.name) is None
    assert state.get_revision(served_tiny.manifest.name, res["revision"]).status == "removed"
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
    resp = httpx.post(f"{served_tiny.endpoint}/v1/completions", json=body, headers={"Authorization": f"Bearer {served_tiny.api_key}"},
                      timeout=60)  # fmt: skip
    assert resp.status_code != 200, resp.text[:300]
    assert all(c.ray_pids(h.name) for h in c.bed.hosts)


def test_down_with_one_host_unreachable_then_down_leaves_no_ray_process(ray_testbed_cluster, capsys):
    c = ray_testbed_cluster
    name = c.manifest.name
    assert all(c.ray_pids(h.name) for h in c.bed.hosts)
    # decoys of another cluster on host0 (issue 12: substring matching of the temp dir killed
    # ~20 processes of a cluster whose temp dir began the same; the name tag is shared by any
    # two clusters of one name; another user's processes are not ours)
    cluster_id = StateStore(c.state_dir).read_cluster_id(name)
    assert cluster_id
    decoys = _start_decoys(c, "host0", str(c.manifest.ray.temp_dir).rstrip("/"), cluster_id)
    assert all(_alive(c, "host0", m) for m in decoys.values())

    # host1's sshd is down: the others are stopped, host1 is reported, the exit code is 4.
    c.bed.stop_sshd("host1")
    try:
        capsys.readouterr()
        assert main(c.cli("down", c.manifest_path, "--json")) == 4
        captured = capsys.readouterr()
    finally:
        c.bed.start_sshd("host1")
    result = json.loads(captured.out)
    by = {n["node"]: n for n in result["nodes"]}
    assert by["host1"]["unreachable"] is True and by["host1"]["ok"] is False
    assert by["host0"]["ok"] and by["host2"]["ok"]
    assert "error: not reached: host1; Ray may still run there" in captured.err
    # a killed process stays a zombie until the host's init reaps it (up to ~1 s later): wait for that
    assert c.wait_for(lambda: _gone(c, "host0") and _gone(c, "host2"), timeout=30), (c.ray_pids("host0"), c.ray_pids("host2"))
    assert c.ray_pids("host1")  # untouched: it was not reachable
    # host1 did not confirm: the cluster is not recorded as down
    assert result["recorded_down"] is False and StateStore(c.state_dir).get_cluster(name).state == "up"

    # Once reachable again, `orch down` stops it too: no Ray process anywhere.
    assert main(c.cli("down", c.manifest_path)) == 0
    out = capsys.readouterr().out
    assert "stopped" in out
    assert c.wait_for(lambda: all(_gone(c, h.name) for h in c.bed.hosts), timeout=30), {h.name: c.ray_pids(h.name) for h in c.bed.hosts}
    assert StateStore(c.state_dir).get_cluster(name).state == "down"
    try:
        assert {label: _alive(c, "host0", m) for label, m in decoys.items()} == {label: True for label in decoys}
    finally:
        for m in decoys.values():
            c.bed.ns_exec("host0", ["pkill", "-f", m], check=False)
    assert not Path(f"/root/.orch/nodes/{name}").exists()  # no secret left on the nodes

    # Status of a cluster that is down says so (and does not fail).
    assert main(c.cli("status", c.manifest_path, "--json")) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["healthy"] is False and status["dashboard_error"]
    assert {n["ray_state"] for n in status["nodes"]} == {"UNKNOWN"}
