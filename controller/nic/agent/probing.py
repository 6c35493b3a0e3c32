"""The agent's active prober on a host (controller/nic/prober.py, the twin's too): a thread
that sends the probes (unless paused) through a raw IPv4 socket (the NIC's tc program gives
them INT, as it gives the data) and reads the probes that arrive through a raw UDP socket
whose classic BPF filter keeps only probes (UDP to 4791, BTH destination queue pair
`PROBE_QPN`, after INT's headers when the DSCP says INT), so the agent never reads the data.

Probes are sent on time as the thread's clock allows: one that is late is sent late, and a
thread that fell more than a second behind starts its round again from now (it does not
send a burst).
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from controller.common.sockfilter import Program, attach_filter, drain
from controller.nic.prober import ProbeConfig, Prober
from controller.wire.probe import PROBE_QPN
from controller.wire.roce import ROCE_UDP_PORT

log = logging.getLogger("xingmai.agent.probing")

SO_RXQ_OVFL = 40  # a received packet says how many the socket had dropped before it
RCVBUF = 1 << 20
MAX_BEHIND_S = 1.0


def probe_filter(int_dscp: int | None) -> Program:
    """Classic BPF over an IPv4 packet: accept UDP to 4791 whose BTH (after the UDP header,
    and after INT's shim, MD header and stack when the DSCP is `int_dscp`) names PROBE_QPN."""
    # (code, jt, jf, k); jumps count the instructions skipped
    accept, drop = (0x06, 0, 0, 0x40000), (0x06, 0, 0, 0)
    plain = [
        (0x40, 0, 0, 12),  # A = u32 at X + 12: BTH bytes 4-7 (X = the IPv4 header's length)
        (0x54, 0, 0, 0xFFFFFF),  # A &= the destination queue pair
        (0x15, 0, 1, PROBE_QPN),
        accept,
        drop,
    ]
    with_int = [
        (0x50, 0, 0, 9),  # A = u8 at X + 9: INT shim's length (words after the shim)
        (0x64, 0, 0, 2),  # A <<= 2
        (0x0C, 0, 0, 0),  # A += X
        (0x07, 0, 0, 0),  # X = A: the BTH is at X + 8 (UDP) + 4 (shim)
        (0x40, 0, 0, 16),  # A = u32 at X + 16: BTH bytes 4-7
        (0x54, 0, 0, 0xFFFFFF),
        (0x15, 0, 1, PROBE_QPN),
        accept,
        drop,
    ]
    head = [
        (0xB1, 0, 0, 0),  # X = 4 * (u8 at 0 & 0xf): the IPv4 header's length
        (0x48, 0, 0, 2),  # A = u16 at X + 2: the UDP destination port
    ]
    if int_dscp is None:  # not UDP to 4791: to the plain branch's drop
        return [*head, (0x15, 0, len(plain) - 1, ROCE_UDP_PORT), *plain]
    dscp = [
        (0x30, 0, 0, 1),  # A = u8 at 1: TOS
        (0x74, 0, 0, 2),  # A >>= 2: the DSCP
        (0x15, len(plain), 0, int_dscp),  # INT: past the plain branch
    ]
    not_4791 = len(dscp) + len(plain) - 1  # to the plain branch's drop
    return [*head, (0x15, 0, not_4791, ROCE_UDP_PORT), *dscp, *plain, *with_int]


class ProbeRunner:
    """The prober's thread: `start()`, `stop()`; `snapshot()` reads its counts."""

    def __init__(self, prober: Prober, int_dscp: int | None):
        self.prober = prober
        self.int_dscp = int_dscp
        self.lock = threading.Lock()
        self.send_errors = 0
        self.rx_dropped = 0  # probes the receiving socket dropped (read too late)
        self._stop = threading.Event()
        # paused: nothing sent, what arrives still counted (a testbed pauses the probers
        # between its runs, so that its fabric falls quiet; the sequences go on after)
        self.paused = threading.Event()
        self._thread: threading.Thread | None = None
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        try:
            self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            self.rx.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
            attach_filter(self.rx, probe_filter(int_dscp))
            drain(self.rx)
            self.tx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        except OSError:
            self.rx.close()
            raise

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="probes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.rx.close()
        self.tx.close()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            p = self.prober
            return {
                "sent": p.sent,
                "send_errors": self.send_errors,
                "malformed": p.malformed,
                "flows_evicted": p.flows_evicted,
                # copies, without the sequence state the prober keeps for itself
                "flows": [replace(f, missing=OrderedDict()) for f in p.flows.values()],
                "rx_dropped": self.rx_dropped,
            }

    def _run(self) -> None:
        gap = self.prober.gap_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self.paused.is_set():
                next_at = now + gap
            elif now >= next_at:
                with self.lock:
                    out = self.prober.next_probe(time.monotonic_ns())
                if out is not None:
                    tg, pkt = out
                    try:
                        self.tx.sendto(pkt, (tg.peer_ip, 0))
                    except OSError:
                        self.send_errors += 1
                next_at += gap
                if now - next_at > MAX_BEHIND_S:
                    next_at = now + gap
                continue
            ready, _, _ = select.select([self.rx], [], [], min(0.05, next_at - now))
            if ready:
                self._receive()

    def _receive(self) -> None:
        for _ in range(256):
            try:
                pkt, anc, _, _ = self.rx.recvmsg(65536, socket.CMSG_SPACE(4))
            except (BlockingIOError, InterruptedError):
                return
            # the packets the socket had dropped when this one was queued (absent: none)
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
                    self.rx_dropped = struct.unpack("I", data[:4])[0]
            with self.lock:
                self.prober.receive_packet(pkt, self.int_dscp, self.rx_dropped)


def start_probing(
    local_ip: str, peers: list[str], cfg: ProbeConfig, seed: int, int_dscp: int | None
) -> ProbeRunner:
    runner = ProbeRunner(Prober(local_ip, peers, cfg, seed), int_dscp)
    runner.start()
    log.info(
        "probing",
        extra={"peers": len(peers), "flows": len(runner.prober.targets), "gap_s": cfg.interval_s},
    )
    return runner
