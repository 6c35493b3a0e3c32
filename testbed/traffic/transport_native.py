"""The transport core with its per-packet work in C (testbed/traffic/transport_native.c).

`NativeTransportCore` is a `TransportCore` (testbed/traffic/transport_core.py, the reference)
whose queue pairs' protocol state and per-packet steps live in C: receiving a packet, building
the next data packet and the feedback, the timers. Python keeps what is not per packet: the
queue pairs' set-up (inherited), and the application's API over the queues the C fills after
each call (send completions, received messages, feedback packets, drops by reason), so a job,
the twin's host and the tests drive either core the same way. tests/test_transport_native.py
holds the two equal, packet for packet and counter for counter, on generated sequences.

Go-back-N only: a configuration with selective repeat is refused with `Unsupported`, whose
message says why in one line, and the caller runs the reference (`make_core`). The NIC as INT
sink (controller/nic/int_sink.py) observes in C (IntSink.observe's decode, flow states and
triggers); the reports it decides, and the loss reports, are queued in the reference's order
and `_take` has the Python sink encode them. The emulation's steps between a job's polls run in
C too (`xm_tp_run`, testbed/traffic/transport.py's `run_steps`). The wire constants reach the
C as #defines made here from controller/wire (one declaration each). The build is cached as the
native switch pipeline's is (testbed/switch/native/build.py).
"""

from __future__ import annotations

import functools
import os
import socket
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from controller.nic import int_sink
from controller.wire import int_md, probe, roce
from testbed.switch.native import PIPELINES
from testbed.switch.native.build import BuildError, build_library, inline_headers
from testbed.traffic.transport_core import (
    MTU_MAX,
    Outgoing,
    QpCounters,
    QueuePair,
    ReceivedMessage,
    SendOp,
    TransportConfig,
    TransportCore,
    checked_store,
)

SOURCE = Path(__file__).with_name("transport_native.c")
HEADER = SOURCE.with_suffix(".h")
# the C's drop reasons, in its enum's order (tests check them against the reference's)
DROP_NAMES = (
    "short",
    "bad_udp_length",
    "bad_int",
    "bad_icrc",
    "unknown_qp",
    "wrong_peer",
    "bad_sack",
    "bad_int_echo",
    "unknown_opcode",
    "nak_unsupported",
    "ack_out_of_window",
    "sack_out_of_window",
    "psn_out_of_window",
    "out_of_order",
    "duplicate",
    "bad_opcode_sequence",
    "bad_length",
    "message_too_long",
)
_COUNTERS = tuple(QpCounters.__dataclass_fields__)
MAX_INT = int_md.SHIM_LEN + 4 * int_md.SHIM_LENGTH_MAX  # the longest INT stack a shim names
_HEADERS = 28  # IPv4 + UDP, as the transport sends them
_STORE_ALL = (1 << 64) - 1  # xm_tp_qp.store for None: every byte
SEND_ERRNO_N = 256  # the emulation's loop counts the sends lost by errno below this (above: 0)
# what xm_tp_run hands back (< 0: -errno of a failed read)
IO_UNTIL, IO_PROGRESS, IO_SINK = 0, 1, 2


class Unsupported(BuildError):
    """The native core does not run this configuration; the message says why."""


# the hop fields the NIC's sink reads (controller.wire.int_md's names), in the C's order
SINK_FIELDS = ("node_id", "l1_ingress_port", "l1_egress_port", "hop_latency", "queue_occupancy")


def _sink_tables() -> dict[str, str]:
    """The INT-MD hop layout as the C's sink reads it, from int_md.HOP_METADATA: each
    instruction bit's unit size, and where each field of SINK_FIELDS sits (bit, shift, mask)."""
    sizes, where = [], {}
    for bit in range(16):
        unit = int_md.HOP_METADATA[bit]
        size = sum(w for _, w in unit) // 8
        sizes.append(size)
        shift = size * 8
        for name, width in unit:
            shift -= width
            if name in SINK_FIELDS:
                where[name] = (bit, shift, (1 << width) - 1)
    attrs = ", ".join(
        "{{{}, {}, {:#x}, {}}}".format(*where[name], i) for i, name in enumerate(SINK_FIELDS)
    )
    return {
        "HOP_UNIT_SIZES": "{" + ", ".join(map(str, sizes)) + "}",
        "SINK_ATTRS": "{" + attrs + "}",
        "SINK_ATTRS_N": str(len(SINK_FIELDS)),
    }


