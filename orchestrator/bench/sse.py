"""Server-sent events of an OpenAI-compatible streaming response, and what each chunk means. Pure.

``SseDecoder`` turns lines (as an HTTP client yields them) into event payloads, following the SSE
rules that matter here: ``data:`` lines (several are joined with newlines), a blank line ends an
event, ``:`` starts a comment, ``[DONE]`` ends the stream. ``read_chunk`` interprets one payload of
``/v1/completions`` or ``/v1/chat/completions``: how many output tokens it carries (vLLM's
``token_ids`` when the request asked for ``return_token_ids``, else one per non-empty text delta),
the usage block, the finish reason, or an in-stream error object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

DONE = "[DONE]"


class StreamProtocolError(ValueError):
    """The stream broke the SSE/OpenAI chunk format (not JSON, not an object, ...)."""


class SseDecoder:
    """Feed lines; get back the data payload of each completed event."""

    __slots__ = ("_data", "_buf")

    def __init__(self) -> None:
        self._data: list[str] = []
        self._buf = b""

    def feed_bytes(self, data: bytes) -> list[str]:
        """Raw bytes as they come off the socket (any split); the payloads they complete."""
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()  # an incomplete last line waits for more bytes
        out = []
        for raw in lines:
            payload = self.feed_line(raw.decode("utf-8"))
            if payload is not None:
                out.append(payload)
        return out

    def feed_line(self, line: str) -> str | None:
        """One line without its line ending. Returns a payload when this line completes an event."""
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            if not self._data:
                return None
            payload = "\n".join(self._data)
            self._data = []
            return payload
        if line[0] == ":":
            return None
        name, sep, value = line.partition(":")
        if not sep:
            name, value = line, ""
        elif value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        # event:, id:, retry: carry nothing orch needs
        return None

    def flush(self) -> str | None:
        """End of stream: an event not followed by a blank line still counts (lenient servers)."""
        if self._buf:
            rest, self._buf = self._buf, b""
            payload = self.feed_line(rest.decode("utf-8"))
            if payload is not None:
                return payload
        if not self._data:
            return None
        payload = "\n".join(self._data)
        self._data = []
        return payload


@dataclass(frozen=True, slots=True)
class Chunk:
    """The meaning of one streamed payload."""

    tokens: int = 0  # output tokens this chunk carries (0: role-only, usage-only, keep-alive)
    done: bool = False  # the [DONE] sentinel
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None  # an in-stream {"error": ...} object
    server_ttft: float | None = None  # seconds, vLLM's per-request metrics (--enable-per-request-metrics)


_DONE_CHUNK = Chunk(done=True)


def _carries_a_token(choice: dict) -> bool:
    """Without ``token_ids``: whether a streamed choice reports a generated token. vLLM sends a
    choice only for new tokens (``completion_stream_generator`` in
    vllm/entrypoints/openai/completion/serving.py skips a chunk with no text and no token ids
    until the first token), and its text is empty when the detokenizer holds back an incomplete
    UTF-8 sequence (byte-level tokens of CJK text, emoji, a random model's output): that chunk
    is still a token, and vLLM's own benchmark times the first token at the first choice chunk
    (vllm/benchmarks/lib/endpoint_request_func.py). A chat stream's first chunk only announces the
    role (``{"role": "assistant", "content": ""}``): not a token."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return True
        return "role" not in delta and isinstance(delta.get("content"), str)
    return isinstance(choice.get("text"), str)


def read_chunk(payload: str) -> Chunk:
    """Interpret one SSE payload of a completions or chat-completions stream."""
    if payload == DONE:
        return _DONE_CHUNK
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise StreamProtocolError(f"stream chunk is not JSON: {payload[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise StreamProtocolError(f"stream chunk is not a JSON object: {payload[:80]!r}")
    err = obj.get("error")
    if err:
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return Chunk(error=str(msg)[:200])
    tokens = 0
    finish = None
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            raise StreamProtocolError("stream chunk has a choice that is not an object")
        ids = choice.get("token_ids")
        if ids:
            tokens += len(ids)
        elif ids is None and _carries_a_token(choice):
            tokens += 1
        finish = choice.get("finish_reason") or finish
    usage = obj.get("usage")
    if isinstance(usage, dict):
        metrics = obj.get("metrics")
        ttft_ms = metrics.get("time_to_first_token_ms") if isinstance(metrics, dict) else None
        return Chunk(
            tokens=tokens,
            usage_completion_tokens=usage.get("completion_tokens"),
            usage_prompt_tokens=usage.get("prompt_tokens"),
            finish_reason=finish,
            server_ttft=ttft_ms / 1000.0 if isinstance(ttft_ms, (int, float)) else None,
        )
    return Chunk(tokens=tokens, finish_reason=finish)
