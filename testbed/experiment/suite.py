"""The scenario suite: AI-training traffic on the booted fabric, once per congestion-control
scheme, measured the same way for every scheme.

Scenarios (testbed.traffic.workloads over the testbed's hosts):
- `incast`: every other host sends `incast_bytes` to the first host at once (N:1);
- `allreduce`: ring all-reduce of `allreduce_bytes` of float32 per rank over all hosts
  (testbed.collective: reduce-scatter then all-gather, one channel per NIC, so on the rail
  topology every rail; the sums are checked on every rank);
- `alltoall`: an MoE dispatch: all-to-all of `alltoall_bytes` per rank over all hosts
  (testbed.collective, one channel per NIC; every block checked);
- `twojob`: two training jobs at once, a data-parallel all-reduce on the first half of the
  hosts and an MoE all-to-all on the other half (`twojob_bytes`, a few iterations of
  compute + collective), each also alone: per-job iteration time and slowdown;
- `websearch`: flows with the WebSearch size distribution (sizes divided by
  `websearch_size_divisor`, so that the run holds hundreds of flows rather than a few dozen)
  and Poisson arrivals at `websearch_load` of the NIC line rate per host.

Lossless schemes (`dcqcn+pfc`, `tita+pfc`) run their law with PFC on in every switch and NIC
(testbed/switch/pfc.py; on the emulation the built-in switch only, and a host's transport
holds its sends while its NIC's XDP records a pause), with the PFC watchdog in the switches
unless `pfc_watchdog` is off. Two scenarios show PFC's
classic harms (not in the default list):
- `victim`: an incast to the first host from every host but the second and the last, and a
  victim flow from the last host to the second, whose own path is idle but shares the
  incast's upstream ports: head-of-line blocking under PFC shows as its stalls;
- `storm`: the second host's NIC keeps pausing its switch (`storm_seconds` from the start)
  while the last host sends it a flow (stuck behind the storm) and the other hosts across
  the fabric send to the first host: the pauses spread up the stuck flow's path and stall
  them (the victim: the first of them); the watchdog finds the storm, drops the stuck
  queue's packets and ignores its pauses, and restores it when the pauses stop.

Schemes: `none` (flows at line rate), `dcqcn` (ECN marks -> CNPs -> the DCQCN law in the
sender's NIC), `tita` (INT echoed in ACKs -> the proactive law in the sender's NIC; like
HPCC, whose law it follows, its senders keep at most one bandwidth-delay product B*T in
flight per flow, and the frames its receivers wait for before they ACK, where DCQCN and no-CC
senders keep up to 64 packets); `tita-reactive` (TiTa
without the proactive start); the rest in testbed.experiment.schemes. By default the incast's
senders and the collectives' ranks declare each flow's fair share to their NICs before they
send (the proactive start, under every scheme with a rate law: SuiteConfig.proactive_start).
The controller sets each scheme on every host's agent (SetPolicy). Its slow-loop caps are off
unless the testbed was started with them, so the schemes differ only in what the NIC does.

Measured per (scheme, scenario) — testbed.probes:
- queue occupancy at every switch egress port the traffic crosses, from the INT records of
  the packets that arrive (departure-sampled); the bottleneck is the incast receiver's
  downlink, else the port with the highest p99;
- drops inside the switches (kernel counters: received - sent over all ports);
- utilisation of the bottleneck port while the scenario ran;
- FCT slowdown (FCT / (size / payload line rate + base RTT)), bus bandwidth, completion time;
- each flow's NIC rate over time (WatchRates).

The suite is written once, engine-neutral (`Suite`, importing no engine): an engine is a
subclass that implements the hooks in `Suite`'s "engine hooks" section (the interface,
docs/architecture.md) and says how the measurements reach it. testbed.emu.suite.EmuSuite
runs it on the emulation (a booted Testbed: worker processes, packet sockets, agents'
streams, kernel counters), testbed.sim.suite.SimSuite on the simulated twin (the same jobs,
INT decoding and summaries, in virtual time, a fresh fabric for every run).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from controller.nic.ratelaw import CcParams, Law
from controller.nic.ratelaw.profiles import DEFAULT_PROFILES, Profile, load_profile
from controller.wire.telemetry_report import TELEMETRY_REPORT_PORT
from testbed.collective import run as coll
from testbed.collective.run import CollFabric
from testbed.ctlconfig import smallest_resolving_scale, telemetry_resolution
from testbed.experiment import metrics
from testbed.experiment.schemes import (
    DEFAULT_SCHEMES,
    cc_profile,
    declares_start,
    default_cc_profiles,
    lossless,
    scheme_law,
)
from testbed.experiment.schemes import scheme as scheme_info
from testbed.faults import Fault
from testbed.model import TRANSPORT_OVERHEAD, Scaling, fmt_rate
from testbed.probes import Capture, PortCounters, RateEvent, counters_delta
from testbed.topo import COLLECTOR_IP, FabricSpec
from testbed.traffic import generators as gen
from testbed.traffic import metrics as m
from testbed.traffic import workloads as wl
from testbed.traffic.netns import Host
from testbed.traffic.runner import RunError, RunOutput

if TYPE_CHECKING:
    from testbed.topo import FabricSpec

# the switches' drop reasons that are about MAC Control frames, not traffic
CONTROL_DROPS = ("pfc_off", "mac_control_unknown")
SCENARIOS = ("incast", "allreduce", "alltoall", "twojob", "websearch")
PFC_SCENARIOS = ("victim", "storm")  # PFC's harms: known, not in the default list
ALL_SCENARIOS = SCENARIOS + PFC_SCENARIOS
SERIES_POINTS = 2000  # per series kept in the results file
# a victim flow "stalls" when no packet of it arrives for this many full-frame times at the
# link rate (at its fair share behind the incast's flows it gets one every few)
STALL_FRAMES = 16
ALLTOALL_CHUNK = 64 << 10  # the alltoall scenario's messages (the collective library's chunk)
# what the NICs' Telemetry Reports may take of the collector's port, all together
REPORT_SHARE = 0.1


@dataclass(frozen=True)
class SuiteConfig:
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    scenarios: tuple[str, ...] = SCENARIOS
    incast_bytes: int = 1_000_000
    allreduce_bytes: int = 4 << 20
    allreduce_chunk: int = 256 << 10
    alltoall_bytes: int = 1 << 20
    twojob_bytes: int = 1 << 20
    websearch_load: float = 0.5
    websearch_seconds: float = 5.0
    websearch_size_divisor: float = 10.0
    seed: int = 1
    repeat: int = 1  # runs of every (scenario, scheme); the table shows their median and range
    # TiTa's base RTT T; None: the model's base RTT dilated by the scale, or the RTT measured
    # on the fabric if that is longer
    tita_base_rtt_s: float | None = None
    retransmit: str = "gbn"  # the transport's: gbn (go-back-N) or sr (selective repeat)
    pfc_watchdog: bool = True  # the PFC watchdog in the switches of a lossless scheme
    # the proactive start: the incast's senders and the collectives' ranks declare each
    # flow's fair share to their NICs before they send (schemes.declares_start); False: every
    # flow starts at line rate
    proactive_start: bool = True
    storm_seconds: float = 1.0  # how long the storm scenario's NIC keeps pausing
    # the named CC profile of each rate law (--cc-profile; controller/nic/ratelaw/profiles/)
    cc_profiles: dict[str, str] = field(default_factory=default_cc_profiles)
    # per rate law, parameters set otherwise than its profile says (--cc-set; the tuner's)
    cc_set: dict[str, dict[str, str]] = field(default_factory=dict)
    # the receivers ACK every N packets under every scheme (--ack-every); None: each scheme's
    # own (testbed/experiment/schemes.py)
    ack_every: int | None = None
    # the hosts' active probers (controller/nic/prober.py): each probe flow's interval,
    # emulated seconds (--probes); None: off
    probe_interval_s: float | None = None

    @staticmethod
    def quick() -> SuiteConfig:
        """A short suite (benchmarks, tests): smaller collectives and a shorter mix."""
        return SuiteConfig(
            incast_bytes=400_000,
            allreduce_bytes=1 << 20,
            allreduce_chunk=128 << 10,
            alltoall_bytes=256 << 10,
            twojob_bytes=256 << 10,
            websearch_seconds=2.0,
        )


# the suite's numeric parameters `--param` sets (the seed and the repetitions have options)
def _numeric_fields() -> dict[str, type]:
    out: dict[str, type] = {}
    for f in dataclasses.fields(SuiteConfig):
        kind = str(f.type)  # the annotation's text (postponed annotations)
        if f.name not in ("seed", "repeat") and kind in ("int", "float"):
            out[f.name] = float if kind == "float" else int
    return out


def suite_param(name: str, text: str) -> Any:
    """A numeric SuiteConfig field's value from its text (`run --param`, `sweep --param`);
    a ValueError names the fields that can be set, or the value that is not a number."""
    fields = _numeric_fields()
    if name not in fields:
        known = ", ".join(fields)
        raise ValueError(f"--param {name}: not a numeric suite parameter (one of {known})")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--param {name}={text}: not a number") from None
    if fields[name] is int:
        if value != int(value) or value < 0:
            raise ValueError(f"--param {name}={text}: a whole number of at least 0")
        return int(value)
    return value


@dataclass
class RunRecord:
    """One scenario under one scheme, summarised (and the series behind the plots)."""

    scheme: str
    scenario: str
    bottleneck: str
    queue_p50_bytes: float
    queue_p99_bytes: float
    queue_max_bytes: float
    queue_samples: int
    drops: int
    utilization: float | None
    fct_slowdown_p50: float | None
    fct_slowdown_p99: float | None
    flows: int
    flows_completed: int
    busbw_bps: float | None
    completion_s: float
    int_packets: int
    int_max_hops: int
    retransmits: int
    cnps: int
    out_of_order: int  # data packets the receivers dropped for a PSN gap (loss or reordering)
    window: int  # the senders' in-flight bound, packets per queue pair
    correct: bool | None = None
    repetition: int = 0  # which of the suite's --repeat runs of this (scenario, scheme)
    seed: int = 1  # the run's seed (the suite's, plus the repetition on the twin)
    reordered: int = 0  # PSN gaps whose missing packet came late (the transports' `reordered`)
    feedback_not_sent: int = 0  # ACKs, NAKs and CNPs the hosts' sockets refused (lost at home)
    load_avg_1m: float | None = None  # the machine's when the run started (emulation only)
    # the incast's, at the receiver's downlink, over the flows to it:
    # Jain's index of their received rates per window of 10 T while >= 2 are active (worst
    # and median window), and the link's utilization after the first 2 T
    fairness_min: float | None = None
    fairness_p50: float | None = None
    fairness_windows: int = 0
    util_after_2t: float | None = None
    queue_by_link: dict[str, dict[str, float]] = field(default_factory=dict)
    drops_by_switch: dict[str, int] = field(default_factory=dict)
    # what the switches themselves counted of those drops, by reason (GetStatus: a full
    # queue, the pipeline, a port down, the PFC watchdog, ...), and the rest: frames their
    # ports received that no switch counted (the emulation: a switch process that did not read
    # them in time); None where the engine gives no counts
    drops_by_reason: dict[str, int] = field(default_factory=dict)
    drops_uncounted: int | None = None
    error: str = ""  # why the workload did not finish (its figures then say nothing)
    rate_events: int = 0
    slowdowns: list[float] = field(default_factory=list)
    queue_series: dict[str, list[float]] = field(default_factory=dict)
    rate_series: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # operations (testbed/faults.py, controller/health.py): the faults injected, each suspect
    # the controller named (first_named: seconds from the scenario's start) and fail-overs
    faults: list[dict[str, Any]] = field(default_factory=list)
    suspects: list[dict[str, Any]] = field(default_factory=list)
    failovers: list[dict[str, Any]] = field(default_factory=list)
    # the active probers' probes (--probes): sent, received and lost as the receivers counted
    probes: dict[str, Any] = field(default_factory=dict)
    flow_fcts: list[dict[str, Any]] = field(default_factory=list)  # per flow (flows runs)
    port_series: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # per port
    jobs: list[dict[str, Any]] = field(default_factory=list)  # per job (twojob)
    # Telemetry Reports during the scenario: what the NIC sinks sent (by trigger) and what
    # the controller's collector received and counted lost (sequence gaps), per reporter
    telemetry: dict[str, Any] = field(default_factory=dict)
    # PFC (lossless schemes): pause frames sent (XOFF, by switches and NICs), the time
    # switch egress ports and NICs were held by pauses (s, summed), per port, and the
    # watchdog's storms
    pauses: int = 0
    paused_s: float = 0.0
    # the emulation's senders: pauses of their NIC their transport held for, and the time
    # held (s, summed over hosts); the twin's NICs hold by themselves (paused_s)
    sender_holds: int = 0
    sender_held_s: float = 0.0
    start_hints: int = 0  # flows whose start rate the application handed its NIC
    pfc_by_port: dict[str, dict[str, int]] = field(default_factory=dict)
    pfc_storms: int = 0
    pfc_restored: int = 0
    # the victim flow (victim and storm scenarios): its FCT slowdown, stalls and longest gap
    victim_fct_slowdown: float | None = None
    victim_stalls: int | None = None
    victim_longest_gap_s: float | None = None

    def summary(self) -> dict[str, Any]:
        """The record without its series (emptied before the copy: asdict copies deeply, and
        the series are most of a record)."""
        series = ("queue_series", "rate_series", "slowdowns", "flow_fcts", "port_series")
        d = asdict(replace(self, **{k: type(getattr(self, k))() for k in series}))
        for k in series:
            d.pop(k)
        return d


DEFAULT_WINDOW = 64  # packets in flight per queue pair (RoCE NICs bound little)


def tita_window(
    s: Scaling, tita_t_s: float, link_bps: float | None = None, ack_every: int = 1
) -> int:
    """HPCC's in-flight bound, one bandwidth-delay product B*T per flow, in packets (B the
    hosts' link, `link_bps`; the model's port where not given), and the ACK interval's frames
    but one: a receiver that ACKs every `ack_every` frames sends a frame's ACK only with the
    last of them, so without those frames the bound held a flow under B once its round trip
    reached T (the emulation's all-reduce under TiTa at 87 % of the NIC, the twin's at 94 %:
    docs/main-job.md, "The links in time")."""
    b = s.link_bps if link_bps is None else link_bps
    return max(2, math.ceil(b * tita_t_s / 8 / s.frame_bytes)) + max(1, ack_every) - 1


# The RTO's margin over the deepest queue's drain (`deepest_queue_s`): a packet may wait
# behind one full queue and its ACK behind another.
RTO_QUEUES = 2


def deepest_queue_s(spec: FabricSpec, s: Scaling) -> float:
    """The longest one egress queue of the fabric can take to drain: the deepest queue a
    switch's buffer admits, at its port's rate. Shared: the switch's share of the part's
    buffer (its ports' shares), of which the dynamic threshold lets one queue take alpha / (1
    + alpha) when it alone is busy; static: the queue's depth."""
    m = s.model
    ports = {sw.name: len(spec.switch_ports(sw.name)) for sw in spec.switches}
    # every switch port with its rate: the links' ends, and the collector's at the model's
    ends = [(e.node, s.emulated_bps(lk.gbps)) for lk in spec.links for e in (lk.a, lk.b)]
    if spec.collector is not None:
        ends.append((spec.collector.node, s.link_bps))
    worst = 0.0
    for node, bps in ends:
        if node not in ports:
            continue  # a host's end
        if m.shared:
            depth = m.buffer_per_port() * ports[node] * m.buffer_alpha / (1 + m.buffer_alpha)
        else:
            depth = float(m.queue_bytes)
        worst = max(worst, depth * 8 / bps)
    return worst