def defines() -> str:
    """The wire constants the C uses, from their one declaration in controller/wire (and the
    INT sink's names, from controller/nic/int_sink.py)."""
    values = {
        name: getattr(roce, name)
        for name in (
            "ROCE_UDP_PORT",
            "OP_SEND_FIRST",
            "OP_SEND_MIDDLE",
            "OP_SEND_LAST",
            "OP_SEND_ONLY",
            "OP_ACK",
            "OP_CNP",
            "AETH_ACK",
            "AETH_NAK_PSN_SEQ_ERR",
            "AETH_NAK_PSN_SEQ_ERR_SACK",
            "BTH_LEN",
            "AETH_LEN",
            "SACK_LEN",
            "CNP_LEN",
            "ICRC_LEN",
            "PSN_MASK",
            "DEFAULT_PKEY",
            "ICRC_LRH",
        )
    }
    values |= {
        "INT_TYPE_MD": int_md.INT_TYPE_MD,
        "SHIM_LEN": int_md.SHIM_LEN,
        "HEADERS_LEN": int_md.HEADERS_LEN,
        "PROBE_QPN": probe.PROBE_QPN,
        "MAX_INT": MAX_INT,
        "FB_MAX": _HEADERS + roce.BTH_LEN + roce.AETH_LEN + MAX_INT + roce.ICRC_LEN,
        "OUT_MAX": _HEADERS + roce.BTH_LEN + MTU_MAX + roce.ICRC_LEN,
        "DROPS_N": len(DROP_NAMES),
        "SEND_ERRNO_N": SEND_ERRNO_N,
        "MD_LEN": int_md.MD_LEN,
        "MD_WORDS": int_md.MD_WORDS,
        "HOP_ML_MAX": int_md.HOP_ML_MAX,
        "INT_VERSION": int_md.INT_VERSION,
        "INNER_PAYLOAD_BYTES": int_sink.INNER_PAYLOAD_BYTES,
        "SINK_ERRORS_N": len(int_sink.ERRORS),
        **{f"SINK_ERR_{e.upper()}": i for i, e in enumerate(int_sink.ERRORS)},
        **{f"SINK_WHY_{w.upper()}": i for i, w in enumerate(int_sink.TRIGGERS)},
    }
    return "".join(f"#define {k} {v}\n" for k, v in values.items())


def cdef() -> str:
    """What cffi reads: the constants and the header."""
    return defines() + HEADER.read_text()


def source() -> str:
    """The C with the header in place of its #include, after the constants."""
    tables = "".join(f"#define {k} {v}\n" for k, v in _sink_tables().items())  # not cffi's
    return defines() + tables + inline_headers(SOURCE, [HEADER])


@functools.lru_cache(maxsize=1)
def library() -> tuple[Any, Any]:
    """(ffi, lib), built once per process (and cached across them); BuildError if it cannot
    be built here."""
    if not SOURCE.is_file() or not HEADER.is_file():
        raise BuildError(f"{SOURCE.name} or {HEADER.name} is not beside {Path(__file__).name}")
    ffi, lib = build_library(source(), cdef(), "transport")
    fields = tuple(name for name, _ in ffi.typeof("struct xm_tp_counters").fields)
    if fields != _COUNTERS:
        raise BuildError(f"{HEADER.name}'s counters are not QpCounters' fields: {fields}")
    return ffi, lib


def unsupported(cfg: TransportConfig) -> str | None:
    """Why the native core cannot run `cfg` (None: it can)."""
    if cfg.retransmit != "gbn":
        return f"retransmit={cfg.retransmit!r} (the native core is go-back-N)"
    return None


def make_core(cfg: TransportConfig, seed: int, pipeline: str) -> tuple[TransportCore, str]:
    """The core `pipeline` asks for, and why not native when it was asked ("" when it is or
    was not): the reference where the native one cannot run `cfg` or cannot be built."""
    if pipeline not in PIPELINES:
        raise ValueError(f"transport pipeline must be one of {PIPELINES}, got {pipeline!r}")
    if pipeline == "native":
        try:
            return NativeTransportCore(cfg, seed), ""
        except BuildError as exc:
            return TransportCore(cfg, seed), str(exc)
    return TransportCore(cfg, seed), ""


