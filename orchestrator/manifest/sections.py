"""The sections of the cluster manifest: field checks and the strict models of ssh, nodes, ray,
serve, targets and slo, plus the Ray port constants the rules need. Pure."""


from __future__ import annotations

import ipaddress
import os
import re
from decimal import Context, Decimal, Inexact, InvalidOperation, Overflow
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    model_validator,
)

from orchestrator.errors import UsageError
from orchestrator.manifest.adapters import manifest_adapters
from orchestrator.manifest.gpu_types import find_gpu_type, unknown_gpu_type

if TYPE_CHECKING:  # NodeSpec's helpers take the whole manifest; for annotations only
    from orchestrator.manifest.model import Manifest

# Ray's fixed ports and limits (ray 2.60: ray/_private/ray_constants.py, ray/scripts/scripts.py).
RAY_CLIENT_SERVER_PORT = 10001  # `ray start --head` default --ray-client-server-port
RAY_DASHBOARD_AGENT_PORT = 52365  # DEFAULT_DASHBOARD_AGENT_LISTEN_PORT, on every node
RAY_WORKER_PORTS = range(10002, 20000)  # --min-worker-port 10002 --max-worker-port 19999
RAY_MIN_OBJECT_STORE_BYTES = 75 * 1024 * 1024  # OBJECT_STORE_MINIMUM_MEMORY_BYTES
RAY_MAX_OBJECT_STORE_BYTES = 2**63 - 1  # the raylet reads it as an int64 (src/ray/raylet/main.cc)
# Ray puts unix sockets under TEMP/session_<26-char date>_<pid>/sockets/ (ray/_private/node.py) and
# refuses paths over 107 bytes (ray/_private/utils.py validate_socket_filepath). The longest is a
# dashboard module's, dash_<module> (ray/dashboard/subprocesses/utils.py get_socket_path):
# dash_TaskEventsHead, 19 bytes. With a 7-digit pid (Linux's pid_max up to 4194304):
# 107 - (1 + 42 + 9 + 19) = 36. A longer TEMP starts the raylet (plasma_store is shorter) and
# then the dashboard fails ("Module MetricsHead failed to start"): measured, docs/manifest.md.
RAY_TEMP_DIR_MAX_BYTES = 36
MAX_MANIFEST_BYTES = 1024 * 1024
RULES_CHECKED = "orch.manifest.rules_checked"  # validation context key set by the loader

HINT = (
    "the examples in cluster-templates/ explain every field (reference: docs/manifest.md); "
    "fix the file and re-check it with `orch validate FILE`"
)
# A manifest that is not there: pip users have no cluster-templates/ folder, so the way to one is
# the command that writes it.
MISSING_HINT = (
    "`orch init FILE` writes a commented starter manifest; `orch init FILE --hosts H1,H2 --user USER` "
    "fills it in by probing the hosts over SSH (reference: docs/manifest.md)"
)

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
_HOST_LABEL_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*")
_SIZE_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
# Exact decimal arithmetic for sizes: a result that would need rounding (more digits than any size has,
# or a fraction far below one byte) or an exponent beyond decimal's range raises instead.
_SIZE_MATH = Context(prec=60, traps=[InvalidOperation, Overflow, Inexact])


# ---- field checks (each raises ValueError with the sentence printed after the field path) ----


def _check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"'{value}' is not a valid name: use 1-63 letters, digits, '-', '_' or '.', "
            "starting with a letter or digit (it names files and Ray labels)"
        )
    return value


def _check_host(value: str) -> str:
    if "@" in value:
        raise ValueError(f"'{value}' is not a host name or address; put the user in 'user'")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    head, _, tail = value.rpartition(":")
    if head and tail.isdigit():
        raise ValueError(f"'{value}' is not a host name or address; put the SSH port in 'port'")
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    if len(value) > 253 or not all(_HOST_LABEL_RE.fullmatch(label) for label in labels):
        raise ValueError(f"'{value}' is not a valid host name or IP address")
    return value


