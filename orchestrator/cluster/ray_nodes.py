"""Ray on the nodes: the argv and environment of `ray start`, the scoped stop of a cluster's
processes (the dashboard's JSON about nodes is parsed in ``node_state``). No I/O here
(``orchestrator.cluster.dashboard`` talks HTTP; ``orchestrator.workflows.cluster`` runs the argv through runners).

Naming a node inside Ray: every node gets the custom resource ``orch_node_<name>`` with amount
``NODE_RESOURCE_AMOUNT`` (1000). Placement can pin work to a node by asking for a fraction of
it (``{"orch_node_gpu-2": 0.001}``, see ``node_resource``), and orch maps a Ray node back to its
manifest name with it. ``/api/v0/nodes`` reports the name unchanged (the dashboard's
``/nodes?view=summary`` camel-cases it, so orch does not read that one).

Environment of the Ray processes (``ray_process_env``): the serving defaults of
``SERVE_ENV_DEFAULTS`` (measured in the stack notes: they more than double Serve LLM
throughput) and the node-death detection of ``NODE_DEATH_ENV_DEFAULTS``, then the NIC pinning (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``) and
``VLLM_HOST_IP``, then the manifest's cluster env and node env (which win), then token auth
(``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``) and ``ORCH_CLUSTER_ID=<cluster id>``, which
nothing overrides (the latter tags every process of the cluster so that stopping it kills only
those). With HAProxy on, its files live in a 0700 folder of the cluster's temp dir.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.manifest.model import Manifest
from orchestrator.manifest.sections import NodeSpec
from orchestrator.nodes.facts import NodeFacts
from orchestrator.remote.node_programs import python_argv

RAY_MODULE = "ray.scripts.scripts"  # `python -m ray.scripts.scripts` is the `ray` CLI of that python
NODE_RESOURCE_PREFIX = "orch_node_"
NODE_RESOURCE_AMOUNT = 1000
DASHBOARD_HOST = "127.0.0.1"

# Environment of `ray start` that Ray Serve (LLM) reads at startup. Measured (stack notes, tiny
# model, 16 streams): defaults 473-551 tok/s, with all three 1,498-1,855 tok/s. The rollout code
# may pass its own ``serve_env`` to ``ray_process_env``; the manifest's env overrides both.
SERVE_ENV_DEFAULTS: dict[str, str] = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1",
}

# Ray's GCS marks a node DEAD after health_check_failure_threshold failed health checks in a row;
# the next check starts health_check_period_ms after the last one answered or timed out
# (health_check_timeout_ms). Ray 2.60's values (``ray._raylet.Config``): 5, 3000, 10000. A killed
# raylet refuses at once: DEAD after 5 x 3 s = 15 s (measured), ~5 s with a 1 s period. A host
# that is gone (powered off, unplugged) answers nothing: every check waits its whole timeout,
# 5 x (10 + 1) = 55 s with Ray's timeout; with 3 s, 5 x (3 + 1) = 20 s, so `orch status` shows
# the node DEAD within 30 s (issue 46). The threshold stays Ray's: a live raylet must miss five
# checks in a row (20 s without answering a trivial RPC, and without a resource report, which
# Ray counts as a passed check) to be declared dead. docs/rollout.md, "Node loss while serving".
NODE_DEATH_ENV_DEFAULTS: dict[str, str] = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "3000"}
RAY_HEALTH_CHECK_DEFAULTS: dict[str, int] = {"period_ms": 3000, "timeout_ms": 10000, "failure_threshold": 5}


def silent_node_death_s(env: Mapping[str, str]) -> float:
    """The longest a node that answers nothing stays ALIVE in Ray with the health-check settings of
    ``env`` (the head's `ray start` environment; Ray 2.60's defaults for what it does not set):
    threshold x (timeout + period), plus one period for a check that passed just before."""
    value = {k: int(env.get(f"RAY_health_check_{k}", v)) for k, v in RAY_HEALTH_CHECK_DEFAULTS.items()}
    ms = value["failure_threshold"] * (value["timeout_ms"] + value["period_ms"]) + value["period_ms"]
    return ms / 1000

# HAProxy (RAY_SERVE_ENABLE_HA_PROXY) binds fixed ports on every node besides serve.http_port.
# They follow the manifest's http_port (offsets from Ray 2.60's defaults at 8000), so two clusters
# on one machine, or a moved http_port, do not collide; the manifest's env can still set them.
HAPROXY_PORT_OFFSETS: dict[str, int] = {
    "RAY_SERVE_HAPROXY_METRICS_PORT": 9101 - 8000,
    "RAY_SERVE_HAPROXY_STATS_PORT": 8404 - 8000,
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": 8500 - 8000,
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": 9500 - 8000,
}


def haproxy_ports(http_port: int) -> dict[str, str]:
    """HAProxy's side ports for a Serve HTTP port (the defaults for 8000)."""
    return {name: str(http_port + offset) for name, offset in HAPROXY_PORT_OFFSETS.items()}


