"""How many streamed requests per second one core of orch's load generator sustains.

A trivial OpenAI-style streaming endpoint (raw asyncio, HTTP/1.1 keep-alive, chunked SSE: a few
token chunks, a usage chunk, [DONE], all sent at once) runs in a separate process pinned to the
other core(s); orch's client (``orchestrator.bench.loadgen.run_concurrency``, the code ``orch bench``
runs) is pinned to one core with ``os.sched_setaffinity``. Prints JSON:
{"req_per_s": ..., "target_req_per_s": 500, ...}.

    python benchmarks/loadgen_capacity.py [--requests 4000] [--concurrency 64] [--tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 500.0


def _chunk(payload: str) -> bytes:
    data = f"data: {payload}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(tokens: int) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    parts = [head]
    for i in range(tokens):
        parts.append(_chunk(json.dumps({"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i}", "token_ids": [i], "finish_reason": None}]})))
    parts.append(_chunk(json.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}})))
    parts.append(_chunk("[DONE]"))
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


def serve(sock: socket.socket, tokens: int, cores: set[int]) -> None:
    if cores:
        os.sched_setaffinity(0, cores)
    body = _response(tokens)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def measure(port: int, requests: int, concurrency: int, tokens: int) -> dict:
    from orchestrator.bench.loadgen import ClientPool, Prompt, RequestSpec, run_concurrency

    spec = RequestSpec(base_url=f"http://127.0.0.1:{port}", model="m", output_tokens=tokens)
    prompts = [Prompt("hello world")]

    async def go() -> tuple[list, float]:
        async with ClientPool(spec) as client:
            await run_concurrency(client, spec, prompts, concurrency, concurrency * 4, time.perf_counter)  # warm up
            return await run_concurrency(client, spec, prompts, concurrency, requests, time.perf_counter)

    cpu0 = time.process_time()
    records, wall = asyncio.run(go())
    cpu = time.process_time() - cpu0
    ok = sum(r.ok for r in records)
    return {"requests": requests, "ok": ok, "wall_s": round(wall, 3), "client_cpu_s": round(cpu, 3), "req_per_s": round(ok / wall, 1),
            "req_per_cpu_s": round(ok / cpu, 1) if cpu else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=8, help="token chunks per response")
    args = ap.parse_args()

    cores = sorted(os.sched_getaffinity(0))
    client_core = {cores[0]}
    server_cores = set(cores[1:]) or set(cores)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    proc = mp.get_context("fork").Process(target=serve, args=(sock, args.tokens, server_cores), daemon=True)
    proc.start()
    sock.close()
    try:
        os.sched_setaffinity(0, client_core)
        result = measure(port, args.requests, args.concurrency, args.tokens)
    finally:
        proc.terminate()
        proc.join(5)
    result.update(
        {
            "benchmark": "loadgen_capacity",
            "concurrency": args.concurrency,
            "tokens_per_response": args.tokens,
            "client_core": sorted(client_core),
            "server_cores": sorted(server_cores),
            "cpu_share": round(result["client_cpu_s"] / result["wall_s"], 2) if result["wall_s"] else None,
            "target_req_per_s": TARGET,
            # on a shared machine the client may get only part of its core: req_per_cpu_s is what one
            # fully available core sustains, req_per_s what this run got
            "meets_target": result["req_per_s"] >= TARGET,
            "meets_target_per_cpu_s": (result["req_per_cpu_s"] or 0) >= TARGET,
        }
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