def _check_user(value: str) -> str:
    if not _USER_RE.fullmatch(value):
        raise ValueError(f"'{value}' is not a valid user name")
    return value


def _check_interface(value: str) -> str:
    # Linux dev_valid_name(): not "." or "..", shorter than IFNAMSIZ (16), no '/', ':' or space.
    if "," in value:
        raise ValueError(
            f"'{value}' names several interfaces; give one (a list for NCCL alone goes in "
            "env NCCL_SOCKET_IFNAME)"
        )
    if len(value.encode()) > 15:
        raise ValueError(f"'{value}' is {len(value.encode())} bytes; Linux interface names have at most 15")
    if value in (".", "..") or not value.isascii() or not value.isprintable() or any(
        c in "/:" or c.isspace() for c in value
    ):
        raise ValueError(f"'{value}' is not a valid interface name (no '/', ':' or spaces; e.g. ib0, eth0, ens1f0)")
    return value


def _check_gpu_type(value: str) -> str:
    # the planner's table, the one rule (`orch plan --cluster` sizes with it)
    if find_gpu_type(value) is None:
        raise ValueError(unknown_gpu_type(value))
    return value


def _check_env_name(value: str) -> str:
    if not _ENV_NAME_RE.fullmatch(value):
        raise ValueError(
            f"'{value}' is not a valid environment variable name "
            "(letters, digits and '_', not starting with a digit)"
        )
    return value


def _env_value(value: Any) -> Any:
    # NCCL_IB_DISABLE: 0 is natural to write; a number becomes its text. A bare yes/no/true
    # would be ambiguous (True -> "True"? "1"?), so it must be quoted.
    if isinstance(value, bool):
        raise ValueError(f"must be a string; quote it (\"{str(value).lower()}\") so YAML does not read it as true/false")
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _check_executable(value: str) -> str:
    if any(c.isspace() for c in value):
        raise ValueError(f"'{value}' must be one interpreter (a name or a path, no spaces or arguments)")
    return value


def parse_size(value: Any) -> Any:
    """Bytes from an int or a string like ``8GiB``/``500MB``/``1.5 GB`` (B, KB..TB, KiB..TiB)."""
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)  # YAML reads 8.0e9 as a float
    if not isinstance(value, str):
        return value  # int, None, and wrong types are left to the type check
    match = _SIZE_RE.fullmatch(value)
    if not match:
        raise ValueError(f"'{value}' is not a size; write bytes (8589934592) or a number and a unit (8GiB, 500MB)")
    unit = match[2].lower() or "b"
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown unit '{match[2]}' in '{value}' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)")
    try:
        size = _SIZE_MATH.multiply(Decimal(match[1]), _SIZE_UNITS[unit])
    except (InvalidOperation, Overflow):  # an exponent beyond decimal's range: 1e99999999999999999999, 1e999999GiB
        raise ValueError(f"'{value}' is not a size") from None
    except Inexact:  # e.g. 1e-9999999 (it would round to 0)
        raise ValueError(f"'{value}' is not a whole number of bytes") from None
    if size != size.to_integral_value():
        raise ValueError(f"'{value}' is not a whole number of bytes")
    if size > RAY_MAX_OBJECT_STORE_BYTES:
        raise ValueError(f"'{value}' is more than {RAY_MAX_OBJECT_STORE_BYTES} bytes, the most Ray takes")
    return int(size)


def _check_object_store(value: int | None) -> int | None:
    if value is not None and value < RAY_MIN_OBJECT_STORE_BYTES:
        raise ValueError(f"{value} bytes is below Ray's minimum object store of 75 MiB ({RAY_MIN_OBJECT_STORE_BYTES})")
    if value is not None and value > RAY_MAX_OBJECT_STORE_BYTES:
        raise ValueError(f"{value} bytes is more than {RAY_MAX_OBJECT_STORE_BYTES}, the most Ray takes (a 64-bit integer)")
    return value


