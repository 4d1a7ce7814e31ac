"""The starter manifest `orch init` writes: commented cluster.yaml text, from what the probes found
on each host (``NodeFacts``) or, without hosts, from placeholders to edit. Pure.

What a probe fills in, per node: ``gpus`` (how many GPUs nvidia-smi lists), ``gpu_type`` (the
catalog type of the name nvidia-smi prints, ``plan/gpu_names.py``; left out with a comment when
orch does not know the card), ``interface`` (the NIC that carries the address orch reached the
node at, from ``ip -j addr``) and ``env.NCCL_IB_HCA`` (the node's active InfiniBand/RoCE ports,
``device:port`` as NCCL reads them). The accelerator is ``gpu`` when every host answered
nvidia-smi with at least one GPU, ``cpu`` when none did; a mix is refused (one manifest is one
kind). The text is checked by loading it (``manifest/load.py``) before anything is written.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from orchestrator.errors import UsageError
from orchestrator.nodes.facts import NodeFacts
from orchestrator.plan.gpu_names import type_of_smi_name

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True)
class StarterSettings:
    """What the user said on the command line (everything else keeps orch's defaults)."""

    name: str = "my-cluster"
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    python: str | None = None
    temp_dir: str | None = None
    hosts: tuple[str, ...] = ()
    command: str = "orch init"  # how the file says it was made


@dataclass(frozen=True)
class StarterNode:
    """One node as the starter writes it; ``notes`` become comments above it."""

    name: str
    host: str
    role: str
    gpus: int
    gpu_type: str | None = None
    interface: str | None = None
    ib_hca: str | None = None
    notes: tuple[str, ...] = ()
    comments: Mapping[str, str] = field(default_factory=dict)  # field -> comment at its end


def node_names(hosts: Sequence[str]) -> list[str]:
    """A name per host: its first label when it is a host name (``gpu-a.example.com`` -> ``gpu-a``),
    ``node<i>`` for an address; made unique."""
    out: list[str] = []
    for i, host in enumerate(hosts):
        try:
            ipaddress.ip_address(host)
            name = f"node{i}"
        except ValueError:
            label = host.split(".")[0]
            name = label if _NAME.fullmatch(label) else f"node{i}"
        while name in out:
            name = f"{name}-{i}"
        out.append(name)
    return out


def interface_carrying(facts: NodeFacts, address: str | None) -> str | None:
    """The NIC that holds ``address`` (the one orch reached the node at)."""
    if not address:
        return None
    for nic in facts.nics:
        if any(a.address == address for a in nic.addresses):
            return nic.name
    return None


def ib_hca(facts: NodeFacts) -> str | None:
    """NCCL_IB_HCA for the node's active InfiniBand/RoCE ports, e.g. ``mlx5_0:1,mlx5_1:1``."""
    active = [f"{p.device}:{p.port}" for p in facts.ib_devices if p.active]
    return ",".join(active) or None


def starter_node(name: str, host: str, role: str, facts: NodeFacts, address: str | None) -> StarterNode:
    """What one host's probes say about it, as a manifest node."""
    notes: list[str] = []
    comments: dict[str, str] = {}
    gpus = [g for g in facts.gpus]
    gpu_type = None
    if gpus:
        names = sorted({g.name for g in gpus})
        comments["gpus"] = f"nvidia-smi lists {len(gpus)} x {', '.join(names)}"
        types = {type_of_smi_name(n) for n in names}
        if len(types) == 1 and None not in types:
            gpu_type = types.pop()
            comments["gpu_type"] = "the catalog type of that name (orch plan sizes with it)"
        else:
            notes.append(f"gpu_type left out: orch has no type for {', '.join(names)} (known: docs/manifest.md)")
    elif facts.nvidia_smi is False:
        notes.append(f"no GPU: nvidia-smi did not run ({facts.errors.get('gpus', 'not installed')})")
    interface = interface_carrying(facts, address)
    if interface:
        comments["interface"] = f"carries {address}: NCCL, Gloo and Ray's address use it"
    else:
        candidates = ", ".join(n.name for n in facts.nics if n.kind != "loopback" and n.global_addresses()) or "none"
        notes.append(f"interface left out: no NIC holds {address or host} (NICs with an address: {candidates}); "
                     "set the one the nodes reach each other on")  # fmt: skip
    hca = ib_hca(facts)
    if hca:
        comments["NCCL_IB_HCA"] = "the active InfiniBand/RoCE ports (/sys/class/infiniband)"
    elif facts.ib_devices:
        notes.append("InfiniBand devices found, none active: " + ", ".join(f"{p.device}:{p.port} {p.state}" for p in facts.ib_devices))
    return StarterNode(name, host, role, len(gpus), gpu_type, interface, hca, tuple(notes), comments)


def accelerator_of(nodes: Sequence[StarterNode]) -> str:
    with_gpus = [n.name for n in nodes if n.gpus > 0]
    if not with_gpus:
        return "cpu"
    without = [n.name for n in nodes if n.gpus == 0]
    if without:
        raise UsageError(
            f"{', '.join(with_gpus)} have GPUs and {', '.join(without)} have none: one cluster is all GPU or all CPU",
            hint="list only the GPU hosts in --hosts (or only the CPU ones)",
        )
    return "gpu"


def placeholder_nodes() -> list[StarterNode]:
    """Without --hosts: one head to edit (a valid manifest as written)."""
    return [StarterNode("gpu0", "10.0.0.10", "head", 8, "H100-80GB", None, None,
                        ("edit: host, gpus and gpu_type (`orch init --hosts HOST,... --user USER` fills them by probing)",),
                        {"host": "what orch SSHes to and what Ray advertises", "gpus": "expected GPUs: preflight compares",
                         "gpu_type": "expected model: preflight compares, orch plan sizes with it"})]  # fmt: skip


def _v(value: object) -> str:
    """One YAML scalar as it must be written (quoted where YAML would read it otherwise)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def _line(indent: str, key: str, value: object, comment: str | None = None) -> str:
    text = f"{indent}{key}: {_v(value)}"
    return f"{text:<34} # {comment}" if comment else text


def render_starter(settings: StarterSettings, nodes: Sequence[StarterNode], accelerator: str, when: str) -> str:
    """The commented manifest text."""
    probed = bool(settings.hosts)
    out = ["# cluster.yaml for orch, written by `" + settings.command + "` on " + when + "."]
    if probed:
        out += ["# Filled in from what each host reported over SSH (nvidia-smi, ip -j addr, /sys/class/infiniband);",
                "# read it, then:"]  # fmt: skip
    else:
        out += ["# A starting point: edit the values marked below, then:"]
    out += [
        "#   orch validate FILE            # checks every field, names the line of a mistake",
        "#   orch up FILE                  # preflight over SSH, then Ray on every node",
        "# Every field: docs/manifest.md; the examples in cluster-templates/ explain each one.",
        "",
        "# name: the cluster's name in orch's state and in `orch status`.",
        _line("", "name", settings.name),
        "",
        "# accelerator: gpu (every node declares its GPUs) or cpu." + (" Chosen from nvidia-smi on the hosts." if probed else ""),
        _line("", "accelerator", accelerator),
        "",
        "# python: the interpreter with ray[llm]==2.60.0 (and its vLLM) on EVERY node, the same path and",
        "# versions everywhere (preflight fails VERSION_MISMATCH otherwise); a bare name is looked up on PATH.",
        _line("", "python", settings.python or "python3"),
        "",
        "# ssh: how orch reaches the nodes (a node's own user/port override these).",
        "ssh:",
        _line("  ", "user", settings.user or "root", None if settings.user else "default root"),
    ]
    if settings.port is not None:
        out.append(_line("  ", "port", settings.port))
    else:
        out.append("  # port: 22")
    out.append(_line("  ", "identity_file", settings.identity_file) if settings.identity_file
               else "  # identity_file: ~/.ssh/id_ed25519   # default: ssh-agent and ~/.ssh keys")  # fmt: skip
    out.append(_line("  ", "known_hosts", settings.known_hosts) if settings.known_hosts
               else "  # known_hosts: default <state dir>/known_hosts (a new host needs `orch up --accept-new-host-keys` once)")  # fmt: skip
    out += ["  connect_timeout: 10                # seconds", "", "nodes:"]
    for i, n in enumerate(nodes):
        for note in n.notes:
            out.append(f"  # {n.name}: {note}")
        out.append(_line("  - ", "name", n.name))
        out.append(_line("    ", "host", n.host, n.comments.get("host")))
        out.append(_line("    ", "role", n.role, "the one head: Ray GCS, dashboard, Serve controller" if n.role == "head" and i == 0 else None))
        if accelerator == "gpu":
            out.append(_line("    ", "gpus", n.gpus, n.comments.get("gpus")))
            if n.gpu_type:
                out.append(_line("    ", "gpu_type", n.gpu_type, n.comments.get("gpu_type")))
        if n.interface:
            out.append(_line("    ", "interface", n.interface, n.comments.get("interface")))
        elif not probed:
            out.append("    # interface: eth0                # the NIC the nodes reach each other on (multi-node: set it)")
        if n.ib_hca:
            out += ["    env:", _line("      ", "NCCL_IB_HCA", n.ib_hca, n.comments.get("NCCL_IB_HCA"))]
    out += [
        "",
        "ray:",
        "  # port: 6379                     # GCS port on the head; every worker must reach it",
        "  # dashboard_port: 8265           # bound to 127.0.0.1, reached through an SSH tunnel",
        _line("  ", "temp_dir", settings.temp_dir, "Ray's sessions, logs and sockets (at most 36 bytes)") if settings.temp_dir
        else "  # temp_dir: /tmp/ray            # Ray's sessions, logs and sockets (at most 36 bytes)",
        "  # object_store_memory: 64GiB     # default: 30% of RAM, capped by /dev/shm",
        "  token_auth: true                 # RAY_AUTH_MODE=token: no anonymous access to the cluster",
        "",
        "# model_store: the weights folder, the same path on every node (`orch model sync` copies there).",
        "# model_store: /data/models",
        "",
        "serve:",
        "  http_port: 8000                  # the OpenAI-compatible endpoint",
        "  api_key_env: ORCH_API_KEY        # the variable that holds the endpoint's API key",
        "",
        "# targets: what `orch accept` holds the deployment to (p95 over the acceptance run).",
        "# targets:",
        "#   ttft_p95_ms: 800",
        "#   tpot_p95_ms: 60",
        "",
    ]  # fmt: skip
    return "\n".join(out)
