"""Fault detection and localization: the controller's view of what is broken, as ranked
suspects with evidence, and which links are dead (for fail-over). Sans-I/O: the daemon feeds
it what it polls from the switches over P4Runtime and SwitchAdmin, the twin feeds it the same
numbers read in process; both call `evaluate(now)` at their own clock.

What each suspect rests on:
- **switch unreachable**: its P4Runtime channel is down or a poll is refused, and it stays so
  for `dead_after_s`; or it answers no poll in time for `silent_after_s` (a timeout is weaker
  evidence than a refusal: a busy switch, or a controller that was itself late, answers late);
  every link of it is dead.
- **link down**: a port at either end reports its link down (oper status).
- **lossy link**: a port receiving corrupted frames (its FCS error counter, as a MAC counts
  them) beyond `min_loss` of what it received. Counters, not packets: every flow on the link
  counts, whatever its path. (Comparing one end's egress counter with the other end's
  ingress counter, for silent drops, needs readings closer in time than two busy switch
  processes give: in the emulation frames waiting in a switch's socket buffer read as lost.)
- **slow link / slow switch**: a port's departures waited longer than the bytes queued ahead
  of them explain at the port's rate (its latency monitor: INT's hop latency against its queue
  occupancy, summed per port). A port that drains below its rate (`rate` fault) or holds every
  frame (`delay`) shows it; a switch with most of its busy ports slow is the suspect, not
  each of its links (ports counted over `hold_s`: a spine's ports are often busy in turns).
- **lossy link, by vote** (007): each receiving NIC reports a gap in a flow's PSNs with the
  path its next packet took (its INT, controller/nic/int_sink.py), once the missing packet
  came only when resent (a late one was reordered, not lost); every such loss gives each
  link of its path an equal share of one vote, and the link with the most votes explains the
  losses that crossed it (greedily, as 007 does; links with the top vote, which no path tells
  apart, share the blame; a link named by the vote alone ranks below any link the counters
  name). A loss whose path held a queue near full is a tail drop of congestion, not a fault,
  and does not vote; a link is named only for losses of at least `min_vote_flows` flows and
  `min_vote_loss` of the frames it carried; a loss whose flow's path just changed counts for
  the path it left. This sees what counters cannot: a drop that no port
  counts (a silent drop), or one on a host's downlink, whose receiving end no switch polls.
- **lossy link, by probe** (Pingmesh, NetBouncer): the hosts' active probers
  (controller/nic/prober.py) send probes to the other hosts (up to 32, from every leaf) over
  many source ports, hence over every path between their leaves; each receiver counts a
  probe flow's losses exactly from its sequence numbers, on the path its probes' INT names.
  Over the vote window each directed link's loss rate is the probes lost over the probes
  sent on the flows that cross it; the link with the highest rate (links that no path tells
  apart tie) is named and the flows it explains are set aside, greedily, for at least
  `min_probe_losses` probes lost at `min_probe_loss`. A loss revealed by a probe that saw a
  queue near full is a tail drop of congestion, and one revealed while the receiving
  agent's socket dropped packets may be the host's: neither counts. Probes cross links that
  no traffic uses, and are not resent: no go-back-N hides a loss behind another.
- **slow NIC**: a host's NIC sent less than its flows waiting in it were paced at over the
  window (its agent counts the bytes its link sent, and samples which flows have packets
  queued in the NIC and their rates every 50 ms: controller/nic/backlog.py), with no PFC
  pause holding it: a NIC that cannot keep up (a downgraded PCIe link, a throttled port)
  holds its flows' packets at home, where no switch counter and no INT record sees them, and
  an INT or ECN law, seeing no queue in the fabric, keeps their rates.
Scores are in [0, 1] and rank the suspects; `first_named` is when a suspect first appeared.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.topology import DirLink, Topology, link_id
from controller.wire.telemetry_report import Hop

log = logging.getLogger("xingmai.controller.health")


@dataclass(frozen=True)
class PortSample:
    port: int
    up: bool = True
    tx_packets: int | None = None  # egress frames (P4 port_tx); None: not read
    rx_packets: int | None = None  # ingress frames (P4 port_rx)
    rx_errors: int = 0  # frames received corrupted (FCS errors), dropped before ingress
    departures: int = 0  # the port's latency monitor (SwitchAdmin GetQueues)
    wait_ns: int = 0
    expected_wait_ns: int = 0
    paused_ns: int = 0  # the time PFC pauses it received held its egress (GetQueues)


@dataclass(frozen=True)
class SwitchSample:
    switch: str
    t: float  # seconds, the caller's clock, when the switch answered
    ports: dict[int, PortSample]


@dataclass(frozen=True)
class PathLoss:
    """A receiving NIC saw packets of a flow lost (a gap in its PSNs) at time `t`, on the
    path the next packet's INT names: directed links (the collector's names), sender first."""

    t: float
    flow: tuple[str, str, int, int, int]
    links: tuple[str, ...]
    max_qocc_bytes: int = 0  # the largest queue on the path (near full: congestion)


@dataclass(frozen=True)
class ProbeTally:
    """A probe flow as its receiver counts it at `t`, since the flow began: probes received
    and lost (of them, lost behind a queue near full), on the path its latest probe took
    (directed links, the collector's names, sender first)."""

    t: float
    flow: tuple[str, str, int]  # sender, receiver, source port
    links: tuple[str, ...]
    received: int
    lost: int
    lost_congested: int = 0
    lost_local: int = 0  # of lost, while the receiver's socket dropped packets


@dataclass(frozen=True)
class ProbeFlowSample:
    """A probe flow as its receiving NIC counts it (its agent's GetProbes; the twin's prober's
    `ProbeFlowRx` has the same fields): the sender's address and source port, probes received
    and lost since the flow began (of them, lost behind a queue near full), and the INT hops
    of its latest probe, the sender's first hop first."""

    src: str
    sport: int
    received: int
    lost: int
    lost_congested: int
    hops: tuple[Hop, ...]
    lost_local: int = 0


def probe_tallies(
    t: float,
    receiver: str,
    flows: Iterable[Any],
    host_of_ip: Mapping[str, str],
    path_links: Callable[[list[Any]], list[str]],
) -> list[ProbeTally]:
    """A receiving NIC's probe flows at `t` (ProbeFlowSample, or the twin's prober's
    `ProbeFlowRx`, which has the same fields) as the localizer reads them: senders by host
    name, paths as the collector names the links (`Collector.path_links`)."""
    return [
        ProbeTally(
            t,
            (host_of_ip.get(f.src, f.src), receiver, f.sport),
            tuple(path_links(list(f.hops))),
            f.received,
            f.lost,
            f.lost_congested,
            f.lost_local,
        )
        for f in flows
    ]


def probe_congested_bytes(queue_depth_bytes: int, th: Thresholds | None = None) -> int:
    """The queue at which a probe's gap counts as a tail drop of congestion (the probers'
    `congested_bytes`): the same share of the queue depth as a path loss's."""
    return int((th or Thresholds()).congested_share * queue_depth_bytes)


@dataclass(frozen=True)
class NicSample:
    """What a host's agent reads from its NIC at `t` (GetNicCounters; the twin's NIC): the
    bytes its link(s) sent, what waited in it (the time integral of the paced rates of its
    flows with packets queued, at most its line rate, in bits: controller/nic/backlog.py),
    and the time PFC pauses held it; all since a start of the NIC's own."""

    host: str
    t: float
    tx_bytes: int
    waiting_bits: float
    line_rate_bps: float  # the NIC's nominal rate, all of its links together
    paused_ns: int = 0


@dataclass
class Suspect:
    element: str  # "switch spine1", "link leaf1:3-spine1:1", "nic h3"
    kind: str  # switch-unreachable | link-down | lossy-link | slow-link | slow-switch | slow-nic
    score: float
    evidence: str
    first_named: float = 0.0
    last_named: float = 0.0


@dataclass(frozen=True)
class Thresholds:
    window_s: float = 2.0  # counters and latency are compared over this long
    dead_after_s: float = 0.3  # a switch refusing polls this long is unreachable
    silent_after_s: float = 3.0  # a switch answering no poll in time this long is unreachable
    min_errors: int = 3  # receive errors before a link is called lossy, and
    min_loss: float = 0.003  # 0.3 % of the frames it received
    min_departures: int = 20  # a latency estimate needs this many departures
    # A port is slow when its frames wait this many frame times (at its rate) beyond what
    # its queue explains and beyond the fabric's median, and wait_ratio times what the queue
    # explains. Over five healthy default suites on the emulation's 2-core box (6,819
    # windows replayed from their Prometheus data) 0.75 frame times marked a link in 21
    # windows, 1.25 in 4; the 25 % link of the operations test stays marked in all its 31
    # windows up to 2.0 (docs/operations.md).
    excess_frames: float = 1.25
    wait_ratio: float = 1.5
    # INT's rule (the controller's figures: hop latency against the queue INT saw, at the
    # link's nominal rate): a port draining at 70 % of its rate waits 1.43 times what its
    # queue explains; healthy links on the twin's WebSearch stay within 1.07 where their
    # queue is more than a few frames (the excess threshold above keeps out the rest)
    int_wait_ratio: float = 1.25
    int_excess_frames: float = 2.0  # and this many frame times beyond the fabric's median
    # and, confirming it, the port sent below this share of its rate while it had a queue
    # (INT's tx utilisation of departures that left one behind, at least int_min_busy of
    # them): a healthy port draining a deep queue waits long against the dequeue depth INT
    # carries, but sends at its rate (the twin's DCQCN incast at 1/20000: 450 ms waited
    # against 97 ms explained on h1's link, named slow without this)
    int_busy_util: float = 0.9
    int_min_busy: int = 10
    switch_share: float = 0.6  # a switch is slow when this share of its busy ports is
    # A port counts towards its switch's slowness on weaker evidence than a slow link: its
    # frames wait this many frame times beyond their queue and this many times what it
    # explains. A switch that holds every frame for d adds about d * (1 - load) beyond each
    # frame's queue, and on a busy port the queue ahead (held too) explains most of the wait:
    # a 5 ms spine on the emulation showed 5.9-6.1 ms waited against 3.9-4.8 ms explained on
    # its busy port (0.66-0.84 frame times beyond, ratios 1.23-1.29) for half a second, which
    # the link rule missed (for 5 s in a full test run). Healthy ports of that run: 0.06-0.18
    # frame times beyond. The emulation's default suite under PFC showed 1.3 frame times at
    # ratios 1.05-1.16 on every port of a leaf, and 0.54 on a quiet host port: not a slow
    # switch, which the ratio and the frame times keep out.
    switch_excess_frames: float = 0.6
    switch_wait_ratio: float = 1.2
    hold_s: float = 3.0  # a suspect not seen again for this long is cleared
    vote_window_s: float = 4.0  # path losses are voted over this long
    min_vote_flows: int = 3  # a link is named by vote for losses of this many flows,
    min_vote_losses: int = 5  # at least this many losses,
    # and 0.4 % of the frames the link carried. A NIC reports a loss per gap in a flow's
    # PSNs, and go-back-N hides the losses that follow one until it is resent, so a link
    # losing p of its frames shows about p/2 to 2p/3: on the emulation's WebSearch a silent
    # loss of 1 % showed 0.62 % and 2 % showed 1.2 %, while the losses other links
    # explained beside them (go-back-N's bursts of resends meeting full queues) stayed
    # at 0.22-0.29 %, and healthy runs showed none (the NICs' reorderings, once counted
    # as losses at 0.5-1.4 % of a link's frames, are not reported since commit 99c1f2f)
    min_vote_loss: float = 0.004
    # links within this share of the top vote share the blame: links that no path tells
    # apart get the same votes (the same losses crossed them); at 0.8 a host whose flows took
    # most of a faulty spine link's losses (2.5 votes against the link's 3.0, on the twin's
    # silent loss of 5 %) was blamed beside it
    tie_ratio: float = 0.99
    congested_share: float = 0.5  # a loss whose path held a queue this share of the
    #                               queue depth is a tail drop of congestion
    # A link is named by the probes for this many probes lost on the flows that cross it
    # and this share of the probes they sent (not counting tail drops of congestion): probes
    # are not resent, so a loss is counted once and exactly
    min_probe_losses: int = 5
    min_probe_loss: float = 0.001
    # A NIC is slow when it sent less than this share of what its waiting flows were paced
    # at over the window (the integral of their rates, each at most its line rate, the whole
    # too), and that shortfall is at least `min_nic_shortfall` of its line rate, PFC holding
    # it less than `nic_paused_share` of the window. A NIC at 70 % of its rate sends 0.7 of
    # it. The shortfall's floor is the emulation's: its healthy NICs at low load sent 0.6-0.77
    # of what waited in them over 2 s (1 Mb/s short of 2.7-4.6, a twentieth of their line
    # rate: a loaded box's HTB timers firing late), NICs at half their rate 2-8 Mb/s short.
    nic_sent_share: float = 0.8
    min_nic_shortfall: float = 0.1
    nic_paused_share: float = 0.1


@dataclass
class _History:
    samples: deque[SwitchSample] = field(default_factory=deque)
    last_seen: float | None = None
    unreachable_since: float | None = None


class Localizer:
    def __init__(
        self,
        topo: Topology,
        mtu_bytes: int = 4154,
        thresholds: Thresholds | None = None,
        on_event: Callable[[str, Suspect], None] | None = None,
    ):
        self.topo = topo
        self.mtu_bytes = mtu_bytes
        self.th = thresholds or Thresholds()
        self.on_event = on_event or (lambda what, s: None)
        self._hist: dict[str, _History] = {s: _History() for s in topo.switches}
        self.suspects: dict[str, Suspect] = {}  # current, by element
        # every suspect ever named: when it was first named (a suspect that cleared and came
        # back keeps it), its latest score, evidence and naming
        self.named: dict[str, Suspect] = {}
        self._dead_links: set[str] = set()
        self._now = 0.0
        self._losses: deque[PathLoss] = deque(maxlen=8192)
        self.losses_seen = 0
        self.losses_congested = 0  # tail drops of a full queue: not voted
        # when each port was last slow and last busy (the slow-switch rule's memory)
        self._slow_at: dict[tuple[str, int], float] = {}
        self._busy_at: dict[tuple[str, int], float] = {}
        # the collector's INT latency totals per directed link, (time, totals) over two windows
        self._int: deque[tuple[float, dict[str, tuple[int, int, int, int, int]]]] = deque()
        self._nics: dict[str, deque[NicSample]] = {h.name: deque() for h in topo.cfg.hosts}
        # each probe flow's tallies over the vote window (its first kept at or before the
        # window's start)
        self._probes: dict[tuple[str, str, int], deque[ProbeTally]] = {}

    # ---- input ----

    def observe(self, sample: SwitchSample) -> None:
        h = self._hist.get(sample.switch)
        if h is None:
            return  # a switch the topology does not know: nothing to localize
        h.samples.append(sample)
        h.last_seen = sample.t
        h.unreachable_since = None
        keep = self.th.window_s * 2
        while len(h.samples) > 2 and sample.t - h.samples[1].t >= keep:
            h.samples.popleft()

    def int_waits(self, t: float, totals: dict[str, tuple[int, int, int, int, int]]) -> None:
        """The collector's INT totals at `t` per directed link (`Collector.int_waits`):
        departures, their hop latencies and what their queues explain at the link's nominal
        capacity, in ns; the departures that left a standing queue and their tx utilisation
        summed, in ppm."""
        self._int.append((t, totals))
        while len(self._int) > 2 and t - self._int[1][0] >= self.th.window_s * 2:
            self._int.popleft()

    def nic(self, sample: NicSample) -> None:
        """A host's NIC counters (its agent's GetNicCounters; the twin's NIC)."""
        q = self._nics.get(sample.host)
        if q is None:
            return  # a host the topology does not know
        q.append(sample)
        while len(q) > 2 and sample.t - q[1].t >= self.th.window_s:
            q.popleft()

    def probes(self, tallies: list[ProbeTally]) -> None:
        """The probe receivers' tallies (every probe flow's, read at once)."""
        for tally in tallies:
            q = self._probes.get(tally.flow)
            if q is None:
                q = self._probes[tally.flow] = deque()
            q.append(tally)
            while len(q) > 2 and tally.t - q[1].t >= self.th.vote_window_s:
                q.popleft()

    def path_loss(self, loss: PathLoss) -> None:
        """A receiving NIC's loss report (the collector's loss events)."""
        self.losses_seen += 1
        depth = self.topo.cfg.model.queue_depth_bytes
        if loss.max_qocc_bytes >= self.th.congested_share * depth:
            self.losses_congested += 1
            return
        self._losses.append(loss)

    def alive(self, switch: str, t: float) -> None:
        """The switch answered at `t` but gave no counters (part of its poll timed out)."""
        h = self._hist.get(switch)
        if h is not None:
            h.last_seen = t
            h.unreachable_since = None

    def paused(self, seconds: float) -> None:
        """The caller could not observe the switches for `seconds` (its own loop was late):
        that time does not count towards any switch's silence."""
        for h in self._hist.values():
            if h.last_seen is not None:
                h.last_seen += seconds
            if h.unreachable_since is not None:
                h.unreachable_since += seconds

    def unreachable(self, switch: str, t: float) -> None:
        """The switch's channel went down or a poll was refused at `t` (not: it was late)."""
        h = self._hist.get(switch)
        if h is not None and h.unreachable_since is None:
            h.unreachable_since = t

    # ---- output ----

    def dead_links(self) -> set[str]:
        """Undirected links (link_id) that must carry nothing: down, or at a dead switch."""
        return set(self._dead_links)

    def ranked(self) -> list[Suspect]:
        """Suspects the last evaluation found first (then those held), by score."""
        return sorted(
            self.suspects.values(),
            key=lambda s: (s.last_named < self._now, -s.score, s.first_named, s.element),
        )

    def evaluate(self, now: float) -> list[Suspect]:
        self._now = now
        found: dict[str, tuple[str, float, str]] = {}  # element -> (kind, score, evidence)
        dead_switches = self._dead_switches(now)
        dead: set[str] = set()
        for sw, since in dead_switches.items():
            found[f"switch {sw}"] = (
                "switch-unreachable",
                1.0,
                f"no answer from {sw} for {now - since:.2f} s",
            )
            for _nb, port in self.topo.adj.get(sw, []):
                peer = self.topo.peer(sw, port)
                if peer is not None:
                    dead.add(link_id(f"{sw}:{port}", str(peer)))
        for lid, ev in self._down_links().items():
            dead.add(lid)
            found.setdefault(f"link {lid}", ("link-down", 1.0, ev))
        for lid, (loss, ev) in self._lossy_links().items():
            if lid not in dead:
                found.setdefault(f"link {lid}", ("lossy-link", min(0.99, 0.5 + 10 * loss), ev))
        for lid, (share, ev) in self._voted_links(now, dead).items():
            old = found.get(f"link {lid}")
            if old is not None and old[0] == "lossy-link":  # counters and votes agree
                found[f"link {lid}"] = (old[0], min(0.99, old[1] + 0.1), f"{old[2]}; {ev}")
            elif old is None:
                # Below any link the counters name (0.5 and up): a counted error is measured
                # where it happened, a vote is inferred from paths, and a receiving host that
                # drops what it cannot read in time votes against its own downlink.
                found[f"link {lid}"] = ("lossy-link", 0.3 + 0.2 * share, ev)
        for lid, (rate, ev) in self._probed_links(now, dead).items():
            old = found.get(f"link {lid}")
            if old is not None and old[0] == "lossy-link":  # counters or votes agree
                found[f"link {lid}"] = (old[0], min(0.99, old[1] + 0.1), f"{old[2]}; {ev}")
            elif old is None:
                # measured end to end on every path, unlike the vote (inferred from the
                # data's losses), but not where it happened, unlike a counter
                found[f"link {lid}"] = ("lossy-link", min(0.49, 0.4 + 5 * rate), ev)
        deltas = {sw: self._port_deltas(sw) for sw in self.topo.switches}
        slow_ports = self._slow_ports(deltas)
        by_switch: dict[str, list[tuple[int, float, str, bool]]] = {}
        for (sw, port), (excess, ev, link_rule) in slow_ports.items():
            by_switch.setdefault(sw, []).append((port, excess, ev, link_rule))
            self._slow_at[(sw, port)] = now
        for sw, ports_deltas in deltas.items():
            for port, (departures, _, _) in ports_deltas.items():
                if departures >= self.th.min_departures:  # busy in this window
                    self._busy_at[(sw, port)] = now
        for sw, ports in by_switch.items():
            # A switch's ports are busy in turns (a spine carries one direction of a flow
            # on each), so a slow switch shows one slow port at a time: its ports are counted
            # over the hold time, not within one window.
            slow = {
                p for (s, p), t in self._slow_at.items() if s == sw and now - t <= self.th.hold_s
            }
            busy = slow | {
                p for (s, p), t in self._busy_at.items() if s == sw and now - t <= self.th.hold_s
            }
            held = self.suspects.get(f"switch {sw}")
            # A switch already named slow explains its own slow ports while any is still slow:
            # at a moment when only one of its ports is busy, that port is not a new slow link.
            still_slow = held is not None and held.kind == "slow-switch"
            if still_slow or (len(slow) >= 2 and len(slow) >= self.th.switch_share * len(busy)):
                worst = max(e for _, e, _, _ in ports)
                found.setdefault(
                    f"switch {sw}",
                    (
                        "slow-switch",
                        min(0.95, 0.4 + 0.1 * worst),
                        f"{len(slow)} of {len(busy)} ports busy in the last "
                        f"{self.th.hold_s:g} s waited beyond their queues: "
                        + "; ".join(ev for _, _, ev, _ in sorted(ports)[:4]),
                    ),
                )
                continue
            for port, excess, ev, link_rule in ports:
                if not link_rule:
                    continue  # beyond its queue, not by the ratio: evidence for its switch only
                peer = self.topo.peer(sw, port)
                lid = link_id(f"{sw}:{port}", str(peer)) if peer is not None else f"{sw}:{port}"
                if lid in dead:
                    continue
                score = min(0.9, 0.3 + 0.1 * excess)
                old = found.get(f"link {lid}")
                if old is None or (old[0] == "slow-link" and old[1] < score):
                    found[f"link {lid}"] = ("slow-link", score, ev)
        for lid, by_int in self._int_slow_links(found, dead).items():
            old = found.get(f"link {lid}")
            if old is None:
                found[f"link {lid}"] = by_int
            elif old[0] == "slow-link":  # the port's monitor and INT agree
                found[f"link {lid}"] = (
                    old[0],
                    min(0.95, old[1] + 0.05),
                    f"{old[2]}; {by_int[2]}",
                )
        for host, (score, ev) in self._slow_nics().items():
            found.setdefault(f"nic {host}", ("slow-nic", score, ev))
        self._dead_links = dead
        for element, (kind, score, ev) in found.items():
            s = self.suspects.get(element)
            if s is None or s.kind != kind:  # named (again, after it cleared): from now
                s = Suspect(element, kind, score, ev, now, now)
                self.suspects[element] = s
                first = self.named.get(element)
                if first is None or first.kind != kind:
                    self.named[element] = replace(s)
                log.warning(
                    "suspect named",
                    extra={
                        "element": element,
                        "kind": kind,
                        "score": round(score, 3),
                        "evidence": ev,
                    },
                )
                self.on_event("named", s)
            s.score, s.evidence, s.last_named = score, ev, now
            seen = self.named[element]  # the history keeps when it was first named
            seen.score, seen.evidence, seen.last_named = score, ev, now
        for element in list(self.suspects):
            s = self.suspects[element]
            if element not in found and now - s.last_named >= self.th.hold_s:
                del self.suspects[element]
                log.info("suspect cleared", extra={"element": element, "kind": s.kind})
                self.on_event("cleared", s)
        return self.ranked()

    # ---- rules ----

    def _dead_switches(self, now: float) -> dict[str, float]:
        out = {}
        for sw, h in self._hist.items():
            since = h.unreachable_since
            if h.last_seen is None:
                continue  # never seen: not up yet (a start), not a failure
            if since is not None and now - since >= self.th.dead_after_s:
                out[sw] = since
            elif (
                since is None
                and h.last_seen is not None
                and now - h.last_seen >= self.th.silent_after_s
            ):
                out[sw] = h.last_seen  # answered before, silent since
        return out

    def _latest(self, sw: str) -> SwitchSample | None:
        h = self._hist.get(sw)
        return h.samples[-1] if h is not None and h.samples else None

    def _window(self, sw: str) -> tuple[SwitchSample, SwitchSample] | None:
        """The oldest sample within the window and the newest."""
        h = self._hist.get(sw)
        if h is None or len(h.samples) < 2:
            return None
        last = h.samples[-1]
        first = next((s for s in h.samples if last.t - s.t <= self.th.window_s), None)
        if first is None or first is last:
            first = h.samples[-2]
        return first, last

    def _down_links(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for sw in self.topo.switches:
            last = self._latest(sw)
            if last is None:
                continue
            for port, ps in last.ports.items():
                if ps.up:
                    continue
                peer = self.topo.peer(sw, port)
                lid = link_id(f"{sw}:{port}", str(peer)) if peer is not None else f"{sw}:{port}"
                out.setdefault(lid, f"{sw}:{port} reports its link down")
        return out

    def _lossy_links(self) -> dict[str, tuple[float, str]]:
        """Ports receiving corrupted frames (their FCS error counters), over the history kept
        (up to two windows: at 1 % and a few hundred frames a second, a few errors)."""
        out: dict[str, tuple[float, str]] = {}
        for sw in self.topo.switches:
            h = self._hist[sw]
            if len(h.samples) < 2:
                continue
            first, last = h.samples[0], h.samples[-1]
            for port, p1 in last.ports.items():
                p0 = first.ports.get(port)
                if p0 is None:
                    continue
                errors = p1.rx_errors - p0.rx_errors
                good = (p1.rx_packets or 0) - (p0.rx_packets or 0)
                if errors < self.th.min_errors or errors + good <= 0:
                    continue
                loss = errors / (errors + good)
                if loss < self.th.min_loss:
                    continue
                peer = self.topo.peer(sw, port)
                lid = link_id(f"{sw}:{port}", str(peer)) if peer is not None else f"{sw}:{port}"
                ev = (
                    f"{sw}:{port} received {errors} corrupted frames of {errors + good} in "
                    f"{last.t - first.t:.1f} s ({loss * 100:.2f} %)"
                )
                if lid not in out or out[lid][0] < loss:
                    out[lid] = (loss, ev)
        return out

    def _undirected(self, name: str) -> str | None:
        dl = self.topo.links.get(name)
        return link_id(str(dl.tx), str(dl.rx)) if dl is not None else None

    def _frames_over(self, name: str) -> int | None:
        """Frames the directed link carried over the history kept: its transmitting switch
        port's egress counter, or for a host's uplink its switch port's ingress counter."""
        dl = self.topo.links.get(name)
        if dl is None:
            return None
        for ep, attr in ((dl.tx, "tx_packets"), (dl.rx, "rx_packets")):
            if ep.port is None or ep.node not in self._hist:
                continue
            h = self._hist[ep.node]
            if len(h.samples) < 2:
                return None
            p0, p1 = h.samples[0].ports.get(ep.port), h.samples[-1].ports.get(ep.port)
            if p0 is None or p1 is None:
                return None
            a, b = getattr(p0, attr), getattr(p1, attr)
            return None if a is None or b is None else max(0, b - a)
        return None

    def _voted_links(self, now: float, dead: set[str]) -> dict[str, tuple[float, str]]:
        """007: the links that explain the path losses of the window, with the share of the
        losses they explain (split among links that tie) and the evidence."""
        th = self.th
        while self._losses and now - self._losses[0].t > th.vote_window_s:
            self._losses.popleft()
        events = []
        for e in self._losses:
            lids = {lid for lid in map(self._undirected, e.links) if lid is not None}
            if lids and not lids & dead:  # a dead link's losses are the fail-over's
                events.append((e, lids))
        total = len(events)
        out: dict[str, tuple[float, str]] = {}
        for _ in range(3):  # at most three culprits at once
            votes: dict[str, float] = {}
            for _e, lids in events:
                for lid in lids:
                    votes[lid] = votes.get(lid, 0.0) + 1.0 / len(lids)
            if not votes:
                break
            top = max(votes.values())
            blamed = []
            for lid, v in sorted(votes.items(), key=lambda kv: -kv[1]):
                if v < th.tie_ratio * top:
                    break
                crossing = [e for e, lids in events if lid in lids]
                flows = {e.flow for e in crossing}
                if len(crossing) < th.min_vote_losses or len(flows) < th.min_vote_flows:
                    continue
                names = {n for e in crossing for n in e.links if self._undirected(n) == lid}
                frames = sum(self._frames_over(n) or 0 for n in names)
                if frames and len(crossing) / frames < th.min_vote_loss:
                    continue  # a few drops among many frames: no worse than a healthy link
                blamed.append((lid, v, len(crossing), len(flows), frames))
            if not blamed:
                break
            for lid, v, n, nflows, frames in blamed:
                share = n / total / len(blamed)
                rate = f", {n / frames * 100:.2f} % of its {frames} frames" if frames else ""
                out[lid] = (
                    share,
                    f"007: {n} of {total} path losses ({nflows} flows) in "
                    f"{th.vote_window_s:.1f} s crossed it{rate} (vote {v:.1f}"
                    + (f", tied with {len(blamed) - 1} other link(s))" if len(blamed) > 1 else ")"),
                )
            gone = {lid for lid, *_ in blamed}
            events = [(e, lids) for e, lids in events if not lids & gone]
        return out

    def _probed_links(self, now: float, dead: set[str]) -> dict[str, tuple[float, str]]:
        """The links that explain the probes lost in the window, greedily, with their loss
        rate (probes lost over probes sent on the flows crossing them, in one direction)
        and the evidence. Directions apart: a NIC losing what it sends loses every probe
        flow on its uplink, and only a share of those on each peer's downlink."""
        th = self.th
        flows = []  # (lost, sent, directed links) per probe flow over the window
        for key in list(self._probes):
            q = self._probes[key]
            last = q[-1]
            if now - last.t > th.vote_window_s:  # the flow ended: forget it
                del self._probes[key]
                continue
            first = q[0]
            lost = (last.lost - last.lost_congested - last.lost_local) - (
                first.lost - first.lost_congested - first.lost_local
            )
            sent = (last.received + last.lost) - (first.received + first.lost)
            names = {n for n in last.links if self._undirected(n) is not None}
            if sent > 0 and names and not {self._undirected(n) for n in names} & dead:
                flows.append((lost, sent, names))
        out: dict[str, tuple[float, str]] = {}
        for _ in range(3):  # at most three culprits at once
            per_link: dict[str, list[int]] = {}  # directed link -> [lost, sent, flows]
            for lost, sent, names in flows:
                for n in names:
                    t = per_link.setdefault(n, [0, 0, 0])
                    t[0] += lost
                    t[1] += sent
                    t[2] += 1
            cands = {
                n: (lost / sent, lost, sent, k)
                for n, (lost, sent, k) in per_link.items()
                if lost >= th.min_probe_losses and lost >= th.min_probe_loss * sent
            }
            if not cands:
                break
            top = max(c[0] for c in cands.values())
            blamed = {n: c for n, c in cands.items() if c[0] >= th.tie_ratio * top}
            tied = len({self._undirected(n) for n in blamed})
            for n, (rate, lost, sent, k) in sorted(blamed.items()):
                lid, dl = self._undirected(n), self.topo.links[n]
                assert lid is not None
                ev = (
                    f"probes: {lost} of {sent} lost ({rate * 100:.2f} %) on the {k} probe "
                    f"flows over {dl.tx}->{dl.rx} in {th.vote_window_s:.1f} s"
                    + (f", tied with {tied - 1} other link(s)" if tied > 1 else "")
                )
                old = out.get(lid)
                out[lid] = (rate, ev) if old is None else (max(old[0], rate), f"{old[1]}; {ev}")
            flows = [f for f in flows if not f[2] & blamed.keys()]
        return out

    def _slow_nics(self) -> dict[str, tuple[float, str]]:
        """Hosts whose NIC sent less over the window than its waiting flows were paced at."""
        out = {}
        th = self.th
        for host, q in self._nics.items():
            # counters since the NIC began: two readings suffice, the latest a window apart
            if not q:
                continue
            last = q[-1]
            first = next((s for s in reversed(q) if last.t - s.t >= 0.9 * th.window_s), None)
            if first is None or last.line_rate_bps <= 0:
                continue  # not a window yet
            dt, line = last.t - first.t, last.line_rate_bps
            want = last.waiting_bits - first.waiting_bits
            sent = (last.tx_bytes - first.tx_bytes) * 8
            if sent >= th.nic_sent_share * want or want - sent < th.min_nic_shortfall * line * dt:
                continue
            if last.paused_ns - first.paused_ns > th.nic_paused_share * dt * 1e9:
                continue  # held by pauses: the switch that sent them is where to look
            out[host] = (
                min(0.9, 0.3 + 0.6 * (1 - sent / want)),
                f"{host}'s NIC sent {sent / dt / 1e6:.4g} Mb/s ({sent / dt / line * 100:.0f} % "
                f"of its {line / 1e6:.4g} Mb/s) in {dt:.1f} s while its flows waiting in it "
                f"were paced at {want / dt / 1e6:.4g} Mb/s on average",
            )
        return out

    def _int_slow_links(
        self, found: dict[str, tuple[str, float, str]], dead: set[str]
    ) -> dict[str, tuple[str, float, str]]:
        """Links whose packets' INT hop latency is longer than the queue they saw explains at
        the link's nominal capacity (the port monitor's rule, on the controller's figures): a
        port that drains below its rate shows here even when no counter of its switch does.

        INT's hop latency is ingress to egress: besides the queue it holds the switch's own
        processing, which a software switch makes milliseconds long and about the same on
        every link (the emulation's healthy links waited 1.3-3.9 ms per packet beyond their
        queue). So a link is judged against the fabric's other links: its excess beyond the
        median excess of the links seen in the window. A switch already named slow explains
        its own links."""
        if len(self._int) < 2:
            return {}
        t1, last = self._int[-1]
        first = next((tot for t, tot in self._int if t1 - t <= self.th.window_s), None)
        if first is None or first is last:
            first = self._int[-2][1]
        # per link: departures, waited, explained; those that left a queue, their util (ppm)
        seen: list[tuple[str, DirLink, int, int, int, int, int]] = []
        for name, (d1, w1, e1, b1, u1) in last.items():
            d0, w0, e0, b0, u0 = first.get(name, (0, 0, 0, 0, 0))
            dl = self.topo.links.get(name)
            if d1 - d0 >= self.th.min_departures and dl is not None and dl.capacity_bps > 0:
                seen.append((name, dl, d1 - d0, w1 - w0, e1 - e0, b1 - b0, u1 - u0))
        if len(seen) < 3:
            return {}  # no fabric to judge a link against
        base = statistics.median(
            (wait - expected) / deps for _, _, deps, wait, expected, *_ in seen
        )
        base = max(0.0, base)
        out: dict[str, tuple[str, float, str]] = {}
        for name, dl, deps, wait, expected, n_busy, busy_ppm in seen:
            util = busy_ppm / n_busy / 1e6 if n_busy else 1.0
            if n_busy < self.th.int_min_busy or util >= self.th.int_busy_util:
                continue  # sent at its rate while it had a queue (or too few to tell)
            sw = str(dl.tx).partition(":")[0]
            lid = link_id(str(dl.tx), str(dl.rx))
            # a packet reported now may have waited through pauses of the window before
            if (
                lid in dead
                or f"switch {sw}" in found
                or self._paused_since(dl, 2 * self.th.window_s)
            ):
                continue  # a paused port's packets waited for the pauses (PFC counts them)
            frame = self.mtu_bytes * 8e9 / dl.capacity_bps
            excess = ((wait - expected) / deps - base) / frame  # frame times per packet
            explained = expected + base * deps
            if excess >= self.th.int_excess_frames and wait >= self.th.int_wait_ratio * explained:
                out[lid] = (
                    "slow-link",
                    min(0.9, 0.3 + 0.1 * excess),
                    f"INT: {deps} packets waited {wait / deps / 1e6:.2f} ms on average at "
                    f"{name}, their queue explains {expected / deps / 1e6:.2f} ms at its "
                    f"{dl.capacity_bps / 1e6:g} Mb/s and the fabric's links wait "
                    f"{base / 1e6:.2f} ms beyond theirs; it sent at {util:.0%} of its rate "
                    f"while it had a queue ({n_busy} packets)",
                )
        return out

    def _paused_since(self, dl: DirLink, span_s: float) -> bool:
        """Whether PFC pauses held the link's egress at some time in the last `span_s` of
        its switch's samples (as many as are kept: two windows)."""
        h = self._hist.get(dl.tx.node)
        if h is None or len(h.samples) < 2 or dl.tx.port is None:
            return False
        last = h.samples[-1]
        first = next((s for s in h.samples if last.t - s.t <= span_s), h.samples[-2])
        p0, p1 = first.ports.get(dl.tx.port), last.ports.get(dl.tx.port)
        return p0 is not None and p1 is not None and p1.paused_ns > p0.paused_ns

    def _frame_ns(self, sw: str, port: int) -> float:
        return self.mtu_bytes * 8e9 / self.topo.port_speed_bps(sw, port)

    def _port_deltas(self, sw: str) -> dict[int, tuple[int, int, int]]:
        """Per port, over the window: departures, their waits and what their queues explain;
        a port that PFC paused in the window is left out (its frames waited for the pauses:
        the port downstream that sent them is where to look, not this one)."""
        w = self._window(sw)
        if w is None:
            return {}
        out = {}
        for port, p1 in w[1].ports.items():
            p0 = w[0].ports.get(port)
            if p0 is None or p1.paused_ns > p0.paused_ns:
                continue
            out[port] = (
                p1.departures - p0.departures,
                p1.wait_ns - p0.wait_ns,
                p1.expected_wait_ns - p0.expected_wait_ns,
            )
        return out

    def _slow_ports(
        self, deltas: dict[str, dict[int, tuple[int, int, int]]]
    ) -> dict[tuple[str, int], tuple[float, str, bool]]:
        """Ports whose frames waited beyond their queue: (excess in frame times, evidence,
        slow by the link rule too). Every one counts towards its switch's slowness.

        Like INT's rule, a port is judged beyond the fabric's own wait: the median, over the
        busy ports, of what a departure waited beyond its queue (a software switch's
        processing, about the same on every port, is not a fault of one). On hardware and
        the twin it is about nothing; the emulation's 2-core box made it 0.18 frame times
        in half its windows and up to 0.66 over a default suite, where it had named
        healthy links and leaves slow (docs/operations.md)."""
        busy = [
            (sw, port, deps, wait, expected)
            for sw, ports in deltas.items()
            for port, (deps, wait, expected) in ports.items()
            if deps >= self.th.min_departures
        ]
        base = 0.0
        if len(busy) >= 3:  # a fabric to judge a port against
            base = max(0.0, statistics.median((w - e) / d for _, _, d, w, e in busy))
        out = {}
        for sw, port, deps, wait, expected in busy:
            frame = self._frame_ns(sw, port)
            excess = ((wait - expected) / deps - base) / frame  # frame times per departure
            explained = expected + base * deps
            link_rule = excess >= self.th.excess_frames and wait >= self.th.wait_ratio * explained
            switch_rule = (
                excess >= self.th.switch_excess_frames
                and wait >= self.th.switch_wait_ratio * explained
            )
            if link_rule or switch_rule:
                beyond = f" and the fabric's ports wait {base / 1e6:.2f} ms beyond theirs"
                out[(sw, port)] = (
                    excess,
                    (
                        f"{sw}:{port}: {deps} frames waited {wait / deps / 1e6:.2f} ms on "
                        f"average, their queue explains {expected / deps / 1e6:.2f} ms"
                        + (beyond if base > 0 else "")
                    ),
                    link_rule,
                )
        return out
