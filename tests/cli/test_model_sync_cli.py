"""`orch model sync` and `orch rollout --sync-model` at the CLI boundary, on one local node
(`transport: local`): dry run, a real sync, the no-op re-run, and the usage errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator.cli import main


def local_manifest(tmp_path: Path, store: Path | None) -> Path:
    doc = {
        "name": "one",
        "accelerator": "cpu",
        "python": sys.executable,
        "nodes": [{"name": "local", "host": "127.0.0.1", "role": "head", "transport": "local"}],
    }
    if store is not None:
        doc["model_store"] = str(store)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def make_model(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    return root


def sha256sum(path: Path) -> str:
    return subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


def test_dry_run_then_sync_then_nothing_to_do(tmp_path, capsys):
    src = make_model(tmp_path / "src" / "tiny-cli")
    store = tmp_path / "store"
    cluster = local_manifest(tmp_path, store)
    assert main(["model", "sync", str(cluster), "--model", str(src), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "local: would receive 2 file(s), 1.0 MiB" in out and "model.safetensors" in out
    assert not store.exists() or not any(store.iterdir())  # nothing copied

    assert main(["model", "sync", str(cluster), "--model", str(src), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["action"] == "synced" and data["sent_bytes"] == 256 * 4096 + (src / "config.json").stat().st_size
    assert data["nodes"] == [{"node": "local", "action": "synced", "received_bytes": data["sent_bytes"],
                              "written_bytes": data["sent_bytes"], "seconds": data["nodes"][0]["seconds"],
                              "verified": True, "error": None}]  # fmt: skip
    for name in ("config.json", "model.safetensors"):
        assert sha256sum(store / "tiny-cli" / name) == sha256sum(src / name)

    assert main(["model", "sync", str(cluster), "--model", str(src)]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path, capsys):
    src = make_model(tmp_path / "src" / "m")
    no_store = local_manifest(tmp_path, None)
    assert main(["model", "sync", str(no_store), "--model", str(src)]) == 2
    assert "sets no model_store" in capsys.readouterr().err
    cluster = local_manifest(tmp_path, tmp_path / "store")
    assert main(["model", "sync", str(cluster), "--model", "m;rm"]) == 2
    assert "must be one folder name" in capsys.readouterr().err
    assert main(["model", "sync", str(cluster), "--model", "m", "--from", "nowhere"]) == 2
    assert "no such node" in capsys.readouterr().err
    assert main(["model", "sync", str(cluster), "--model", str(tmp_path / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_rollout_sync_model_needs_the_model_in_the_store(tmp_path, capsys):
    src = make_model(tmp_path / "elsewhere" / "m")
    cluster = local_manifest(tmp_path, tmp_path / "store")
    rc = main(["rollout", "--model", str(src), str(cluster), "--sync-model", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "--sync-model copies models to <model_store>/<name>" in err
