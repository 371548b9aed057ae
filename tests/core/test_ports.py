"""kvcake.core.ports: ports below the ephemeral range, free, never handed out twice."""

from __future__ import annotations

import socket

import pytest

from kvcake.core.ports import ephemeral_start, free_port, free_ports


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    ports = free_ports(4, span=50)
    again = [free_port() for _ in range(20)]
    assert len(set(ports + again)) == 24
    assert all(1024 <= p < ephemeral_start() - 50 for p in ports)  # room for the span
    assert all(1024 <= p < ephemeral_start() for p in again)
    assert all(abs(a - b) > 50 for a in ports for b in ports if a != b)
    assert not any(p <= q <= p + 50 for p in ports for q in again)  # each base's span is kept
    for p in (*ports, *(p + 50 for p in ports)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="n >= 0"):
        free_ports(-1)
    with pytest.raises(ValueError, match="span >= 0"):
        free_ports(1, span=-5)
