"""The transport's packet handler (testbed.traffic.transport_core, the sans-I/O core both
engines run): valid data, ACK/NAK and CNP packets of a live queue pair, the same mutated, and
random datagrams, each fed to `receive`; the core's timers fire between cases."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from testbed.traffic.transport_core import TransportConfig, TransportCore
from tests.fuzz.harness import EDITS, Surface, mutate

A, B = "10.0.1.1", "10.0.2.2"
MAX_MESSAGE = 1 << 20


class TransportSurface(Surface):
    name = "transport_packet_handler"

    def __init__(self) -> None:
        cfg = {"mtu": 1000, "max_message": MAX_MESSAGE}
        self.a = TransportCore(TransportConfig(local_ip=A, **cfg), seed=1)  # type: ignore[arg-type]
        self.b = TransportCore(TransportConfig(local_ip=B, **cfg), seed=2)  # type: ignore[arg-type]
        self.qa = self.a.create_qp(5, B, 6)
        self.qb = self.b.create_qp(6, A, 5)
        self.now = 0.0
        self.data_templates: list[bytes] = []
        self.feedback_templates: list[bytes] = []
        self._refill()

    def _refill(self) -> None:
        """A message from a to b: its packets (and b's answers) are the valid templates."""
        self.qa.post_send(bytes(range(256)) * 12, self.now)
        for _ in range(8):
            pkt = self.qa.peek(self.now)
            if pkt is None:
                break
            self.qa.commit(self.now)
            self.data_templates.append(bytes(pkt))
            self.b.receive(pkt, self.now)
        while self.b.feedback:
            fb = self.b.feedback.popleft()
            self.feedback_templates.append(bytes(fb.packet))
            self.a.receive(fb.packet, self.now)
        self.data_templates = self.data_templates[-16:]
        self.feedback_templates = self.feedback_templates[-16:]

    def strategy(self) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.tuples(st.just("data"), st.integers(0, 15), EDITS),
            st.tuples(st.just("feedback"), st.integers(0, 15), EDITS),
            st.tuples(st.just("random"), st.binary(max_size=200), st.booleans()),
            st.tuples(st.just("time"), st.floats(0, 0.5)),
        )

    def check(self, case: Any) -> str:
        kind = case[0]
        if kind == "time":
            self.now += case[1]
            self.a.expire(self.now)
            self.b.expire(self.now)
            self._drain()
            return "timers"
        if kind == "random":
            (self.b if case[2] else self.a).receive(case[1], self.now)
            self._drain()
            return "random"
        pool = self.data_templates if kind == "data" else self.feedback_templates
        if not pool:
            self._refill()
            return "refilled"
        pkt = mutate(pool[case[1] % len(pool)], case[2])
        target = self.b if kind == "data" else self.a
        before = sum(target.drops.values())
        target.receive(pkt, self.now)
        self._drain()
        if len(self.data_templates) < 4:
            self._refill()
        return "dropped" if sum(target.drops.values()) > before else "taken"

    def _drain(self) -> None:
        # the I/O below takes whatever the cores made, as a wire would
        for core in (self.a, self.b):
            core.feedback.clear()
            for qp in core.qps.values():  # and the application takes what arrived
                while qp.poll_recv() is not None:
                    pass
            for qp in core.senders():
                for _ in range(64):
                    if qp.peek(self.now) is None:
                        break
                    qp.commit(self.now)

    def bounds(self) -> list[str]:
        out = []
        for core in (self.a, self.b):
            if len(core.qps) != 1:
                out.append(f"{len(core.qps)} queue pairs (packets must not make them)")
            for qp in core.qps.values():
                if len(qp.recv_q) > 16 or len(qp.send_q) > 64:
                    out.append(f"qp {qp.qpn}: queues grew ({len(qp.recv_q)}, {len(qp.send_q)})")
                if len(qp.rx_buf) > MAX_MESSAGE:
                    out.append(f"qp {qp.qpn}: {len(qp.rx_buf)} bytes buffered")
        return out
