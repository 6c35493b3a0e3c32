"""The host agent's core: loads the NIC programs, keeps the pacer in step with the rate map,
and carries out the controller's requests (caps, weights, rate laws, INT settings).

Threads: gRPC workers call the public methods; one event thread blocks on the datapath's ring
buffer (xm_events: XDP wrote a flow's rate, tc saw a new flow), re-rates the HTB classes of
the flows that changed, publishes the changes to watchers, and retires idle flows when the
first of them can expire. Nothing runs while nothing happens: no periodic scan of the rate
map (it is read whole only at start, after the agent's own writes, and when the ring was full
and events were lost). While rates move, passes over them are at least `sync_interval_s`
apart (the changes in between are handled together). Map updates are single syscalls;
netlink work is serialised by the pacer's lock.

Restart: pinned maps (flows, rates, CC state, caps, config) are adopted, the root HTB and its
classes are adopted from the kernel and the class map, and the programs are re-attached in
place (XDP and tc replace, sock_ops swapped for the previous agent's pinned program). While no
agent runs, flows stay paced at their last class rate.
"""

from __future__ import annotations

import bisect
import ctypes
import json
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from controller.nic.agent import netdev, tcstats
from controller.nic.agent.pacer import (
    DEFAULT_MINOR,
    MIN_RATE_BPS,
    EdtPacer,
    HtbPacer,
    PacingMode,
    classid,
    detect_mode,
)
from controller.nic.agent.probing import ProbeRunner, start_probing
from controller.nic.backlog import WAITING_SAMPLE_S, WaitingMeter
from controller.nic.bpf.loader import (
    CTL_HAS_CAP,
    CTL_HAS_PARAMS,
    EV_RATE,
    ORIGIN_AGENT,
    ORIGINS,
    PACING_EDT,
    PACING_HTB,
    FlowKey,
    NicBpf,
    cc_params_from_c,
    cc_params_to_c,
    key_from_c,
)
from controller.nic.bpf.ringbuf import RingBuffer
from controller.nic.pfc import PinnedPfc
from controller.nic.prober import MAX_FLOWS as MAX_PROBE_FLOWS
from controller.nic.prober import ProbeConfig
from controller.nic.ratelaw import UNIT, CcParams, Law
from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.roce import ROCE_UDP_PORT

log = logging.getLogger("xingmai.agent")

VERSION = "0.1.0"
TCP = 6
UDP = 17
MAX_WEIGHT = 100
INT_BITMAP_DEFAULT = 0xF500  # node id, L1 ports, hop latency, queue, egress ts, tx utilisation


class AgentLimit(Exception):
    """A request the agent refuses to hold more of (RESOURCE_EXHAUSTED at the API)."""


@dataclass(frozen=True)
class AgentOptions:
    name: str
    interfaces: tuple[str, ...]
    line_rate_bps: int
    law: Law = Law.TITA
    base_rtt_ns: int = 100_000
    int_enabled: bool = True
    int_dscp: int = INT_DSCP_DEFAULT
    int_bitmap: int = INT_BITMAP_DEFAULT
    int_hop_budget: int = 8
    mtu: int = 1500
    pacing: str = "auto"  # auto, htb, edt
    sockops: bool = True
    cgroup: Path | None = None  # default: the cgroup v2 mount
    bpffs_root: Path = Path("/run/xingmai/bpffs")
    run_root: Path = Path("/run/xingmai/agents")
    sync_interval_s: float = 0.002  # least time between two passes over rate changes
    rerate_min_change: float = 0.005  # relative change of a flow's rate worth a netlink call
    idle_timeout_s: float = 30.0
    # flows the controller may set (rate, cap, weight, law) before they have sent anything:
    # each can cost an HTB class, and a request must not make thousands for flows that never
    # existed; such settings without a cap or law are forgotten after idle_timeout_s
    max_unseen_flows: int = 256
    # the far end of an interface's wire, (interface, namespace path, peer interface): under
    # HTB tc_wire.c stamps the RTT probes' departures there (the emulation's veth peers)
    wire_peers: tuple[tuple[str, str, str], ...] = ()

    @property
    def pin_dir(self) -> Path:
        return self.bpffs_root / self.name

    @property
    def run_dir(self) -> Path:
        return self.run_root / self.name


# The pacer's lag behind the rate laws (HTB mode), seconds: the upper bounds of a histogram of
# the time from the kernel's write of a rate to its flow's class re-rated. A NIC's rate limiter
# takes its law's rate at once; the agent's rate thread waits for a CPU like any process, and
# sync_interval_s between two batches.
APPLY_LAG_BOUNDS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass
class LagHistogram:
    """Observations counted by the least of `bounds` at or above them (the last bucket: above
    them all), and summed."""

    bounds: tuple[float, ...] = APPLY_LAG_BOUNDS_S
    counts: list[int] = field(default_factory=list)
    sum_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus's buckets: (le, observations at most le), "+Inf" last."""
        out, n = [], 0
        for le, c in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            n += c
            out.append((le, n))
        return out


@dataclass
class FlowView:
    """One flow as ListFlows reports it."""

    key: FlowKey
    rate_bps: int = 0
    rate_origin: str = ""
    cap_bps: int = 0
    weight: int = 1
    law: Law = Law.NONE
    tx_bytes: int = 0
    tx_packets: int = 0
    int_packets: int = 0
    idle_s: float = 0.0
    interface: str = ""
    paced_rate_bps: int = 0
    cc: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RateEvent:
    key: FlowKey
    rate_bps: int
    previous_bps: int
    origin: str
    time_ns: int


