"""LoRA adapters on a base model (`orch rollout --lora NAME=SOURCE`, serve/lora.py): the flag's
parsing and validation, what the rollout renders (vLLM's ``lora_modules``, read back by vLLM's own
``FrontendArgs``), the slots it plans, and the fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.catalog import CATALOG
from orchestrator.plan.engine_features import LoraOptions
from orchestrator.serve.desired import RolloutRequest, lora_options
from orchestrator.serve.lora import (
    LoraAdapter,
    adapter_rank,
    adapters_of,
    check_adapters,
    lora_modules,
    parse_lora,
    static_adapters,
)
from orchestrator.serve.shapes import llm_config_of
from orchestrator.workflows.desired import desired_for_model

TEMPLATES = Path(__file__).resolve().parents[2] / "cluster-templates"


@pytest.mark.parametrize(("value", "adapter"), [
    ("sql=/models/adapters/sql", LoraAdapter("sql", "/models/adapters/sql")),
    ("sql=/models/adapters/sql/", LoraAdapter("sql", "/models/adapters/sql")),
    ("chat-v2=s3://bucket/adapters/chat/", LoraAdapter("chat-v2", "s3://bucket/adapters/chat")),
    ("a.b_c=s3://bucket", LoraAdapter("a.b_c", "s3://bucket")),
])  # fmt: skip
def test_a_lora_flag_is_a_name_and_a_node_folder_or_an_s3_prefix(value, adapter):
    parsed = parse_lora(value)
    assert parsed == adapter and parsed.remote == adapter.source.startswith("s3://")


@pytest.mark.parametrize(("value", "needle"), [
    ("sql", "expected NAME=SOURCE"),
    ("=/models/sql", "the adapter's name (before =) is empty"),
    ("sql=", "the source (after =) is empty"),
    ("s q=/models/sql", "may hold letters, digits"),
    ("base:sql=/models/sql", "may hold letters, digits"),
    ("sql=gs://bucket/sql", "the scheme gs:// of 'gs://bucket/sql' is not supported"),
    ("sql=https://example.com/sql", "the scheme https:// of"),
    ("sql=adapters/sql", "is not an absolute folder on the nodes"),
    ("sql=s3:///sql", "names no bucket"),
])  # fmt: skip
def test_bad_lora_flags_exit_2_naming_the_flag_and_the_value_with_a_hint(value, needle):
    with pytest.raises(UsageError) as caught:
        parse_lora(value)
    assert caught.value.exit_code == 2
    assert f"--lora {value!r}" in str(caught.value) and needle in str(caught.value)
    assert caught.value.hint


def test_an_adapter_named_as_the_base_or_given_twice_is_refused():
    with pytest.raises(UsageError, match="is the base model's served name") as caught:
        check_adapters([LoraAdapter("tiny", "/m/a")], "tiny")
    assert "--lora tiny=/m/a" in str(caught.value)
    with pytest.raises(UsageError, match="the adapter 'sql' is given twice"):
        check_adapters([LoraAdapter("sql", "/m/a"), LoraAdapter("sql", "s3://b/sql")], "tiny")
    both = (LoraAdapter("sql", "/m/a"), LoraAdapter("chat", "/m/a"))  # one folder under two names: vLLM loads it twice
    assert check_adapters(both, "tiny") == both


def test_the_modules_are_what_vllms_frontend_args_take_as_lora_modules():
    from vllm.entrypoints.launchers.cli_args import FrontendArgs
    from vllm.entrypoints.openai.models.protocol import LoRAModulePath

    modules = lora_modules([LoraAdapter("sql", "/m/sql"), LoraAdapter("chat", "s3://b/chat")], "tiny")
    # Ray Serve LLM hands engine_kwargs' frontend fields to FrontendArgs(**kwargs) (vllm_models.py)
    args = FrontendArgs(lora_modules=modules)
    assert args.lora_modules == [LoRAModulePath("sql", "/m/sql", "tiny"), LoRAModulePath("chat", "s3://b/chat", "tiny")]
    assert static_adapters({"engine_kwargs": {"lora_modules": modules}}) == (LoraAdapter("sql", "/m/sql"), LoraAdapter("chat", "s3://b/chat"))


def test_the_rank_comes_from_the_adapters_own_config():
    # a PEFT adapter_config.json (the keys vLLM's PEFTHelper reads)
    text = '{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}'
    assert adapter_rank(text) == 8
    assert adapter_rank("{}") is None and adapter_rank("not json") is None and adapter_rank('{"r": true}') is None
    # a rank is a whole number of at least 1 (r=0 is no low-rank update at all); r=1 is a rank
    assert adapter_rank('{"r": 1}') == 1 and adapter_rank('{"r": 0}') is None and adapter_rank('{"r": -8}') is None
    assert adapter_rank("[8]") is None and adapter_rank('"r"') is None  # JSON, but not a config object


def test_a_stored_config_entry_without_a_name_or_a_path_is_not_an_adapter():
    modules = [{"name": "sql"}, {"path": "/m/x"}, "chat=/m/chat", {"name": "ok", "path": "/m/ok", "base_model_name": "tiny"}]
    assert static_adapters({"engine_kwargs": {"lora_modules": modules}}) == (LoraAdapter("ok", "/m/ok"),)


# ---- what the rollout renders and plans ----


def _rendered(tmp_path: Path, **request) -> tuple[dict, object]:
    from orchestrator.plan.tinymodel import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny") if not (tmp_path / "tiny").exists() else tmp_path / "tiny"
    manifest = load_manifest_file(TEMPLATES / "local.yaml")
    desired = desired_for_model(manifest, RolloutRequest(model=str(model), served_name="tiny", max_model_len=1024, **request))([], 2)
    return desired.rendered.llm_config, desired


def test_a_rollout_with_adapters_renders_them_as_the_engine_deployments_user_config_and_one_slot_each(tmp_path):
    adapters = (parse_lora("sql=/models/adapters/sql"), parse_lora("chat=s3://bucket/adapters/chat"))
    llm, desired = _rendered(tmp_path, adapters=adapters)
    engine = llm["engine_kwargs"]
    # runtime adapters (orch's builder): outside the args, so a change of them is no new code version
    assert "lora_modules" not in engine and desired.rendered.app["import_path"] == "orch_serve_hooks:build_openai_app"
    assert desired.rendered.app["deployments"] == [{"name": "LLMServer:tiny", "user_config": {"lora_adapters": [
        {"name": "chat", "source": "s3://bucket/adapters/chat"}, {"name": "sql", "source": "/models/adapters/sql"}]}}]  # fmt: skip
    assert adapters_of(desired.rendered.app) == (LoraAdapter("chat", "s3://bucket/adapters/chat"), LoraAdapter("sql", "/models/adapters/sql"))
    # one slot per adapter at vLLM's default rank (LoRAConfig.max_lora_rank = 16)
    assert (engine["enable_lora"], engine["max_loras"], engine["max_lora_rank"]) == (True, 2, 16)
    assert desired.plan["features"]["lora_gib_per_gpu"] > 0
    # orch's callback (which downloads the S3 adapter on the node) is rendered for the local base
    assert llm["callback_config"]["callback_class"] == "orch_serve_hooks.SkipNodeInit"
    from orchestrator.serve.ray_io.validate import validate_app

    validate_app(desired.rendered.app)  # Ray Serve LLM's own LLMConfig takes it


def test_the_slots_the_adapters_imply_are_the_planners_lora_term(tmp_path):
    """The planner sizes LoRA slots already (plan/engine_features.py, tested against vLLM's
    create_lora_weights in test_engine_features.py): two adapters plan what --enable-lora
    --max-loras 2 plans, and the flags win over the implied slots."""
    two = (LoraAdapter("a", "/m/a"), LoraAdapter("b", "/m/b"))
    assert lora_options(RolloutRequest(model="x", adapters=two)) == LoraOptions(max_loras=2, max_lora_rank=16)
    assert lora_options(RolloutRequest(model="x", adapters=two, lora=LoraOptions(1, 8))) == LoraOptions(1, 8)
    assert lora_options(RolloutRequest(model="x")) is None
    _, implied = _rendered(tmp_path, adapters=two)
    _, flags = _rendered(tmp_path, lora=LoraOptions(max_loras=2, max_lora_rank=16))
    assert implied.plan["features"] == flags.plan["features"] and implied.plan["kv_cache_tokens"] == flags.plan["kv_cache_tokens"]


def test_the_fingerprint_changes_when_the_adapters_change(tmp_path):
    one = _rendered(tmp_path, adapters=(LoraAdapter("sql", "/m/sql"),))[1].rendered.fingerprint()
    assert _rendered(tmp_path, adapters=(LoraAdapter("sql", "/m/sql"),))[1].rendered.fingerprint() == one
    assert _rendered(tmp_path, adapters=(LoraAdapter("sql", "/m/sql2"),))[1].rendered.fingerprint() != one
    two = (LoraAdapter("sql", "/m/sql"), LoraAdapter("chat", "/m/chat"))
    assert _rendered(tmp_path, adapters=two, lora=LoraOptions(2, 16))[1].rendered.fingerprint() != one


def test_adapters_the_rollout_cannot_serve_are_refused_before_anything_is_applied(tmp_path):
    with pytest.raises(UsageError, match="is the base model's served name"):
        _rendered(tmp_path, adapters=(LoraAdapter("tiny", "/m/a"),))
    with pytest.raises(UsageError, match="--engine-arg lora_modules: orch renders the adapters itself"):
        _rendered(tmp_path, engine_args=(("lora_modules", []),))


def test_an_s3_adapter_on_a_base_from_a_bucket_is_refused():
    # A remote base keeps Serve LLM's own per-node download and not orch's callback, which is
    # what fetches an S3 adapter.
    from orchestrator.plan.planner import plan_model
    from orchestrator.plan.shape import shape_from_manifest
    from orchestrator.serve.desired import checked_adapters

    manifest = load_manifest_file(TEMPLATES / "2x8-h100-405b.yaml")
    plan = plan_model(CATALOG["llama3-8b"], shape_from_manifest(manifest))
    request = RolloutRequest(model="llama3-8b", adapters=(LoraAdapter("sql", "s3://b/sql"),))
    with pytest.raises(UsageError, match="S3 adapter is downloaded on the node by orch's Serve callback"):
        checked_adapters(manifest, request, "l8", "s3://models/llama3-8b", plan)
    assert checked_adapters(manifest, request, "l8", "/models/llama3-8b", plan)[0].source == "s3://b/sql"


# ---- the manifest's serve.lora ----


def _manifest_with(lora_yaml: str, tmp_path: Path):
    from orchestrator.manifest.load import load_manifest

    text = (TEMPLATES / "local.yaml").read_text().replace("serve:\n", "serve:\n  lora:\n" + lora_yaml, 1)
    return load_manifest(text, tmp_path / "cluster.yaml")


def test_the_manifests_adapters_of_a_model_are_served_unless_the_flag_gives_them(tmp_path):
    from orchestrator.plan.tinymodel import build_tiny_model

    manifest = _manifest_with("    tiny:\n      sql: /models/adapters/sql\n      chat: s3://bucket/chat/\n    other:\n      x: /m/x\n", tmp_path)
    model = str(build_tiny_model(tmp_path / "tiny"))

    def app(**request) -> dict:
        return desired_for_model(manifest, RolloutRequest(model=model, served_name="tiny", max_model_len=1024, **request))([], 2).rendered.app

    assert [(a.name, a.source) for a in adapters_of(app())] == [("chat", "s3://bucket/chat"), ("sql", "/models/adapters/sql")]
    assert llm_config_of(app())["engine_kwargs"]["max_loras"] == 2
    assert [a.name for a in adapters_of(app(adapters=(LoraAdapter("only", "/m/only"),)))] == ["only"]
    other = desired_for_model(manifest, RolloutRequest(model=model, served_name="plain", max_model_len=1024))([], 2)
    assert adapters_of(other.rendered.app) == () and "deployments" not in other.rendered.app  # another model: none of them


@pytest.mark.parametrize(("lora_yaml", "needle"), [
    ("    tiny:\n      sql: gs://b/sql\n", "cluster.yaml:65: serve.lora: serve.lora.tiny.sql: the scheme gs:// of 'gs://b/sql' is not supported"),
    ("    tiny:\n      tiny: /m/x\n", "the name 'tiny' is the base model's served name"),
    ("    tiny:\n      sql: models/sql\n", "serve.lora.tiny.sql: 'models/sql' is not an absolute folder on the nodes"),
])  # fmt: skip
def test_bad_adapters_in_the_manifest_name_the_field_and_line(lora_yaml, needle, tmp_path):
    from orchestrator.errors import ManifestError

    with pytest.raises(ManifestError) as caught:
        _manifest_with(lora_yaml, tmp_path)
    assert needle in caught.value.message and caught.value.exit_code == 2


def test_an_s3_adapter_for_an_engine_that_spans_nodes_is_refused():
    # The callback downloads on the replica's node only; vLLM's workers on the other nodes load
    # the adapter from the same path (each worker's LoRA manager reads it).
    from orchestrator.plan.planner import plan_model
    from orchestrator.plan.shape import shape_from_manifest
    from orchestrator.serve.desired import checked_adapters

    manifest = load_manifest_file(TEMPLATES / "2x8-h100-405b.yaml")
    plan = plan_model(CATALOG["llama3-405b"], shape_from_manifest(manifest))
    assert plan.tp * plan.pp > plan.gpus_per_node  # TP=8 x PP=2 over two 8-GPU nodes
    s3 = RolloutRequest(model="llama3-405b", adapters=(LoraAdapter("sql", "s3://b/sql"),))
    with pytest.raises(UsageError, match="this plan's engine spans nodes") as caught:
        checked_adapters(manifest, s3, "l", "/models/llama3-405b", plan)
    assert "every node's disk" in (caught.value.hint or "")
    disk = RolloutRequest(model="llama3-405b", adapters=(LoraAdapter("sql", "/models/adapters/sql"),))
    assert checked_adapters(manifest, disk, "l", "/models/llama3-405b", plan)[0].source == "/models/adapters/sql"
