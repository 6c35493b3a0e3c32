"""A host of the twin: its NIC (the tc egress INT source and pacer, the XDP rate law) and its
transport (the sans-I/O core and the workload's job), on the event loop.

- The NIC's programs: ebpf/tc_egress.c (INT source, each flow's counters and RTT probe) and
  ebpf/xdp_ingress.c (the rate laws) themselves, compiled for the process
  (testbed/sim/nic_native.py), or their Python reference (testbed/sim/nic_programs.py); tc
  sees every frame the host sends, XDP every feedback frame it receives.
- Pacer: each flow (5-tuple) sends at exactly its rate, earliest-departure-time first (as
  EDT pacing does: a packet's departure is the flow's previous one plus its length over the
  rate, never before now), and the NIC's port sends one frame at a time at the NIC's line
  rate. The NIC fetches a queue pair's next packet only when the flow may send it (a NIC
  pulls a message's data as its rate allows), so there is no NIC queue to overflow.
- PFC: with `pfc` on, a pause frame (controller/wire/pfc.py) arriving at a NIC stops that
  NIC's transmission for the pause's time (the frame on the wire finishes; a resume ends it
  early), as XDP records it (controller/nic/pfc.py, the reference of ebpf/lib/pfc.h): the
  fabric runs one priority, 0, so it holds data and feedback alike. `pfc_storm`
  makes a NIC that keeps pausing its switch (a stuck receive path), for the watchdog.
- Kernel: the IPv4 header checksum the kernel fills in for the transport's raw sockets, and
  Ethernet towards the gateway (the switch's router MAC).
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller.nic.backlog import WaitingMeter
from controller.nic.pfc import PfcNic
from controller.nic.prober import Prober
from controller.nic.ratelaw import CcParams, Law
from controller.wire.ipv4 import ETHERTYPE_IPV4, udp_packet, with_checksum
from controller.wire.pfc import MAX_QUANTA, is_mac_control, pfc_frame
from controller.wire.roce import OP_ACK, OP_CNP, OP_RC_DATA_MAX, ROCE_UDP_PORT
from controller.wire.telemetry_report import TELEMETRY_REPORT_PORT
from testbed.probes import Capture, RateEvent, record_int_frame
from testbed.sim.engine import EventLoop
from testbed.sim.native_loop import NativeEventLoop
from testbed.sim.nic_native import NativeNic
from testbed.sim.nic_programs import IntSource, ReferencePrograms
from testbed.traffic.jobs import Job
from testbed.traffic.transport_core import QueuePair, TransportCore
from testbed.traffic.transport_native import NativeTransportCore


@dataclass
class NicPort:
    """A host's NIC beyond the first: its address, Ethernet header, link and pacer state."""

    addr: bytes
    eth: bytes
    send: Callable[[bytes, int], bool]  # (frame, departure ns) -> sent? (over the MTU: not)
    busy_until: int = 0
    kick_at: int | None = None
    # PFC: the pauses the switch sent (XDP's xm_pfc), and pause frames this NIC sent
    pfc: PfcNic = field(default_factory=PfcNic)
    pfc_sent: int = 0
    tx_bytes: int = 0  # frames put on the link (the netdev's tx_bytes)


@dataclass
class FlowTx:
    """The pacer's state of a flow: its rate (the law's or the start rate the agent set, as
    the NIC's programs hold it in xm_rates) and its next departure."""

    next_ns: int = 0
    rate_bps: int = 0  # 0: the NIC's line rate (no rate set)
    gap_bps: int = 0  # the rate `next_ns` was paced at (its last packet's)


def flow_key(saddr: bytes, daddr: bytes, sport: int) -> tuple[int, int, int, int, int]:
    return (int.from_bytes(saddr, "big"), int.from_bytes(daddr, "big"), sport, ROCE_UDP_PORT, 17)