class Watcher:
    """A WatchRates subscriber: a bounded queue (the oldest events go when it is full)."""

    # flows whose last told rate a watcher with a min_change remembers; past it, it forgets
    # them all (their next events pass): bounded however many flows come and go
    MAX_TOLD = 1 << 16

    def __init__(self, flows: set[FlowKey] | None, min_change: float, maxsize: int = 10000):
        self.flows = flows
        self.min_change = min_change
        self.q: queue.Queue[RateEvent | None] = queue.Queue(maxsize)
        self.dropped = 0
        self.told: dict[FlowKey, int] = {}  # the rate this watcher was last told, per flow

    def offer(self, ev: RateEvent) -> None:
        if self.flows and ev.key not in self.flows:
            return
        if self.min_change > 0:
            # a change counts against what this watcher was last told, not the previous
            # event's rate: steps each below min_change add up to one that is not
            told = self.told.get(ev.key)
            if told is not None and abs(ev.rate_bps - told) < self.min_change * told:
                return
            if len(self.told) >= self.MAX_TOLD:
                self.told.clear()
            self.told[ev.key] = ev.rate_bps
        while True:
            try:
                self.q.put_nowait(ev)
                return
            except queue.Full:
                try:
                    self.q.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass


class Agent:
    def __init__(self, opts: AgentOptions):
        self.opts = opts
        self.started = time.monotonic()
        self.bpf: NicBpf | None = None
        self.ipr: Any = None
        self.ifindex: dict[str, int] = {}
        self.mode = PacingMode.HTB
        self.mode_detail = ""
        self.pacer: HtbPacer | EdtPacer | None = None
        self.mounted_bpffs = False
        self.adopted = False
        self.created_clsact: dict[str, bool] = {}
        self.tx_csum_restore: dict[str, bool] = {}
        self.xdp_mode: dict[str, str] = {}
        # tc_wire.c where it is attached: (namespace path, ifindex there, clsact made), and
        # by "namespace:peer" whether this agent (or a killed one before it) made the clsact
        self.wires: list[tuple[str, int, bool]] = []
        self.wire_clsact: dict[str, bool] = {}
        self.sockops_cgroup: Path | None = None
        self.lock = threading.RLock()
        self.stop_event = threading.Event()
        self.sync_thread: threading.Thread | None = None
        self.watchers: list[Watcher] = []
        self.rates_seen: dict[FlowKey, tuple[int, int]] = {}  # rate, origin
        self.events: RingBuffer | None = None
        self.event_type: Any = None  # struct xm_event's ctypes (bcc derives it)
        self.events_seen = 0
        self.events_lost = 0  # the datapath's count when the rate map was last read whole
        self.retire_at: float | None = None  # monotonic s: when the first idle flow can expire
        self.sync_runs = 0
        self.sync_seconds = 0.0
        self.sync_errors = 0
        self.flows_retired = 0
        self.apply_lag = LagHistogram()  # rate writes to their classes (on_events)
        self.rpc_calls: dict[str, int] = {}
        self.healthy = False
        # what waited in the NIC (HTB mode), sampled by a thread of its own
        self.meter: WaitingMeter | None = None
        self._meter_lock = threading.Lock()
        self.waiting_errors = 0  # failed reads of the classes' backlogs
        self.waiting_thread: threading.Thread | None = None
        self.pfc: PinnedPfc | None = None  # xm_pfc, for the time pauses held the NIC
        self.probes: ProbeRunner | None = None  # the active prober (SetProbes)

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        o = self.opts
        from pyroute2 import IPRoute

        o.run_dir.mkdir(parents=True, exist_ok=True)
        self._load_previous_state()
        self.mounted_bpffs = netdev.mount_bpffs(o.pin_dir) or self.mounted_bpffs
        programs = ("tc", "xdp", "sockops", *(("wire",) if o.wire_peers else ()))
        self.bpf = NicBpf(o.pin_dir, programs)
        self.adopted = self.bpf.adopted
        self.ipr = IPRoute()
        for name in o.interfaces:
            found = self.ipr.link_lookup(ifname=name)
            if not found:
                raise RuntimeError(f"no interface {name!r} in this network namespace")
            self.ifindex[name] = found[0]
        self.mode, self.mode_detail = detect_mode(o.interfaces[0], o.pacing)
        if self.mode is PacingMode.EDT:
            self.pacer = EdtPacer(self.ipr, list(self.ifindex.values()))
            self.pacer.setup()
        else:
            self.pacer = HtbPacer(self.ipr, list(self.ifindex.values()), o.line_rate_bps)
            if self.pacer.setup():
                self._adopt_classes()
        self._write_config()
        self.events, self.event_type = self.bpf.events()
        for name, idx in self.ifindex.items():
            if o.int_enabled:
                self._tx_checksum_off(name)
            self.xdp_mode[name] = netdev.attach_xdp(name, self.bpf.fd("xdp"))
            created = netdev.attach_tc(self.ipr, idx, self.bpf.fd("tc"), "xm_tc_egress")
            self.created_clsact[name] = created or self.created_clsact.get(name, False)
        if self.mode is PacingMode.HTB:  # EDT: tc egress knows each departure itself
            for _iface, netns_path, peer in o.wire_peers:
                idx, created = netdev.attach_wire(netns_path, peer, self.bpf.fd("wire"))
                # a killed agent's clsact there is this one's to remove
                created = created or self.wire_clsact.get(f"{netns_path}:{peer}", False)
                self.wire_clsact[f"{netns_path}:{peer}"] = created
                self.wires.append((netns_path, idx, created))
        if o.sockops:
            cg = o.cgroup or netdev.cgroup2_root()
            if cg is None:
                log.warning("no cgroup v2 mount: TCP flows are not paced by sock_ops")
            else:
                prev = o.pin_dir / "prog_sockops"
                netdev.attach_sockops(cg, self.bpf.fd("sockops"), prev)
                self.bpf.pin_program("sockops")
                self.sockops_cgroup = cg
        self._save_state()
        self.healthy = True
        log.info(
            "agent started",
            extra={
                "agent": o.name,
                "interfaces": ",".join(o.interfaces),
                "pacing_mode": self.mode.value,
                "pacing_detail": self.mode_detail,
                "adopted_pins": self.adopted,
                "xdp_mode": ",".join(f"{k}={v}" for k, v in self.xdp_mode.items()),
                "wire_stamps": ",".join(f"{n}={p}" for n, _, p in o.wire_peers) or "none",
                "kernel_headers": self.bpf.headers,
                "bpffs": str(o.pin_dir),
            },
        )
        self.sync_thread = threading.Thread(
            target=self._event_loop, name="rate-events", daemon=True
        )
        self.sync_thread.start()
        if isinstance(self.pacer, HtbPacer):
            self.meter = WaitingMeter(o.line_rate_bps * len(self.ifindex))
            self.waiting_thread = threading.Thread(
                target=self._sample_waiting, name="nic-waiting", daemon=True
            )
            self.waiting_thread.start()

    def stop(self) -> None:
        """Detach every program, remove every class and pin this agent made."""
        self.stop_event.set()
        if self.probes is not None:
            self.probes.stop()
        if self.events is not None:
            self.events.wake()
        if self.sync_thread:
            self.sync_thread.join(timeout=2)
        if self.waiting_thread:
            self.waiting_thread.join(timeout=2)
        if self.pfc is not None:
            self.pfc.close()
        if self.events is not None and not (self.sync_thread and self.sync_thread.is_alive()):
            self.events.close()
        self.healthy = False
        for w in self.watchers:
            w.q.put(None)
        bpf = self.bpf
        with self.lock:
            if bpf is not None and self.sockops_cgroup is not None:
                try:
                    netdev.detach_sockops(self.sockops_cgroup, bpf.fd("sockops"))
                except OSError as exc:
                    log.warning("sock_ops detach: %s", exc)
            for name, idx in self.ifindex.items():
                netdev.detach_xdp(name)
                netdev.detach_tc(self.ipr, idx, self.created_clsact.get(name, False))
            for netns_path, idx, created in self.wires:
                netdev.detach_wire(netns_path, idx, created)
            if self.pacer is not None:
                self.pacer.teardown()
            for name, on in self.tx_csum_restore.items():
                try:
                    netdev.set_tx_checksum(name, on)
                except Exception as exc:
                    log.warning("restoring tx checksum on %s: %s", name, exc)
            removed: list[Path] = []
            if bpf is not None:
                removed = bpf.remove_pins()
                bpf.close()
            if self.mounted_bpffs:
                try:
                    netdev.umount(self.opts.pin_dir)
                except OSError as exc:
                    log.warning("unmount %s: %s", self.opts.pin_dir, exc)
            for p in (self.opts.pin_dir, self.opts.run_dir / "state.json"):
                try:
                    p.rmdir() if p.is_dir() else p.unlink()
                except OSError:
                    pass
            try:
                self.opts.run_dir.rmdir()
            except OSError:
                pass
            if self.ipr is not None:
                self.ipr.close()
        log.info("agent stopped", extra={"agent": self.opts.name, "pins_removed": len(removed)})

    def _load_previous_state(self) -> None:
        """A previous agent of this name (killed) made things this one now owns: the bpffs
        mount, clsact qdiscs, and the host's original checksum settings to restore."""
        path = self.opts.run_dir / "state.json"
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        self.mounted_bpffs = bool(old.get("mounted_bpffs"))
        self.created_clsact = {k: bool(v) for k, v in old.get("created_clsact", {}).items()}
        self.wire_clsact = {k: bool(v) for k, v in old.get("wire_clsact", {}).items()}
        self.tx_csum_restore = {k: bool(v) for k, v in old.get("tx_checksum_restore", {}).items()}
        log.info("found a previous agent's state", extra={"pid": old.get("pid")})

    def _save_state(self) -> None:
        """What this agent made, for people and for the next agent (the kernel is the truth)."""
        doc = {
            "name": self.opts.name,
            "pid": os.getpid(),
            "interfaces": self.ifindex,
            "pacing_mode": self.mode.value,
            "bpffs": str(self.opts.pin_dir),
            "mounted_bpffs": self.mounted_bpffs,
            "created_clsact": self.created_clsact,
            "wire_clsact": self.wire_clsact,
            "tx_checksum_restore": self.tx_csum_restore,
            "sockops_cgroup": str(self.sockops_cgroup) if self.sockops_cgroup else None,
        }
        path = self.opts.run_dir / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)

    def _tx_checksum_off(self, name: str) -> None:
        if netdev.tx_checksum(name):
            netdev.set_tx_checksum(name, False)
            self.tx_csum_restore.setdefault(name, True)

    def _write_config(self) -> None:
        assert self.bpf is not None
        o = self.opts
        cfg = self.bpf.config()
        keep = self.adopted and cfg.line_rate_bps != 0
        if keep:
            # the controller's choices (law, parameters, INT) survive a restart
            log.info("adopted host configuration from pinned maps")
        else:
            params = CcParams.defaults(o.law, o.line_rate_bps, o.base_rtt_ns)
            params.validate(o.line_rate_bps)
            cc_params_to_c(params, cfg.cc)
            cfg.int_enabled = int(o.int_enabled)
            cfg.int_dscp = o.int_dscp
            cfg.int_bitmap = o.int_bitmap
            cfg.int_hop_budget = o.int_hop_budget
        cfg.line_rate_bps = o.line_rate_bps
        cfg.netns_cookie = netdev.netns_cookie()
        cfg.pacing_mode = PACING_EDT if self.mode is PacingMode.EDT else PACING_HTB
        cfg.default_classid = classid(DEFAULT_MINOR)
        cfg.int_max_frame = o.mtu + 14
        self.bpf.write_config(cfg)

    def _adopt_classes(self) -> None:
        """After a restart: the class map says which flow owns which HTB class."""
        assert self.bpf is not None and isinstance(self.pacer, HtbPacer)
        kernel = self.pacer.existing_minors()
        rates = {k: int(v.rate_bps) for k, v in self.bpf.items("xm_rates")}
        for key, cid in list(self.bpf.items("xm_class")):
            minor = int(getattr(cid, "value", cid)) & 0xFFFF
            if minor in kernel:
                self.pacer.adopt(key, minor, rates.get(key, 0))
            else:
                self.bpf.delete("xm_class", key)
        log.info("adopted HTB classes", extra={"classes": len(self.pacer.classes)})

    # ---- the sync loop ------------------------------------------------------------------

    def _event_loop(self) -> None:
        """Block on the datapath's events; wake for nothing else than the first idle flow's
        expiry (retire_at) and stop()."""
        assert self.bpf is not None and self.events is not None
        with self.lock:
            self.events_lost = self.bpf.counter("event_lost")
            self.sync_once()  # the flows a previous agent left (adopted pins)
            self.retire_idle_flows()
        while not self.stop_event.is_set():
            timeout = None
            if self.retire_at is not None:
                timeout = max(0.0, self.retire_at - time.monotonic())
            records = self.events.wait(timeout)
            if self.stop_event.is_set():
                break
            t0 = time.perf_counter()
            try:
                if records:
                    self.on_events(records)
                if self.retire_at is not None and time.monotonic() >= self.retire_at:
                    self.retire_idle_flows()
            except Exception:
                self.sync_errors += 1
                log.exception("rate events failed")
            self.sync_runs += 1
            self.sync_seconds += time.perf_counter() - t0
            if records:
                # rates are moving: the next pass takes what came in the meantime together
                self.stop_event.wait(self.opts.sync_interval_s)

    def on_events(self, records: list[bytes]) -> None:
        """Handle a batch of ring records: the flows they name get the rate the rate map
        holds now (the last write wins, whoever made it); watchers get every change the
        events carry, at the kernel's time of the write."""
        assert self.bpf is not None and self.event_type is not None
        self.events_seen += len(records)
        changed: dict[FlowKey, list[Any]] = {}
        for rec in records:
            ev = self.event_type.from_buffer_copy(rec)
            changed.setdefault(key_from_c(ev.key), []).append(ev)
        with self.lock:
            lost = self.bpf.counter("event_lost")
            if lost != self.events_lost:  # the ring was full: read the whole map
                self.events_lost = lost
                self.sync_once()
                return
            for key, evs in changed.items():
                cur = self.bpf.get("xm_rates", key)
                prev = self.rates_seen.get(key)
                if cur is None:
                    if prev is not None:
                        self._drop_pacing(key)
                        del self.rates_seen[key]
                    continue
                # the pacer first: a watcher told of a rate finds it applied (ListFlows)
                now_rate = int(cur.rate_bps)
                if (prev is None or prev[0] != now_rate) and self._apply_pacing(key, now_rate):
                    written = [int(ev.rate.stamp_ns) for ev in evs if int(ev.kind) == EV_RATE]
                    if written:  # since the oldest write this batch carried for the flow
                        self.apply_lag.observe(max(0, time.monotonic_ns() - min(written)) / 1e9)
                self.rates_seen[key] = (now_rate, int(cur.origin))
                last = prev[0] if prev else 0
                for ev in evs:
                    rate = int(ev.rate.rate_bps)
                    if int(ev.kind) != EV_RATE or rate == last:
                        continue
                    out = RateEvent(
                        key,
                        rate,
                        last,
                        ORIGINS.get(int(ev.rate.origin), "?"),
                        int(ev.rate.stamp_ns),
                    )
                    for w in list(self.watchers):
                        w.offer(out)
                    last = rate
            if self.retire_at is None:
                self.retire_at = time.monotonic() + self.opts.idle_timeout_s

    def _ceiling(self, key: FlowKey, ctl: Any | None) -> int:
        ceil = self.opts.line_rate_bps
        if ctl is not None and int(ctl.flags) & CTL_HAS_CAP:
            ceil = min(ceil, int(ctl.cap_bps))
        return ceil

    def sync_once(self) -> None:
        """Bring the pacer in line with the rate map and tell the watchers what moved."""
        assert self.bpf is not None
        now = time.monotonic_ns()
        # The rate map is read under the lock: a snapshot taken before another sync (SetRate's)
        # and applied after it would drop the classes of flows that sync had just paced.
        with self.lock:
            current: dict[FlowKey, tuple[int, int]] = {}
            for key, r in self.bpf.items("xm_rates"):
                current[key] = (int(r.rate_bps), int(r.origin))
            for key, (rate, origin) in current.items():
                prev = self.rates_seen.get(key)
                if prev is None or prev[0] != rate:
                    self._apply_pacing(key, rate)
                    ev = RateEvent(key, rate, prev[0] if prev else 0, ORIGINS.get(origin, "?"), now)
                    for w in list(self.watchers):
                        w.offer(ev)
            for key in set(self.rates_seen) - set(current):
                self._drop_pacing(key)
            self.rates_seen = current
            if current and self.retire_at is None:
                self.retire_at = time.monotonic() + self.opts.idle_timeout_s

    def _apply_pacing(self, key: FlowKey, rate: int, own: bool = False) -> bool:
        """HTB mode: a non-TCP flow below the line rate (or declared: `own`) gets (or
        re-rates) its own class. Whether a class was written."""
        if not isinstance(self.pacer, HtbPacer) or key.proto == TCP:
            return False
        assert self.bpf is not None
        fc = self.pacer.classes.get(key)
        if fc is None and rate >= self.opts.line_rate_bps and not own:
            return False  # the default class already runs at the line rate
        if fc is not None and abs(rate - fc.rate_bps) < self.opts.rerate_min_change * fc.rate_bps:
            return False
        ctl = self.bpf.get("xm_ctl", key)
        weight = int(ctl.weight) if ctl is not None and int(ctl.weight) else 1
        fc, _ = self.pacer.apply(key, rate, weight)
        self.bpf.put("xm_class", key, ctypes.c_uint(classid(fc.minor)))
        return True

    def _drop_pacing(self, key: FlowKey) -> None:
        if isinstance(self.pacer, HtbPacer) and key in self.pacer.classes:
            assert self.bpf is not None
            self.bpf.delete("xm_class", key)
            self.pacer.remove(key)

    def retire_idle_flows(self) -> int:
        """Forget flows that sent nothing for idle_timeout_s and carry no controller setting;
        set retire_at to when the first of the others can expire (None: none can)."""
        assert self.bpf is not None
        now = time.monotonic_ns()  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
        limit = int(self.opts.idle_timeout_s * 1e9)
        ctl_keys = {k for k, _ in self.bpf.items("xm_ctl")}
        retired = 0
        expiries = []
        flows = dict(self.bpf.items("xm_flows"))
        for key, st in list(flows.items()):
            if key in ctl_keys:
                continue
            if now - int(st.last_ns) < limit:
                expiries.append(int(st.last_ns) + limit)
                continue
            self._retire(key)
            retired += 1
        # a rate set for a flow that never sent (SetRate ahead of traffic) goes the same way
        for key, r in list(self.bpf.items("xm_rates")):
            if key in flows or key in ctl_keys:
                continue
            if now - int(r.stamp_ns) < limit:
                expiries.append(int(r.stamp_ns) + limit)
                continue
            self._retire(key)
            retired += 1
        self.flows_retired += retired
        # a little after the expiry: a flow exactly at the limit would be rescheduled again
        self.retire_at = min(expiries) / 1e9 + 0.01 if expiries else None
        return retired

    def _retire(self, key: FlowKey) -> None:
        assert self.bpf is not None
        with self.lock:
            self._drop_pacing(key)
            for m in ("xm_rates", "xm_cc", "xm_flows"):
                self.bpf.delete(m, key)
            self.rates_seen.pop(key, None)

    # ---- controller requests ------------------------------------------------------------

    def _admit(self, keys: list[FlowKey]) -> None:
        """Refuse a request that would hold settings for more than max_unseen_flows flows
        that have sent nothing (checked before any of the request is applied)."""
        assert self.bpf is not None
        seen = {k for k, _ in self.bpf.items("xm_flows")}
        new = {k for k in keys if k not in seen}
        if not new:
            return
        held = {k for k, _ in self.bpf.items("xm_rates")} | {k for k, _ in self.bpf.items("xm_ctl")}
        unseen = (held - seen) | new
        if len(unseen) > self.opts.max_unseen_flows:
            raise AgentLimit(
                f"settings for {len(unseen)} flows that have sent nothing: at most "
                f"{self.opts.max_unseen_flows}"
            )

    def _count(self, rpc: str) -> None:
        self.rpc_calls[rpc] = self.rpc_calls.get(rpc, 0) + 1

    def _ctl(self, key: FlowKey) -> Any:
        assert self.bpf is not None
        ctl = self.bpf.get("xm_ctl", key)
        if ctl is None:
            ctl = self.bpf.new_value("xm_ctl")
            ctl.weight = 1
        return ctl

    def _law_of(self, key: FlowKey, ctl: Any | None) -> Law:
        """The rate laws act on the RoCEv2-like transport's feedback; any other flow (TCP,
        other UDP) is paced at min(line rate, cap)."""
        assert self.bpf is not None
        if key.proto != UDP or key.dport != ROCE_UDP_PORT:
            return Law.NONE
        if ctl is not None and int(ctl.flags) & CTL_HAS_PARAMS:
            return Law(int(ctl.params.law))
        return Law(int(self.bpf.config().cc.law))

    def _store_ctl(self, key: FlowKey, ctl: Any) -> None:
        assert self.bpf is not None
        if int(ctl.flags) == 0 and int(ctl.weight) in (0, 1):
            self.bpf.delete("xm_ctl", key)
        else:
            self.bpf.put("xm_ctl", key, ctl)

    def _reconcile_rate(self, key: FlowKey, ctl: Any | None) -> None:
        """Put the flow's rate map entry in line with its cap and law, then its pacer."""
        assert self.bpf is not None
        law = self._law_of(key, ctl)
        ceil = self._ceiling(key, ctl)
        cur = self.bpf.get("xm_rates", key)
        if law is Law.NONE:
            if ceil >= self.opts.line_rate_bps:
                if cur is not None:
                    self.bpf.delete("xm_rates", key)
            else:
                self.bpf.set_rate(key, ceil, time.monotonic_ns())
        elif cur is not None and int(cur.rate_bps) > ceil:
            self.bpf.set_rate(key, ceil, time.monotonic_ns())
        self.sync_once()

    def set_caps(self, caps: list[tuple[FlowKey, int]]) -> int:
        """All or nothing: every cap is checked before the first is applied."""
        self._count("SetCaps")
        for key, cap in caps:
            if cap < MIN_RATE_BPS:
                raise ValueError(
                    f"cap of {key} must be at least {MIN_RATE_BPS} b/s (the "
                    "slowest the pacer paces)"
                )
        with self.lock:
            self._admit([k for k, _ in caps])
            for key, cap in caps:
                ctl = self._ctl(key)
                ctl.cap_bps = cap
                ctl.flags = int(ctl.flags) | CTL_HAS_CAP
                self._store_ctl(key, ctl)
                self._reconcile_rate(key, ctl)
        return len(caps)

    def clear_caps(self, keys: list[FlowKey]) -> int:
        self._count("ClearCaps")
        assert self.bpf is not None
        n = 0
        with self.lock:
            for key in keys:
                ctl = self.bpf.get("xm_ctl", key)
                if ctl is None or not int(ctl.flags) & CTL_HAS_CAP:
                    continue
                ctl.flags = int(ctl.flags) & ~CTL_HAS_CAP
                ctl.cap_bps = 0
                self._store_ctl(key, ctl)
                self._reconcile_rate(key, self.bpf.get("xm_ctl", key))
                n += 1
        return n

    def set_weights(self, weights: list[tuple[FlowKey, int]]) -> int:
        """All or nothing, as set_caps."""
        self._count("SetWeights")
        for key, w in weights:
            if not 0 <= w <= MAX_WEIGHT:
                raise ValueError(f"weight of {key} must be within [0, {MAX_WEIGHT}]")
        with self.lock:
            self._admit([k for k, _ in weights])
            for key, w in weights:
                ctl = self._ctl(key)
                ctl.weight = w or 1
                self._store_ctl(key, ctl)
        return len(weights)

    def effective_params(self, base: CcParams, law: Law, overrides: dict[str, Any]) -> CcParams:
        """CcParams for `law`: the defaults for this line rate, then the given overrides."""
        o = self.opts
        # T (TitaParams.base_rtt_ns) also sets HPCC's T and Swift's target
        tita_o = overrides.get("tita", {})
        p = CcParams.defaults(
            law, o.line_rate_bps, tita_o.get("base_rtt_ns", base.tita.base_rtt_ns)
        )
        if law is Law.HPCC:  # the TitaParams message carries HPCC's own values
            p = replace(p, hpcc=replace(p.hpcc, **tita_o))
        else:
            p = replace(p, tita=replace(p.tita, **tita_o))
        p = replace(p, dcqcn=replace(p.dcqcn, **overrides.get("dcqcn", {})))
        p = replace(p, timely=replace(p.timely, **overrides.get("timely", {})))
        p = replace(p, swift=replace(p.swift, **overrides.get("swift", {})))
        if "min_rate_bps" in overrides:
            p = replace(p, min_rate_bps=overrides["min_rate_bps"])
        p.validate(o.line_rate_bps)
        return p

    def host_params(self) -> CcParams:
        assert self.bpf is not None
        return cc_params_from_c(self.bpf.config().cc)

    def set_rate_law(self, key: FlowKey | None, law: Law, overrides: dict[str, Any]) -> CcParams:
        self._count("SetRateLaw")
        assert self.bpf is not None
        with self.lock:
            params = self.effective_params(self.host_params(), law, overrides)
            if key is not None:
                self._admit([key])
            if key is None:
                cfg = self.bpf.config()
                cc_params_to_c(params, cfg.cc)
                self.bpf.write_config(cfg)
                flows = [k for k, _ in self.bpf.items("xm_rates")]
            else:
                ctl = self._ctl(key)
                cc_params_to_c(params, ctl.params)
                ctl.flags = int(ctl.flags) | CTL_HAS_PARAMS
                self._store_ctl(key, ctl)
                flows = [key]
            for k in flows:
                self._reconcile_rate(k, self.bpf.get("xm_ctl", k))
            log.info("rate law set", extra={"flow": str(key) if key else "host", "law": law.name})
            return params

    def clear_flow_rate_law(self, key: FlowKey) -> None:
        self._count("ClearFlowRateLaw")
        assert self.bpf is not None
        with self.lock:
            ctl = self.bpf.get("xm_ctl", key)
            if ctl is None:
                return
            ctl.flags = int(ctl.flags) & ~CTL_HAS_PARAMS
            self._store_ctl(key, ctl)
            self._reconcile_rate(key, self.bpf.get("xm_ctl", key))

    def set_rate(self, key: FlowKey, rate_bps: int) -> int:
        self._count("SetRate")
        assert self.bpf is not None
        with self.lock:
            self._admit([key])
            ctl = self.bpf.get("xm_ctl", key)
            if ctl is not None and int(ctl.flags) & CTL_HAS_PARAMS:
                prm = cc_params_from_c(ctl.params)
            else:
                prm = self.host_params()
            rate = max(prm.min_rate_bps, min(rate_bps, self._ceiling(key, ctl)))
            self.bpf.set_rate(key, rate, time.monotonic_ns())
            self.sync_once()
            return rate

    def declare_flows(self, keys: list[FlowKey]) -> int:
        """Flows about to send: each gets a rate at its ceiling and its own pacing class now,
        before its first packet, so it never moves between classes (a move reorders it). A
        flow with a rate already, or TCP, is left as it is. Returns how many were declared."""
        self._count("DeclareFlows")
        assert self.bpf is not None
        declared = 0
        with self.lock:
            self._admit(keys)
            now = time.monotonic_ns()
            for key in keys:
                if key.proto == TCP or self.bpf.get("xm_rates", key) is not None:
                    continue
                rate = self._ceiling(key, self.bpf.get("xm_ctl", key))
                self.bpf.set_rate(key, rate, now)
                self._apply_pacing(key, rate, own=True)
                # the rate it had without one: no change to tell the watchers of
                self.rates_seen[key] = (rate, ORIGIN_AGENT)
                declared += 1
            self.sync_once()
        return declared

    def clear_flows(self) -> int:
        """Forget every flow: rate, CC state, counters and pacing class (xm_ctl, the
        controller's settings, stays). Returns how many were forgotten."""
        self._count("ClearFlows")
        assert self.bpf is not None
        with self.lock:
            keys = {k for m in ("xm_flows", "xm_rates", "xm_cc") for k, _ in self.bpf.items(m)}
            keys |= set(self.rates_seen)
            if isinstance(self.pacer, HtbPacer):
                keys |= set(self.pacer.classes)
            for key in keys:
                self._retire(key)
            self.retire_at = None
            return len(keys)

    def set_port_rate(self, rate_bps: int) -> int:
        """The NIC's port rate, all flows together (0: the line rate); the rate laws still
        see the line rate, as a NIC that cannot keep up would not tell them."""
        self._count("SetPortRate")
        if not isinstance(self.pacer, HtbPacer):
            raise ValueError("the port rate is an HTB class: this agent paces by EDT")
        return self.pacer.set_port_rate(rate_bps or self.opts.line_rate_bps)

    def set_hop_speeds(self, speeds: list[tuple[int, int | None, int]]) -> None:
        self._count("SetHopSpeeds")
        assert self.bpf is not None
        for node, port, bps in speeds:
            if not 0 < bps <= 10**12:
                raise ValueError("hop speed must be in (0, 1e12] bit/s")
            self.bpf.set_hop_speed(node, port, bps)

    def set_int(
        self,
        enabled: bool | None = None,
        dscp: int | None = None,
        bitmap: int | None = None,
        hop_budget: int | None = None,
    ) -> None:
        self._count("SetInt")
        assert self.bpf is not None
        if dscp is not None and not 0 <= dscp < 64:
            raise ValueError("DSCP must be within [0, 63]")
        if bitmap is not None and not 0 <= bitmap <= 0xFFFF:
            raise ValueError("instruction bitmap is 16 bits")
        if hop_budget is not None and not 0 <= hop_budget <= 255:
            raise ValueError("hop budget must be within [0, 255]")
        with self.lock:
            cfg = self.bpf.config()
            if enabled is not None:
                cfg.int_enabled = int(enabled)
                if enabled:
                    for name in self.ifindex:
                        self._tx_checksum_off(name)
            if dscp is not None:
                cfg.int_dscp = dscp
            if bitmap is not None:
                cfg.int_bitmap = bitmap
            if hop_budget is not None:
                cfg.int_hop_budget = hop_budget
            self.bpf.write_config(cfg)

    # ---- views --------------------------------------------------------------------------

    def list_flows(self) -> list[FlowView]:
        self._count("ListFlows")
        assert self.bpf is not None
        now = time.monotonic_ns()
        host_law = Law(int(self.bpf.config().cc.law))
        views: dict[FlowKey, FlowView] = {}

        def view(k: FlowKey) -> FlowView:
            roce = k.proto == UDP and k.dport == ROCE_UDP_PORT
            return views.setdefault(k, FlowView(k, law=host_law if roce else Law.NONE))

        names = {idx: name for name, idx in self.ifindex.items()}
        for k, st in self.bpf.items("xm_flows"):
            v = view(k)
            v.tx_bytes, v.tx_packets = int(st.tx_bytes), int(st.tx_packets)
            v.int_packets = int(st.int_packets)
            v.idle_s = max(0.0, (now - int(st.last_ns)) / 1e9)
            v.interface = names.get(int(st.ifindex), str(int(st.ifindex)))
        for k, r in self.bpf.items("xm_rates"):
            v = view(k)
            v.rate_bps, v.rate_origin = int(r.rate_bps), ORIGINS.get(int(r.origin), "?")
        for k, c in self.bpf.items("xm_ctl"):
            v = view(k)
            v.cap_bps = int(c.cap_bps) if int(c.flags) & CTL_HAS_CAP else 0
            v.weight = int(c.weight) or 1
            if int(c.flags) & CTL_HAS_PARAMS:
                v.law = Law(int(c.params.law))
        for k, s in self.bpf.items("xm_cc"):
            v = view(k)
            v.cc = {
                "rate_bps": int(s.rate_bps),
                "ref_rate_bps": int(s.ref_rate_bps),
                "utilization": int(s.util) / UNIT,
                "inc_stage": int(s.inc_stage),
                "alpha": int(s.alpha) / UNIT,
                "timer_count": int(s.timer_count),
                "byte_count": int(s.byte_count),
                "feedback": int(s.feedback),
                "updates": int(s.updates),
            }
        if isinstance(self.pacer, HtbPacer):
            with self.lock:  # the event thread re-rates classes
                classes = dict(self.pacer.classes)
            for k, fc in classes.items():
                if k in views:
                    views[k].paced_rate_bps = fc.rate_bps
        for v in views.values():
            if not v.rate_bps:
                v.rate_bps = min(self.opts.line_rate_bps, v.cap_bps or self.opts.line_rate_bps)
                v.rate_origin = v.rate_origin or "agent"
        return sorted(views.values(), key=lambda v: v.key)

    def watch(self, flows: set[FlowKey] | None, min_change: float) -> Watcher:
        """Subscribe to rate changes. The watcher first gets every watched flow's current rate
        (origin "current"), so a change made while the subscription was being set up is seen
        either way."""
        w = Watcher(flows, min_change)
        now = time.monotonic_ns()
        with self.lock:
            for key, (rate, _origin) in self.rates_seen.items():
                w.offer(RateEvent(key, rate, rate, "current", now))
            self.watchers.append(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        with self.lock:
            if w in self.watchers:
                self.watchers.remove(w)

    def set_probes(
        self, interval_s: float, local_ip: str, peers: list[str], cfg: dict[str, int]
    ) -> int:
        """SetProbes: a new prober (its counts from zero), or none with an interval of 0;
        the probe flows it sends."""
        self._count("SetProbes")
        if not interval_s >= 0 or interval_s == float("inf"):
            raise ValueError("the probe interval must be a finite number of seconds >= 0")
        for ip in [local_ip, *peers] if interval_s > 0 else []:
            try:
                socket.inet_aton(ip)
            except OSError:
                raise ValueError(f"not an IPv4 address: {ip!r}") from None
        ports = cfg.get("ports_per_peer") or 8
        if len(peers) * ports > MAX_PROBE_FLOWS:
            raise AgentLimit(f"at most {MAX_PROBE_FLOWS} probe flows (peers x ports)")
        with self.lock:
            if self.probes is not None:
                self.probes.stop()
                self.probes = None
            if interval_s <= 0:
                return 0
            assert self.bpf is not None
            pcfg = ProbeConfig(
                interval_s, ports_per_peer=ports, congested_bytes=cfg.get("congested_bytes", 0)
            )
            self.probes = start_probing(
                local_ip, peers, pcfg, cfg.get("seed", 1), self.bpf.config().int_dscp
            )
            return len(self.probes.prober.targets)

    def pause_probes(self, paused: bool) -> bool:
        """PauseProbes: stop sending probes (receiving goes on) or send again; whether the
        NIC probes now."""
        self._count("PauseProbes")
        runner = self.probes
        if runner is None:
            return False
        if paused:
            runner.paused.set()
        else:
            runner.paused.clear()
        return not paused

    def probe_tallies(self) -> dict[str, Any]:
        """GetProbes: what the prober sent and the probe flows it received (none: empty)."""
        self._count("GetProbes")
        runner = self.probes
        out: dict[str, Any] = {"time_ns": time.monotonic_ns()}
        if runner is not None:
            out.update(runner.snapshot())
        return out

    def nic_counters(self) -> dict[str, int]:
        """GetNicCounters: the bytes the interfaces sent, what waited in the NIC (the time
        integral of its waiting flows' rates) and the time PFC pauses held it."""
        self._count("GetNicCounters")
        return self.nic_totals()

    def nic_totals(self) -> dict[str, int]:
        """What GetNicCounters answers (the controller's slow-NIC rule reads it), also
        exported to Prometheus."""
        assert self.bpf is not None
        now = time.monotonic_ns()
        tx = tcstats.tx_bytes(list(self.ifindex))
        with self._meter_lock:
            waiting_bits = int(self.meter.bits) if self.meter is not None else 0
        with self.lock:  # the transport's reader of the pinned map, opened once
            if self.pfc is None:
                self.pfc = PinnedPfc(self.opts.pin_dir / "xm_pfc")
            pfc = self.pfc.state(0)
        return {
            "time_ns": now,
            "tx_bytes": tx,
            "waiting_bits": waiting_bits,
            "line_rate_bps": self.opts.line_rate_bps * len(self.ifindex),
            "paused_ns": pfc.held_ns(now),
        }

    def _sample_waiting(self) -> None:
        """Every WAITING_SAMPLE_S: the rates of the flow classes holding packets, into the
        meter (its own netlink socket: the pacer's is not touched from this thread)."""
        assert isinstance(self.pacer, HtbPacer) and self.meter is not None
        reader = tcstats.ClassBacklogs()
        failing = False
        try:
            while not self.stop_event.wait(WAITING_SAMPLE_S):
                with self.pacer.lock:
                    rates = {fc.minor: fc.rate_bps for fc in self.pacer.classes.values()}
                waiting = 0
                try:
                    for idx in self.ifindex.values():
                        for minor, qlen in reader.read(idx).items():
                            if qlen and minor in rates:
                                waiting += min(rates[minor], self.opts.line_rate_bps)
                except OSError as exc:
                    self.waiting_errors += 1
                    if not failing:  # once per streak: 20 a second would flood the log
                        log.warning("reading the classes' backlogs: %s", exc)
                    failing = True
                    continue
                if failing:
                    log.info("reading the classes' backlogs again")
                failing = False
                with self._meter_lock:
                    self.meter.sample(time.monotonic(), waiting)
        finally:
            reader.close()

    def status(self) -> dict[str, Any]:
        self._count("GetStatus")
        assert self.bpf is not None
        cfg = self.bpf.config()
        return {
            "name": self.opts.name,
            "version": VERSION,
            "healthy": self.healthy
            and self.sync_thread is not None
            and self.sync_thread.is_alive(),
            "interfaces": list(self.opts.interfaces),
            "pacing_mode": self.mode.value,
            "pacing_detail": self.mode_detail,
            "line_rate_bps": int(cfg.line_rate_bps),
            "host_law": self.host_params(),
            "int_enabled": bool(cfg.int_enabled),
            "int_dscp": int(cfg.int_dscp),
            "int_bitmap": int(cfg.int_bitmap),
            "int_hop_budget": int(cfg.int_hop_budget),
            "bpffs": str(self.opts.pin_dir),
            "adopted_pins": self.adopted,
            "kernel_headers": self.bpf.headers,
            "flows": len(list(self.bpf.items("xm_flows"))),
            "counters": self.bpf.counter_values(),
            "uptime_s": time.monotonic() - self.started,
        }
