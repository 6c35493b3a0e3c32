"""The native transport core against its reference, driven by generated sequences: a pair of
cores of either kind (testbed/traffic/transport_core.py, testbed/traffic/transport_native.py),
posts, packets through a path that loses, duplicates, reorders, CE-marks, gives INT, corrupts,
forges (a field changed, the ICRC made right) and cuts them, and timer expiries; a log of
everything observable after every step. tests/test_transport_native.py compares the two logs
in make test; tests/fuzz/transport.py --native over many more seeds in make fuzz, also with the
C built with AddressSanitizer and UBSan."""

from __future__ import annotations

import random
from typing import Any

from scapy.layers.inet import IP

from controller.wire.int_md import HEADERS_LEN, INT_DSCP_DEFAULT, SHIM_LEN
from controller.wire.probe import PROBE_QPN
from controller.wire.roce import BTH_LEN, ICRC_LEN, ROCE_UDP_PORT, icrc
from testbed.packets import int_packet
from testbed.traffic.transport_core import TransportConfig, TransportCore
from testbed.traffic.transport_native import NativeTransportCore

A, B = "10.0.1.1", "10.0.2.2"


def _int_stack(rng: random.Random) -> bytes:
    """A valid INT shim, MD header and stack of 1-3 hops (as a source and transit switches
    write them), with random queues and latencies: what the sink decodes."""
    hops = [
        {
            "node_id": rng.randrange(1, 5),
            "l1_ingress_port": rng.randrange(1, 9),
            "l1_egress_port": rng.randrange(1, 9),
            "hop_latency": rng.randrange(1 << 16),
            "queue_id": 0,
            "queue_occupancy": rng.randrange(1 << 12),
            "egress_ts": rng.randrange(1 << 31),
            "tx_util": 0,
        }
        for _ in range(rng.randrange(1, 4))
    ]
    pkt = bytes(int_packet(src_ip=A, dst_ip=B, sport=49152, hops=hops, payload=bytes(16))[IP])
    return pkt[28 : 28 + SHIM_LEN + 4 * pkt[29]]


_STACKS: list[bytes] = []