class SimHost:
    """One host: NIC 0 carries its transport (as the workloads use NIC 0 everywhere)."""

    def __init__(
        self,
        loop: EventLoop | NativeEventLoop,
        name: str,
        ip: str,
        mac: str,
        gateway_mac: str,
        line_rate_bps: float,
        hop_speeds: dict[tuple[int, int], int],
        send: Callable[[bytes, int], bool],
        int_source: IntSource,
        links: dict[tuple[int, int], str],
        nic_pipeline: str = "reference",
    ):
        """`hop_speeds`: (node id, port) -> bit/s of every switch port INT may report (the
        agent's xm_hop_speed); `nic_pipeline`: the NIC programs' code, `native` (tc egress and
        XDP compiled: testbed/sim/nic_native.py, the caller has checked that they build) or
        `reference` (Python: testbed/sim/nic_programs.py)."""
        self.loop = loop
        self.name = name
        self.ip = ip
        self.addr = socket.inet_aton(ip)
        self.eth = (
            bytes.fromhex(gateway_mac.replace(":", ""))
            + bytes.fromhex(mac.replace(":", ""))
            + ETHERTYPE_IPV4
        )
        self.line_rate_bps = int(line_rate_bps)
        self.ns_per_byte = 8e9 / line_rate_bps
        self.int_source = int_source
        self.links = links
        params = CcParams.defaults(Law.NONE, self.line_rate_bps)
        self.nic: NativeNic | ReferencePrograms
        if nic_pipeline == "native":
            self.nic = NativeNic(self.line_rate_bps, params, hop_speeds, int_source)
        else:
            self.nic = ReferencePrograms(self.line_rate_bps, params, hop_speeds, int_source)
        self.flows: dict[tuple[int, int, int, int, int], FlowTx] = {}
        self._qp_keys: dict[QueuePair, tuple[int, int, int, int, int]] = {}
        self._qp_flows: dict[QueuePair, FlowTx] = {}  # each queue pair's flow, looked up once
        # with the native NIC and transport core: a data packet's peek, commit, checksum and
        # tc egress in one C call (NativeTransportCore.frame_sender), else None
        self._send_frame: Callable[[QueuePair, float, bytes, int], tuple[bytes, int]] | None = None
        self.core: TransportCore | None = None
        self.job: Job | None = None
        self.done = True
        self.result: dict[str, Any] | None = None
        self.on_done: Callable[[], None] = lambda: None  # the job's part is done
        # the host's NICs: the first, and more on a multi-rail host (add_nic); each sends
        # the queue pairs whose source address is its own, on its own link
        # send: (frame, departure ns) -> the NIC's link towards its switch
        self.ports: list[NicPort] = [NicPort(self.addr, self.eth, send)]
        # what waited in the NICs (all of them), sampled by the operations loop
        self.meter = WaitingMeter(self.line_rate_bps)
        self._timer_at: int | None = None
        self.capture: Capture | None = None
        self.rate_events: list[RateEvent] | None = None
        self.rx_dropped = 0  # frames that are not for this host's transport
        self.tx_too_big = 0
        self.pfc = False  # honour pause frames (a lossless scheme)
        self.pfc_ignored = 0  # pause frames that arrived with PFC off
        self.mac_control_unknown = 0
        # the active prober (controller/nic/prober.py), and its probes waiting for the NIC
        self.prober: Prober | None = None
        self.probes_out: deque[bytes] = deque()

    # ---- control ----

    def set_law(self, params: CcParams) -> None:
        """SetRateLaw on the host: the new law for every flow; flows restart at line rate
        when their law changes (the NIC's XDP program re-initialises their states)."""
        self.nic.params = params
        for key, f in self.flows.items():
            f.rate_bps = 0
            self.nic.set_rate(key, 0)

    def add_nic(
        self, ip: str, mac: str, gateway_mac: str, send: Callable[[bytes, int], bool]
    ) -> NicPort:
        port = NicPort(
            socket.inet_aton(ip),
            bytes.fromhex(gateway_mac.replace(":", ""))
            + bytes.fromhex(mac.replace(":", ""))
            + ETHERTYPE_IPV4,
            send,
        )
        self.ports.append(port)
        self.meter.line_rate_bps += self.line_rate_bps
        return port

    def start_job(self, core: TransportCore, job: Job, t0_ns: int) -> None:
        self.core, self.job, self.done, self.result = core, job, False, None
        self.flows.clear()
        self.nic.reset()
        self._qp_keys.clear()
        self._qp_flows.clear()
        self._send_frame = None
        if isinstance(core, NativeTransportCore) and isinstance(self.nic, NativeNic):
            self._send_frame = core.frame_sender(self.nic.tc_entry())
        core.nic_rates = self  # the application reads its flows' rates (rate_bps)
        # the application's start rates: the flows are paced at them from their first packet,
        # as the agent's SetRate does on the emulation
        while core.rate_hints:
            qp, bps = core.rate_hints.popleft()
            self._start_rate(qp, max(self.nic.params.min_rate_bps, min(bps, self.line_rate_bps)))
        self.loop.at(t0_ns, self._start, job)

    def _start_rate(self, qp: QueuePair, bps: int) -> None:
        """`qp`'s flow paced at `bps` from its first packet."""
        key = flow_key(qp.local_addr, qp.peer_addr, qp.sport)
        self._flow(key).rate_bps = bps
        self.nic.set_rate(key, bps)

    def _flow_of(self, qp: QueuePair) -> FlowTx | None:
        """The pacer's state of `qp`'s flow, None if it has none yet."""
        key = self._qp_keys.get(qp)
        if key is None:
            key = self._qp_keys[qp] = flow_key(qp.local_addr, qp.peer_addr, qp.sport)
        return self.flows.get(key)

    def rate_bps(self, qp: QueuePair) -> int:
        """The rate the NIC sends `qp`'s flow at: its rate law's or start rate, the line rate
        where none is set (as the emulation's agent tells it, WatchRates)."""
        f = self._flow_of(qp)
        return f.rate_bps if f is not None and f.rate_bps else self.line_rate_bps

    def send_probe(self) -> None:
        """The prober's next probe, to the NIC (sent like the sink's reports: not paced)."""
        if self.prober is None or self.core is None:
            return
        out = self.prober.next_probe(self.loop.now_ns)
        if out is not None:
            self.probes_out.append(out[1])
            self._request_kick(self.ports[0], self.loop.now_ns)

    def _start(self, job: Job) -> None:
        job.start(self.loop.now)
        self._activity()

    # ---- the host's loop: job, timers, NIC ----

    def _activity(self) -> None:
        """Something happened (a packet, a timer, a start): let the job look, then the NIC."""
        core, job = self.core, self.job
        if core is None or job is None:
            return
        now = self.loop.now
        if not self.done and job.poll(now):
            self.done = True
            self.result = job.result(now)
            self.on_done()
        for port in self.ports:
            self._request_kick(port, self.loop.now_ns)
        wake = core.next_deadline()
        if not self.done and job.next_wake < (wake if wake is not None else float("inf")):
            wake = job.next_wake
        self._arm(wake)

    def _arm(self, wake: float | None) -> None:
        """A timer at `wake` (s), unless an earlier one is set."""
        if wake is not None and wake != float("inf"):
            # 1 ns past the deadline: the core and the job compare in float seconds
            t = max(self.loop.now_ns + 1, int(wake * 1e9) + 1)
            if self._timer_at is None or t < self._timer_at:
                self._timer_at = t
                self.loop.at(t, self._timer, t)

    def _timer(self, t: int) -> None:
        if t != self._timer_at:
            return  # superseded by an earlier timer
        self._timer_at = None
        if self.core is not None:
            self.core.expire(self.loop.now)
        self._activity()

    def _request_kick(self, port: NicPort, t: int) -> None:
        t = max(t, port.busy_until)
        if port.kick_at is not None and port.kick_at <= t:
            return
        port.kick_at = t
        self.loop.at(t, self._kick, port, t)

    def _kick(self, port: NicPort, t: int) -> None:
        if t != port.kick_at:
            return
        port.kick_at = None
        core = self.core
        if core is None:
            return
        now_ns = self.loop.now_ns
        if now_ns < port.busy_until:
            self._request_kick(port, port.busy_until)
            return
        pause = port.pfc.prio[0]
        if pause.holds(now_ns):  # the switch paused this NIC: nothing leaves
            self._request_kick(port, pause.pause_until_ns)
            return
        single = len(self.ports) == 1
        fb = core.feedback
        if core.reports and port is self.ports[0]:  # the NIC sink's Telemetry Reports
            self._send_report(port, core.reports.popleft(), core.cfg.report_to, now_ns)
            self._request_kick(port, port.busy_until)
            return
        if self.probes_out and port is self.ports[0]:  # tc gives them INT: data opcodes
            self._transmit(port, self.probes_out.popleft(), None, now_ns)
            self._request_kick(port, port.busy_until)
            return
        if fb:  # ACK/NAK/CNP: the default class, not paced per flow
            i = (
                0
                if single
                else next((i for i, o in enumerate(fb) if o.qp.local_addr == port.addr), -1)
            )
            if i >= 0:
                out = fb.popleft() if i == 0 else fb[i]
                if i:
                    del fb[i]
                self._transmit(port, out.packet, None, now_ns)
                self._request_kick(port, port.busy_until)
                return
        now = self.loop.now
        best = None
        best_t = 0
        flows = self._qp_flows
        best_f = None
        for qp in core.senders():
            if not single and qp.local_addr != port.addr:
                continue
            f = flows.get(qp)
            if f is None:  # a queue pair sends on its own NIC's port only: one flow
                f = flows[qp] = self._flow(flow_key(port.addr, qp.peer_addr, qp.sport))
            if best is None or f.next_ns < best_t or (f.next_ns == best_t and qp.qpn < best.qpn):
                best, best_t, best_f = qp, f.next_ns, f
        if best is None:
            return
        if best_t > now_ns:
            self._request_kick(port, best_t)
            return
        if self._send_frame is not None:  # the same steps in C
            frame, ip_len = self._send_frame(best, now, port.eth, now_ns)
            self._depart(port, frame, 14 + ip_len, now_ns, best_f)
        else:
            pkt = best.peek(now)
            assert pkt is not None
            best.commit(now)
            self._transmit(port, pkt, best.peer_addr, now_ns, best_f)
        # a packet in flight runs the retransmission timer, even if nothing ever comes back
        # (every packet lost: no ACK would arm it)
        self._arm(core.next_deadline())
        self._request_kick(port, port.busy_until)

    def _send_report(self, port: NicPort, payload: bytes, to: str | None, now_ns: int) -> None:
        """A Telemetry Report to the collector: IPv4/UDP from this NIC, as the emulation's
        transport sends it through the kernel (the default class, not paced)."""
        if to is None:
            return
        host, _, dport = to.rpartition(":")
        pkt = udp_packet(
            port.addr, socket.inet_aton(host), TELEMETRY_REPORT_PORT, int(dport), payload
        )
        port.busy_until = now_ns + int((14 + len(pkt)) * self.ns_per_byte)
        port.tx_bytes += 14 + len(pkt)
        if not port.send(port.eth + pkt, now_ns):
            self.tx_too_big += 1

    def _flow(self, key: tuple[int, int, int, int, int]) -> FlowTx:
        f = self.flows.get(key)
        if f is None:
            f = self.flows[key] = FlowTx()
        return f

    def _transmit(
        self,
        port: NicPort,
        pkt: bytes,
        peer: bytes | None,
        now_ns: int,
        flow: FlowTx | None = None,
    ) -> None:
        """tc egress (INT source, flow accounting; its RTT probe departs now: the pacer sends
        at the EDT time), the pacer and the wire. `flow`: the data packet's flow where the
        caller has it (else it is looked up from the packet's headers)."""
        pkt = with_checksum(pkt)
        frame = self.nic.egress(port.eth + pkt, now_ns)
        if pkt[28] <= OP_RC_DATA_MAX:  # a data packet (BTH opcode after IPv4 and UDP)
            flow = flow or self._flow(
                flow_key(pkt[12:16], pkt[16:20], int.from_bytes(pkt[20:22], "big"))
            )
        else:
            flow = None
        self._depart(port, frame, 14 + len(pkt), now_ns, flow)

    def _depart(
        self, port: NicPort, frame: bytes, paced_len: int, now_ns: int, flow: FlowTx | None
    ) -> None:
        """A frame leaves the NIC: the data packet's flow paced (`paced_len`: its bytes before
        INT, what the qdisc accounts), the port busy while it serializes, the link."""
        if flow is not None:
            rate = flow.rate_bps or self.line_rate_bps
            flow.next_ns = max(flow.next_ns, now_ns) + int(paced_len * 8e9 / rate)
            flow.gap_bps = rate
        port.busy_until = now_ns + int(paced_len * self.ns_per_byte)
        port.tx_bytes += len(frame)
        if not port.send(frame, now_ns):
            self.tx_too_big += 1  # over the link's MTU: lost, as the kernel would refuse it

    # ---- what the agent reads ----

    def sample_waiting(self) -> None:
        """What waits in the NIC now (the sum of the paced rates of the queue pairs with a
        packet to send), into its meter, as the agent samples its pacer's classes. A flow whose
        next departure is still ahead counts at the rate that set it, not at a rate its law
        raised since: the pacer holds it to the old pace until then (DCQCN's recovery raising
        flows paced at a few Mb/s after timeouts made healthy NICs look slow)."""
        line, now_ns = self.line_rate_bps, self.loop.now_ns
        waiting = 0
        if self.core is not None:
            for qp in self.core.senders():
                f = self._flow_of(qp)
                if f is None:
                    bps = line
                elif f.next_ns > now_ns:  # held to the pace its last packet set
                    bps = min(f.gap_bps or line, line)
                else:
                    bps = min(f.rate_bps or line, line)
                waiting += bps
        self.meter.sample(self.loop.now, waiting)

    def nic_counters(self) -> tuple[int, float, int]:
        """As the agent's GetNicCounters reads them now: bytes sent on the host's links, what
        waited in the NIC (bits), and the time PFC pauses held it."""
        now_ns = self.loop.now_ns
        return (
            sum(p.tx_bytes for p in self.ports),
            self.meter.bits,
            sum(p.pfc.prio[0].held_ns(now_ns) for p in self.ports),
        )

    # ---- PFC ----

    def _pause(self, nic: int, frame: bytes) -> None:
        """A MAC Control frame at NIC `nic`: XDP's record of a PFC pause holds priority 0."""
        if not self.pfc:
            self.pfc_ignored += 1
            return
        port = self.ports[nic]
        now = self.loop.now_ns
        if port.pfc.on_frame(frame, self.line_rate_bps, now) == ["PFC_MALFORMED"]:
            self.mac_control_unknown += 1
        self._request_kick(port, max(now, port.pfc.prio[0].pause_until_ns))

    def release_pauses(self) -> None:
        now = self.loop.now_ns
        for port in self.ports:
            port.pfc.release(now)

    def pfc_storm(self, start_ns: int, end_ns: int, period_ns: int, nic: int = 0) -> None:
        """From `start_ns` to `end_ns` the NIC keeps pausing its switch: a pause of the
        longest time every `period_ns` (a NIC whose receive path is stuck), then a resume."""
        port = self.ports[nic]
        mac = port.eth[6:12]

        def tick(t: int) -> None:
            last = t + period_ns >= end_ns
            port.pfc_sent += 1
            port.send(pfc_frame(mac, {0: 0 if last else MAX_QUANTA}), t)
            if not last:
                self.loop.at(t + period_ns, tick, t + period_ns)

        self.loop.at(start_ns, tick, start_ns)

    # ---- receiving ----

    def receive(self, frame: bytes, nic: int = 0) -> None:
        """A frame from the switch: XDP's rate law, the INT sampler, then the transport."""
        now_ns = self.loop.now_ns
        if is_mac_control(frame):
            self._pause(nic, frame)
            return
        if (
            len(frame) < 14 + 28
            or frame[12:14] != ETHERTYPE_IPV4
            or (frame[30:34] != self.addr and all(frame[30:34] != p.addr for p in self.ports))
        ):
            self.rx_dropped += 1
            return
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 17 or int.from_bytes(ip[ihl + 2 : ihl + 4], "big") != ROCE_UDP_PORT:
            self.rx_dropped += 1
            return
        if self.prober is not None and self.prober.receive_packet(ip, self.int_source.dscp):
            return  # a probe, for the NIC's prober (while a job runs: its agent's)
        opcode = ip[ihl + 8] if ip[1] >> 2 != self.int_source.dscp else OP_RC_DATA_MAX
        if opcode in (OP_ACK, OP_CNP) and self.nic.params.law != Law.NONE:
            key = flow_key(ip[16:20], ip[12:16], int.from_bytes(ip[ihl : ihl + 2], "big"))
            f = self._flow(key)
            rate = self.nic.ingress(frame, now_ns, key)
            if rate is not None and rate != f.rate_bps:
                f.rate_bps = rate
                if self.rate_events is not None:
                    self.rate_events.append(
                        RateEvent(
                            self.loop.now,
                            self.name,
                            (socket.inet_ntoa(ip[16:20]), socket.inet_ntoa(ip[12:16]), key[2]),
                            rate,
                            "law",
                        )
                    )
        elif ip[1] >> 2 == self.int_source.dscp and self.capture is not None:
            record_int_frame(self.capture, frame, self.loop.now, self.links)
        if self.core is not None:
            self.core.receive(ip, self.loop.now)
            self._activity()
