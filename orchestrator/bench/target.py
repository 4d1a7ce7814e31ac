"""Where ``orch bench`` sends load and reads metrics on a cluster: the Serve endpoint of the
manifest's head, the served model name (``/v1/models``), and Ray's per-node metrics export
addresses from the head's Prometheus service-discovery file. ``parse_discovery`` is
pure; the rest does I/O (httpx, a runner).
"""

from __future__ import annotations

import json
import os

import httpx

from orchestrator.errors import ServeError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner

# Ray writes this file (prometheus file_sd format) in its temp dir on the head; it lists every
# alive node's metrics export address (ray/_private/metrics_agent.py, PrometheusServiceDiscoveryWriter).
DISCOVERY_FILE = "prom_metrics_service_discovery.json"



def api_key_from_env(var: str | None) -> str | None:
    if not var:
        return None
    value = os.environ.get(var)
    return value or None


def parse_discovery(text: str) -> list[str]:
    """Metrics URLs from Ray's service-discovery JSON: [{"labels":..., "targets": ["ip:port", ...]}]."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    urls: list[str] = []
    for group in data if isinstance(data, list) else []:
        for target in group.get("targets", []) if isinstance(group, dict) else []:
            if isinstance(target, str) and target and not target.endswith(":None"):
                url = f"http://{target}/metrics"
                if url not in urls:
                    urls.append(url)
    return urls


def discover_metrics_urls(head: Runner, manifest: Manifest, timeout: float = 15.0) -> list[str]:
    """Read the head's service-discovery file through its runner; [] when Ray has not written it."""
    path = f"{manifest.ray.temp_dir.rstrip('/')}/{DISCOVERY_FILE}"
    result = head.run(["cat", path], timeout=timeout)
    return parse_discovery(result.stdout) if result.ok else []


def served_models(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> list[str]:
    """The model ids an OpenAI-compatible endpoint serves."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{base_url.rstrip('/')}/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ServeError(
            f"cannot reach {base_url}/v1/models: {type(exc).__name__}",
            hint="check the URL, or that the Serve application is RUNNING (orch status)",
        ) from exc
    if resp.status_code == 401:
        raise UsageError(
            f"{base_url} refused the API key (HTTP 401)",
            hint="export the key in the variable named by serve.api_key_env, or pass --api-key-env",
        )
    if resp.status_code >= 400:
        raise ServeError(f"{base_url}/v1/models answered HTTP {resp.status_code}")
    return [m.get("id") for m in resp.json().get("data", []) if isinstance(m, dict) and m.get("id")]