class NativeQueuePair(QueuePair):
    """A queue pair whose state is the C's; the application's API as the reference's."""

    def __init__(
        self,
        core: NativeTransportCore,
        qpn: int,
        peer_ip: str,
        remote_qpn: int,
        sport: int,
        sq_psn: int,
        rq_psn: int,
    ) -> None:
        # not QueuePair.__init__: the protocol state it would make is the C's
        self.core = self._core = core
        self.qpn = qpn
        self.peer_ip = peer_ip
        self.peer_addr = socket.inet_aton(peer_ip)
        self.remote_qpn = remote_qpn
        self.sport = sport
        ffi, lib = core._ffi, core._lib
        index = lib.xm_tp_create_qp(
            core._tp, qpn, remote_qpn, sport, core.local_addr, self.peer_addr, sq_psn, rq_psn
        )
        if index < 0:
            raise MemoryError("the native transport core could not create a queue pair")
        self._index = index
        self._c = lib.xm_tp_qp(core._tp, index)
        self.counters = cast(QpCounters, self._c.c)  # the C struct: the same fields
        self.send_q: deque[SendOp] = deque()
        self._buffers: deque[Any] = deque()  # the posted data, alive while the C reads it
        self.recv_q: deque[ReceivedMessage] = deque()
        self.rtx_q: deque[int] = deque()  # go-back-N: never a selective resend
        self._ffi = ffi

    @property  # type: ignore[override]
    def local_addr(self) -> bytes:
        return bytes(self._ffi.buffer(self._c.local_addr, 4))

    @local_addr.setter
    def local_addr(self, addr: bytes) -> None:
        self._ffi.memmove(self._c.local_addr, addr, 4)

    def post_send(
        self,
        data: bytes | bytearray | memoryview,
        now: float,
        tag: object = None,
        size: int | None = None,
    ) -> SendOp:
        mv = memoryview(data).cast("B")
        total = len(mv) if size is None else size
        if total < len(mv):
            raise ValueError(f"message size {total} below its {len(mv)} bytes of data")
        npkts = max(1, -(-total // self.core.cfg.mtu))
        op = SendOp(mv, total, self.tail, npkts, now, tag)
        buf = self._ffi.from_buffer(mv)
        if self._core._lib.xm_tp_post(self._core._tp, self._index, buf, len(mv), total) < 0:
            raise MemoryError("the native transport core could not queue the message")
        self.send_q.append(op)
        self._buffers.append(buf)
        return op

    @property  # type: ignore[override]
    def store_bytes(self) -> int | None:
        store = int(self._c.store)
        return None if store == _STORE_ALL else store

    @store_bytes.setter
    def store_bytes(self, n: int | None) -> None:
        n = checked_store(n)
        self._c.store = _STORE_ALL if n is None else n

    @property
    def wants_to_send(self) -> bool:
        return bool(self._core._lib.xm_tp_wants_to_send(self._core._tp, self._index))

    def peek(self, now: float) -> bytes | None:
        core = self._core
        n = core._lib.xm_tp_peek(core._tp, self._index)
        return bytes(self._ffi.buffer(core._out, n)) if n else None

    def commit(self, now: float) -> None:
        self._core._lib.xm_tp_commit(self._core._tp, self._index, now)

    @property
    def deadline(self) -> float | None:
        c = self._c
        return c.last_progress + c.rto if self.una < self.high else None

    # the protocol state, read from the C (tests and tools; not on the per-packet path)
    una = property(lambda self: self._c.una)
    nxt = property(lambda self: self._c.nxt)
    high = property(lambda self: self._c.high)
    tail = property(lambda self: self._c.tail)
    epsn = property(lambda self: self._c.epsn)
    ident = property(lambda self: self._c.ident)
    rto = property(lambda self: self._c.rto)
    last_progress = property(lambda self: self._c.last_progress)
    rx_buf = property(lambda self: bytes(self._ffi.buffer(self._c.rx_buf, self._c.rx_len)))


class NativeTransportCore(TransportCore):
    """A host's queue pairs with the per-packet work in C; see the module's docstring."""

    pipeline = "native"

    def __init__(self, cfg: TransportConfig, seed: int) -> None:
        why = unsupported(cfg)
        if why is not None:
            raise Unsupported(why)
        ffi, lib = library()
        self._ffi, self._lib = ffi, lib
        ccfg = ffi.new(
            "struct xm_tp_cfg *",
            {
                "mtu": cfg.mtu,
                "window": cfg.window,
                "ack_every": cfg.ack_every,
                "psn_window": cfg.psn_window,
                "int_dscp": -1 if cfg.int_dscp is None else cfg.int_dscp,
                "tos": cfg.tos,
                "ttl": cfg.ttl,
                "sink": cfg.report_to is not None and cfg.int_dscp is not None,
                "max_message": cfg.max_message,
                "rto": cfg.rto,
                "rto_max": cfg.rto_max,
                "cnp_interval": cfg.cnp_interval,
                "sink_sample_s": cfg.report_sample_s,
                "sink_event_gap_s": cfg.report_event_gap_s,
                "sink_queue_bytes": cfg.report_queue_bytes,
                "sink_latency_ns": cfg.report_latency_ns,
                "sink_max_flows": cfg.report_max_flows,
            },
        )
        tp = lib.xm_tp_new(ccfg)
        if tp == ffi.NULL:
            raise MemoryError("the native transport core could not be allocated")
        self._tp = ffi.gc(tp, lib.xm_tp_free)
        self._out = self._tp.out
        self._at = ffi.new("double *")
        self._sent = ffi.new("uint32_t *")
        self._idx = ffi.new("uint32_t[]", 16)
        self._by_index: list[NativeQueuePair] = []
        self._drops_seen = [0] * len(DROP_NAMES)  # what `drops` holds of the C's counts
        self._drops_total_seen = 0
        self._sink_errors_seen = [0] * len(int_sink.ERRORS)  # and the sink's errors
        self._sink_errors_total_seen = 0
        super().__init__(cfg, seed)

    # the core's own counters live in the C
    rx_packets = property(
        lambda self: self._tp.rx_packets, lambda self, v: setattr(self._tp, "rx_packets", v)
    )
    probes_ignored = property(
        lambda self: self._tp.probes_ignored,
        lambda self, v: setattr(self._tp, "probes_ignored", v),
    )

    def _queue_pair(
        self, qpn: int, peer_ip: str, remote_qpn: int, sport: int, sq_psn: int, rq_psn: int
    ) -> QueuePair:
        qp = NativeQueuePair(self, qpn, peer_ip, remote_qpn, sport, sq_psn, rq_psn)
        self._by_index.append(qp)
        if len(self._by_index) > len(self._idx):
            self._idx = self._ffi.new("uint32_t[]", 2 * len(self._by_index))
        return qp

    def next_deadline(self) -> float | None:
        at = self._at
        return float(at[0]) if self._lib.xm_tp_next_deadline(self._tp, at) else None

    def restart_timer(self, qp: QueuePair, now: float) -> None:
        self._lib.xm_tp_restart_timer(self._tp, cast(NativeQueuePair, qp)._index, now)

    def expire(self, now: float) -> None:
        self._lib.xm_tp_expire(self._tp, now)

    def senders(self) -> list[QueuePair]:
        idx, qps = self._idx, self._by_index
        n = self._lib.xm_tp_senders(self._tp, idx)
        return [qps[idx[i]] for i in range(n)]

    def receive(self, pkt: memoryview | bytes, now: float) -> None:
        data = pkt if isinstance(pkt, bytes) else bytes(pkt)
        if self._lib.xm_tp_receive(self._tp, data, len(data), now):
            self._take()

    def _sink_counts(self) -> None:
        """The C sink's errors (by IntSink's names) and evictions into the sink's counters."""
        tp, sink = self._tp, self.sink
        assert sink is not None
        self._sink_errors_total_seen = tp.sink_errors_total
        seen = self._sink_errors_seen
        for i, name in enumerate(int_sink.ERRORS):
            n = tp.sink_errors[i]
            if n != seen[i]:
                sink.errors[name] += n - seen[i]
                seen[i] = n
        sink.flows_evicted = int(tp.sink_flows_evicted)

    # ---- the twin's NIC (testbed/sim/nic.py) ----

    def frame_sender(
        self, tc: tuple[int, int, int]
    ) -> Callable[[QueuePair, float, bytes, int], tuple[bytes, int]]:
        """`send(qp, now, eth, now_ns) -> (frame, IPv4 length)`: `qp`'s next data packet as the
        twin's host sends it, in one C call: peek, commit, the IPv4 header checksum, the
        Ethernet header `eth`, and tc egress, `tc` being the native NIC's `tc_entry()`."""
        ffi, lib, tp = self._ffi, self._lib, self._tp
        fn_addr, nic_addr, growth = tc
        fn = ffi.cast("uint32_t (*)(void *, uint8_t *, uint32_t, uint32_t, uint64_t)", fn_addr)
        nic = ffi.cast("void *", nic_addr)
        frame = tp.frame
        ip_len = ffi.new("uint32_t *")
        send_frame, buffer = lib.xm_tp_send_frame, ffi.buffer

        def send(qp: QueuePair, now: float, eth: bytes, now_ns: int) -> tuple[bytes, int]:
            index = cast(NativeQueuePair, qp)._index
            n = send_frame(tp, index, now, eth, fn, nic, now_ns, growth, ip_len)
            if not n:
                raise RuntimeError(f"queue pair {qp.qpn:#x} had no packet to send")
            return buffer(frame, n)[:], int(ip_len[0])

        return send

    # ---- the emulation's sockets (testbed/traffic/transport.py) ----

    def receive_from(self, fd: int, budget: int, now: float) -> int:
        """Up to `budget` packets from the raw socket `fd`, each `receive`d at `now`, read in
        batches in C; how many. OSError on what the reference's loop would raise."""
        got = self._lib.xm_tp_recv_batch(self._tp, fd, budget, now)
        if got < 0:
            raise OSError(-got, os.strerror(-got))
        if got:
            self._take()
        return int(got)

    def send_burst(self, qp: QueuePair, fd: int, most: int, now: float) -> tuple[int, int]:
        """Up to `most` of `qp`'s data packets sent on its raw socket `fd` (peek, sendto,
        commit, in C): (how many, the errno of the send that failed, 0 for none; that packet
        is not committed)."""
        sent = self._sent
        err = self._lib.xm_tp_send_burst(
            self._tp, cast(NativeQueuePair, qp)._index, fd, most, now, sent
        )
        return int(sent[0]), int(err)

    def _take(self) -> None:
        """Into Python what the last call made: completions, messages, feedback, drops."""
        lib, tp, ffi, qps = self._lib, self._tp, self._ffi, self._by_index
        nd, nm, nf, ns = tp.ndone, tp.nmsgs, tp.nfb, tp.nsink
        if ns:
            sink, evs = self.sink, tp.sink_ev
            assert sink is not None  # the C queues events only for a core with a sink
            triggers = int_sink.TRIGGERS
            for i in range(ns):
                e = evs[i]
                pkt = bytes(ffi.buffer(e.pkt, e.len))
                rep: bytes | None
                if e.kind == 0:  # what observe decided, in C
                    rep = sink.encode(triggers[e.why], pkt, e.int_off, e.t, bool(e.congested))
                else:
                    rep = sink.loss(pkt, e.int_off, e.t)
                if rep is not None:
                    self.reports.append(rep)
        if nd:
            dones = tp.done
            for i in range(nd):
                d = dones[i]
                qp = qps[d.qp]
                qp.send_q.popleft().t_done = d.t
                qp._buffers.popleft()
                if qp.watch is not None:
                    qp.watch.add(qp)
        if nm:
            msgs = tp.msgs
            for i in range(nm):
                m = msgs[i]
                qp = qps[m.qp]
                qp.recv_q.append(
                    ReceivedMessage(
                        bytearray(ffi.buffer(m.data, m.len)), m.size, m.t_first, m.t_done
                    )
                )
                if qp.watch is not None:
                    qp.watch.add(qp)
        if nf:
            fbs = tp.fb
            for i in range(nf):
                f = fbs[i]
                self.feedback.append(Outgoing(qps[f.qp], bytes(ffi.buffer(f.pkt, f.len))))
        if nd or nm or nf or ns:
            lib.xm_tp_taken(tp)
        if self.sink is not None and (
            tp.sink_errors_total != self._sink_errors_total_seen
            or tp.sink_flows_evicted != self.sink.flows_evicted
        ):
            self._sink_counts()
        if tp.drops_total != self._drops_total_seen:
            self._drops_total_seen = tp.drops_total
            seen = self._drops_seen
            for i, name in enumerate(DROP_NAMES):
                n = tp.drops[i]
                if n != seen[i]:
                    self.drops[name] += n - seen[i]
                    seen[i] = n


__all__ = [
    "DROP_NAMES",
    "NativeQueuePair",
    "NativeTransportCore",
    "Unsupported",
    "library",
    "make_core",
    "unsupported",
]
