"""What `--model` names (orchestrator.plan.model_ref): every precedence case of the one rule that
plan, rollout and model sync share, and hostile inputs. The repo-id shape is checked against
huggingface_hub's own validator (``huggingface_hub.utils.validate_repo_id``)."""

from __future__ import annotations

import os

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import CATALOG
from orchestrator.plan.model_ref import ModelRef, resolve_ref, spec_for_ref


def nothing_here(_: str) -> bool:
    return False


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_catalog_name_in_any_case_is_the_catalog_entry():
    assert resolve_ref("llama3-8b", nothing_here) == ModelRef("catalog", "llama3-8b", "llama3-8b")
    upper = resolve_ref("LLAMA3-8B", nothing_here)
    assert (upper.kind, upper.name, upper.store_name) == ("catalog", "llama3-8b", "LLAMA3-8B")  # the store folder as written
    assert spec_for_ref(upper) is CATALOG["llama3-8b"]


def test_a_catalog_name_that_is_also_a_folder_here_is_the_catalog_and_dot_slash_is_the_folder(here):
    (here / "llama3-8b").mkdir()
    assert resolve_ref("llama3-8b").kind == "catalog"
    folder = resolve_ref("./llama3-8b")
    assert (folder.kind, folder.name, folder.path) == ("path", "llama3-8b", here / "llama3-8b")


def test_a_folder_named_like_a_hub_id_wins_over_the_hub(here):
    assert resolve_ref("meta-llama/Llama-3.1-8B") == ModelRef("hub", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B")
    (here / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)
    ref = resolve_ref("meta-llama/Llama-3.1-8B")
    assert (ref.kind, ref.name, ref.path, ref.store_name) == ("path", "Llama-3.1-8B", here / "meta-llama" / "Llama-3.1-8B", None)


def test_a_bare_word_is_a_model_store_folder_even_when_a_folder_here_has_that_name(here):
    assert resolve_ref("my-llama", nothing_here) == ModelRef("store", "my-llama", "my-llama")
    (here / "my-llama").mkdir()
    assert resolve_ref("my-llama").kind == "store"
    with pytest.raises(ModelSpecError, match=r"unknown model 'my-llama'.*write \./my-llama") as err:
        spec_for_ref(resolve_ref("my-llama"))  # alone (no model_store) it is sized from nothing
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    "text",
    ["/models/llama", "./llama", "../llama", "~/llama", "llama.json", "config.json", ".", "..", ".hidden"],
)
def test_path_syntax_is_a_local_path_made_absolute(text):
    ref = resolve_ref(text, nothing_here)
    assert ref.kind == "path" and ref.store_name is None
    assert ref.path is not None and str(ref.path) == os.path.abspath(os.path.expanduser(text))


def test_dot_dot_is_the_parent_folder_and_never_a_repo_id(here):
    parent = resolve_ref("..")
    assert (parent.kind, parent.path, parent.name) == ("path", here.parent, here.parent.name)
    for text in ("org/../x", "org/..", "../name"):
        assert resolve_ref(text, nothing_here).kind == "path", text


# (text, huggingface_hub.utils.validate_repo_id accepts it as namespace/name): the validator's own
# docstring examples and its edges (-- and .., a leading or trailing - or ., .git, 96 characters).
HUB_SHAPES = [
    ("meta-llama/Llama-3.1-405B-Instruct-FP8", True),
    ("Qwen/Qwen3-235B-A22B", True),
    ("foo/Foo-BAR_foo.bar123", True),
    ("org/" + "a" * 96, True),
    ("org/" + "a" * 97, False),
    ("datasets/foo/bar", False),
    ("org/foo--bar", False),
    ("org/other..repo", False),
    ("org/foo.git", False),
    ("org/.repo", False),
    ("org/-repo", False),
    ("-org/repo", False),
    ("org/repo name", False),
]


@pytest.mark.parametrize(("text", "valid"), HUB_SHAPES)
def test_the_repo_id_shape_is_huggingface_hubs(text, valid):
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
        hub_accepts = True
    except HFValidationError:
        hub_accepts = False
    assert hub_accepts == valid  # the table above is what the Hub's validator says
    assert (resolve_ref(text, nothing_here).kind == "hub") == valid


@pytest.mark.parametrize("text", ["", " ", "\t", " llama3-8b", "llama3-8b ", "llama\n3", "a\x00b", "org/\x7fname"])
def test_empty_padded_or_control_characters_are_refused(text):
    with pytest.raises(ModelSpecError) as err:
        resolve_ref(text, nothing_here)
    assert err.value.exit_code == 2 and err.value.hint


@pytest.mark.parametrize("text", ["https://huggingface.co/meta-llama/Llama-3.1-8B", "hf://meta-llama/Llama-3.1-8B", "s3://bucket/models/x", "file:///models/x"])
def test_a_url_is_refused_with_the_repo_id_form_in_the_hint(text):
    with pytest.raises(ModelSpecError, match="a URL is not a model reference") as err:
        resolve_ref(text, nothing_here)
    assert "org/name" in (err.value.hint or "")


def test_a_path_that_only_contains_a_colon_slash_slash_is_still_a_path():
    assert resolve_ref("./a://b", nothing_here).kind == "path"


def test_the_spec_of_a_folder_and_of_its_config_json_are_the_same(tiny_model_dir):
    folder = spec_for_ref(resolve_ref(str(tiny_model_dir)))
    file = spec_for_ref(resolve_ref(str(tiny_model_dir / "config.json")))
    assert folder.name == file.name == tiny_model_dir.name
    assert (folder.layers, folder.hidden) == (file.layers, file.hidden) == (4, 256)
