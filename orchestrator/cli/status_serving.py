"""The serving section of `orch status`: rich rendering and JSON. CLI only (prints nothing itself).

``render_serving(serving)`` returns a rich renderable (``orchestrator.cli.status.render_report``
adds it after the nodes); ``render_serving_to(console, serving)`` prints it; ``serving_json``
gives the plain dict ``--json`` shows under ``"serving"`` (the same as
``ServingStatus.to_dict()``).
"""

from __future__ import annotations

from typing import Any

APP_STYLE = {"RUNNING": "green", "DEPLOYING": "yellow", "DEPLOY_FAILED": "bold red", "UNHEALTHY": "bold red",
             "DELETING": "yellow", "NOT_STARTED": "yellow"}  # fmt: skip
DEPLOYMENT_STYLE = {"HEALTHY": "green", "UPDATING": "yellow", "UPSCALING": "yellow", "DOWNSCALING": "yellow",
                    "UNHEALTHY": "bold red", "DEPLOY_FAILED": "bold red"}  # fmt: skip
REPLICA_STYLE = {"RUNNING": "green", "STARTING": "yellow", "RECOVERING": "yellow", "UPDATING": "yellow",
                 "PENDING_MIGRATION": "yellow", "STOPPING": "yellow"}  # fmt: skip


def serving_json(serving: Any) -> dict[str, Any] | None:
    return None if serving is None else serving.to_dict()


def _styled(value: str | None, styles: dict[str, str], default: str = "red") -> str:
    if value is None:
        return "[red]-[/]"
    return f"[{styles.get(value, default)}]{value}[/]"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000.0
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _capacity(cap: Any) -> tuple[str, str]:
    if cap is None:
        return "unknown", "-"
    tokens = f"{cap.tokens:,} tokens" if cap.tokens is not None else (f"{cap.blocks:,} blocks" if cap.blocks else "-")
    if cap.device:
        tokens += f" ({cap.device})"
    if cap.max_concurrency is None:
        conc = "-"
    elif cap.max_model_len is not None:
        conc = f"{cap.max_concurrency:.2f}x at {cap.max_model_len:,} tokens"
    else:
        conc = f"{cap.max_concurrency:.2f}x"
    return tokens, conc


def _latency(lat: Any) -> str:
    if lat is None:
        return "-"
    if lat.count == 0:
        return "no requests"
    return f"{_ms(lat.p50)} / {_ms(lat.p95)} (n={lat.count})"


def _window(live: Any) -> str:
    if live is None:
        return ""
    if live.window_s is None:
        return "since the engine started"
    return f"last {live.window_s / 60:.1f} min" if live.window_s >= 90 else f"last {live.window_s:.0f} s"


def _model_lines(m: Any) -> list[Any]:
    """Three or four short lines per model (readable at 80 columns)."""
    from rich.text import Text

    tokens, conc = _capacity(m.capacity)
    source = "" if m.capacity is None else (" (engine log)" if m.capacity.source == "log" else f" ({m.capacity.source})")
    lines = [Text.from_markup(f"model [bold]{m.model_id}[/]: KV cache {tokens}, max concurrency {conc}{source}")]
    if m.max_ongoing_requests is not None or m.max_num_seqs is not None:
        cap = "-" if m.max_ongoing_requests is None else f"{m.max_ongoing_requests:,}"
        seqs = "vLLM's default" if m.max_num_seqs is None else f"{m.max_num_seqs:,}"
        lines.append(Text(f"  Serve max_ongoing_requests {cap} per replica; engine max_num_seqs {seqs}"))
    live = m.live
    if live is None:
        lines.append(Text("  live: no engine metrics"))
        return lines
    if live.kv_cache_usage is None and live.running is None and live.waiting is None:
        now = "  now: idle (Ray exports the engine's gauges only while it works)"
    else:
        usage = "-" if live.kv_cache_usage is None else f"{live.kv_cache_usage * 100:.1f}%"
        now = f"  now: KV cache used {usage}, {_num(live.running)} running, {_num(live.waiting)} waiting"
    lines.append(Text(now))
    lines.append(Text(f"  TTFT p50/p95 {_latency(live.ttft)}, TPOT p50/p95 {_latency(live.tpot)}, {_window(live)}"))
    if m.slo is not None:
        lines.append(Text.from_markup(slo_line(m.slo)))
    return lines


