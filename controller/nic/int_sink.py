"""The receiving NIC as INT sink for the monitoring path (sans-I/O).

A host NIC that is the INT sink of its flows' packets echoes their INT stacks to the sender
for the rate law (the transport does that) and, for the operators, sends Telemetry Report
v2.0 (controller/wire/telemetry_report.py) to the collector: not one per packet, but

- **sampled**: a flow's first INT packet, then one at least every `sample_s`;
- **event-triggered**: a packet that saw a queue above `queue_bytes` at some hop, or whose hop
  latencies add up to more than `latency_ns` (flag Q), at most one per flow per `event_gap_s`
  while the condition lasts, and at once when it starts; a packet whose path (the hops' node
  ids and ports) differs from the flow's last one;
- **a loss** (`loss`, flag D, drop reason `DROP_REASON_PSN_GAP`): the packet that revealed a
  gap in the flow's PSNs, once the transport knows the gap was a loss on the path its INT
  names and not a reordering (testbed/traffic/transport_core.py decides): what 007 votes
  with.

Within a **budget**: the triggers fire per flow, so a NIC with a thousand congested flows (an
all-to-all at 32 hosts) would send a report per flow every `event_gap_s`, and every NIC's
reports converge on the collector's port: measured on the twin, a 64-host all-to-all took
1.35-1.53 times as long with the reports as without, held by the spine's link towards the
collector. A NIC's report path is therefore rate-limited, as a switch's report mirror
session is: a token bucket of `budget_bps` (its depth `burst_bytes`) that every report but a
loss report draws from; a report made beyond it is not sent and takes no sequence number (so
the collector does not count it lost), counted in `suppressed` by trigger. Loss reports
always go: they are rare and what localization votes with.

Each datagram carries one report with this NIC's sequence number (22 bits, +1 per report,
so the collector counts the reports lost on the way), the NIC's node id (its IPv4 address,
`nic_node_id`), its own metadata (its receive time; the drop reason on a loss report) and the
inner packet from its IPv4 header to 16 bytes past the INT stack, as the switch's sink
(p4src/control/int_sink.p4) truncates it. The engines send what `observe` returns: the
emulation's transport over a UDP socket, the twin's host through its simulated link.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from controller.wire.int_md import BIT_INGRESS_TS, bitmap_bit, shim_total_len
from controller.wire.telemetry_report import (
    DROP_REASON_PSN_GAP,
    SEQ_BITS,
    Hop,
    IntReport,
    ReportError,
    decode_inner,
    encode_report,
    nic_node_id,
    report_size,
)

INNER_PAYLOAD_BYTES = 16  # of the packet after its INT stack (p4src REPORT_INNER_PAYLOAD_BYTES)
BIT_DROP = 15  # RepMdBits: drop queue id + reason
REP_MD_SAMPLE = bitmap_bit(BIT_INGRESS_TS)
REP_MD_DROP = bitmap_bit(BIT_INGRESS_TS) | bitmap_bit(BIT_DROP)
# the report path's burst: about ten reports of a 3-hop path (about 210 bytes each, framed) at once
REPORT_BURST_BYTES = 2048
REPORT_HEADERS = 14 + 20 + 8  # Ethernet, IPv4 and UDP around a report: what the budget counts too

Path = tuple[tuple[int | None, int | None, int | None], ...]
# what makes a report, and what `observe` counts in `errors`, each once (the native transport
# core's sink, testbed/traffic/transport_native.c, names them by their index here)
TRIGGERS = ("new", "path", "queue", "latency", "sample", "loss")
ERRORS = (
    "short",
    "no_flow",
    "inner_not_ipv4",
    "inner_truncated",
    "int_truncated",
    "int_bad_type",
    "int_bad_version",
    "int_bad_length",
    "int_bad_hop_ml",
)


@dataclass(frozen=True)
class SinkConfig:
    """When the NIC reports (seconds on the caller's clock; 0 turns a trigger off)."""

    sample_s: float = 0.1
    queue_bytes: int = 0
    latency_ns: int = 0
    event_gap_s: float = 0.01
    hw_id: int = 0
    max_flows: int = 4096
    budget_bps: float = 0.0  # the report path's rate limit (loss reports exempt); 0: none
    burst_bytes: int = REPORT_BURST_BYTES  # its token bucket's depth

    def __post_init__(self) -> None:
        if self.sample_s <= 0 or self.event_gap_s < 0:
            raise ValueError("sample_s must be > 0 and event_gap_s >= 0")
        if self.queue_bytes < 0 or self.latency_ns < 0 or self.max_flows < 1:
            raise ValueError("queue_bytes and latency_ns must be >= 0, max_flows >= 1")
        if not self.budget_bps >= 0 or self.burst_bytes < 0:
            raise ValueError("budget_bps and burst_bytes must be >= 0")


@dataclass
class _FlowState:
    path: Path
    last_report: float
    last_event: float | None = None  # the last report a queue/latency condition triggered
    in_event: bool = False


class IntSink:
    """One NIC's sink: `observe()` every INT data packet that arrives; it returns the report
    datagram to send to the collector (the UDP payload), or None."""

    def __init__(self, ip: str, cfg: SinkConfig, int_dscp: int):
        self.cfg = cfg
        self.node_id = nic_node_id(ip)
        self.int_dscp = int_dscp
        self.seq = 0
        self.flows: OrderedDict[tuple[bytes, int, int], _FlowState] = OrderedDict()
        self.reports: Counter[str] = Counter()  # by trigger
        self.suppressed: Counter[str] = Counter()  # made beyond the budget, not sent
        self._tokens = float(cfg.burst_bytes)  # the budget's bucket, bytes
        self._tokens_t: float | None = None  # when it was last filled
        self.errors: Counter[str] = Counter()  # packets the sink could not read
        self.flows_evicted = 0

    def observe(self, pkt: bytes | memoryview, int_off: int, now: float) -> bytes | None:
        """An IPv4 packet with INT at `int_off` (its shim) arrived at `now`: its report when
        one of the triggers above fires."""
        parsed = self._parse(pkt, int_off)
        if parsed is None:
            return None
        inner, rep = parsed
        queue, slow = self._conditions(rep)
        event = queue or slow
        path: Path = tuple((h.node_id, h.in_port, h.out_port) for h in rep.hops)
        assert rep.flow is not None
        key = (bytes(pkt[12:16]), rep.flow.sport, rep.flow.dport)
        st = self.flows.get(key)
        cfg = self.cfg
        why = None
        if st is None:
            why = "new"
            st = self.flows[key] = _FlowState(path, now)
            if len(self.flows) > cfg.max_flows:
                self.flows.popitem(last=False)
                self.flows_evicted += 1
        else:
            self.flows.move_to_end(key)
            if path != st.path:
                why = "path"
            elif event and (
                not st.in_event or st.last_event is None or now - st.last_event >= cfg.event_gap_s
            ):
                why = "queue" if queue else "latency"
            elif now - st.last_report >= cfg.sample_s:
                why = "sample"
        st.in_event = event
        if why is None:
            return None
        st.path = path
        st.last_report = now
        if event:
            st.last_event = now
        return self.encode(why, inner, int_off, now, event)

    def loss(self, pkt: bytes | memoryview, int_off: int, t: float) -> bytes | None:
        """The report of a loss: `pkt` (INT at `int_off`) arrived at `t` after a gap in its
        flow's PSNs that the transport has since found to be a loss (one report per gap)."""
        parsed = self._parse(pkt, int_off)
        if parsed is None:
            return None
        inner, rep = parsed
        return self.encode("loss", inner, int_off, t, any(self._conditions(rep)))

    def _parse(self, pkt: bytes | memoryview, int_off: int) -> tuple[bytes, IntReport] | None:
        """The packet's inner part as a report carries it, and its INT decoded (None: counted
        in `errors`)."""
        pkt = bytes(pkt)
        if len(pkt) < int_off + 2:
            self.errors["short"] += 1
            return None
        end = int_off + shim_total_len(pkt[int_off + 1]) + INNER_PAYLOAD_BYTES
        inner = pkt[: min(end, len(pkt))]
        inner = inner[: len(inner) & ~3]
        rep = IntReport(0, 0, 0, False, False, False, Hop())
        try:
            decode_inner(inner, self.int_dscp, rep)
        except ReportError as exc:
            self.errors[exc.reason] += 1
            return None
        if rep.flow is None:
            self.errors["no_flow"] += 1
            return None
        return inner, rep

    def _conditions(self, rep: IntReport) -> tuple[bool, bool]:
        """(a hop's queue over `queue_bytes`, the hop latencies over `latency_ns`)."""
        cfg = self.cfg
        qmax = max((h.qocc for h in rep.hops if h.qocc is not None), default=0)
        latency = sum(h.latency_ns for h in rep.hops if h.latency_ns is not None)
        return (
            cfg.queue_bytes > 0 and qmax > cfg.queue_bytes,
            cfg.latency_ns > 0 and latency > cfg.latency_ns,
        )

    def encode(
        self, why: str, inner: bytes, int_off: int, t: float, congested: bool
    ) -> bytes | None:
        """The report `why` (TRIGGERS) of `inner` (the packet as a report carries it, INT at
        `int_off`) at `t`; `congested`: its Q flag. Counted, and the next sequence number;
        None (counted in `suppressed`) where the budget has no room for it."""
        bits = REP_MD_DROP if why == "loss" else REP_MD_SAMPLE
        size = REPORT_HEADERS + report_size(len(inner), bits)
        if why != "loss" and not self._within_budget(size, t):  # checked before it is made
            self.suppressed[why] += 1
            return None
        md = {"ingress_ts": int(t * 1e9) & ((1 << 64) - 1)}
        if why == "loss":
            md.update(drop_queue_id=0, drop_reason=DROP_REASON_PSN_GAP, drop_padding=0)
        seq = self.seq
        rep = encode_report(
            hw_id=self.cfg.hw_id,
            seq=seq,
            node_id=self.node_id,
            inner=inner,
            rep_md_bits=bits,
            metadata=md,
            dropped=why == "loss",
            congested=congested,
            tracked=True,
            domain_id=int.from_bytes(inner[int_off + 10 : int_off + 12], "big"),
        )
        self.reports[why] += 1
        self.seq = (seq + 1) % (1 << SEQ_BITS)
        return rep

    def _within_budget(self, size: int, t: float) -> bool:
        """Whether the bucket, filled at `budget_bps` since it last was, holds `size` bytes
        (then they are taken)."""
        rate = self.cfg.budget_bps
        if rate <= 0:
            return True
        if self._tokens_t is not None and t > self._tokens_t:
            self._tokens = min(
                float(self.cfg.burst_bytes), self._tokens + (t - self._tokens_t) * rate / 8
            )
        self._tokens_t = t if self._tokens_t is None else max(t, self._tokens_t)
        if self._tokens < size:
            return False
        self._tokens -= size
        return True
