"""The local ports handed to the servers the testbed starts lie outside the kernel's
ephemeral range (where a client's source port could take them first), are free, and are
never handed out twice by one process."""

from __future__ import annotations

import socket

from controller.common import ports


def test_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    lo, hi = ports._ephemeral_range()
    got = [ports.free_port() for _ in range(50)] + [ports.free_port(socket.SOCK_DGRAM)]
    assert len(set(got)) == len(got)
    for p in got:
        assert not lo <= p <= hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_not_handed_out(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        picks = iter([taken, taken, 20001])
        monkeypatch.setattr(ports._rng, "choice", lambda pool: next(picks))
        monkeypatch.setattr(ports, "_candidates", lambda: range(20000, 20002))
        monkeypatch.setattr(ports, "_given", set())
        assert ports.free_port() == 20001