def _with_int(pkt: bytes, rng: random.Random) -> bytes:
    """`pkt` with INT after its UDP header, its DSCP the INT one, as a source switch inserts
    it (lengths grown, the ICRC unchanged); now and then a stack the sink cannot read."""
    if not _STACKS:  # scapy is slow: a pool of stacks, made once
        pool = random.Random(0)
        _STACKS.extend(_int_stack(pool) for _ in range(64))
    ins = rng.choice(_STACKS)
    if rng.random() < 0.2:
        words = rng.randrange(0, 12)
        stack = bytes(rng.randrange(256) for _ in range(HEADERS_LEN - SHIM_LEN + 4 * words))
        ins = bytes([0x10, len(stack) // 4, 0, pkt[1] >> 2]) + stack
    ip = bytearray(pkt[:28])
    ip[1] = (INT_DSCP_DEFAULT << 2) | (pkt[1] & 3)
    ip[2:4] = (len(pkt) + len(ins)).to_bytes(2, "big")
    ip[24:26] = (int.from_bytes(pkt[24:26], "big") + len(ins)).to_bytes(2, "big")
    return bytes(ip) + ins + pkt[28:]


def _forge(pkt: bytes, rng: random.Random) -> bytes:
    """`pkt` with one protocol field changed and its ICRC made right again: what reaches the
    transport's checks past the ICRC (opcode, QPN, PSN, AETH syndrome, source, length)."""
    ip, body = bytearray(pkt[:28]), bytearray(pkt[28:-ICRC_LEN])
    field = rng.randrange(6)
    if field == 0:
        body[0] = rng.choice([0x00, 0x01, 0x02, 0x04, 0x11, 0x81, 0x0A, rng.randrange(256)])
    elif field == 1:
        qpn = rng.choice([5, 6, 7, 8, PROBE_QPN, rng.randrange(1 << 24)])
        body[4:8] = qpn.to_bytes(4, "big")
    elif field == 2:
        psn = int.from_bytes(body[9:12], "big") + rng.choice([-1, 1, 2, 40, 1 << 22, 1 << 23])
        body[9:12] = (psn & 0xFFFFFF).to_bytes(3, "big")
    elif field == 3 and len(body) > BTH_LEN:
        body[BTH_LEN] = rng.choice([0x00, 0x1F, 0x20, 0x60, 0x61, 0x65, 0x7F, 0xC0])
    elif field == 4:
        ip[12:16] = bytes([10, 0, rng.randrange(4), rng.randrange(4)])
    else:
        body = body[: rng.randrange(BTH_LEN, len(body) + 1)]
        if rng.random() < 0.5:
            body += bytes(rng.randrange(1, 9))
    udp_len = 8 + len(body) + ICRC_LEN
    ip[2:4] = (20 + udp_len).to_bytes(2, "big")
    ip[24:26] = udp_len.to_bytes(2, "big")
    sport = int.from_bytes(ip[20:22], "big")
    return bytes(ip) + bytes(body) + icrc(bytes(ip[:20]), sport, ROCE_UDP_PORT, bytes(body))


def _wire(pkt: bytes, rng: random.Random) -> list[bytes]:
    """What the path delivers of one packet: mostly itself, sometimes nothing, two copies, a
    CE mark, INT, a flipped byte, a cut, or garbage."""
    r = rng.random()
    if r < 0.06:
        return []
    if r < 0.10:
        return [pkt, pkt]
    if r < 0.20:
        return [pkt[:1] + bytes([pkt[1] | 0b11]) + pkt[2:]]
    if r < 0.30:
        return [_with_int(pkt, rng)]
    if r < 0.33:
        i = rng.randrange(len(pkt))
        return [pkt[:i] + bytes([pkt[i] ^ (1 << rng.randrange(8))]) + pkt[i + 1 :]]
    if r < 0.35:
        return [pkt[: rng.randrange(len(pkt))]]
    if r < 0.36:
        return [bytes(rng.randrange(256) for _ in range(rng.randrange(80)))]
    if r < 0.40:
        return [pkt, _forge(pkt, rng)]
    return [pkt]


def _snapshot(core: TransportCore) -> tuple[Any, ...]:
    qps = tuple(
        (
            qp.qpn,
            qp.una,
            qp.nxt,
            qp.high,
            qp.tail,
            qp.epsn,
            qp.ident,
            qp.wants_to_send,
            qp.deadline,
            len(qp.send_q),
        )
        for qp in core.qps.values()
    )
    sink = (
        (dict(core.sink.reports), dict(core.sink.errors), core.sink.flows_evicted)
        if core.sink is not None
        else None
    )
    counters = {k: v for k, v in core.counters().items() if k != "transport"}  # its name
    return counters, dict(core.drops), core.probes_ignored, core.next_deadline(), qps, sink


def drive(native: bool, seed: int, steps: int, **cfg: Any) -> list[Any]:
    """One generated sequence through a pair of cores; the log of everything observable."""
    rng = random.Random(seed)
    make = NativeTransportCore if native else TransportCore
    a = make(TransportConfig(local_ip=A, **cfg), seed=1)
    b = make(TransportConfig(local_ip=B, **cfg), seed=2)
    cores = (a, b)
    # PSNs start near the wrap, so sequence arithmetic crosses 2^24
    p1, p2 = (1 << 24) - rng.randrange(1, 300), rng.randrange(1 << 24)
    a.create_qp(5, B, 6, sq_psn=p1, rq_psn=p2)
    b.create_qp(6, A, 5, sq_psn=p2, rq_psn=p1)
    a.create_qp(7, B, 8)
    b.create_qp(8, A, 7, local_ip=B)
    mtu = a.cfg.mtu
    # what each stores of a message (all, none, or its first bytes), from a stream of its own
    # so the sequences stay those the other tests were written on
    stores = random.Random(-seed)
    holds = random.Random(seed ^ 0x5A5A)  # which due timers the I/O restarts (NIC still holds)
    watched: set[Any] = set()  # the queue pairs a completion or a message touched
    for core in cores:
        for qp in core.qps.values():
            qp.store_bytes = stores.choice([None, None, 0, 3, mtu + 5])
            qp.watch = watched
    now = 0.0
    flight: list[tuple[TransportCore, bytes]] = []
    ops: list[Any] = []
    log: list[Any] = []
    for step in range(steps):
        r = rng.random()
        if r < 0.08:  # the application posts a message
            core = rng.choice(cores)
            qp = rng.choice(list(core.qps.values()))
            size = rng.choice([0, 1, mtu - 1, mtu, mtu + 1, rng.randrange(10 * mtu)])
            data = bytes(rng.randrange(256) for _ in range(rng.choice([size, size // 2, 0])))
            ops.append(qp.post_send(data, now, tag=step, size=size))
            log.append(("post", step, qp.qpn, size))
        elif r < 0.45:  # the NICs send: feedback first, then up to a few data packets
            for core, peer in ((a, b), (b, a)):
                while core.feedback:
                    out = core.feedback.popleft()
                    log.append(("fb", out.qp.qpn, out.packet))
                    flight += [(peer, p) for p in _wire(out.packet, rng)]
                # the reference's senders are a set's: in no order its callers rely on
                for qp in sorted(core.senders(), key=lambda q: q.qpn):
                    for _ in range(rng.randrange(1, 6)):
                        pkt = qp.peek(now)
                        if pkt is None:
                            break
                        if rng.random() < 0.03:  # peeked, not sent (the I/O pushed back)
                            log.append(("peeked", qp.qpn, pkt))
                            break
                        qp.commit(now)
                        log.append(("data", qp.qpn, pkt))
                        flight += [(peer, p) for p in _wire(pkt, rng)]
        elif r < 0.85 and flight:  # the path delivers one, mostly in order
            i = 0 if rng.random() < 0.8 else rng.randrange(len(flight))
            core, pkt = flight.pop(i)
            core.receive(pkt if rng.random() < 0.5 else memoryview(pkt), now)
            while core.reports:
                log.append(("report", core.reports.popleft()))
            for qp in core.qps.values():
                while (m := qp.poll_recv()) is not None:
                    log.append(("msg", qp.qpn, bytes(m.data), m.size, m.t_first, m.t_done))
        else:  # time passes; the timers fire
            now += rng.choice([0.0, 1e-6, 3e-6, a.cfg.rto / 3, a.cfg.rto, 2 * a.cfg.rto])
            for core in cores:
                for qp in sorted(core.qps.values(), key=lambda q: q.qpn):
                    due = qp.deadline
                    if due is not None and due <= now and holds.random() < 0.3:
                        core.restart_timer(qp, now)
                        log.append(("restart", qp.qpn))
                core.expire(now)
        log.append(("watched", sorted(qp.qpn for qp in watched)))
        watched.clear()
        log.append(("state", _snapshot(a), _snapshot(b)))
        log.append(("done", tuple(op.t_done for op in ops)))
    return log


def first_difference(ref: list[Any], nat: list[Any]) -> str:
    for i, (x, y) in enumerate(zip(ref, nat, strict=False)):
        if x != y:
            return f"entry {i}:\n reference {x!r:.600}\n native    {y!r:.600}"
    return f"lengths {len(ref)} and {len(nat)}"


CONFIGS = [
    {"mtu": 256, "window": 8, "ack_every": 3, "rto": 0.001, "rto_max": 0.004},
    {"mtu": 1024, "window": 256, "ack_every": 4, "cnp_interval": 2e-6},
    {"mtu": 100, "window": 3, "ack_every": 1, "psn_window": 16, "max_message": 700},
    {"mtu": 512, "window": 64, "int_dscp": None, "rto": 5e-6},
    # the NIC as INT sink: its Telemetry Reports (sampled, on queue and latency, on loss)
    {
        "mtu": 300,
        "window": 16,
        "report_to": "10.0.9.9:32766",
        "report_sample_s": 2e-6,
        "report_queue_bytes": 1,
        "report_latency_ns": 1,
        "report_event_gap_s": 1e-6,
    },
    # a sink that keeps one flow's state (each other flow's packet evicts it), events only
    {
        "mtu": 200,
        "window": 12,
        "report_to": "10.0.9.9:32766",
        "report_sample_s": 1.0,
        "report_queue_bytes": 2000,
        "report_event_gap_s": 3e-6,
        "report_max_flows": 1,
    },
]
