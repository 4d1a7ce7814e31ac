"""orch's own files on a node, under the SSH user's home (``~/.orch/nodes/<cluster>/``): the Ray
token, the Serve LLM hook module and the LoRA adapters its callback downloads. Written by `orch up` (and the module by every rollout),
removed by `orch down`. ``home``: the node user's home, read once per node by the caller
(``node_home``) for every file it touches there."""

from __future__ import annotations

from orchestrator.cluster.ray_nodes import node_token_path
from orchestrator.errors import CommandFailedError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.serve import node_hooks


def node_home(runner: Runner) -> str:
    """The node user's home, as the node reports it (an absolute path, or an error naming the node)."""
    home = runner.run(["printenv", "HOME"], timeout=30).check(runner.node).stdout.strip()
    if not home.startswith("/"):
        raise CommandFailedError(f"{runner.node}: HOME is not an absolute path ({home!r})", node=runner.node)
    return home


def install_serve_hooks(runner: Runner, manifest: Manifest, home: str) -> str:
    """Write orch's Serve LLM callback module (``serve.node_hooks``) under the node user's home,
    where the rendered application's PYTHONPATH finds it; return its path there. Idempotent (an
    atomic rewrite of the same text)."""
    path = node_hooks.hooks_path(manifest.name, home)
    runner.put_file(path, node_hooks.source().encode(), 0o644)
    return path


def remove_serve_hooks(runner: Runner, manifest: Manifest, home: str) -> None:
    """Delete the module, the adapters downloaded from S3 and their folders (`orch down`): only
    orch's own files, never the module folder's other contents."""
    folder = node_hooks.hooks_dir(manifest.name, home)
    runner.run(["rm", "-f", "--", f"{folder}/{node_hooks.MODULE}.py"], timeout=30).check(runner.node)
    # The adapters folder is written only by orch's callback (copies of S3 objects, lock files).
    runner.run(["rm", "-rf", "--", node_hooks.adapters_dir(manifest.name, home)], timeout=60).check(runner.node)
    # Not checked: nodes sharing a home race for it; an empty folder left behind is harmless.
    runner.run(["rm", "-rf", "--", f"{folder}/__pycache__"], timeout=30)
    runner.run(["rmdir", "--ignore-fail-on-non-empty", "--", folder, folder.rsplit("/", 1)[0]], timeout=30)


def install_token(runner: Runner, manifest: Manifest, token: str, home: str) -> str:
    """Write the token 0600 under the node user's home; return its absolute path there."""
    path = node_token_path(manifest.name, home)
    folder = path.rsplit("/", 1)[0]
    runner.run(["mkdir", "-p", "-m", "700", "--", folder], timeout=30).check(runner.node)
    runner.put_file(path, (token + "\n").encode(), 0o600)
    return path


def remove_token(runner: Runner, manifest: Manifest, home: str, keep: str | None = None) -> None:
    """Delete the node's copy of the token (a stopped cluster leaves no secret behind) and its
    folder when nothing else is in it. ``keep``: a path never deleted (orch's own state copy,
    should a ``transport: local`` node's path ever be the same file)."""
    path = node_token_path(manifest.name, home)
    if keep is not None and path == keep:
        return
    runner.run(["rm", "-f", "--", path], timeout=30).check(runner.node)
    # Not checked: nodes sharing a home (NFS) race for the same folder, and a folder left
    # behind holds nothing secret.
    runner.run(["rmdir", "--ignore-fail-on-non-empty", "--", path.rsplit("/", 1)[0]], timeout=30)