# Ray 2.60 puts HAProxy's files under /tmp/haproxy-serve/<node_id>/ (directories 0755) with an
# admin socket of `mode 666 level admin` (hard-coded in haproxy_templates.py): any local user
# could disable servers or redirect traffic, and so capture clients' Bearer keys. orch moves every
# file Ray lets it move into HAPROXY_SUBDIR of the cluster's temp dir, which orch creates 0700
# (``private_dir_argv``) before `ray start`: the socket's own mode then no longer matters. Ray
# appends /<56-hex node id>/<name> to each path, and a unix socket path has at most 107 bytes: with
# a temp dir of RAY_TEMP_DIR_MAX_BYTES (43), "/hap" and the node id, 2 bytes are left for the
# socket's name, hence "a" (admin) and "m" (per-request metrics).
# What Ray offers no setting for: the stats page (`bind *:STATS_PORT`) and the Prometheus
# frontend (`bind :METRICS_PORT`) always listen on every address (docs/cluster.md; preflight
# reports HAPROXY_PORTS_PUBLIC and `orch status` warns).
HAPROXY_SUBDIR = "hap"


def haproxy_dir(temp_dir: str) -> str:
    return f"{temp_dir.rstrip('/')}/{HAPROXY_SUBDIR}"


def haproxy_paths(temp_dir: str) -> dict[str, str]:
    """Ray's HAProxy file settings pointing into the cluster's private ``haproxy_dir``."""
    d = haproxy_dir(temp_dir)
    return {
        "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{d}/a",
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{d}/m",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{d}/haproxy.cfg",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": d,
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{d}/server-state",
    }


def haproxy_enabled(env: Mapping[str, str]) -> bool:
    return env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"


def private_dir_argv(manifest: Manifest, node: NodeSpec, path: str) -> list[str]:
    """Make ``path`` a 0700 directory of the SSH user on the node (``remote/node_programs/private_dir.py``)."""
    return python_argv(node.python_bin(manifest), "private_dir", path)


# A worker started together with its head waits this long for the head's GCS to listen:
# Ray's connect loop in ray/_private/node.py (_init_gcs_client) retries once a second,
# 20 times by default, or RAY_gcs_server_port_wait_time_s times when that is set.
GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
WORKER_GCS_WAIT_S = 60

# Every process of an orch Ray node carries ORCH_CLUSTER_ID=<the cluster's id> in its environment:
# a random id made once per cluster by `orch up` and kept in orch's state (``StateStore.
# ensure_cluster_id``), never the cluster's name, which two clusters (say, from two control
# machines) may share. It is set on `ray start` and inherited by the raylet, the agents, Ray's
# workers, Serve replicas and the vLLM engine processes they spawn (also once orphaned; vLLM
# renames its processes, so their command line no longer says whose they are).
#
# The stop program (``remote/node_programs/stop_ray.py``) kills, among the invoking user's processes only: those tagged with the id, those
# whose command line gives a long option a value that is the cluster's Ray temp dir T or a path
# under ``T/`` (``--temp-dir T``, ``--temp_dir=T``, ``--session_dir=T/session_...``: whole
# values, never a mere prefix, so /tmp/orch does not match /tmp/orch-other), and their
# descendants. Never another user's processes, another cluster's Ray (same name or not) or
# someone else's vLLM, which `ray stop` (no filter) and `pkill -f vllm` would kill. A process it
# may not inspect or kill is reported (``denied``), and the node then counts as not stopped.
CLUSTER_ID_ENV = "ORCH_CLUSTER_ID"


def node_resource(name: str) -> str:
    """The custom Ray resource that names an orch node (``orch_node_<name>``)."""
    return f"{NODE_RESOURCE_PREFIX}{name}"


# A placement group derives resources such as orch_node_w1_group_0_<36 hex>: not node names.
_PG_DERIVED = re.compile(r"_group_(\d+_)?[0-9a-f]{32,}$")


def node_name_from_resources(resources: Mapping[str, float]) -> str | None:
    for key in resources:
        if key.startswith(NODE_RESOURCE_PREFIX) and not _PG_DERIVED.search(key):
            return key[len(NODE_RESOURCE_PREFIX) :]
    return None