def _ranks_table(ranks: list[Any]) -> Any:
    """One row per data-parallel rank (a DPServer replica): its group, node, state, the KV cache
    its engine logged and how much of it is used now."""
    from rich.table import Table

    table = Table(title="data-parallel ranks (one engine each, its own KV cache)", title_justify="left")
    for col in ("group", "rank", "replica", "state", "node", "KV cache", "KV used", "running"):
        table.add_column(col, overflow="fold")
    for r in sorted(ranks, key=lambda r: (r.dp.group, r.dp.rank)):
        tokens = f"{r.capacity.tokens:,} tokens" if r.capacity is not None and r.capacity.tokens is not None else "-"
        g = r.gauges
        used = "-" if g is None else ("idle" if g.kv_cache_usage is None else f"{g.kv_cache_usage * 100:.1f}%")
        node = r.node or "-"
        if r.node_state and r.node_state != "ALIVE":
            node += f" [bold red]({r.node_state})[/]"
        table.add_row(r.dp.group, f"{r.dp.rank}/{r.dp.size}", r.replica_id, _styled(r.state, REPLICA_STYLE), node, tokens, used,
                      _num(g.running if g else None))  # fmt: skip
    return table


def slo_line(slo: Any) -> str:
    """The live p95s against the manifest's objective, one line."""
    parts = []
    for name, bound, live in (("TTFT", slo.ttft_p95_ms, slo.live_ttft_p95_ms), ("TPOT", slo.tpot_p95_ms, slo.live_tpot_p95_ms)):
        if bound is not None:
            parts.append(f"{name} p95 {'-' if live is None else f'{live:.1f} ms'} (objective {bound:g} ms)")
    verdict = {True: "[green]met[/]", False: "[bold red]missed[/]", None: "[dim]no requests to judge[/]"}[slo.met]
    return "  SLO: " + ", ".join(parts) + f": {verdict}"


def _hit_rate(cache: Any) -> str:
    if cache is None or cache.hit_rate is None:
        return "-"
    return f"{cache.hit_rate * 100:.1f}%"


