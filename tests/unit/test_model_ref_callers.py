"""Rollout (where the nodes load from) and model sync (what is copied) read `--model` by the one
rule of orchestrator.plan.model_ref: the same text names the same thing in both."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.model_ref import ModelRef
from orchestrator.serve.location import locate
from orchestrator.workflows.model_sync import SyncOptions, resolve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpu():
    return load_manifest_file(REPO / "cluster-templates" / "2x8-h100-405b.yaml")  # model_store: /mnt/shared/models


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_catalog_name_is_the_store_folder_for_rollout_and_sync_even_with_a_folder_here(gpu, here):
    (here / "llama3-8b").mkdir()
    where = locate(gpu, "llama3-8b")
    assert (where.served_name, where.node_path, where.planner_ref) == ("llama3-8b", "/mnt/shared/models/llama3-8b", ModelRef("catalog", "llama3-8b", "llama3-8b"))
    paths, src = resolve(gpu, SyncOptions(model="llama3-8b"))
    assert (paths.final, src) == ("/mnt/shared/models/llama3-8b", "/mnt/shared/models/llama3-8b")


def test_a_bare_word_is_the_store_folder_for_both(gpu, here):
    (here / "my-llama").mkdir()  # a folder here does not make a bare word a path
    assert (locate(gpu, "my-llama").served_name, locate(gpu, "my-llama").node_path) == ("my-llama", "/mnt/shared/models/my-llama")
    assert resolve(gpu, SyncOptions(model="my-llama"))[1] == "/mnt/shared/models/my-llama"


def test_a_folder_here_named_like_a_repo_id_is_that_folder_for_both(gpu, here):
    (here / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)
    where = locate(gpu, "meta-llama/Llama-3.1-8B")
    assert (where.served_name, where.node_path) == ("Llama-3.1-8B", str(here / "meta-llama" / "Llama-3.1-8B"))
    paths, src = resolve(gpu, SyncOptions(model="meta-llama/Llama-3.1-8B"))
    assert (paths.final, src) == ("/mnt/shared/models/Llama-3.1-8B", str(here / "meta-llama" / "Llama-3.1-8B"))


def test_a_repo_id_is_loaded_by_the_nodes_but_sync_refuses_it(gpu, here):
    assert locate(gpu, "meta-llama/Llama-3.1-8B").node_path == "/mnt/shared/models/Llama-3.1-8B"
    with pytest.raises(UsageError, match="names a Hugging Face repo, not a folder") as err:
        resolve(gpu, SyncOptions(model="meta-llama/Llama-3.1-8B"))
    assert "./meta-llama/Llama-3.1-8B" in (err.value.hint or "")


def test_from_a_node_a_path_is_taken_as_written_there(gpu, here):
    node = gpu.nodes[0].name
    paths, src = resolve(gpu, SyncOptions(model="/data/../data/models/x", source=node))
    assert (paths.name, src) == ("x", "/data/models/x")


def test_dot_dot_syncs_the_parent_folder_under_its_name(gpu, here):
    (here / "sub").mkdir()
    paths, src = resolve(gpu, SyncOptions(model="./sub/.."))
    assert (paths.name, src) == (here.name, str(here))