def _not_blank(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    return value


def _resolve(value: Path | str | None, info: ValidationInfo) -> Any:
    """``~`` expanded; a relative path joined to the manifest's folder (``context['base_dir']``)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    base = (info.context or {}).get("base_dir")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    resolved = os.path.normpath(path)
    return Path(resolved) if isinstance(value, Path) else resolved


def _resolve_executable(value: str, info: ValidationInfo) -> str:
    """A bare name (``python3``) is looked up on the node's PATH; anything with a '/' is a path,
    resolved like the other paths (so ``../.venv/bin/python`` works for a local cluster)."""
    return _resolve(value, info) if "/" in value or value.startswith("~") else value


def _check_temp_dir(value: str) -> str:
    if len(value.encode()) > RAY_TEMP_DIR_MAX_BYTES:
        raise ValueError(
            f"'{value}' is {len(value.encode())} bytes; Ray's unix sockets under it would pass the "
            f"107-byte AF_UNIX limit, keep it at most {RAY_TEMP_DIR_MAX_BYTES} (e.g. /tmp/ray)"
        )
    return value


def _none_is_empty(value: Any) -> Any:
    # `ray:` with every key commented out reads as null: treat it as "all defaults".
    return {} if value is None else value


Text = Annotated[str, Strict(), BeforeValidator(_not_blank)]
Name = Annotated[str, Strict(), AfterValidator(_check_name)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
Count = Annotated[int, Strict(), Field(ge=0)]
Seconds = Annotated[float, Strict(), Field(gt=0, le=600)]
Millis = Annotated[float, Strict(), Field(gt=0)]
LocalPath = Annotated[Path, BeforeValidator(_not_blank), AfterValidator(_resolve)]
Executable = Annotated[
    str, Strict(), BeforeValidator(_not_blank), AfterValidator(_check_executable), AfterValidator(_resolve_executable)
]
EnvMap = Annotated[
    dict[Annotated[str, AfterValidator(_check_env_name)], Annotated[str, Strict(), BeforeValidator(_env_value)]],
    BeforeValidator(_none_is_empty),
]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SshDefaults(_Frozen):
    """How orch reaches nodes over SSH; a node's own port/user override these."""

    user: Annotated[str, Strict(), AfterValidator(_check_user)] = "root"
    port: Port = 22
    identity_file: LocalPath | None = None
    known_hosts: LocalPath | None = None  # None: <state_dir>/known_hosts, decided by the caller
    connect_timeout: Seconds = 10.0


class NodeSpec(_Frozen):
    """One machine of the cluster, as the operator expects it to be (preflight checks it)."""

    name: Name
    host: Annotated[str, Strict(), BeforeValidator(_not_blank), AfterValidator(_check_host)]
    port: Port | None = None
    user: Annotated[str, Strict(), AfterValidator(_check_user)] | None = None
    role: Literal["head", "worker"] = "worker"
    gpus: Count = 0
    gpu_type: Annotated[str, Strict(), BeforeValidator(_not_blank), AfterValidator(_check_gpu_type)] | None = None
    interface: Annotated[str, Strict(), BeforeValidator(_not_blank), AfterValidator(_check_interface)] | None = None
    transport: Literal["ssh", "local"] = "ssh"
    python: Executable | None = None
    cpus: PositiveInt | None = None
    env: EnvMap = Field(default_factory=dict)

    def ssh_port(self, manifest: Manifest) -> int:
        return self.port if self.port is not None else manifest.ssh.port

    def ssh_user(self, manifest: Manifest) -> str:
        return self.user if self.user is not None else manifest.ssh.user

    def python_bin(self, manifest: Manifest) -> str:
        return self.python if self.python is not None else manifest.python

    def ray_cpus(self, manifest: Manifest) -> int | None:
        """Logical CPUs to give Ray on this node (None: let Ray count the cores)."""
        return self.cpus if self.cpus is not None else manifest.ray.num_cpus

    def merged_env(self, manifest: Manifest) -> dict[str, str]:
        """Cluster env overlaid with this node's env (the node wins)."""
        return {**manifest.env, **self.env}


class RaySettings(_Frozen):
    port: Port = 6379
    dashboard_port: Port = 8265
    temp_dir: Annotated[str, Strict(), BeforeValidator(_not_blank), AfterValidator(_resolve), AfterValidator(_check_temp_dir)] = "/tmp/ray"
    object_store_memory: Annotated[
        Annotated[int, Strict()] | None, BeforeValidator(parse_size), AfterValidator(_check_object_store)
    ] = None
    token_auth: Annotated[bool, Strict()] = True
    num_cpus: PositiveInt | None = None


# How Serve picks the LLMServer replica of each request (docs/rollout.md, "Request routing"):
# "default": HAProxy's own balancing over the replicas; "session_affinity": Ray Serve's
# ConsistentHashRouter on the request's x-session-id (orchestrator.serve.routing).
REQUEST_ROUTERS = ("default", "session_affinity")


def _refuse_prefix_affinity(value: Any) -> Any:
    # Offered once: Ray 2.60's PrefixCacheAffinityRouter never learns a prefix behind orch's
    # ingress (serve/routing.py says why), so a manifest that still names it is told so, not
    # merely "must be 'default' or 'session_affinity'".
    if value == "prefix_affinity":
        raise ValueError(
            "prefix_affinity is no longer offered: Ray Serve LLM's PrefixCacheAffinityRouter never learns a prefix "
            "behind orch's HAProxy ingress and sends every request to one replica; use session_affinity and send one "
            "x-session-id per shared prefix (docs/rollout.md, 'Request routing')"
        )
    return value


def _check_lora(value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    for served_name, adapters in value.items():
        try:
            manifest_adapters(served_name, adapters)
        except UsageError as exc:
            raise ValueError(f"{exc.message} ({exc.hint})" if exc.hint else exc.message) from exc
    return value


class ServeSettings(_Frozen):
    http_port: Port = 8000
    api_key_env: Annotated[str, Strict(), AfterValidator(_check_env_name)] = "ORCH_API_KEY"
    request_router: Annotated[Literal["default", "session_affinity"], BeforeValidator(_refuse_prefix_affinity)] = "default"
    # Serve's autoscaling, sized from the recorded per-replica goodput (`slo:`) and bounded by
    # the cluster's GPUs (serve/scaling.py); false: the plan's fixed replica count.
    autoscaling: Annotated[bool, Strict()] = False
    # Serve's max_ongoing_requests per engine replica; None: the engine's batch with headroom
    # (orchestrator.serve.in_flight). `orch rollout --max-ongoing-requests` wins over it.
    max_ongoing_requests: PositiveInt | None = None
    # LoRA adapters a model is served with unless `orch rollout --lora` gives its own: the base's
    # served name -> adapter name -> a folder on the nodes or s3://bucket/prefix (serve/lora.py).
    lora: Annotated[dict[str, dict[str, str]], AfterValidator(_check_lora)] = Field(default_factory=dict)


class Targets(_Frozen):
    ttft_p95_ms: Millis | None = None
    tpot_p95_ms: Millis | None = None
    max_error_rate: Annotated[float, Strict(), Field(ge=0, le=1)] = 0.01


class Slo(Targets):
    """The latency objective the model is served to: p95 TTFT and TPOT (at least one), the error
    budget, and optionally the request rate the whole deployment must sustain with them met."""

    target_rps: Annotated[float, Strict(), Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _needs_a_latency(self) -> Slo:
        if self.ttft_p95_ms is None and self.tpot_p95_ms is None:
            raise ValueError("set ttft_p95_ms or tpot_p95_ms (or both): an objective without a latency bound cannot be met or missed")
        return self
