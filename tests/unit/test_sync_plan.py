"""The pure sync plan: what each node receives, links or keeps, the chain, the disk refusal.

The digests are sha256 of real byte strings as `sha256sum` prints them (tests/data/sync/SOURCES.md):
the scenarios are the issue's starting states (missing, corrupted shard, older copy)."""

from __future__ import annotations

import pytest

from orchestrator.sync.plan import (
    FileEntry,
    FolderPrint,
    ModelPaths,
    NodeHolding,
    after,
    check_model_name,
    folder_print,
    next_hops,
    plan_sync,
)

# `printf '' | sha256sum`, `printf 'a' | sha256sum`, `printf 'b' | sha256sum`, `printf 'c' | sha256sum`
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
A = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
B = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
C = "2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6"

MIB = 1 << 20
CONFIG = FileEntry("config.json", 1_000, A)
SHARD1 = FileEntry("model-00001-of-00002.safetensors", 40 * MIB, B)
SHARD2 = FileEntry("model-00002-of-00002.safetensors", 30 * MIB, C)
TARGET = (CONFIG, SHARD1, SHARD2)
STORE = "/models"
GIB = 1 << 30


def folder(path: str, *files: FileEntry) -> FolderPrint:
    return FolderPrint(path, True, "folder", tuple(sorted(files)))


def absent(path: str) -> FolderPrint:
    return FolderPrint(path, False)


def holding(node: str, final: FolderPrint, staging: FolderPrint | None = None, free: int = 100 * GIB, **kw) -> NodeHolding:
    staging = staging or absent("/models/.m.orch-sync")
    return NodeHolding(node, final, staging, free, staging_owned=kw.pop("staging_owned", staging.exists), **kw)


def test_mixed_starting_states():
    corrupted = FileEntry(SHARD2.rel, SHARD2.size, EMPTY)  # same size, other bytes
    older_config = FileEntry("config.json", 900, EMPTY)
    extra = FileEntry("pytorch_model.bin", 5 * MIB, A)
    plan = plan_sync(
        TARGET,
        [
            holding("n0", folder("/models/m", *TARGET)),
            holding("missing", absent("/models/m")),
            holding("corrupt", folder("/models/m", CONFIG, SHARD1, corrupted)),
            holding("older", folder("/models/m", older_config, SHARD1, SHARD2, extra)),
        ],
        STORE,
    )
    assert plan.problems == ()
    n0, missing, corrupt, older = plan.nodes
    assert n0.up_to_date and not n0.receive
    assert missing.receive == TARGET and missing.link == ()
    assert corrupt.receive == (SHARD2,) and set(corrupt.link) == {CONFIG, SHARD1}
    assert older.receive == (CONFIG,) and set(older.link) == {SHARD1, SHARD2}
    assert older.remove == ("pytorch_model.bin",)
    # the node that needs the most bytes heads the chain; the up-to-date one is not in it
    assert plan.chain == ("missing", "corrupt", "older")
    to = {f.entry.rel: f.to for f in plan.frames}
    assert to == {"config.json": ("missing", "older"), SHARD1.rel: ("missing",), SHARD2.rel: ("missing", "corrupt")}
    # the source sends each needed file once, whatever the number of nodes
    assert plan.stream_bytes == CONFIG.size + SHARD1.size + SHARD2.size


def test_interrupted_sync_keeps_verified_staging_files():
    staging = folder("/models/.m.orch-sync", SHARD1, FileEntry(SHARD2.rel, 3 * MIB, EMPTY))
    plan = plan_sync(TARGET, [holding("n1", absent("/models/m"), staging)], STORE)
    (n1,) = plan.nodes
    assert n1.keep == (SHARD1,)
    assert n1.receive == (CONFIG, SHARD2)  # the half-received shard is sent again
    assert plan.stream_bytes == CONFIG.size + SHARD2.size


def test_low_disk_refused_before_sending():
    plan = plan_sync(TARGET, [holding("big", absent("/models/m")), holding("small", absent("/models/m"), free=10 * MIB)], STORE)
    assert len(plan.problems) == 1
    assert plan.problems[0].startswith("small: needs ")
    assert "has 10.0 MiB" in plan.problems[0]


def test_disk_counts_only_bytes_to_receive():
    # the final folder already holds both shards: only config.json must fit
    plan = plan_sync(TARGET, [holding("n", folder("/models/m", SHARD1, SHARD2), free=2 * MIB)], STORE)
    assert plan.problems == ()
    assert plan.nodes[0].receive == (CONFIG,)


def test_paths_orch_does_not_own_are_refused():
    plan = plan_sync(
        TARGET,
        [
            holding("link", folder("/models/m", CONFIG), final_is_link=True),
            holding("foreign", absent("/models/m"), folder("/models/.m.orch-sync", CONFIG), staging_owned=False),
            holding("file", FolderPrint("/models/m", True, "file", (CONFIG,))),
        ],
        STORE,
    )
    assert [p.split(":")[0] for p in plan.problems] == ["link", "foreign", "file"]
    assert plan.chain == ()


def test_names_that_would_leave_the_store():
    for bad in ("../etc", ".hidden", "a/b", "", "-rf", ".."):
        assert check_model_name(bad) is not None, bad
    for good in ("Llama-3.1-8B-Instruct", "tiny", "qwen3_32b@rev2"):
        assert check_model_name(good) is None, good


def test_paths_are_siblings_inside_the_store():
    p = ModelPaths("/models", "llama")
    assert (p.final, p.staging, p.old) == ("/models/llama", "/models/.llama.orch-sync", "/models/.llama.orch-old")


def test_chain_wiring():
    chain = ("a", "b", "c")
    assert next_hops(chain) == {"a": "b", "b": "c", "c": None}
    assert after(chain, "a") == ("b", "c")
    assert after(chain, "c") == ()
    assert after(chain, "x") == ()


def test_folder_print_from_agent_json():
    d = {"path": "/m", "exists": True, "index_kind": "file-list", "files": [["b", 1, B], ["a", 1, A]], "content_sha256": "x"}
    fp = folder_print(d)
    assert fp.kind == "folder" and [f.rel for f in fp.files] == ["a", "b"] and fp.total_bytes == 2
    assert folder_print({"path": "/m", "exists": False}).files == ()
    with pytest.raises(KeyError):
        folder_print({"exists": True})
