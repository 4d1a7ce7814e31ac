"""remote/banner.py: what a port that was expected to speak SSH said, in words. Greetings are real
ones: OpenSSH's identification string (RFC 4253 section 4.2: 'SSH-protoversion-softwareversion',
other lines may come before it) and a web server's answer to a line it cannot parse."""

from __future__ import annotations

from orchestrator.remote.banner import not_ssh_reason


def test_an_ssh_banner_is_not_a_port_mistake_even_after_other_lines():
    assert not_ssh_reason(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n", eof=False) is None
    assert not_ssh_reason(b"Welcome\r\nSSH-2.0-OpenSSH_9.6p1\r\n", eof=True) is None


def test_a_web_server_is_named_by_its_first_line():
    assert not_ssh_reason(b"\r\nHTTP/1.1 400 Bad Request\r\nServer: nginx\r\n\r\n", eof=True) == (
        "it answered 'HTTP/1.1 400 Bad Request' instead of an SSH banner"
    )


def test_silence_and_a_closed_connection_are_told_apart():
    assert not_ssh_reason(b"", eof=True) == "it accepted the connection and closed it without sending an SSH banner"
    assert not_ssh_reason(b"", eof=False) == "it accepted the connection but sent no SSH banner"