def node_token_path(cluster: str, home: str) -> str:
    """Where the cluster's Ray token lives on a node: under the SSH user's home (``home`` as the
    node reports it), written 0600 with the runner's ``put_file`` (never through argv or env,
    which other users of the node could read in `ps`). Not under ``.orch/clusters/``, where orch's
    own state (default ``~/.orch``) keeps the token: on a ``transport: local`` node the two would be
    one file, and `orch down` would delete the state's copy."""
    return f"{home.rstrip('/')}/.orch/nodes/{cluster}/ray-token"


# `ray start --node-ip-address` replaces these with the machine's own address (the source address
# of its default route): ray/_private/services.py, resolve_ip_for_localhost. Given one of them,
# the address Ray reports for the node is known only once the node runs.
RAY_LOCALHOST_NAMES = ("localhost", "127.0.0.1", "::1")


def node_address(node: NodeSpec, facts: NodeFacts | None) -> str:
    """The address Ray binds on this node: the first global address (IPv4 first) of the
    manifest's ``interface`` as probed, else the node's ``host`` (the same rule as
    ``inventory.head_address``, so workers join the address preflight tested)."""
    if facts is not None and node.interface:
        nic = facts.nic(node.interface)
        if nic is not None:
            for addr in nic.global_addresses():
                return addr.address
    return node.host


@dataclass(frozen=True)
class CollectiveInterface:
    """The NIC that NCCL and Gloo use on a node (``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``),
    and where the choice came from: ``manifest`` (its ``interface``) or ``derived`` (the probed
    NIC carrying the node's address). ``name`` None: neither (``reason`` says why)."""

    name: str | None
    source: str  # "manifest" | "derived" | "none"
    address: str | None = None
    reason: str = ""

    def describe(self, node: str) -> str:
        if self.source == "manifest":
            return f"{node}: NCCL/Gloo interface {self.name} (the manifest's interface)"
        if self.source == "derived":
            return f"{node}: NCCL/Gloo interface {self.name} (carries the node's address {self.address}; the manifest names none)"
        return f"{node}: NCCL/Gloo interface left unset ({self.reason}); set `interface:` on the node"


def collective_interface(manifest: Manifest, node: NodeSpec, facts: NodeFacts | None) -> CollectiveInterface:
    """Which NIC the node's collectives use. Pure.

    The manifest's ``interface`` when set. Otherwise, on a multi-node cluster, the probed NIC
    (``ip -j addr``) that carries the node's address: left unset, Gloo and NCCL pick an address
    from the host name, which often resolves to loopback, and a tensor-parallel group across
    nodes dies with ``Gloo connectFullMesh failed ... remote=[127.0.0.1]`` (reproduced on the
    test bed, docs/rollout.md); on CPU clusters `orch up`'s Gloo check meets the same. A single
    node needs no choice (``source`` none)."""
    if node.interface:
        return CollectiveInterface(node.interface, "manifest", node_address(node, facts))
    if len(manifest.nodes) < 2:
        return CollectiveInterface(None, "none", reason="single node")
    if facts is None or not facts.nics:
        return CollectiveInterface(None, "none", reason="no interfaces were probed on the node")
    address = node.host.strip("[]")
    for nic in facts.nics:
        if nic.name == "lo":
            continue
        if any(a.address == address for a in nic.addresses):
            return CollectiveInterface(nic.name, "derived", address)
    return CollectiveInterface(None, "none", reason=f"no interface carries the node's address {node.host}")


def node_gpus(manifest: Manifest, node: NodeSpec, facts: NodeFacts | None) -> int:
    """GPUs Ray is told about: as probed when nvidia-smi answered, else the manifest's count."""
    if manifest.accelerator == "cpu":
        return 0
    if facts is not None and facts.nvidia_smi and facts.gpus:
        return len(facts.gpus)
    return node.gpus


def ray_argv(manifest: Manifest, node: NodeSpec, *args: str) -> list[str]:
    return [node.python_bin(manifest), "-m", RAY_MODULE, *args]


def _common_start_args(manifest: Manifest, node: NodeSpec, facts: NodeFacts | None) -> list[str]:
    args = [
        "--node-ip-address", node_address(node, facts),
        "--num-gpus", str(node_gpus(manifest, node, facts)),
        "--resources", json.dumps({node_resource(node.name): NODE_RESOURCE_AMOUNT}, separators=(",", ":")),
        "--temp-dir", manifest.ray.temp_dir,
        "--disable-usage-stats",
    ]  # fmt: skip
    cpus = node.ray_cpus(manifest)
    if cpus is not None:
        args += ["--num-cpus", str(cpus)]
    if manifest.ray.object_store_memory is not None:
        args += ["--object-store-memory", str(manifest.ray.object_store_memory)]
    return args


