"""Several models on the shared cluster, each its own Serve application behind one endpoint, and
LoRA adapters: a second model with two adapters beside the session's served model, a third that
does not fit, a new revision and a rollback of the second, its removal. The session's model keeps
serving throughout and ends as it began (alone on "/", the front gone with the second model), so
the tests after it see the cluster as before. Marked ``disrupts_serving``: it runs after the tests
that read the served model and before those that take the cluster down (tests/integration/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from orchestrator.cli import main
from orchestrator.manifest.load import load_manifest_file
from orchestrator.serve import node_hooks
from orchestrator.serve.lora import LoraAdapter
from tests.fixtures.cluster import TESTBED_ENV
from tests.fixtures.cluster import testbed_manifest as manifest_text  # not collected as a test
from tests.integration.test_benchmark_smokes import overhead_smoke
from tests.integration.test_rollout import STEADY_PAUSE_S, BackgroundClient
from tests.lora_store import S3Store, make_adapter

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm, pytest.mark.disrupts_serving]


def _served_model(served, capsys, model: str) -> dict:
    """``model``'s entry of `orch status --json` (``served_models``)."""
    capsys.readouterr()
    assert main(served.cluster.cli("status", served.manifest_path, "--json")) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    (entry,) = [m for m in report["serving"]["served_models"] if m["served_name"] == model]
    return entry


def _replicas_of(served, capsys, model: str) -> list[tuple[str, float]]:
    """(id, start time) of ``model``'s engine replicas, as `orch status --json` lists them."""
    return sorted((r["replica_id"], r["start_time_s"]) for r in _served_model(served, capsys, model)["replicas"])


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
    assert cards["sql"]["root"].startswith(node_hooks.adapters_dir(c.manifest.name, home) + "/sql-"), cards
    assert _complete(served_tiny, "tiny", None).status_code == 401
    assert _complete(served_tiny, "sql", "wrong-key").status_code == 401
    unknown = _complete(served_tiny, "nope", key)
    assert unknown.status_code == 404 and "'nope' is not served here; served: sql, terse, tiny, tiny-b" in unknown.text, unknown.text[:300]


def _overhead_smoke_through_the_front(served_tiny, bare_url: str) -> None:
    """benchmarks/serve_overhead.py's measuring part with two models served: its streamed 'tiny'
    requests to the base URL go through orch's front (``/v1``), as every client's do now; the
    figures are the twomodels variant's job (docs/rollout.md), here every request must answer."""
    level = overhead_smoke(bare_url, served_tiny.endpoint, served_tiny.api_key)
    assert level["serve"]["failed"] == 0 and level["serve"]["rounds"][0]["ok"] == 64 and level["serve"]["output_tok_s"] > 0, level


