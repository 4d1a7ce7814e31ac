"""The cluster manifest as one value: ``Manifest`` (sections + cross-field rules). Pure."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, model_validator

from orchestrator.manifest.crossfield import cross_field_problems, format_path
from orchestrator.manifest.sections import (
    RULES_CHECKED,
    EnvMap,
    Executable,
    LocalPath,
    Name,
    NodeSpec,
    RaySettings,
    ServeSettings,
    Slo,
    SshDefaults,
    Targets,
    _Frozen,
    _none_is_empty,
)


class Manifest(_Frozen):
    name: Name
    accelerator: Literal["gpu", "cpu"] = "gpu"
    python: Executable = "python3"
    ssh: Annotated[SshDefaults, BeforeValidator(_none_is_empty)] = Field(default_factory=SshDefaults)
    nodes: list[NodeSpec] = Field(min_length=1)
    ray: Annotated[RaySettings, BeforeValidator(_none_is_empty)] = Field(default_factory=RaySettings)
    model_store: LocalPath | None = None
    serve: Annotated[ServeSettings, BeforeValidator(_none_is_empty)] = Field(default_factory=ServeSettings)
    env: EnvMap = Field(default_factory=dict)
    targets: Targets | None = None
    slo: Slo | None = None
    source_path: Path | None = Field(default=None, exclude=True)  # set by the loader only

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> Manifest:
        # The loader runs these rules itself (with file lines, on partially valid input) and
        # says so in the context; this guards manifests built in code or read back from JSON.
        if (info.context or {}).get(RULES_CHECKED):
            return self

        data = self.model_dump(mode="json", exclude={"source_path"})
        problems = cross_field_problems(data, dict(info.context or {}))
        if problems:
            raise ValueError("; ".join(f"{format_path(path)}: {message}" for path, message in problems))
        return self

    @property
    def objective(self) -> Targets | None:
        """The latency objective goodput and the SLO gate judge by: ``slo``, else ``targets``."""
        return self.slo if self.slo is not None else self.targets

    @property
    def head(self) -> NodeSpec:
        return next(node for node in self.nodes if node.role == "head")

    @property
    def workers(self) -> list[NodeSpec]:
        return [node for node in self.nodes if node.role == "worker"]

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def serve_url(self) -> str:
        """The public OpenAI endpoint: the head's address and Serve's HTTP port."""
        host = self.head.host
        if ":" in host:  # an IPv6 literal goes in brackets (RFC 3986 3.2.2); the manifest never holds them
            host = f"[{host}]"
        return f"http://{host}:{self.serve.http_port}"

    def fingerprint(self) -> str:
        """sha256 of the canonical content (defaults filled in, paths resolved, keys sorted):
        comments, key order and layout of the file do not change it; any value does."""
        payload = self.model_dump(mode="json", exclude={"source_path"})
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def summary(self) -> str:
        """One line: ``cluster 'x' - 2 nodes (1 head, 1 worker), 16 GPUs (H100-80GB), ray :6379``."""
        count = len(self.nodes)
        workers = len(self.workers)
        roles = "1 head" + (f", {workers} worker{'s' if workers != 1 else ''}" if workers else "")
        if self.accelerator == "gpu":
            types = sorted({node.gpu_type for node in self.nodes if node.gpu_type})
            gpus = f"{self.total_gpus} GPU{'s' if self.total_gpus != 1 else ''}"
            compute = gpus + (f" ({', '.join(types)})" if types else "")
        else:
            compute = "CPU only"
        return (
            f"cluster '{self.name}' - {count} node{'s' if count != 1 else ''} ({roles}), "
            f"{compute}, ray :{self.ray.port}"
        )



def validate_sections(data: dict[str, Any], context: dict[str, Any]) -> tuple[Manifest | None, ValidationError | None]:
    """Validate the whole mapping; the ValidationError (if any) is returned, not raised."""
    try:
        return Manifest.model_validate(data, context={**context, RULES_CHECKED: True}), None
    except ValidationError as exc:
        return None, exc