def transport_settings(
    s: Scaling,
    window: int = DEFAULT_WINDOW,
    ack_every: int = 2,
    retransmit: str = "gbn",
    cnp_interval: float | None = None,
    deepest_queue: float = 0.0,
    rto_floor: float = 0.0,
) -> dict[str, Any]:
    """The transport's parameters for every run (testbed.traffic.transport.TransportConfig).

    - MTU 4096 (RoCE's), jumbo links;
    - a socket buffer of a few frames per queue pair: a real NIC fetches a message's data
      only as its rate allows, so retransmissions do not wait behind seconds of paced data;
    - the RTO above the deepest queueing delay: RTO_QUEUES times `deepest_queue` (s, the
      fabric's `deepest_queue_s`), and at least 1 s at the emulation's scale dilated like
      every time of the model (50 us at the model's own speed), which a full static 500 KB
      queue (0.2 s at that scale) stays under; a timer below a queue's delay resends (go-back-N:
      a window) what is only waiting; and at least `rto_floor` (s: the engine's, Suite.rto_floor_s);
    - an ACK every 2 packets (TiTa's feedback; every packet for TIMELY and Swift, which
      time packets);
    - `cnp_interval`: the least time between two CNPs of a flow (s), the notification
      point of the DCQCN profile in force (`Suite.cnp_interval_s`); where not given, the
      default DCQCN profile's at the model's NIC;
    - `window`: packets in flight per queue pair. TiTa is HPCC-like, and HPCC's sender
      bounds its in-flight bytes by B*T (`tita_window`, with the ACK interval's frames but
      one); DCQCN and no-CC senders do not;
    - `retransmit`: go-back-N (`gbn`, RC's) or selective repeat (`sr`).
    """
    dilation = min(1.0, s.scale / 20_000)  # the RTO's floor was chosen at the emulation's scale
    rto = max(1.0 * dilation, 50e-6, RTO_QUEUES * deepest_queue, rto_floor)
    if cnp_interval is None:
        np = load_profile(DEFAULT_PROFILES[Law.DCQCN]).np_values(int(s.nic_bps), 1, s.scale)
        cnp_interval = np["cnp_interval_ns"] / 1e9
    return {
        "mtu": s.transport_mtu,
        "window": window,
        "ack_every": ack_every,
        "rto": rto,
        "rto_max": 4 * rto,
        "sndbuf": 4 * s.frame_bytes,
        "cnp_interval": cnp_interval,
        "retransmit": retransmit,
    }