def test_a_second_model_with_lora_adapters_serves_behind_one_endpoint_and_the_first_is_never_disturbed(
        served_tiny, vllm_server, monkeypatch, capsys, measured, tmp_path):  # fmt: skip
    """A second model (the tiny model as 'tiny-b') with two LoRA adapters comes up beside the
    session's 'tiny' while a client sends 'tiny' requests: one adapter from an S3-compatible store
    (moto's real server, started in host0's namespaces), one from the hosts' disk, both random
    rank-8 adapters made on the spot (tests/lora_store.py). A third model that does not fit is
    refused naming what each holds. 'tiny-b' gets a new revision with one more replica (Serve adds
    it beside the serving one, which keeps its id), is rolled back to one, then removed. 'tiny' never fails a request and keeps its replicas (ids
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
        variant.write_text(manifest_text(c.bed, model_store=served_tiny.model_path.parent, accelerator="cpu",
                                            env={**TESTBED_ENV, **store.env}))  # fmt: skip
        adapters = (LoraAdapter("sql", s3_uri), LoraAdapter("terse", str(disk)))
        with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
            added = served_tiny.rollout(manifest=load_manifest_file(variant), served_name="tiny-b", adapters=adapters)
        assert added.action == "fresh" and added.app_name == "orch-m-tiny-b", added.steps
        assert client.fail == 0, client.errors[:5]
        assert _replicas_of(served_tiny, capsys, "tiny") == before
        _both_models_and_adapters_answer(served_tiny, key, disk)
        _overhead_smoke_through_the_front(served_tiny, vllm_server.url)

        # a third adapter added to the running second model: its replicas load it (user_config,
        # reconfigure), none restarts: the same replica ids and start times; it answers at once
        # and is listed, by the front and by vLLM's own /v1/models on the model's route
        b_serving = _replicas_of(served_tiny, capsys, "tiny-b")
        brief = make_adapter(tmp_path / "adapters" / "brief", served_tiny.model_path, seed=3)
        adapters = (*adapters, LoraAdapter("brief", str(brief)))
        with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
            grown = served_tiny.rollout(manifest=load_manifest_file(variant), served_name="tiny-b", adapters=adapters)
        assert grown.action == "adapters" and grown.revision > added.revision and grown.app_name == "orch-m-tiny-b", grown.steps
        assert client.fail == 0, client.errors[:5]
        assert _replicas_of(served_tiny, capsys, "tiny-b") == b_serving and _replicas_of(served_tiny, capsys, "tiny") == before
        answer = _complete(served_tiny, "brief", key, logprobs=True)
        assert answer.status_code == 200 and answer.json()["model"] == "brief", answer.text[:300]
        headers = {"Authorization": f"Bearer {key}"}
        listed = httpx.get(f"{served_tiny.endpoint}/v1/models", headers=headers, timeout=30).json()["data"]
        own = httpx.get(f"{served_tiny.endpoint}/_orch/m/tiny-b/v1/models", headers=headers, timeout=30).json()["data"]
        assert "brief" in {m["id"] for m in listed} and {m["id"]: m.get("parent") for m in own}["brief"] == "tiny-b", (listed, own)

        # a third model that does not fit is refused, naming what each model holds
        capsys.readouterr()
        rc = main(c.cli("rollout", served_tiny.manifest_path, "--model", str(served_tiny.model_path), "--served-name", "tiny-c",
                        "--replicas", "40", "--max-model-len", "1024", "--enforce-eager", "--json"))  # fmt: skip
        refused = capsys.readouterr().err
        assert rc == 2 and "'tiny-c' does not fit beside the models this cluster serves" in refused, refused[-800:]
        assert "'tiny' (orch) holds CPU" in refused and "'tiny-b' (orch-m-tiny-b) holds CPU" in refused, refused[-800:]

        # a new revision of the second model: one more replica (`--replicas 2`) and the third
        # adapter gone, which Serve adds beside its serving one (no candidate, the serving replica
        # not restarted, the adapter unloaded); then its rollback to one replica and three adapters. The first keeps serving throughout, its
        # replicas the same; the adapters answer on the second's replicas.
        b_before = _replicas_of(served_tiny, capsys, "tiny-b")
        assert len(b_before) == 1
        with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
            again = served_tiny.rollout(manifest=load_manifest_file(variant), served_name="tiny-b", adapters=adapters[:2], replicas=2)
        assert again.action == "scale" and again.revision > grown.revision and again.app_name == "orch-m-tiny-b", again.steps
        assert client.fail == 0, client.errors[:5]
        b_scaled = _replicas_of(served_tiny, capsys, "tiny-b")
        assert len(b_scaled) == 2 and set(b_before) < set(b_scaled), (b_before, b_scaled)  # the serving replica kept
        for model in ("tiny-b", "sql", "terse"):
            assert _complete(served_tiny, model, key).status_code == 200, model
        assert _complete(served_tiny, "brief", key).status_code == 404  # unloaded, and the front no longer routes it
        with BackgroundClient(served_tiny, pause_s=STEADY_PAUSE_S) as client:
            capsys.readouterr()
            assert main(c.cli("rollback", variant, "--model", "tiny-b", "--json")) == 0
            back = json.loads(capsys.readouterr().out)
        assert back["model"] == "tiny-b" and back["revision"] > again.revision and back["app_name"] == "orch-m-tiny-b", back["steps"]
        assert back["action"] == "scale", back["decision"]
        assert client.fail == 0, client.errors[:5]
        b_back = _replicas_of(served_tiny, capsys, "tiny-b")
        assert len(b_back) == 1 and set(b_back) < set(b_scaled), (b_scaled, b_back)
        assert _complete(served_tiny, "sql", key).status_code == 200 and _complete(served_tiny, "brief", key).status_code == 200
    assert _replicas_of(served_tiny, capsys, "tiny") == before
    measured(f"second model with 2 LoRA adapters: fresh beside the first in {added.cold_load_s} s; a third adapter added "
             f"({grown.action}, no replica restarted) in {grown.cold_load_s} s; one more replica "
             f"({again.action}) in {again.cold_load_s} s; its rollback ({back['action']}) in {back['cold_load_s']} s; "
             f"the first answered every request throughout, its replicas unchanged")

    # removing it leaves the first serving through the same base URL
    capsys.readouterr()
    assert main(c.cli("remove", "tiny-b", served_tiny.manifest_path, "--json")) == 0
    removed = json.loads(capsys.readouterr().out)
    assert removed["apps"] == ["orch-front", "orch-m-tiny-b"] and removed["kept"] == ["orch"], removed  # 'tiny' takes "/" back
    assert _complete(served_tiny, "tiny", key).status_code == 200
    assert _complete(served_tiny, "tiny-b", key).status_code == 404
    last = _served_model(served_tiny, capsys, "tiny")
    assert last["route_prefix"] == "/" and sorted((r["replica_id"], r["start_time_s"]) for r in last["replicas"]) == before