def head_start_argv(manifest: Manifest, node: NodeSpec, facts: NodeFacts | None) -> list[str]:
    """`ray start --head` bound to the node's address; dashboard on 127.0.0.1 only."""
    return ray_argv(
        manifest,
        node,
        "start", "--head",
        "--port", str(manifest.ray.port),
        "--include-dashboard", "true",
        "--dashboard-host", DASHBOARD_HOST,
        "--dashboard-port", str(manifest.ray.dashboard_port),
        *_common_start_args(manifest, node, facts),
    )  # fmt: skip


def worker_start_argv(manifest: Manifest, node: NodeSpec, facts: NodeFacts | None, head_address: str) -> list[str]:
    """`ray start --address HEAD:PORT` for a worker."""
    return ray_argv(
        manifest, node, "start", "--address", f"{head_address}:{manifest.ray.port}", *_common_start_args(manifest, node, facts)
    )


def stop_argv(manifest: Manifest, node: NodeSpec, cluster_id: str | None) -> list[str]:
    """Kill (SIGKILL) every process of this cluster's Ray node here, vLLM engines included: the
    invoking user's processes tagged ``ORCH_CLUSTER_ID=<cluster_id>`` or naming the cluster's temp
    dir, and their descendants (``remote/node_programs/stop_ray.py``). Without an id (orch's state lost) only the
    temp dir is matched. Prints JSON ``{"killed": n, "alive": [pids], "names": [...],
    "denied": {pid: why}}`` (see ``parse_stop``)."""
    return python_argv(node.python_bin(manifest), "stop_ray", cluster_id or "-", manifest.ray.temp_dir)


def parse_stop(text: str) -> dict[str, Any]:
    """The stop script's report; raises ValueError when it printed none."""
    for line in reversed(text.strip().splitlines()):
        if line.strip().startswith("{"):
            data = json.loads(line)
            return {
                "killed": int(data.get("killed", 0)),
                "alive": list(data.get("alive", [])),
                "names": list(data.get("names", [])),
                "denied": {int(k): str(v) for k, v in dict(data.get("denied", {})).items()},
            }
    raise ValueError("the stop script printed no report")


def network_env(manifest: Manifest, node: NodeSpec, facts: NodeFacts | None) -> dict[str, str]:
    """What every collective on ``node`` runs with: the NIC pinning (``NCCL_SOCKET_IFNAME``,
    ``GLOO_SOCKET_IFNAME``), ``VLLM_HOST_IP``, then the manifest's cluster env and node env (which
    win). Part of ``ray_process_env``; the collective check of `orch up`
    runs its job with exactly this, so it proves the network the vLLM workers will use."""
    env: dict[str, str] = {}
    nic = collective_interface(manifest, node, facts).name
    if nic:
        env["NCCL_SOCKET_IFNAME"] = nic
        env["GLOO_SOCKET_IFNAME"] = nic
    env["VLLM_HOST_IP"] = node_address(node, facts)
    env.update(manifest.env)
    env.update(node.env)
    return env


def ray_process_env(
    manifest: Manifest,
    node: NodeSpec,
    facts: NodeFacts | None,
    token_path: str | None = None,
    serve_env: Mapping[str, str] | None = None,
    cluster_id: str | None = None,
) -> dict[str, str]:
    """The environment `ray start` runs with on ``node``; see the module doc for the order.
    ``serve_env`` replaces ``SERVE_ENV_DEFAULTS`` when given; ``cluster_id`` (what `orch down`
    kills by) is set last, so nothing overrides it."""
    env: dict[str, str] = dict(SERVE_ENV_DEFAULTS if serve_env is None else serve_env)
    if haproxy_enabled(env):
        env.update(haproxy_ports(manifest.serve.http_port))
    env.update(NODE_DEATH_ENV_DEFAULTS)
    env.update(network_env(manifest, node, facts))
    if haproxy_enabled(env):  # HAProxy's files in the cluster's 0700 folder, unless the manifest says where
        for name, path in haproxy_paths(manifest.ray.temp_dir).items():
            env.setdefault(name, path)
    if cluster_id is not None:
        env[CLUSTER_ID_ENV] = cluster_id
    if manifest.ray.token_auth:
        if not token_path:
            raise ValueError("token auth is on: ray_process_env needs the node's token_path")
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = token_path
    return env
