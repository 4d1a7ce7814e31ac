"""The public endpoint as orch checks it: a real completion (the readiness probe), the 401 check,
and Serve's route table. Does I/O (HTTP with httpx).

A revision is ready only when a streamed completion through the public endpoint returns tokens
with the API key: ``/v1/models`` answers before the engine can generate, so it proves nothing.
The probe reuses ``orchestrator.bench.loadgen.send_request`` (the same client ``orch bench`` measures
with), so the first-token time it reports is measured the same way.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from orchestrator.bench.loadgen import Prompt, RequestSpec, make_client, send_request

PROBE_PROMPT = "Hello! How can I help you today?"
PROBE_TOKENS = 8


@dataclass(frozen=True)
class ProbeResult:
    """A real completion sent to the public endpoint: whether tokens came back, and how fast.
    The one result type of the readiness probe (rollout's gate, ``orch status``, ``orch accept``)."""

    ok: bool
    latency_s: float | None = None  # the whole answer
    status_code: int | None = None  # HTTP status; None when nothing answered
    error: str | None = None
    url: str | None = None
    model: str | None = None
    output_tokens: int | None = None
    timed_out: bool = False  # connected, but no answer within the probe's timeout
    first_token_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "timed_out": self.timed_out,
            "latency_ms": _ms(self.latency_s),
            "first_token_ms": _ms(self.first_token_s),
            "status_code": self.status_code,
            "error": self.error,
            "url": self.url,
            "model": self.model,
            "output_tokens": self.output_tokens,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def route_url(base_url: str, route_prefix: str) -> str:
    """``http://head:8000`` + ``/_orch/r3`` -> ``http://head:8000/_orch/r3`` (no trailing slash)."""
    return base_url.rstrip("/") + ("" if route_prefix in ("", "/") else "/" + route_prefix.strip("/"))


def probe_completion(base_url: str, route_prefix: str, model: str, api_key: str | None, timeout_s: float = 120.0) -> ProbeResult:
    """One streamed completion of a few tokens through ``base_url`` + ``route_prefix``. A timeout
    after connecting (not a connect timeout) is ``timed_out``: the engine is stuck or overloaded."""
    url = route_url(base_url, route_prefix)
    spec = RequestSpec(base_url=url, model=model, output_tokens=PROBE_TOKENS, api_key=api_key, timeout_s=timeout_s, token_ids=False)

    async def once():
        async with make_client(spec, 1) as client:
            return await send_request(client, spec, Prompt(PROBE_PROMPT), time.monotonic)

    rec = asyncio.run(once())
    if not rec.ok:
        timed_out = rec.error_kind == "timeout" and rec.error != "ConnectTimeout"
        return ProbeResult(False, rec.end, rec.status, f"{rec.error_kind}: {rec.error}", url, model, timed_out=timed_out)
    first = rec.token_times[0] if rec.token_times else None
    return ProbeResult(True, rec.end, 200, None, url, model, rec.output_tokens or 0, first_token_s=first)


def unauthenticated_status(base_url: str, route_prefix: str, model: str, timeout_s: float = 30.0) -> int | None:
    """The HTTP status of a completion sent without a key (401 when the endpoint is guarded);
    None when nothing answered."""
    url = route_url(base_url, route_prefix) + "/v1/completions"
    try:
        resp = httpx.post(url, json={"model": model, "prompt": "hi", "max_tokens": 1}, timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return resp.status_code
