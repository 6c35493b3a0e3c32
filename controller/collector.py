"""The telemetry collector: a UDP server for Telemetry Report v2.0 and the fabric view it feeds.

Per reporting switch it counts reports received and lost — exactly, from the 22-bit sequence
numbers: a gap is counted lost at once, and un-counted if the missing report turns up late
(reordered); a report seen twice is a duplicate; a sequence that restarts (0, or a jump far
behind) is a switch restart, not a loss. Per directed link (named by its transmitting end, see
`controller.topology`) it keeps the queue occupancy, hop latency and tx utilisation reported by
INT, and the utilisation computed from port counters polled over P4Runtime. Per flow it keeps
the path (and how often it changed), its hop latencies and the congestion seen along it.
Reporters are the switches (their sinks) and the hosts' NICs (INT sinks of their own flows,
controller/nic/int_sink.py, with their address as node id); a NIC's report with the D flag
says packets of the flow were lost before it, on the path its INT names: those go into
`loss_events` (bounded), which the localizer votes with. Every time series is a bounded
deque; the number of flows is bounded too (the least recently seen are evicted and counted).

Malformed datagrams are counted by reason and skipped; nothing a peer sends can raise here.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.common.netns import in_netns
from controller.health import PathLoss
from controller.topology import Topology
from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.telemetry_report import (
    SEQ_BITS,
    Hop,
    IntReport,
    ReportError,
    decode,
    decode_inner,
)

log = logging.getLogger("xingmai.controller.collector")

SEQ_MOD = 1 << SEQ_BITS
# a departure that leaves this much queued behind it left a busy port (a few jumbo frames)
BUSY_QUEUE_BYTES = 16 * 1024
REORDER_WINDOW = 4096  # how far from the expected number a report still belongs to the stream


class SeqTracker:
    """Sequence accounting of one reporting node (node id, hardware id).

    Within the window around the expected number: a gap is counted lost at once and un-counted
    if the report turns up late; a number seen before is a duplicate. A 0 out of order is the
    reporter restarting (its pipeline reloaded), not a loss. Any other number outside the
    window moves nothing by itself — one corrupt or spoofed report must not count millions
    lost or reset the count — until a report follows it (its successor, or one within the
    window after it): then the stream really jumped (a long outage: counted lost) or went
    back (a restart: counted as one)."""

    def __init__(self, window: int = REORDER_WINDOW):
        self.window = window
        self.next: int | None = None
        self.received = 0
        self.lost = 0
        self.reordered = 0
        self.duplicates = 0
        self.resets = 0
        self.out_of_window = 0  # reports far from the stream that no report followed
        self.last_seq: int | None = None
        self._missing: OrderedDict[int, None] = OrderedDict()
        self._candidate: int | None = None  # a far number waiting for its successor

    def _gap(self, n: int) -> None:
        """The n numbers before `next + n` did not come: lost, the last `window` of them
        remembered in case they come late."""
        assert self.next is not None
        self.lost += n
        for s in range(max(0, n - self.window), n):
            self._missing[(self.next + s) % SEQ_MOD] = None
        while len(self._missing) > self.window:
            self._missing.popitem(last=False)  # stays counted lost

    def _restart(self, seq: int) -> None:
        self.resets += 1
        self._missing.clear()
        self.next = (seq + 1) % SEQ_MOD

    def see(self, seq: int) -> None:
        self.received += 1
        self.last_seq = seq
        if self.next is None:
            self.next = (seq + 1) % SEQ_MOD
            return
        ahead = (seq - self.next) % SEQ_MOD
        behind = SEQ_MOD - ahead
        if ahead == 0:
            self.next = (seq + 1) % SEQ_MOD
        elif ahead <= self.window:
            self._gap(ahead)
            self.next = (seq + 1) % SEQ_MOD
        elif seq in self._missing:
            del self._missing[seq]
            self.lost -= 1
            self.reordered += 1
        elif seq == 0:
            self._restart(seq)
        elif behind <= self.window:
            self.duplicates += 1
        elif self._candidate is not None and 0 < (seq - self._candidate) % SEQ_MOD <= self.window:
            # the stream followed the candidate (its successor, or within the window after
            # it: an overloaded socket keeps dropping after an outage): it jumped
            cand, self._candidate = self._candidate, None
            self.out_of_window -= 1  # the candidate was the stream after all
            jump = (cand - self.next) % SEQ_MOD
            if jump < SEQ_MOD // 2:
                self._gap(jump)  # the outage: lost
                self.next = (cand + 1) % SEQ_MOD
            else:
                self._restart(cand)  # it went back: a restart
            if seq != self.next:
                self._gap((seq - self.next) % SEQ_MOD)  # between the candidate and this one
            self.next = (seq + 1) % SEQ_MOD
        else:
            self._candidate = seq
            self.out_of_window += 1


@dataclass
class LinkTelemetry:
    """What INT and port counters say about one directed link (its egress queue)."""

    name: str
    capacity_bps: float
    qocc_bytes: int | None = None
    qocc_max_bytes: int = 0
    latency_ns: int | None = None
    latency_max_ns: int = 0
    util_int: float | None = None  # fraction of capacity, from INT bit 7
    util_counter: float | None = None  # fraction of capacity, from polled port counters
    tx_bps_counter: float | None = None
    samples: int = 0
    drops_reported: int = 0  # drop reports of the switch whose egress this is
    # INT's view of the port's latency monitor, summed over the hops that carried both a hop
    # latency and a queue occupancy: departures, their hop latencies, and what the queue they
    # saw explains at the link's nominal capacity (the controller's figure, not the switch's:
    # a port draining below its rate without a counter showing it still waits longer)
    int_departures: int = 0
    int_wait_ns: int = 0
    int_expected_ns: int = 0
    # and INT's tx utilisation of the departures that left a standing queue behind them
    # (BUSY_QUEUE_BYTES or more): a healthy port sends at its rate while it has a queue, a
    # slow one below it, whatever the queue does (a draining queue makes waits look long
    # against the dequeue depth INT carries)
    int_busy: int = 0
    int_busy_util_ppm: int = 0
    last_update: float = 0.0  # monotonic
    int_series: deque[tuple[float, int | None, int | None, float | None]] = field(
        default_factory=deque
    )  # (unix time, qocc bytes, latency ns, util)
    counter_series: deque[tuple[float, float, float]] = field(
        default_factory=deque
    )  # (unix time, tx bps, util)


@dataclass
class FlowRecord:
    key: tuple[str, str, int, int, int]  # src, dst, proto, sport, dport
    src_host: str | None
    dst_host: str | None
    first_seen: float  # monotonic
    last_seen: float
    reports: int = 0
    reported_bytes: int = 0
    path: list[tuple[int, int | None, int | None]] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    max_qocc_bytes: int = 0  # along the path, in the last report
    latency_ns: int = 0  # sum of the hop latencies along the path, in the last report
    latency_max_ns: int = 0
    path_changes: int = 0
    loss_reports: int = 0  # reports of packets lost before the reported one (NIC sinks)
    drops_reported: int = 0  # switches' drop reports of its packets
    reporter: str = ""  # who reported it last (the sink)
    series: deque[tuple[float, int, int]] = field(
        default_factory=deque
    )  # (unix time, max qocc bytes, sum of hop latency ns)


@dataclass
class NodeStats:
    node_id: int
    name: str
    seq: dict[int, SeqTracker] = field(default_factory=dict)  # by hw id
    last_report: float = 0.0

    def total(self, attr: str) -> int:
        return sum(getattr(t, attr) for t in self.seq.values())


class Collector:
    """With a topology, only its switches are reporters and only its links are tracked (what
    else a datagram names is counted in `errors`: unknown_node, unknown_link); without one,
    `max_nodes` and `max_links` bound them. Flows are bounded by `max_flows`, every series by
    `series_points`: nothing a peer sends grows the collector without bound."""

    def __init__(
        self,
        topo: Topology | None,
        int_dscp: int | None = INT_DSCP_DEFAULT,
        series_points: int = 600,
        max_flows: int = 10_000,
        max_nodes: int = 1024,
        max_links: int = 8192,
    ):
        self.topo = topo
        self.int_dscp = int_dscp
        self.series_points = series_points
        self.max_flows = max_flows
        self.max_nodes = max_nodes
        self.max_links = max_links
        self.nodes: dict[int, NodeStats] = {}
        self.links: dict[str, LinkTelemetry] = {}
        self.flows: OrderedDict[tuple[str, str, int, int, int], FlowRecord] = OrderedDict()
        self.datagrams = 0
        self.reports = 0
        self.errors: Counter[str] = Counter()
        self.flows_evicted = 0
        self.punted = 0  # INT packets received as packet-ins (sinks without a collector)
        self.loss_events: deque[PathLoss] = deque(maxlen=4096)
        self.drop_reports = 0  # reports with the D flag
        self.drop_reasons: Counter[int] = Counter()  # switches' drop reports by reason
        self.loss_reports = 0  # of them, NIC sinks' reports of a flow's packets lost
        self._counter_prev: dict[str, tuple[float, int]] = {}
        if topo is not None:
            for name, dl in topo.links.items():
                self._link(name, dl.capacity_bps)

    # ---- names ----

    def node_name(self, node_id: int | None) -> str:
        if node_id is None:
            return "?"
        if self.topo is not None:
            name = self.topo.by_node_id.get(node_id) or self.topo.nic_by_node_id.get(node_id)
            if name is not None:
                return name
        return f"node{node_id}"

    def _link(self, name: str, capacity_bps: float | None = None) -> LinkTelemetry | None:
        """The link's record, made on first use; None (counted) for a link the topology does
        not have, or one past `max_links` without a topology."""
        lt = self.links.get(name)
        if lt is None:
            if self.topo is not None and name not in self.topo.links:
                self.errors["unknown_link"] += 1
                return None
            if len(self.links) >= self.max_links:
                self.errors["too_many_links"] += 1
                return None
            if capacity_bps is None and self.topo is not None and name in self.topo.links:
                capacity_bps = self.topo.links[name].capacity_bps
            lt = LinkTelemetry(
                name,
                capacity_bps or 0.0,
                int_series=deque(maxlen=self.series_points),
                counter_series=deque(maxlen=self.series_points),
            )
            self.links[name] = lt
        return lt

    def link_of_hop(self, node_id: int | None, port: int | None) -> str | None:
        if node_id is None or port is None:
            return None
        return f"{self.node_name(node_id)}:{port}"

    # ---- ingest ----

    def ingest(self, data: bytes, now: float | None = None, wall: float | None = None) -> None:
        """One datagram. Never raises: malformed input is counted in `errors` by reason."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        self.datagrams += 1
        try:
            dg = decode(data, self.int_dscp)
        except ReportError as exc:
            self.errors[exc.reason] += 1
            log.debug("malformed report: %s", exc)
            return
        except Exception as exc:  # a decoder bug must not stop the collector
            self.errors["decoder_exception"] += 1
            log.warning("report decoder failed: %r", exc)
            return
        node = self.nodes.get(dg.node_id)
        if node is None:
            if (
                self.topo is not None
                and dg.node_id not in self.topo.by_node_id
                and dg.node_id not in self.topo.nic_by_node_id
            ):
                self.errors["unknown_node"] += 1
                return
            if len(self.nodes) >= self.max_nodes:
                self.errors["too_many_nodes"] += 1
                return
            node = self.nodes[dg.node_id] = NodeStats(dg.node_id, self.node_name(dg.node_id))
        tracker = node.seq.get(dg.hw_id)
        if tracker is None:
            tracker = node.seq[dg.hw_id] = SeqTracker()
        tracker.see(dg.seq)
        node.last_report = now
        for rep in dg.reports:
            self.reports += 1
            self._report(rep, now, wall)

    def _hop_sample(self, hop: Hop, now: float, wall: float) -> str | None:
        name = self.link_of_hop(hop.node_id, hop.out_port)
        if name is None:
            return None
        lt = self._link(name)
        if lt is None:
            return None
        lt.samples += 1
        lt.last_update = now
        if hop.qocc is not None:
            lt.qocc_bytes = hop.qocc
            lt.qocc_max_bytes = max(lt.qocc_max_bytes, hop.qocc)
        if hop.latency_ns is not None:
            lt.latency_ns = hop.latency_ns
            lt.latency_max_ns = max(lt.latency_max_ns, hop.latency_ns)
            if hop.qocc is not None and lt.capacity_bps > 0:
                lt.int_departures += 1
                lt.int_wait_ns += hop.latency_ns
                lt.int_expected_ns += round(hop.qocc * 8e9 / lt.capacity_bps)
                if hop.qocc >= BUSY_QUEUE_BYTES and hop.tx_util_ppm is not None:
                    lt.int_busy += 1
                    lt.int_busy_util_ppm += hop.tx_util_ppm
        if hop.tx_util_ppm is not None:
            lt.util_int = hop.tx_util_ppm / 1e6
        lt.int_series.append((wall, hop.qocc, hop.latency_ns, lt.util_int))
        return name

    def _drop_report(self, rep: IntReport, now: float) -> None:
        """A switch's drop report: the packet died at the reporter's egress port (its flow's
        path stops there, so the flow's path is left as it was)."""
        self.drop_reports += 1
        self.drop_reasons[rep.sink.drop_reason or 0] += 1
        name = self.link_of_hop(rep.node_id, rep.sink.out_port)
        lt = self._link(name) if name is not None else None
        if lt is not None:
            lt.drops_reported += 1
            if rep.sink.qocc is not None:
                lt.qocc_bytes = rep.sink.qocc
                lt.qocc_max_bytes = max(lt.qocc_max_bytes, rep.sink.qocc)
            lt.last_update = now
        rec = self.flows.get(rep.flow.astuple()) if rep.flow is not None else None
        if rec is not None:
            rec.drops_reported += 1

    def _report(self, rep: IntReport, now: float, wall: float) -> None:
        if rep.dropped and self.topo is not None and rep.node_id in self.topo.by_node_id:
            self._drop_report(rep, now)
            return
        path_hops = list(reversed(rep.hops)) + [rep.sink]  # oldest first, the sink last
        for hop in path_hops:
            self._hop_sample(hop, now, wall)
        if rep.flow is None:
            return
        key = rep.flow.astuple()
        rec = self.flows.get(key)
        if rec is None:
            owner = self.topo.ip_owner if self.topo is not None else {}
            rec = FlowRecord(
                key,
                owner.get(key[0]),
                owner.get(key[1]),
                now,
                now,
                series=deque(maxlen=self.series_points),
            )
            self.flows[key] = rec
            if len(self.flows) > self.max_flows:
                self.flows.popitem(last=False)
                self.flows_evicted += 1
        else:
            self.flows.move_to_end(key)
        rec.last_seen = now
        rec.reports += 1
        rec.reported_bytes += rep.inner_len
        path = [(h.node_id or 0, h.in_port, h.out_port) for h in path_hops]
        old_links = rec.links
        changed = bool(rec.path) and path != rec.path
        if changed:
            rec.path_changes += 1
        rec.path = path
        rec.links = self.path_links(path_hops)
        rec.reporter = self.node_name(rep.node_id)
        qmax = max((h.qocc for h in path_hops if h.qocc is not None), default=0)
        lat = sum(h.latency_ns for h in path_hops if h.latency_ns is not None)
        rec.max_qocc_bytes = qmax
        rec.latency_ns = lat
        rec.latency_max_ns = max(rec.latency_max_ns, lat)
        rec.series.append((wall, qmax, lat))
        if rep.dropped:
            self.drop_reports += 1
            if self.topo is not None and rep.node_id in self.topo.nic_by_node_id:
                rec.loss_reports += 1
                self.loss_reports += 1
                # packets lost as the flow moved were lost on the path it left (a link or
                # switch that died): the old path takes the vote
                links = old_links if changed and old_links else rec.links
                self.loss_events.append(PathLoss(now, key, tuple(links), qmax))

    def path_links(self, hops: Sequence[Hop]) -> list[str]:
        """Directed links of the path: the sender's uplink, then every hop's egress."""
        names: list[str] = []
        if hops and self.topo is not None:
            first = hops[0]
            if first.node_id is not None and first.in_port is not None:
                ing = self.topo.ingress_link(self.node_name(first.node_id), first.in_port)
                if ing is not None:
                    names.append(ing.name)
        for h in hops:
            name = self.link_of_hop(h.node_id, h.out_port)
            if name is not None and name not in names:
                names.append(name)
        return names

    def ingest_punted(
        self,
        node_id: int,
        ingress_port: int,
        frame: bytes,
        now: float | None = None,
        wall: float | None = None,
    ) -> None:
        """An INT packet a sink could not report (no collector route): the switch sent it to the
        controller as a packet-in, as the sink received it. Its INT still feeds the links and
        flows (no sequence number: nothing to count lost)."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        self.punted += 1
        if len(frame) < 14 or frame[12:14] != b"\x08\x00":
            self.errors["punted_not_ipv4"] += 1
            return
        rep = IntReport(
            0, 0, node_id, False, False, False, Hop(node_id=node_id, in_port=ingress_port)
        )
        try:
            decode_inner(frame[14:], self.int_dscp, rep)
        except ReportError as exc:
            self.errors[f"punted_{exc.reason}"] += 1
            return
        self.reports += 1
        self._report(rep, now, wall)

    # ---- port counters ----

    def port_counter(
        self,
        switch: str,
        port: int,
        tx_bytes: int,
        now: float | None = None,
        wall: float | None = None,
    ) -> None:
        """A port's transmitted-bytes counter read at `now`: utilisation over the interval."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        name = f"{switch}:{port}"
        prev = self._counter_prev.get(name)
        self._counter_prev[name] = (now, tx_bytes)
        if prev is None or now <= prev[0] or tx_bytes < prev[1]:
            return  # first reading, or the counter was reset (switch restart)
        bps = (tx_bytes - prev[1]) * 8 / (now - prev[0])
        cap = self.topo.port_speed_bps(switch, port) if self.topo is not None else 0.0
        lt = self._link(name, cap)
        if lt is None:
            return
        lt.tx_bps_counter = bps
        lt.util_counter = bps / cap if cap > 0 else None
        lt.counter_series.append((wall, bps, lt.util_counter or 0.0))

    # ---- views ----

    def active_flows(self, idle_s: float, now: float | None = None) -> list[FlowRecord]:
        now = time.monotonic() if now is None else now
        return [f for f in self.flows.values() if now - f.last_seen <= idle_s]

    def node_summary(self) -> list[dict[str, Any]]:
        return [
            {
                "node_id": n.node_id,
                "name": n.name,
                "received": n.total("received"),
                "lost": n.total("lost"),
                "reordered": n.total("reordered"),
                "duplicates": n.total("duplicates"),
                "resets": n.total("resets"),
                "out_of_window": n.total("out_of_window"),
                "last_seq": max((t.last_seq or 0 for t in n.seq.values()), default=0),
            }
            for n in sorted(self.nodes.values(), key=lambda n: n.node_id)
        ]

    def int_waits(self) -> dict[str, tuple[int, int, int, int, int]]:
        """Each directed link's INT latency totals so far (departures, hop latency ns, what
        their queues explain ns; departures that left a standing queue, the sum of their tx
        utilisation in ppm): the localizer's second latency monitor."""
        return {
            name: (
                lt.int_departures,
                lt.int_wait_ns,
                lt.int_expected_ns,
                lt.int_busy,
                lt.int_busy_util_ppm,
            )
            for name, lt in self.links.items()
            if lt.int_departures
        }

    def losses_since(self, seen: int) -> tuple[list[PathLoss], int]:
        """The loss events after the first `seen` (of `loss_reports`), and the new count: what
        the localizer has not been given yet (those the bounded deque dropped are skipped)."""
        new = self.loss_reports - seen
        events = list(self.loss_events)[-new:] if new > 0 else []
        return events, self.loss_reports

    @property
    def lost(self) -> int:
        return sum(n.total("lost") for n in self.nodes.values())


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, collector: Collector):
        self.collector = collector

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.collector.ingest(data)

    def error_received(self, exc: Exception) -> None:
        self.collector.errors["socket_error"] += 1
        log.warning("collector socket error: %s", exc)


def udp_socket(listen: str, netns: str | None = None) -> socket.socket:
    """A bound UDP socket for HOST:PORT, created inside network namespace `netns` (a name under
    /run/netns) when given: a socket stays in the namespace it was made in, so the collector can
    listen on a dataplane address while the daemon reaches the switches from its own."""
    host, _, port = listen.rpartition(":")
    if netns is None:
        return _bound(host, int(port))
    with in_netns(netns):
        return _bound(host, int(port))


def _bound(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind((host or "127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


async def serve_udp(
    collector: Collector, listen: str, netns: str | None = None
) -> asyncio.DatagramTransport:
    """The collector's UDP server on HOST:PORT (in network namespace `netns` if given)."""
    sock = udp_socket(listen, netns)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(collector), sock=sock)
    return transport