def render_serving(serving: Any) -> Any:
    """A rich Group: application line, deployments/replicas table, models table, probe, problems."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if serving is None:
        return Text("serving: not read", style="yellow")
    parts: list[Any] = []
    if serving.app_name is None and serving.revision is None and not serving.problems:
        parts.append(Text("serving: nothing is deployed (`orch rollout` deploys a model)"))
        parts.extend(Text(f"also in Serve: application {n} {st}") for n, st in serving.other_apps)
        return Group(*parts)
    head = f"serving: application {serving.app_name or '-'} {_styled(serving.app_status, APP_STYLE)}"
    if serving.route_prefix:
        head += f" on route {serving.route_prefix}"
    if serving.revision is not None:
        rev = serving.revision
        head += f", revision {rev.number} ({rev.model}, {rev.status}, config {rev.config_fingerprint[:12] or '-'})"
    parts.append(Text.from_markup(head))
    if serving.app_message.strip() and serving.app_status != "RUNNING":
        parts.append(Text(serving.app_message.strip()[:400], style="red"))

    if serving.deployments:
        table = Table(title="deployments", title_justify="left")
        caches = any(r.prefix_cache is not None for d in serving.deployments for r in d.replicas)
        for col in ("deployment", "status", "replica", "state", "node", "pid", *(("prefix cache hits",) if caches else ())):
            table.add_column(col, overflow="fold")
        for d in serving.deployments:
            status = _styled(d.status, DEPLOYMENT_STYLE)
            target = f" ({len(d.replicas)}/{d.target_replicas})" if d.target_replicas is not None else ""
            if not d.replicas:
                table.add_row(d.name, status + target, "-", "-", "-", "-", *(("-",) if caches else ()))
            for i, r in enumerate(d.replicas):
                node = r.node or "-"
                if r.node_state and r.node_state != "ALIVE":
                    node += f" [bold red]({r.node_state})[/]"
                table.add_row(d.name if i == 0 else "", status + target if i == 0 else "", r.replica_id,
                              _styled(r.state, REPLICA_STYLE), node, _num(r.pid),
                              *((_hit_rate(r.prefix_cache),) if caches else ()))  # fmt: skip
        parts.append(table)
        spanned = [(r, w) for d in serving.deployments for r in d.replicas for w in r.workers]
        if spanned:
            workers = Table(title="engine workers (vLLM's Ray executor, one per GPU)", title_justify="left")
            for col in ("replica", "rank", "node", "pid", "state"):
                workers.add_column(col, overflow="fold")
            for r, w in spanned:
                workers.add_row(r.replica_id, w.rank or "-", w.node or "-", _num(w.pid), _styled(w.state, REPLICA_STYLE))
            parts.append(workers)

        ranks = [r for d in serving.deployments for r in d.replicas if r.dp is not None]
        if ranks:
            parts.append(_ranks_table(ranks))

    for m in serving.models:
        parts.extend(_model_lines(m))

    if serving.endpoint or serving.probe is not None:
        p = serving.probe
        if p is None:
            line = f"endpoint {serving.endpoint}: not probed"
        elif p.ok:
            line = f"endpoint {p.url or serving.endpoint}: [green]ready[/] (completion in {_ms(p.latency_s)})"
        else:
            code = f"HTTP {p.status_code}" if p.status_code is not None else "no answer"
            line = f"endpoint {p.url or serving.endpoint}: [bold red]probe failed[/] ({code}{': ' + p.error if p.error else ''})"
        parts.append(Text.from_markup(line))
    if len(serving.served_models) > 1:  # several models: each its own application
        for m in serving.served_models:
            reps = ", ".join(f"{i} {s}" + (f" on {n}" if n else "") for i, s, n, _ in m.replicas) or "no replica"
            parts.append(Text(f"model '{m.served_name}': revision {m.revision}, application {m.app_name or '-'} "
                              f"{m.app_status or 'not in Serve'} on {m.route_prefix or '-'}; replicas: {reps}"))  # fmt: skip
    for name, status in serving.other_apps:
        parts.append(Text(f"also in Serve: application {name} {status}"))
    for problem in serving.problems:
        style = "bold red" if problem.severity == "fail" else "yellow"
        parts.append(Text.assemble((f"{problem.severity} {problem.code}", style), f" {problem.subject}: {problem.message}"))
        parts.append(Text(f"  hint: {problem.hint}"))
    if serving.calibration:
        parts.append(Text(calibration_line(serving.calibration)))
    for note in serving.notes:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)


def calibration_line(record: Any) -> str:
    """Predicted vs measured memory per GPU, with the error (the plan's figures against the engine's log)."""
    pred, meas, err = record.get("predicted") or {}, record.get("measured") or {}, record.get("error") or {}
    head = f"memory (vLLM {record.get('vllm_version')}, TP={record.get('tp')} PP={record.get('pp')}): "
    if record.get("mismatch"):  # a CPU engine standing in for the planned GPU: its figures measure the CPU
        got = [f"{label} {fmt.format(meas[f])} measured" for f, label, fmt in
               (("weights_gib", "weights", "{:.2f} GiB"), ("kv_gib", "KV cache", "{:.2f} GiB"), ("kv_tokens", "KV tokens", "{:,}")) if meas.get(f) is not None]  # fmt: skip
        return head + "; ".join([*got, str(record["mismatch"])])
    parts = []
    for field, label, fmt in (("weights_gib", "weights", "{:.2f} GiB"), ("kv_gib", "KV cache", "{:.2f} GiB"), ("kv_tokens", "KV tokens", "{:,}")):
        if meas.get(field) is not None and pred.get(field) is not None:
            parts.append(f"{label} {fmt.format(pred[field])} planned, {fmt.format(meas[field])} measured ({err.get(field, 0):+.1%})")
    reserve = record.get("measured_reserve_gib")
    tail = f"; measured reserve {reserve:.2f} GiB per GPU, used by `orch plan --cluster`" if reserve is not None else ""
    return head + ("; ".join(parts) or "not logged") + tail


def render_serving_to(console: Any, serving: Any) -> None:
    """Print the serving section on a rich console."""
    console.print(render_serving(serving))
