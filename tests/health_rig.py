"""The 2x2 example fabric's switch counters, grown as traffic flows, fed to a localizer."""

from __future__ import annotations

from pathlib import Path

from controller.config import load
from controller.health import Localizer, NicSample, PortSample, SwitchSample
from controller.topology import Topology

EXAMPLE = Path(__file__).resolve().parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"
PORTS = {
    "leaf1": (1, 2, 3, 4, 5, 6),
    "leaf2": (1, 2, 3, 4, 5, 6),
    "spine1": (1, 2),
    "spine2": (1, 2),
}

NIC_LINE_BPS = 1e9


class Fabric:
    """Counters that grow as traffic flows: every switch port sends `pps` frames per second
    to its peer, which receives them all unless the link loses some."""

    def __init__(self) -> None:
        self.topo = Topology(load(EXAMPLE))
        self.loc = Localizer(self.topo, mtu_bytes=4154)
        self.tx = {(s, p): 0 for s, ps in PORTS.items() for p in ps}
        self.rx = dict.fromkeys(self.tx, 0)
        self.mon = {k: (0, 0, 0) for k in self.tx}  # departures, wait, expected wait
        self.t = 0.0
        self.loss: dict[tuple[str, int], float] = {}
        self.extra_wait_ns: dict[tuple[str, int], int] = {}
        self.down: set[tuple[str, int]] = set()
        self.idle: set[tuple[str, int]] = set()  # ports that send nothing
        self.silent: set[str] = set()
        # INT's view (the collector's totals per directed link): a port draining at this
        # fraction of its rate that no switch counter shows (a silent rate fault)
        self.silent_rate: dict[tuple[str, int], float] = {}
        # ... and a healthy port draining a deep queue: its packets wait this many times what
        # the dequeue depth INT carries explains, while it sends at its full rate
        self.draining: dict[tuple[str, int], float] = {}
        # departures, wait, expected wait, departures leaving a queue, their tx util (ppm)
        self.int = {k: (0, 0, 0, 0, 0) for k in self.tx}
        self._owed: dict[tuple[str, int], float] = {}  # fractions of frames lost so far
        self.errors: dict[tuple[str, int], int] = {}
        # ports that PFC pauses hold: the share of each step their egress is paused
        self.paused: dict[tuple[str, int], float] = {}
        self.paused_ns = dict.fromkeys(self.tx, 0)
        # every host's NIC: its flows waiting to leave are paced at `nic_waiting` of its line
        # rate, and it sends `nic_sends` of that (1: a healthy NIC); PFC holds it `nic_paused`
        # of each step
        self.hosts = [h.name for h in self.topo.cfg.hosts]
        self.nic_waiting = dict.fromkeys(self.hosts, 0.6)
        self.nic_sends = dict.fromkeys(self.hosts, 1.0)
        self.nic_paused = dict.fromkeys(self.hosts, 0.0)
        self.nic_tx = dict.fromkeys(self.hosts, 0.0)
        self.nic_waited = dict.fromkeys(self.hosts, 0.0)  # bits: the integral of the rates
        self.nic_paused_ns = dict.fromkeys(self.hosts, 0)

    def step(self, dt: float = 0.1, pps: int = 500) -> list[str]:
        self.t += dt
        n = int(pps * dt)
        for s, p in self.tx:
            self.paused_ns[(s, p)] += round(self.paused.get((s, p), 0.0) * dt * 1e9)
            if (s, p) in self.down or (s, p) in self.idle:
                continue
            self.tx[(s, p)] += n
            peer = self.topo.peer(s, p)
            if peer is not None and peer.node in PORTS and peer.port is not None:
                # a lossy link's receiving end counts the corrupted frames
                rx = (peer.node, peer.port)
                owed = self._owed.get(rx, 0.0) + n * self.loss.get(rx, 0.0)
                bad = int(owed)
                self._owed[rx] = owed - bad
                self.rx[rx] += n - bad
                self.errors[rx] = self.errors.get(rx, 0) + bad
            di, wi, ei, bi, ui = self.int[(s, p)]
            # INT: what the queue it saw explains at the nominal rate (2 ms: every departure
            # leaves a queue), the wait at the rate the port really drains at, and the share of
            # its rate the port sent at
            rate = self.silent_rate.get((s, p), 1.0)
            self.int[(s, p)] = (
                di + n,
                wi + round(n * 2_000_000 * self.draining.get((s, p), 1.0) / rate),
                ei + n * 2_000_000,
                bi + n,
                ui + n * round(rate * 1_000_000),
            )
            d, w, e = self.mon[(s, p)]
            # a healthy port waits what its queue explains (2 ms here) plus a little
            self.mon[(s, p)] = (
                d + n,
                w + n * (2_100_000 + self.extra_wait_ns.get((s, p), 0)),
                e + n * 2_000_000,
            )
        for s, ps in PORTS.items():
            if s in self.silent:
                self.loc.unreachable(s, self.t)
                continue
            self.loc.observe(
                SwitchSample(
                    s,
                    self.t,
                    {
                        p: PortSample(
                            p,
                            up=(s, p) not in self.down,
                            tx_packets=self.tx[(s, p)],
                            rx_packets=self.rx[(s, p)],
                            rx_errors=self.errors.get((s, p), 0),
                            departures=self.mon[(s, p)][0],
                            wait_ns=self.mon[(s, p)][1],
                            expected_wait_ns=self.mon[(s, p)][2],
                            paused_ns=self.paused_ns[(s, p)],
                        )
                        for p in ps
                    },
                )
            )
        self.loc.int_waits(self.t, {f"{s}:{p}": v for (s, p), v in self.int.items()})
        for h in self.hosts:
            waiting = self.nic_waiting[h] * NIC_LINE_BPS
            self.nic_waited[h] += waiting * dt
            self.nic_tx[h] += waiting * self.nic_sends[h] * dt / 8
            self.nic_paused_ns[h] += round(self.nic_paused[h] * dt * 1e9)
            self.loc.nic(
                NicSample(
                    h,
                    self.t,
                    int(self.nic_tx[h]),
                    self.nic_waited[h],
                    NIC_LINE_BPS,
                    self.nic_paused_ns[h],
                )
            )
        return [s.element for s in self.loc.evaluate(self.t)]

    def run(self, seconds: float) -> list[str]:
        out: list[str] = []
        for _ in range(round(seconds / 0.1)):
            out = self.step()
        return out
