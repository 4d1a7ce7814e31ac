"""The request routers `orch rollout` renders: the manifest's ``serve.request_router`` (or
``--request-router``) -> the class set as the LLMServer deployment's ``request_router_config``.
Pure.

Under orch's ingress (HAProxy + direct ingress + Serve LLM's direct streaming, which vLLM's API
key needs) with a router chosen here, HAProxy asks the application's ``LLMRouter`` deployment which LLMServer replica
takes each request (``POST /internal/route``); LLMRouter asks the LLMServer deployment's handle
(``handle.choose_replica(..., _reserve=False)``), so the router configured on the LLMServer
deployment is the one that decides (ray/llm/_internal/serve/core/ingress/router.py, Ray 2.60).

- ``default``: no router and no LLMRouter: the application is built by orch's builder on the
  nodes (``serve.node_hooks``), and HAProxy balances over the LLMServer replicas' own ports
  (``balance leastconn``, Ray's ``RAY_SERVE_HAPROXY_BALANCE_ALGORITHM``). Serve LLM's builder
  would set ``RoundRobinRouter`` for LLMRouter to ask (core/ingress/builder.py:
  ``_get_direct_streaming_serve_options``), one more hop per request that decides nothing more.
  (A bucket model source keeps Serve LLM's builder: ``serve.shapes.TpPpShape.import_path``.)
- ``session_affinity``: Ray Serve's ``ConsistentHashRouter``: a consistent-hash ring over the
  request's session id, which HAProxy forwards from the client's ``x-session-id`` header to
  LLMRouter (the Lua router hook, ``ingress_request_router.lua.tmpl``). Requests of one session
  (a conversation, a tenant, a shared system prompt) go to one replica, whose prefix cache holds
  their common prefix; requests without the header spread uniformly.
- ``prefix_affinity`` (Ray Serve LLM's ``PrefixCacheAffinityRouter``) is not offered (``orch rollout
  --request-router`` lists only the two above; a manifest that names it is refused at load with the
  reason, manifest/sections.py) and refused here for any other caller: it learns which
  replica holds which prompt in ``on_request_routed``, and the pick-only path LLMRouter uses never
  calls it, so its prefix tree stays empty, every request falls to the "smallest tenant" branch
  and LLMRouter takes the first of those: one replica gets every request (measured on the test
  bed: of two replicas, one finished all 64 requests of the load, the other none). Configured on
  the ingress deployment without LLMRouter (orch's builder), Serve refuses it when HAProxy is on
  (``CUSTOM_INGRESS_REQUEST_ROUTER_UNSUPPORTED_ERROR``, ray/serve/_private/build_app.py). Without
  ``RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1`` HAProxy does not even send it the prompt.
  docs/rollout.md, "Request routing", has the whole finding.
"""

from __future__ import annotations

from orchestrator.errors import ServeConfigError

REQUEST_ROUTER_CLASSES: dict[str, str | None] = {
    "default": None,
    "session_affinity": "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter",
}
PREFIX_CACHE_AFFINITY_ROUTER = "ray.serve.llm.request_router.PrefixCacheAffinityRouter"
REFUSED: dict[str, tuple[str, str]] = {
    "prefix_affinity": (
        "request router prefix_affinity (PrefixCacheAffinityRouter) cannot work behind orch's direct-streaming ingress: "
        "LLMRouter picks replicas without calling the router's on_request_routed, so it never learns a prefix and sends "
        "every request to one replica (measured: one of two replicas took all 64 requests of a load, the other none)",
        "use session_affinity and send one x-session-id per shared prefix (a conversation, a tenant, a system prompt); "
        "see docs/rollout.md, 'Request routing'",
    ),
}


def router_class(name: str) -> str | None:
    """The class path to render for ``name`` (None: leave Serve LLM's own); ServeConfigError for
    a refused or unknown router."""
    if name in REFUSED:
        message, hint = REFUSED[name]
        raise ServeConfigError(message, hint=hint)
    if name not in REQUEST_ROUTER_CLASSES:
        raise ServeConfigError(f"unknown request router {name!r}", hint="use one of: " + ", ".join(REQUEST_ROUTER_CLASSES))
    return REQUEST_ROUTER_CLASSES[name]