def report_settings(spec: FabricSpec, s: Scaling) -> dict[str, Any]:
    """The receiving NICs' INT sink (TransportConfig.report_*): Telemetry Reports to the
    collector, when the fabric has one. A flow is sampled every 0.1 s of the emulation's time
    (dilated like every time of the model); a packet that met a queue above 5 frames (ECN's
    kmin) or hop latencies above 10 frame times at the link rate is reported at once, and
    while that lasts at most every quarter of the sampling interval. All the NICs' reports
    together take at most REPORT_SHARE of the collector's port: each NIC's budget is its
    share of that (controller/nic/int_sink.py says why)."""
    if spec.collector is None:
        return {}
    dilation = s.scale / 20_000
    sample = 0.1 * dilation
    nics = sum(len(h.nics) for h in spec.hosts)
    return {
        "report_to": f"{COLLECTOR_IP}:{TELEMETRY_REPORT_PORT}",
        "report_sample_s": sample,
        "report_queue_bytes": 5 * s.frame_bytes,
        "report_latency_ns": round(10 * s.frame_bytes * 8e9 / s.link_bps),
        "report_event_gap_s": sample / 4,
        "report_budget_bps": REPORT_SHARE * s.link_bps / max(1, nics),
    }


def telemetry_summary(
    sent: dict[str, int],
    before: dict[str, dict[str, int]],
    after: dict[str, dict[str, int]],
    suppressed: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A scenario's Telemetry Reports: sent by the NIC sinks (by trigger), made beyond their
    budget and not sent (by trigger), received and lost at the collector (the difference of
    its totals), per reporter."""
    per = {}
    for name, a in sorted(after.items()):
        b = before.get(name, {})
        d = {k: a.get(k, 0) - b.get(k, 0) for k in ("received", "lost")}
        if d["received"] or d["lost"]:
            per[name] = d
    return {
        "sent": dict(sorted(sent.items())),
        "sent_total": sum(sent.values()),
        "suppressed": dict(sorted((suppressed or {}).items())),
        "received": sum(d["received"] for d in per.values()),
        "lost": sum(d["lost"] for d in per.values()),
        "reporters": per,
    }


def payload_line_rate(s: Scaling, nic_bps: float | None = None) -> float:
    """A NIC's line rate in payload bits (what an idle path delivers): the model's NIC, or
    one of `nic_bps`."""
    nic = s.nic_bps if nic_bps is None else nic_bps
    return nic * s.transport_mtu / (s.transport_mtu + TRANSPORT_OVERHEAD)


def host_link_bps(spec: FabricSpec, s: Scaling, host: str) -> float:
    """A host's link speed in the model (a 100G host under 400G switch ports; the model's
    port where the link sets none)."""
    lk = spec.link_at(spec.attachment(host, 0))
    return s.emulated_bps(None if lk is None else lk.gbps)


def host_nic_bps(spec: FabricSpec, s: Scaling, host: str) -> float:
    """A host's NIC line rate, at its own link's speed."""
    return s.nic_rate(host_link_bps(spec, s, host))


def flow_line_rate(spec: FabricSpec, s: Scaling, src: str, dst: str) -> float:
    """The payload rate an idle path gives a flow from host `src` to host `dst`: the slower
    of its two NICs."""
    return payload_line_rate(s, min(host_nic_bps(spec, s, src), host_nic_bps(spec, s, dst)))


def websearch_flows(cfg: SuiteConfig, hosts: int, nic_bps: float, seconds: float) -> list[gen.Flow]:
    """The WebSearch mix of the suite: sizes divided by the divisor, Poisson arrivals for
    `seconds`."""
    cdf = gen.SizeCdf.load("websearch")
    k = cfg.websearch_size_divisor
    scaled = gen.SizeCdf(
        [(s / k, p) for s, p in zip(cdf.sizes, cdf.probs, strict=True)], f"websearch/{k:g}"
    )
    return gen.poisson(hosts, scaled, cfg.websearch_load, nic_bps, seconds, seed=cfg.seed)


class Suite:
    """The scenario suite on one engine; `records` collects the results.

    An engine subclasses it and sets `spec`, `scaling`, `hosts`, `runner` (how a job reaches
    the hosts) and `time_scale`, and implements the hooks below: those that raise
    NotImplementedError it must, the others where it can (their defaults say "the engine
    cannot"). Port counters are keyed "switch:port"; times are the engine's seconds."""

    spec: FabricSpec
    scaling: Scaling
    hosts: list[Host]
    time_scale: float = 1.0  # timeouts stretch with the model's time (1 at the emulation's)
    # repetition r runs with seed + r (a deterministic engine); else every repetition has the
    # suite's seed and measures the machine's noise (the emulation)
    reseed_repetitions: bool = False
    # a link's utilization is timed by its sender's departures (the last hop's INT egress
    # stamps) where the receivers' arrival times carry the switch processes' late wake-ups
    # (the emulation); by the arrivals where the clock is the engine's own (the twin)
    util_by_departures: bool = False
    # the least RTO the engine's transports need, its seconds (transport_settings' rto_floor):
    # where a transport waits for a CPU, its peer's ACK waits too, as a NIC's would not
    rto_floor_s: float = 0.0

    def __init__(self, cfg: SuiteConfig, say: Callable[[str], None]):
        self.cfg = cfg
        self.say = say
        self.records: list[RunRecord] = []
        self.base_rtt_s = 0.0  # measured (FCT slowdown's ideal)
        self.tita_t_s = 0.0
        self.telemetry: dict[str, Any] = {}  # results.json's setup.telemetry (prepare)
        self.flows_override: list[gen.Flow] | None = None  # a --flows file: the "flows" run
        self.faults: list[Fault] = []  # a --faults file: injected in every scenario
        self._scheme = "none"  # the scheme of the run in progress
        self._scheme_set: str | None = None  # the scheme the engine's fabric has now
        # per scheme: its law's CC profile, source and the values set (results.json's setup)
        self.cc_records: dict[str, dict[str, Any]] = {}
        # per rate law, parameters set for the runs to come over cfg.cc_set (set_cc: the tuner)
        self._cc_set: dict[str, dict[str, str]] = {}

    # ---- engine hooks ----

    def runner(self, hosts: list[Host], spec: dict[str, Any]) -> RunOutput:
        """Run one job (testbed.traffic.jobs) on `hosts` from a common start."""
        raise NotImplementedError

    def _fresh(self) -> bool:
        """A fabric in its initial state for the next run (switches, NICs, transports, the
        clock and every random stream as built): True where the engine built one (its scheme
        must be set again), False where its fabric lives on from run to run."""
        return False

    def _measure_base_rtt(self) -> float:
        raise NotImplementedError

    def _set_policy(self, scheme: str, cc: dict[str, CcParams]) -> int:
        """The scheme's rate law on every host, with the parameters `cc` has for it (the
        controller's SetPolicy); returns how many hosts took it."""
        raise NotImplementedError

    def _begin(self) -> None:
        raise NotImplementedError

    def _end(self) -> tuple[Capture, list[RateEvent]]:
        raise NotImplementedError

    def _counters(self) -> dict[str, PortCounters]:
        raise NotImplementedError

    def _quiet_counters(self) -> dict[str, PortCounters]:
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

    def _operations(self) -> dict[str, Any]:
        """The scenario's faults, suspects, fail-overs and probes (RunRecord's fields)."""
        return {}

    def _load_avg(self) -> float | None:
        """The machine's 1-minute load average, where the engine's timing depends on it."""
        return None

    def _set_port_rate(self, switch: str, port: int, rate_bps: float) -> None:
        raise NotImplementedError

    def _apply_fault(self, f: Fault) -> None:
        """Inject (or remove) one fault now, outside a scenario's schedule (a sweep's)."""
        raise NotImplementedError

    def _begin_faults(self, faults: list[Fault]) -> None:
        """The operations loop for one run outside the scenarios: `faults` injected at their
        times from the start of the next job."""
        raise NotImplementedError

    def _end_faults(self) -> list[dict[str, Any]]:
        """End `_begin_faults`' loop: every fault healed; the faults applied (their
        `applied_at` in the faults' seconds from the job's start)."""
        raise NotImplementedError

    def _report_totals(self) -> dict[str, dict[str, int]]:
        """The collector's report accounting so far: per reporter, received and lost."""
        return {}

    def _port_busy_span(self, port: str) -> float:
        """The span of a switch port's transmissions in the run so far (first start to last
        end, the engine's seconds); 0 where the engine does not know it."""
        return 0.0

    def _switch_drops(self) -> dict[str, int] | None:
        """The switches' own drop counters so far, by reason, summed over the switches
        (SwitchAdmin GetStatus); None where the engine cannot read them."""
        return None

    def _set_pfc(self, on: bool) -> None:
        """PFC on or off in every switch and NIC (the watchdog as the config says)."""
        if on:
            raise NotImplementedError("lossless schemes run on the twin (--engine sim)")

    def _pfc_counters(self) -> dict[str, dict[str, int]]:
        """Per port ("switch:port" or "host:nic"), cumulative PFC counters."""
        return {}

    def _pfc_storm(self, host: int, seconds: float) -> None:
        """The host's NIC keeps pausing its switch for `seconds` from now."""
        raise NotImplementedError("the PFC storm runs on the twin (--engine sim)")

    # ---- the collective library's view of the engine ----

    def nic_ips(self) -> list[list[str]]:
        """Every traffic host's NIC addresses, in host order."""
        by_name = {h.name: [n.ip for n in h.nics] for h in self.spec.hosts}
        return [by_name[h.name] for h in self.hosts]

    def nic_rates(self) -> dict[str, float]:
        """Each traffic host's NIC line rate, at its own link's speed: what its rate law's
        parameters are resolved at (a 100G host's TIMELY thresholds and HPCC's W_AI are a
        100G NIC's, whatever the switches' ports)."""
        return {h.name: host_nic_bps(self.spec, self.scaling, h.name) for h in self.hosts}

    def hosts_link_bps(self) -> float:
        """The traffic hosts' link speed, for what one value sets on every host (the B*T
        window, the receivers' CNP interval, the collectives' start share and line rate):
        the fastest's where their links differ, so that no host is held below its own."""
        return max(host_link_bps(self.spec, self.scaling, h.name) for h in self.hosts)

    def hosts_nic_bps(self) -> float:
        """The NIC line rate on hosts_link_bps: what those values are sized by."""
        return self.scaling.nic_rate(self.hosts_link_bps())

    @cached_property
    def deepest_queue_s(self) -> float:
        """How long the fabric's deepest queue takes to drain (deepest_queue_s)."""
        return deepest_queue_s(self.spec, self.scaling)

    def rto_s(self) -> float:
        """The transport's RTO on this fabric, under every scheme (transport_settings)."""
        settings = transport_settings(
            self.scaling, deepest_queue=self.deepest_queue_s, rto_floor=self.rto_floor_s
        )
        return float(settings["rto"])

    def transport(self, scheme: str, window: int, ack_every: int | None = None) -> dict[str, Any]:
        """The transport's settings under `scheme` (transport_settings): the RTO above this
        fabric's deepest queue, the CNP spacing of the DCQCN profile in force, the receiving
        NICs' INT sink."""
        cfg = self.cfg
        return {
            **transport_settings(
                self.scaling,
                window,
                self.ack_every(scheme) if ack_every is None else ack_every,
                cfg.retransmit,
                self.cnp_interval_s(scheme),
                self.deepest_queue_s,
                self.rto_floor_s,
            ),
            **report_settings(self.spec, self.scaling),
        }

    def collective_fabric(
        self, scheme: str, window: int | None = None, fresh_runs: bool = True
    ) -> CollFabric:
        """The engine as the collective library sees it, `scheme` in force. `fresh_runs`:
        each of its runs starts on a fresh fabric (the collective commands); False inside a
        suite's cell, which started on one and captures the run there."""
        s = self.scaling
        cfg = self.cfg
        nic = self.hosts_nic_bps()

        def websearch(hosts: int, load: float, seconds: float) -> list[gen.Flow]:
            wcfg = SuiteConfig(**{**cfg.__dict__, "websearch_load": load})
            return websearch_flows(wcfg, hosts, nic, seconds)

        return CollFabric(
            topology=self.spec.name,
            hosts=self.hosts,
            nic_ips=self.nic_ips(),
            runner=self.runner,
            scaling=s,
            scheme=scheme,
            law=scheme_law(scheme),
            transport=self.transport(scheme, self.window(scheme) if window is None else window),
            line_rate=payload_line_rate(s, nic),
            time_scale=self.time_scale,
            seed=cfg.seed,
            set_port_rate=self._set_port_rate,
            websearch=websearch,
            apply_fault=self._apply_fault,
            begin_faults=self._begin_faults,
            end_faults=self._end_faults,
            spec=self.spec,
            fresh=(lambda: self.start_run(scheme)) if fresh_runs else (lambda: None),
            set_cc=lambda settings: self.set_cc(scheme, settings),
            start=self._collective_start(scheme),
        )

    # ---- running ----

    def prepare(self) -> None:
        """Measure the base RTT and fix TiTa's T (before the first scheme)."""
        self.base_rtt_s = self._measure_base_rtt()
        model_rtt = self.scaling.base_rtt_s
        self.tita_t_s = self.cfg.tita_base_rtt_s or max(self.base_rtt_s, model_rtt)
        rto = self.rto_s()
        why = f"the deepest queue drains in {fmt_time(self.deepest_queue_s)}"
        if rto == self.rto_floor_s:
            why += "; the engine's floor: its transports wait for a CPU"
        self.say(
            f"base RTT {fmt_time(self.base_rtt_s)} ({self.scaling.transport_mtu} B, "
            f"{self.hosts[0].name} -> {self.hosts[-1].name}); the model's, dilated: "
            f"{fmt_time(model_rtt)}; TiTa's T = {fmt_time(self.tita_t_s)}; the transport's "
            f"RTO {fmt_time(rto)} ({why})"
        )
        self._check_telemetry()

    def _check_telemetry(self) -> None:
        """Whether the switches' INT resolves TiTa's T at this scale (testbed/ctlconfig.py):
        recorded in `telemetry`, and said at the start where it does not, with the smallest
        scale that does (docs/fidelity.md: the twin's results in the model's time differ
        little between scales whose telemetry resolves)."""
        res = telemetry_resolution(self.spec, self.scaling, self.tita_t_s)
        smallest = None if res.resolves else smallest_resolving_scale(self.spec, self.scaling)
        self.telemetry = res.record(smallest)
        for problem in res.problems():
            self.say(f"WARNING: at scale 1/{self.scaling.scale:g} {problem}")
        if smallest is not None:
            self.say(f"WARNING: the telemetry resolves the base RTT from --scale {smallest:g}")

    def run(self) -> list[RunRecord]:
        cfg = self.cfg
        if cfg.repeat < 1:
            raise ValueError(f"repeat must be at least 1, not {cfg.repeat}")
        self.prepare()
        total = cfg.repeat * len(cfg.schemes) * len(cfg.scenarios)
        n = 0
        # repetitions outermost: a slow spell of the shared machine then spreads over every
        # scheme's runs instead of landing on one scheme's
        for rep in range(cfg.repeat):
            if self.reseed_repetitions:
                # a deterministic engine repeats a run identically: its repetitions are the
                # same runs under the next seeds (workloads and the switches' random draws)
                self.cfg = replace(cfg, seed=cfg.seed + rep)
            for scheme in cfg.schemes:
                for scenario in cfg.scenarios:
                    n += 1
                    name = f"{scheme} / {scenario}" + (f" #{rep + 1}" if cfg.repeat > 1 else "")
                    self.say(f"[{n}/{total}] {name} ...")
                    load = self._load_avg()
                    rec = self.run_one(scheme, scenario)
                    rec.repetition, rec.load_avg_1m, rec.seed = rep, load, self.cfg.seed
                    for bad in metrics.out_of_range(rec.summary()):
                        self.say(f"[{n}/{total}] {name}: WARNING: {bad} (a defect: report it)")
                    self.records.append(rec)
                    self.say(f"[{n}/{total}] {name}: {one_line(rec)}")
        self.cfg = cfg
        return self.records

    def use_scheme(self, scheme: str) -> None:
        """The scheme on the engine's fabric as it stands: PFC on or off, the rate law on
        every host (the controller's SetPolicy)."""
        self._set_pfc(lossless(scheme))
        cc = self.scheme_cc(scheme)
        agents = self._set_policy(scheme, cc)
        profile = self.cc_records[scheme]["profile"]
        rates = " and ".join(fmt_rate(r) for r in sorted(set(self.nic_rates().values())))
        self.say(
            f"scheme {scheme} (cc profile {profile}, at the NICs' {rates}): set on {agents} "
            "agents by the controller"
        )
        self._scheme_set = scheme

    def set_cc(self, scheme: str, settings: dict[str, str]) -> None:
        """The runs to come under `scheme` with its law's parameters `settings` set over the
        configured ones (the tuner's candidates; {}: as configured), on either engine."""
        name = scheme_law(scheme)
        if self._cc_set.get(name, {}) != settings:
            self._cc_set[name] = dict(settings)
            if self._scheme_set is not None and scheme_law(self._scheme_set) == name:
                # at once: a suite's cell runs its collective on the fabric it started with
                self.use_scheme(self._scheme_set)

    def scheme_cc(self, scheme: str) -> dict[str, CcParams]:
        """The parameters of a scheme's law on each host: its CC profile for the host NIC's
        line rate, T (the laws that take it) and the model's dilation (the scale); recorded
        in cc_records (`nic_bps` the rate they were resolved at; where the hosts' NICs
        differ, `values_by_nic_bps` those of each)."""
        prof = self._profile(scheme)
        s = self.scaling
        t_ns = self._t_ns()
        rates = {host: int(bps) for host, bps in self.nic_rates().items()}
        at = {line: prof.cc_params(line, t_ns, s.scale) for line in sorted(set(rates.values()))}
        if self.cc_records.get(scheme, {}).get("profile") != prof.name:
            lines = list(at)
            clamped = prof.clamped(lines[-1], t_ns, s.scale)
            np = {r: prof.np_values(r, t_ns, s.scale) for r in lines}
            rec = prof.record(at[lines[-1]], clamped, np[lines[-1]]) | {"nic_bps": lines[-1]}
            if len(lines) > 1:
                rec["values_by_nic_bps"] = {
                    str(r): prof.record(at[r], np_values=np[r])["values"] for r in lines
                }
            self.cc_records[scheme] = rec
            # a slower NIC's times are longer: each clamp, at whichever rate it happens
            beyond = {kv for r in lines for kv in prof.clamped(r, t_ns, s.scale).items()}
            for k, v in sorted(beyond):
                self.say(
                    f"cc profile {prof.name}: {k} {v} ns at scale {s.scale:g} exceeds the "
                    f"NIC's 32 bits, clamped to {2**32 - 1} ns"
                )
        return {host: at[line] for host, line in rates.items()}

    def _profile(self, scheme: str) -> Profile:
        """The CC profile of a scheme's law, with what --cc-set and set_cc set over it."""
        name = scheme_law(scheme)
        settings = {name: self.cfg.cc_set.get(name, {}) | self._cc_set.get(name, {})}
        return cc_profile(scheme, self.cfg.cc_profiles, settings)

    def _t_ns(self) -> int:
        """T for the laws that take it: TiTa's, else the model's base RTT, in ns."""
        return round((self.tita_t_s or self.scaling.base_rtt_s) * 1e9)

    def cnp_interval_s(self, scheme: str) -> float:
        """The receivers' least time between two CNPs of a flow under `scheme`: the
        notification point of the DCQCN profile in force (the scheme's where its law is
        DCQCN, else the configured DCQCN profile's: a NIC's notification point runs whatever
        law its peers' reaction points run), at the hosts' NIC rate."""
        np_scheme = scheme if scheme_law(scheme) == "dcqcn" else "dcqcn"
        nic = int(self.hosts_nic_bps())
        np = self._profile(np_scheme).np_values(nic, self._t_ns(), self.scaling.scale)
        return np["cnp_interval_ns"] / 1e9

    def start_run(self, scheme: str) -> None:
        """Before every run: a fresh fabric where the engine can build one (the twin: its
        result then depends only on the scenario, scheme, parameters and seed, whatever ran
        before it), and the scheme set on it. An engine whose fabric lives on (the emulation)
        sets the scheme only when it changes."""
        if self._fresh() or self._scheme_set != scheme:
            self.use_scheme(scheme)

    def window(self, name: str) -> int:
        if scheme_info(name).bdp_window and self.tita_t_s:
            return tita_window(
                self.scaling, self.tita_t_s, self.hosts_link_bps(), self.ack_every(name)
            )
        return DEFAULT_WINDOW

    def ack_every(self, name: str) -> int:
        """Packets per ACK under scheme `name`: the configured override, else the scheme's."""
        return self.cfg.ack_every or scheme_info(name).ack_every

    def run_one(self, scheme: str, scenario: str) -> RunRecord:
        """One scenario under one scheme, on a fresh fabric where the engine builds one."""
        if self._cc_set:  # the CC a run starts with is the configured one, whatever ran before
            self._cc_set = {}
            self._scheme_set = None
        self.start_run(scheme)
        before = self._counters()
        reports_before = self._report_totals()
        pfc_before = self._pfc_counters()
        drops_before = self._switch_drops()
        self._begin()
        t_call = self._now()
        self._scheme = scheme
        try:
            res = self._workload(scenario, self.window(scheme), self.ack_every(scheme))
        except RunError as exc:
            # a job that cannot finish (a collective stuck, a worker gone) is this run's
            # result, not the end of the suite: recorded as failed, the next run goes on
            res = {"failed": str(exc)}
        finally:
            cap, events = self._end()
        after = self._quiet_counters()
        rec = self._summarise(
            scheme, scenario, res, cap, events, counters_delta(before, after), t_call
        )
        for k, v in self._operations().items():
            setattr(rec, k, v)
        counts = workload_counters(res)
        rec.telemetry = telemetry_summary(
            counts.get("reports", {}),
            reports_before,
            self._report_totals(),
            counts.get("reports_suppressed", {}),
        )
        self._summarise_pfc(rec, pfc_before, self._pfc_counters())
        self._summarise_drops(rec, drops_before, self._switch_drops())
        if scenario in PFC_SCENARIOS:
            self._summarise_victim(rec, cap, res)
        alone = res.get("alone")
        if alone is not None:  # the two jobs' slowdowns: each alone, outside the run's figures
            try:
                alone()  # fills in the rows rec.jobs holds (the summary's)
            except RunError as exc:
                rec.error = rec.error or f"a job alone, for its slowdown: {exc}"
        return rec

    def _summarise_drops(
        self, rec: RunRecord, before: dict[str, int] | None, after: dict[str, int] | None
    ) -> None:
        if before is None or after is None:
            return
        rec.drops_by_reason = {
            r: n - before.get(r, 0) for r, n in sorted(after.items()) if n - before.get(r, 0) > 0
        }
        # the drop counters of MAC Control frames are not traffic: the ports' counters leave
        # those frames out
        counted = sum(n for r, n in rec.drops_by_reason.items() if r not in CONTROL_DROPS)
        rec.drops_uncounted = max(0, rec.drops - counted)

    def _summarise_pfc(
        self, rec: RunRecord, before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
    ) -> None:
        by_port = {}
        for port, c in sorted(after.items()):
            b = before.get(port, {})
            d = {k: v - b.get(k, 0) for k, v in c.items()}
            if any(d.values()):
                by_port[port] = d
        rec.pfc_by_port = by_port
        rec.pauses = sum(d.get("xoff_sent", 0) for d in by_port.values())
        rec.paused_s = sum(d.get("paused_ns", 0) for d in by_port.values()) / 1e9
        rec.pfc_storms = sum(d.get("storms", 0) for d in by_port.values())
        rec.pfc_restored = sum(d.get("restored", 0) for d in by_port.values())

    def _victim_hosts(self) -> tuple[int, int, int, list[int]]:
        """(incast receiver, victim's destination, victim's source, incast senders): the
        first host, the second (on the receiver's switch), the last (across the fabric)."""
        n = len(self.hosts)
        if n < 4:
            raise ValueError("the victim and storm scenarios need at least 4 hosts")
        return 0, 1, n - 1, list(range(2, n - 1))

    def _victim_flows(self, scenario: str) -> list[tuple[int, int]]:
        """(source, destination) of the scenario's victim flows: the victim scenario's one;
        the storm's flows to the first host (innocent of the storm)."""
        rx, vdst, vsrc, senders = self._victim_hosts()
        if scenario == "victim":
            return [(vsrc, vdst)]
        return [(s, rx) for s in self._far(senders, rx)]

    def _far(self, senders: list[int], rx: int) -> list[int]:
        far = [s for s in senders if not self._same_switch(s, rx)]
        if not far:
            raise ValueError("the storm scenario needs hosts on another switch than the first")
        return far

    def _summarise_victim(self, rec: RunRecord, cap: Capture, res: dict[str, Any]) -> None:
        """The victim flow's stalls, longest gap between its packets and FCT slowdown (of
        several, the one with the longest gap)."""
        stall = STALL_FRAMES * self.scaling.frame_bytes * 8 / self.scaling.link_bps
        fcts = {(f["src"], f["dst"]): f["fct"] for r in res.get("raw", []) for f in r["sent"]}
        sizes = {(f["src"], f["dst"]): f["size"] for r in res.get("raw", []) for f in r["sent"]}
        worst: tuple[float, int, float | None] | None = None
        for src, dst in self._victim_flows(rec.scenario):
            sip, dip = self.hosts[src].ip, self.hosts[dst].ip
            arrivals = sorted(
                t
                for (fs, fd, _), pts in cap.flows.items()
                if (fs, fd) == (sip, dip)
                for t, _ in pts
            )
            gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
            fct = fcts.get((src, dst))
            slowdown = (
                None
                if fct is None
                else fct / m.ideal_fct(sizes[(src, dst)], self._line(src, dst), self.base_rtt_s)
            )
            one = (max(gaps, default=0.0), sum(1 for g in gaps if g > stall), slowdown)
            if worst is None or one[0] > worst[0]:
                worst = one
        if worst is not None:
            rec.victim_longest_gap_s, rec.victim_stalls, rec.victim_fct_slowdown = worst

    def _collective_start(self, scheme: str) -> dict[str, Any]:
        """The proactive start of a collective under `scheme`: every job declares each flow
        it starts with its fair share of the NIC (testbed.traffic.collective_jobs), as the
        incast's senders do."""
        if not declares_start(scheme, self.cfg.proactive_start):
            return {}
        return {"start_share_bps": self.hosts_nic_bps()}

    def _incast_start_rate(self) -> float | None:
        """The proactive start (`proactive_start`): the incast's senders know its fan-in and
        declare their fair share of the receiver's link to their NICs, which pace them at
        it from the first packet; the rate law moves on from there. None: they declare
        nothing and start at line rate (and so always under no CC, which has no law)."""
        if not declares_start(self._scheme, self.cfg.proactive_start):
            return None
        # the receiver's (wl.incast's default, the first host) link is the bottleneck shared
        return host_nic_bps(self.spec, self.scaling, self.hosts[0].name) / (len(self.hosts) - 1)

    def _workload(self, scenario: str, window: int, ack_every: int) -> dict[str, Any]:
        cfg, s = self.cfg, self.scaling
        nic = self.hosts_nic_bps()
        tr = self.transport(self._scheme, window, ack_every)
        line = payload_line_rate(s, nic)
        k = self.time_scale
        if scenario == "incast":
            return wl.incast(
                self.hosts,
                cfg.incast_bytes,
                receiver=0,
                transport=tr,
                line_rate=line,
                base_rtt=self.base_rtt_s,
                timeout=120 * k * self._stretch("incast_bytes"),
                seed=cfg.seed,
                runner=self.runner,
                start_rate=self._incast_start_rate(),
            )
        if scenario == "allreduce":
            return wl.collective(
                self.hosts,
                cfg.allreduce_bytes,
                chunk=cfg.allreduce_chunk,
                transport=tr,
                timeout=180 * k * self._stretch("allreduce_bytes"),
                seed=cfg.seed,
                runner=self.runner,
                nic_ips=self.nic_ips(),
            )
        if scenario in ("alltoall", "twojob"):
            return self._collective_workload(scenario, window)
        if scenario == "websearch":
            seconds = cfg.websearch_seconds * k  # as many flows at any scale
            # the load is of the hosts' own NICs (the slowest, where their links differ)
            slowest = min(self.nic_rates().values())
            flows = websearch_flows(cfg, len(self.hosts), slowest, seconds)
            res = wl.run_flows(
                self.hosts,
                flows,
                name="websearch",
                transport=tr,
                line_rate=line,
                base_rtt=self.base_rtt_s,
                timeout=(seconds * 6 + 30 * k),
                seed=cfg.seed,
                runner=self.runner,
            )
            res["offered_load"] = gen.offered_load(flows, len(self.hosts), slowest, seconds)
            return res
        if scenario in PFC_SCENARIOS:
            return self._victim_workload(scenario, tr, line)
        if scenario == "flows" and self.flows_override is not None:
            flows = self.flows_override
            end = max((f.start for f in flows), default=0.0)
            return wl.run_flows(
                self.hosts,
                flows,
                name="flows",
                transport=tr,
                line_rate=line,
                base_rtt=self.base_rtt_s,
                timeout=end * 6 + 30 * k,
                seed=cfg.seed,
                runner=self.runner,
            )
        raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")

    def _victim_workload(self, scenario: str, tr: dict[str, Any], line: float) -> dict[str, Any]:
        cfg, k = self.cfg, self.time_scale
        rx, vdst, vsrc, senders = self._victim_hosts()
        size = cfg.incast_bytes
        if scenario == "victim":
            flows = [
                gen.Flow(id=i, src=s, dst=rx, size=size, start=0.0) for i, s in enumerate(senders)
            ]
        else:  # storm: vdst storms; the far hosts send to rx, vsrc to the storming host
            flows = [
                gen.Flow(id=i, src=s, dst=rx, size=size, start=0.0)
                for i, s in enumerate(self._far(senders, rx))
            ]
            self._pfc_storm(vdst, cfg.storm_seconds * k)
        flows.append(gen.Flow(id=len(flows), src=vsrc, dst=vdst, size=size // 2, start=0.0))
        return wl.run_flows(
            self.hosts,
            flows,
            name=scenario,
            transport=tr,
            line_rate=line,
            base_rtt=self.base_rtt_s,
            timeout=120 * k,
            seed=cfg.seed,
            runner=self.runner,
        )

    def _stretch(self, size_field: str) -> float:
        """How much longer than the default suite's a scenario may take: its timeout grows
        with its size beyond the default's (a size set by `--param`)."""
        return max(1.0, getattr(self.cfg, size_field) / getattr(SuiteConfig(), size_field))

    def _line(self, src: int, dst: int) -> float:
        """The payload rate an idle path gives a flow between two of the hosts (by index)."""
        return flow_line_rate(self.spec, self.scaling, self.hosts[src].name, self.hosts[dst].name)

    def _same_switch(self, a: int, b: int) -> bool:
        ha, hb = self.hosts[a].name, self.hosts[b].name
        return self.spec.attachment(ha, 0).node == self.spec.attachment(hb, 0).node

    def _collective_workload(self, scenario: str, window: int) -> dict[str, Any]:
        cfg = self.cfg
        fab = self.collective_fabric(self._scheme, window, fresh_runs=False)
        if scenario == "alltoall":
            return {
                "workload": "alltoall",
                "summary": coll.collective(
                    fab,
                    collective="alltoall",
                    size=cfg.alltoall_bytes,
                    chunk=ALLTOALL_CHUNK,
                ),
            }
        n = len(self.hosts)
        half = list(range(n // 2)), list(range(n // 2, n))
        # each iteration computes for about as long as its collective takes at line rate
        compute = 2 * cfg.twojob_bytes * 8 / (fab.nics * fab.line_rate) / self.scaling.scale
        decls = [
            coll.JobDecl(
                "dp",
                "training",
                half[0],
                {
                    "collective": "allreduce",
                    "size": cfg.twojob_bytes,
                    "chunk": 64 << 10,
                    "iters": 3,
                    "compute": compute,
                },
            ),
            coll.JobDecl(
                "moe",
                "training",
                half[1],
                {
                    "collective": "alltoall",
                    "size": cfg.twojob_bytes,
                    "chunk": 64 << 10,
                    "iters": 3,
                    "compute": compute,
                },
            ),
        ]
        together = coll.Together(fab, decls)
        # each job alone (its slowdown) runs after the cell's own figures are taken: run_one
        return {"workload": "twojob", "summary": together.summary(), "alone": together.run_alone}

    # ---- summarising ----

    def _summarise(
        self,
        scheme: str,
        scenario: str,
        res: dict[str, Any],
        cap: Capture,
        events: list[RateEvent],
        delta: dict[str, PortCounters],
        t_call: float,
    ) -> RunRecord:
        spec = self.spec
        by_link: dict[str, list[int]] = {}
        for h in cap.hops:
            by_link.setdefault(h.link, []).append(h.qocc_bytes)
        qstats = {lk: metrics.queue_stats(v) for lk, v in sorted(by_link.items())}
        if scenario in ("incast", "victim", "storm"):  # the incast receiver's downlink
            h0 = spec.hosts[0]
            bottleneck = str(spec.attachment(h0.name, 0))
        else:
            bottleneck = max(
                qstats, key=lambda lk: (qstats[lk]["p99"], qstats[lk]["max"]), default=""
            )
        q = qstats.get(bottleneck, {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0.0})
        drops_by_switch: dict[str, int] = {}
        for key, c in sorted(delta.items()):
            sw = key.split(":", 1)[0]
            drops_by_switch[sw] = drops_by_switch.get(sw, 0) + c.rx_packets - c.tx_packets
        # traffic's own start: the first INT data packet seen (workers start a moment after
        # the call)
        t_start = min((h.t for h in cap.hops), default=t_call)
        completion, flows, done, slowdowns, busbw, correct = self._workload_figures(scenario, res)
        util = None
        port_delta = delta.get(bottleneck) if bottleneck else None
        if port_delta is not None and completion > 0:
            util = metrics.utilization(
                port_delta.tx_bytes,
                self.scaling.link_bps,
                completion,
                self._port_busy_span(bottleneck),
            )
        counters = workload_counters(res)
        sd = np.asarray(slowdowns) if slowdowns else None
        rec = RunRecord(
            scheme=scheme,
            scenario=scenario,
            bottleneck=bottleneck,
            queue_p50_bytes=q["p50"],
            queue_p99_bytes=q["p99"],
            queue_max_bytes=q["max"],
            queue_samples=int(q["samples"]),
            drops=sum(drops_by_switch.values()),
            utilization=util,
            fct_slowdown_p50=float(np.percentile(sd, 50)) if sd is not None else None,
            fct_slowdown_p99=float(np.percentile(sd, 99)) if sd is not None else None,
            flows=flows,
            flows_completed=done,
            busbw_bps=busbw,
            completion_s=completion,
            int_packets=cap.packets,
            int_max_hops=cap.max_hops,
            retransmits=int(counters.get("retransmits", 0)),
            cnps=int(counters.get("cnps_received", 0)),
            out_of_order=int(counters.get("drops", {}).get("out_of_order", 0)),
            reordered=int(counters.get("reordered", 0)),
            feedback_not_sent=int(counters.get("drops", {}).get("feedback_not_sent", 0)),
            sender_holds=int(counters.get("pfc_holds", 0)),
            start_hints=int(counters.get("rate_hints", 0)),
            sender_held_s=int(counters.get("pfc_held_us", 0)) / 1e6,
            window=self.window(scheme),
            correct=correct,
            queue_by_link=qstats,
            drops_by_switch=drops_by_switch,
            rate_events=len(events),
            slowdowns=[float(x) for x in slowdowns],
        )
        points: dict[str, list[tuple[float, float]]] = {}
        for h in cap.hops:
            points.setdefault(h.link, []).append((h.t - t_start, float(h.qocc_bytes)))
        self._fairness(rec, cap, t_start)
        rec.port_series = {lk: _downsample(v) for lk, v in sorted(points.items())}
        rec.queue_series = rec.port_series.get(bottleneck, _downsample([]))
        last_seen = {f: pts[-1][0] for f, pts in cap.flows.items() if pts}
        ip_host = {n.ip: h.name for h in spec.hosts for n in h.nics}
        rec.rate_series = _rate_series(events, t_start, last_seen, ip_host)
        rec.flow_fcts = _flow_fcts(res, ip_host, self.hosts)
        if scenario == "twojob" and "summary" in res:
            rec.jobs = res["summary"]["jobs"]
        rec.error = str(res.get("failed", ""))
        return rec

    def _fairness(self, rec: RunRecord, cap: Capture, t_start: float) -> None:
        """RunRecord's fairness and utilization after startup, for the incast: its
        bottleneck is the receiver's downlink, which every flow crosses (elsewhere flows of
        any size meet, bottlenecked elsewhere too, and their Jain index says little)."""
        spec, t = self.spec, self.tita_t_s
        if rec.scenario != "incast":
            return
        behind = [
            n.ip
            for h in spec.hosts
            for i, n in enumerate(h.nics)
            if str(spec.attachment(h.name, i)) == rec.bottleneck
        ]
        if not behind or t <= 0:
            return
        arrivals = {f: pts for f, pts in cap.flows.items() if f[1] in behind and pts}
        windows = m.window_fairness(arrivals, t_start, 10 * t)
        if windows:
            rec.fairness_min = min(windows)
            rec.fairness_p50 = float(np.median(windows))
            rec.fairness_windows = len(windows)
        t_from, rate = t_start + 2 * t, self.scaling.link_bps
        rec.util_after_2t = (
            m.link_utilization_by_departures(arrivals, cap.last_hop_egress_ns, rate, t_from)
            if self.util_by_departures
            else m.link_utilization(arrivals, rate, t_from)
        )

    def _workload_figures(
        self, scenario: str, res: dict[str, Any]
    ) -> tuple[float, int, int, list[float], float | None, bool | None]:
        """(completion time, flows, completed flows, FCT slowdowns, busbw b/s, correct)."""
        if "failed" in res:
            return (0.0, 0, 0, [], None, None)
        scale = self.scaling.scale
        if scenario == "alltoall":
            r = res["summary"]
            n = len(self.hosts)
            return (
                r["makespan_s"] * scale,
                n,
                n if r["correct"] else 0,
                [],
                r["makespan_busbw_Bps"] * 8 / scale,
                bool(r["correct"]),
            )
        if scenario == "twojob":
            jobs = res["summary"]["jobs"]
            ok = all(j.get("correct") for j in jobs)
            end = max(j.get("iter_s", 0.0) for j in jobs) * 3 * scale
            dp = jobs[0]
            return (
                end,
                len(jobs),
                sum(bool(j.get("correct")) for j in jobs),
                [],
                dp.get("makespan_busbw_Bps", 0.0) * 8 / scale,
                ok,
            )
        if scenario == "allreduce":
            coll = res["collective"]
            n = len(self.hosts)
            return (
                float(coll["time_s"]),
                n,
                n if res["correct"] else 0,
                [],
                float(coll["busbw_Bps"]) * 8,
                bool(res["correct"]),
            )
        sent = [f for r in res["raw"] for f in r["sent"]]
        done = [f for f in sent if f["fct"] is not None]
        slow = [
            f["fct"] / m.ideal_fct(f["size"], self._line(f["src"], f["dst"]), self.base_rtt_s)
            for f in done
        ]
        end = max((f["start"] + f["fct"] for f in done), default=0.0)
        # correct: every message that arrived arrived intact (unfinished flows are counted
        # apart, as flows - completed)
        intact = res.get("corrupt", 0) == 0
        return (float(end), len(sent), len(done), slow, None, intact)


def workload_counters(res: dict[str, Any]) -> dict[str, Any]:
    """The transport's counters of a workload's result: beside it (flows, the all-reduce) or,
    for the collective library's runs, in its summary (testbed.collective.run.collective)."""
    if "counters" in res:
        return dict(res["counters"])
    return dict(res.get("summary", {}).get("counters", {}))


def fmt_time(s: float) -> str:
    if s >= 1.0:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _flow_fcts(
    res: dict[str, Any], ip_host: dict[str, str], hosts: list[Host]
) -> list[dict[str, Any]]:
    """Every flow of a flows run: id, src and dst host, bytes, start and FCT (s; None when
    it did not complete)."""
    names = [h.name for h in hosts]
    out = []
    for r in res.get("raw", []):
        for f in r.get("sent", []):
            out.append(
                {
                    "id": f["id"],
                    "src": names[f["src"]],
                    "dst": names[f["dst"]],
                    "bytes": f["size"],
                    "start_s": f["start"],
                    "fct_s": f["fct"],
                }
            )
    return sorted(out, key=lambda f: f["id"])


def _downsample(
    points: list[tuple[float, float]], n: int = SERIES_POINTS
) -> dict[str, list[float]]:
    """At most `n` points, keeping each bucket's maximum (queue peaks must survive)."""
    points.sort()
    if len(points) > n:
        t_end = points[-1][0] - points[0][0] or 1.0
        buckets: dict[int, tuple[float, float]] = {}
        for t, v in points:
            b = min(n - 1, int((t - points[0][0]) / t_end * n))
            if b not in buckets or v > buckets[b][1]:
                buckets[b] = (t, v)
        points = [buckets[b] for b in sorted(buckets)]
    return {"t": [_r(t) for t, _ in points], "v": [v for _, v in points]}


def _r(t: float) -> float:
    """A time kept to 6 significant digits (seconds at 20 Mb/s, microseconds at 400G)."""
    return float(f"{t:.6g}")


def _rate_series(
    events: list[RateEvent],
    t0: float,
    last_seen: dict[tuple[str, str, int], float],
    ip_host: dict[str, str],
) -> dict[str, dict[str, list[float]]]:
    """Per flow (named 'src->dst:sport'): its NIC rate as a step function over time, up to
    its last packet seen at the receiver (the rate map keeps a finished flow's last rate)."""
    out: dict[str, dict[str, list[float]]] = {}
    for e in sorted(events, key=lambda e: e.t):
        end = last_seen.get(e.flow)
        if end is not None and e.t > end:
            continue
        name = (
            f"{ip_host.get(e.flow[0], e.flow[0])}->{ip_host.get(e.flow[1], e.flow[1])}:{e.flow[2]}"
        )
        s = out.setdefault(name, {"t": [], "v": [], "end": [_r(end - t0)] if end else []})
        s["t"].append(_r(e.t - t0))
        s["v"].append(float(e.rate_bps))
    return out


def one_line(r: RunRecord) -> str:
    parts = [
        f"p99 queue {r.queue_p99_bytes / 1e3:.0f} KB at {r.bottleneck or '-'}",
        f"drops {r.drops}",
    ]
    if r.error:
        return f"FAILED ({r.error}); " + ", ".join(parts)
    if r.utilization is not None:
        parts.append(f"util {r.utilization:.0%}")
    if r.fct_slowdown_p50 is not None:
        parts.append(f"FCT slowdown p50 {r.fct_slowdown_p50:.1f} p99 {r.fct_slowdown_p99:.1f}")
    if r.busbw_bps is not None:
        parts.append(f"busbw {fmt_rate(r.busbw_bps)}")
    parts.append(f"done in {fmt_time(r.completion_s)}")
    if r.flows_completed != r.flows:
        parts.append(f"{r.flows - r.flows_completed} flows incomplete")
    if r.pauses or r.paused_s:
        parts.append(f"{r.pauses} pauses, paused {fmt_time(r.paused_s)}")
    if r.drops_uncounted:
        parts.append(f"{r.drops_uncounted} of the drops not counted by the switches")
    if r.feedback_not_sent:
        parts.append(f"{r.feedback_not_sent} ACKs/NAKs/CNPs refused by the hosts' sockets")
    if r.sender_holds:
        parts.append(f"senders held {r.sender_holds} times, {fmt_time(r.sender_held_s)}")
    if r.pfc_storms:
        parts.append(f"watchdog: {r.pfc_storms} storms, {r.pfc_restored} restored")
    if r.victim_stalls is not None:
        vs = "-" if r.victim_fct_slowdown is None else f"{r.victim_fct_slowdown:.1f}"
        parts.append(
            f"victim slowdown {vs}, {r.victim_stalls} stalls, longest gap "
            f"{fmt_time(r.victim_longest_gap_s or 0.0)}"
        )
    return ", ".join(parts)
