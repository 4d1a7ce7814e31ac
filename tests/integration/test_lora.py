"""LoRA adapters on the test bed: `orch rollout --lora` with one adapter from an S3-compatible
store and one from the node's disk, served by one real engine (vLLM's CPU backend runs LoRA).

The store is moto's S3 server, a real process started inside the test host's namespaces and bound
to its address (reachable from the host's engine and from this process, which uploads). The
adapters are random PEFT adapters of rank 8 on q_proj/v_proj, made on the spot for the tiny model
(tests/lora_store.py). The manifest's env carries ``AWS_ENDPOINT_URL_S3`` and moto's credentials,
as a user's would for a store other than AWS.

The bed is its own (one host, one `orch up`, one engine start): a rollout with adapters on the
session's shared served model (``served_tiny``) would be a new revision of it, which restarts its
engine (twice when side by side: the candidate, then the live application at the switch) and
leaves adapters in the config that the later tests of that model compare against. One host is the
cheapest bed that runs the whole path (SSH, `orch up`, the node checks, the hook module, Serve).

Checked: the rollout passes its gate; a completion from each adapter through the public endpoint
with the API key (the response names the adapter); 401 without the key; an unknown adapter gets
vLLM's 404 naming the served names; ``/v1/models`` lists both adapters with the base as parent, the
S3 one loaded from the local copy orch's callback made on the node.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest

from orchestrator.cli import main
from orchestrator.serve import node_hooks
from orchestrator.workflows.down import down
from tests.fixtures.cluster import TESTBED_ENV, RayTestbedCluster
from tests.fixtures.cluster import testbed_manifest as manifest_text
from tests.fixtures.serving import TEST_KV_CACHE_GIB
from tests.lora_store import S3Store, make_adapter

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]

ROLLOUT_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def lora_bed(testbed_factory, tmp_path_factory, tiny_model_dir):
    bed = testbed_factory.make(1, name="lora")
    host = bed.hosts[0]
    work = tmp_path_factory.mktemp("lora")
    with S3Store(host=host.address, prefix=host.ns_exec) as store:
        s3_uri = store.upload(make_adapter(work / "upload" / "sql", tiny_model_dir, seed=1), "adapters", "tiny/sql")
        disk = make_adapter(work / "adapters" / "terse", tiny_model_dir, seed=2)  # the hosts share this filesystem
        path = work / f"{bed.name}.yaml"
        path.write_text(manifest_text(bed, model_store=Path(tiny_model_dir).parent, accelerator="cpu", env={**TESTBED_ENV, **store.env}))
        cluster = RayTestbedCluster(bed=bed, manifest_path=path, state_dir=work / "state")
        try:
            cluster.ensure_up()
            yield cluster, Path(tiny_model_dir), s3_uri, disk, "orch-test-" + secrets.token_hex(16)
        finally:
            if cluster.ups:
                down(cluster.manifest, cluster.deps())
            bed.close()


def _post(endpoint: str, key: str | None, model: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "prompt": "orch deploys vLLM on", "max_tokens": 8, "temperature": 0, "logprobs": 1}
    return httpx.post(f"{endpoint}/v1/completions", json=body, headers=headers, timeout=120)


def test_adapters_from_s3_and_from_the_nodes_disk_answer_through_the_public_endpoint(lora_bed, capsys, monkeypatch, measured):
    cluster, model, s3_uri, disk, key = lora_bed
    monkeypatch.setenv(cluster.manifest.serve.api_key_env, key)
    capsys.readouterr()
    rc = main(cluster.cli("rollout", cluster.manifest_path, "--model", model, "--served-name", "tiny",
                          "--lora", f"sql={s3_uri}", "--lora", f"terse={disk}", "--max-lora-rank", "8", "--replicas", "1",
                          "--max-model-len", "1024", "--enforce-eager", "--kv-cache-gib", str(TEST_KV_CACHE_GIB),
                          "--timeout", str(ROLLOUT_TIMEOUT_S), "--json"))  # fmt: skip
    out = capsys.readouterr()
    assert rc == 0, (out.out[-3000:], out.err[-3000:])
    result = json.loads(out.out)
    measured(f"rollout with two adapters: cold load {result.get('cold_load_s')} s")
    engine = result["config"]["args"]["llm_configs"][0]["engine_kwargs"]
    assert [(m["name"], m["path"]) for m in engine["lora_modules"]] == [("sql", s3_uri), ("terse", str(disk))]
    assert (engine["enable_lora"], engine["max_loras"], engine["max_lora_rank"]) == (True, 2, 8)
    endpoint = cluster.manifest.serve_url()

    first_logprobs = {}
    for adapter in ("sql", "terse", "tiny"):
        resp = _post(endpoint, key, adapter)
        assert resp.status_code == 200, (adapter, resp.text)
        data = resp.json()
        assert data["model"] == adapter and data["usage"]["completion_tokens"] > 0, data
        first_logprobs[adapter] = data["choices"][0]["logprobs"]["top_logprobs"][0]
    # each adapter's weights took part: the first token's distribution differs from the base's
    # and between the two (random adapters of different seeds)
    assert first_logprobs["sql"] != first_logprobs["tiny"] and first_logprobs["terse"] != first_logprobs["tiny"], first_logprobs
    assert first_logprobs["sql"] != first_logprobs["terse"], first_logprobs
    assert _post(endpoint, None, "sql").status_code == 401
    missing = _post(endpoint, key, "nope")
    assert missing.status_code == 404 and "nope" in missing.text, missing.text

    models = httpx.get(f"{endpoint}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert models.status_code == 200, models.text
    cards = {card["id"]: card for card in models.json()["data"]}
    assert set(cards) == {"tiny", "sql", "terse"}, cards
    assert cards["sql"]["parent"] == cards["terse"]["parent"] == "tiny"
    assert cards["terse"]["root"] == str(disk)
    # the S3 adapter was loaded from the copy orch's callback made on the node, beside its module
    home = cluster.bed.ns_exec(cluster.bed.hosts[0], ["printenv", "HOME"]).stdout.strip() or "/root"
    lora_dir = str(Path(node_hooks.hooks_dir(cluster.manifest.name, home)).parent / "lora")
    assert cards["sql"]["root"].startswith(lora_dir + "/sql-"), (cards["sql"], lora_dir)
