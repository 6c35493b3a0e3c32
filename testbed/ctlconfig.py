"""The controller's config for the network the testbed booted (controller/config/ format).

Names are the fabric's (leaf1, h1); host NICs are named as their Mininet interfaces
(`h1-eth0`); switches are reached on their management addresses, agents on their unix sockets,
and the collector's UDP socket is opened in the collector node's network namespace. Hosts do
their own INT (`int: nic`): the NIC inserts it and the receiving transport echoes it back to
the sender's NIC, which is what the proactive rate law runs on; the switches add their hop
records and leave the hosts' INT alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from controller.config import EcnConfig
from controller.program import tx_util_window_shift
from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.telemetry_report import TELEMETRY_REPORT_PORT
from testbed.model import Scaling
from testbed.switch.packet import CLOCK_NS
from testbed.topo import COLLECTOR_IP, COLLECTOR_MAC, End, FabricSpec

REPORT_SRC_IP = "10.0.100.254"
INT_BITMAP = 0xF500  # node id, L1 ports, hop latency, queue, egress timestamp, tx utilisation


# What the rate laws that read INT (TiTa, HPCC) need of the switches' telemetry, per base RTT
# T: a port's tx utilisation is the load of its last complete window, so a window longer than
# a couple of T reports a load from many RTTs ago (or, early in a window longer than the run,
# nothing: 0); and the hop latencies and egress times are counted in the switch clock's steps.
MAX_TX_WINDOW_RTTS = 2.0
MIN_CLOCK_STEPS_PER_RTT = 10
# a window's load counts whole clock steps (the packets stamped with the same step fall in one
# window): a window of n steps reads the load of n or n + 1 of them, up to 1/n high
MIN_CLOCK_STEPS_PER_WINDOW = 16
# the scales tried for the smallest that resolves (1, 2, 5 x 10^k)
_SCALE_STEPS = tuple(m * 10**k for k in range(7) for m in (1, 2, 5))


def _times(r: float) -> str:
    return f"{r:,.0f}" if r >= 10 else f"{r:.2g}"


def mean_packet_bytes(scaling: Scaling) -> int:
    """The frame size the controller sizes the switches' tx utilisation windows by."""
    return min(9216, scaling.frame_bytes)


@dataclass(frozen=True)
class TelemetryResolution:
    """How finely the switches' INT sees the fabric at a scale, against the base RTT T the
    laws act on: the longest tx utilisation window the controller programs (2^shift ns,
    controller/program.py; the program takes 2^10 ns and up) and
    the switch clock's step (v1model counts microseconds). All in the emulation's seconds."""

    tx_window_s: float
    clock_s: float
    base_rtt_s: float

    def problems(self) -> list[str]:
        out = []
        if self.tx_window_s > MAX_TX_WINDOW_RTTS * self.base_rtt_s:
            out.append(
                f"the switches' tx utilisation windows are {self.tx_window_s * 1e6:,.0f} us, "
                f"{_times(self.tx_window_s / self.base_rtt_s)} base RTTs (at most "
                f"{MAX_TX_WINDOW_RTTS:g}): INT's utilisation is stale, or 0 within a run "
                "shorter than a window, and TiTa and HPCC see queues only"
            )
        if self.clock_s * MIN_CLOCK_STEPS_PER_WINDOW > self.tx_window_s:
            out.append(
                f"a tx utilisation window holds {_times(self.tx_window_s / self.clock_s)} steps "
                f"of the switch clock (at least {MIN_CLOCK_STEPS_PER_WINDOW}): a busy port "
                "reads up to one step's load too much or too little"
            )
        if self.clock_s * MIN_CLOCK_STEPS_PER_RTT > self.base_rtt_s:
            out.append(
                f"the switch clock counts {self.clock_s * 1e6:g} us, "
                f"{_times(self.clock_s / self.base_rtt_s)} base RTTs (at most "
                f"1/{MIN_CLOCK_STEPS_PER_RTT}): hop latencies and egress times are coarse"
            )
        return out

    @property
    def resolves(self) -> bool:
        return not self.problems()

    def record(self, smallest_scale: float | None) -> dict[str, Any]:
        """results.json's `setup.telemetry`."""
        return {
            "tx_window_s": self.tx_window_s,
            "clock_s": self.clock_s,
            "base_rtt_s": self.base_rtt_s,
            "resolves": self.resolves,
            "problems": self.problems(),
            "smallest_resolving_scale": smallest_scale,
        }


def telemetry_resolution(
    spec: FabricSpec, scaling: Scaling, base_rtt_s: float | None = None
) -> TelemetryResolution:
    """The telemetry of `spec`'s switches at `scaling` against `base_rtt_s` (default: the
    model's, dilated). The window is the one the controller programs on the switch whose
    slowest port is the fabric's slowest link (the longest window)."""
    slowest = min(
        (scaling.emulated_bps(lk.gbps) for lk in spec.links),
        default=scaling.link_bps,
    )
    shift = tx_util_window_shift(slowest, mean_packet_bytes(scaling))
    return TelemetryResolution(
        tx_window_s=(1 << shift) * 1e-9,
        clock_s=CLOCK_NS * 1e-9,
        base_rtt_s=scaling.base_rtt_s if base_rtt_s is None else base_rtt_s,
    )


def smallest_resolving_scale(spec: FabricSpec, scaling: Scaling) -> float | None:
    """The smallest scale (1, 2, 5 x 10^k) at which `spec`'s telemetry resolves the model's
    base RTT; None if none up to the slowest links the emulation takes."""
    for k in _SCALE_STEPS:
        try:
            at = replace(scaling, scale=k)
        except ValueError:  # links too slow to emulate
            return None
        if telemetry_resolution(spec, at).resolves:
            return k
    return None


@dataclass(frozen=True)
class SwitchAccess:
    grpc_addr: str
    kind: str
    thrift_port: int | None = None


@dataclass(frozen=True)
class ControllerSetup:
    grpc_addr: str
    collector_netns: str | None
    log_file: str
    rate_law: str = "tita"
    law_params: dict[str, float] = field(default_factory=dict)
    ecn: EcnConfig = EcnConfig()
    int_mode: str = "nic"
    caps: bool = False  # the slow loop's max-min caps (off: the NIC's rate law alone)
    metrics_addr: str | None = None  # Prometheus metrics (loopback)
    web_addr: str | None = None  # the fabric page (loopback)
    # INT's hop latency as a latency monitor: the twin's switches timestamp as hardware does;
    # the emulation's software switches stamp a frame when the kernel received it, so its
    # hop latency also holds the wait in the switch process's socket buffer (healthy links
    # of the emulation's WebSearch waited 1.3-6 ms per packet beyond their queue, unevenly)
    int_latency_monitor: bool = True
    probe_interval_s: float = 0.0  # the agents' active probers; 0: off


def controller_config(
    spec: FabricSpec,
    scaling: Scaling,
    switches: dict[str, SwitchAccess],
    agents: dict[str, str],
    setup: ControllerSetup,
    p4info: str,
    bmv2_json: str,
) -> dict[str, Any]:
    """A config document for `xingmai-controller`, validated by controller.config.parse."""
    sw_docs = []
    for s in spec.switches:
        acc = switches[s.name]
        doc: dict[str, Any] = {
            "name": s.name,
            "grpc_addr": acc.grpc_addr,
            "device_id": s.device_id,
            "node_id": s.node_id,
            "router_mac": s.router_mac,
            "kind": acc.kind,
            "ports": [_port_doc(spec, s.name, p) for p in spec.switch_ports(s.name)],
        }
        if acc.thrift_port is not None:
            doc["thrift_port"] = acc.thrift_port
        sw_docs.append(doc)
    hosts = []
    for h in spec.hosts:
        hd: dict[str, Any] = {
            "name": h.name,
            "int": setup.int_mode,
            "nics": [{"name": h.ifname(i), "ip": n.ip, "mac": n.mac} for i, n in enumerate(h.nics)],
        }
        if h.name in agents:
            hd["agent"] = agents[h.name]
        hosts.append(hd)
    links: list[list[str]] = []
    for lk in spec.links:
        ends = []
        for e in (lk.a, lk.b):
            ends.append(
                str(e)
                if spec.is_switch(e.node)
                else f"{e.node}:{spec.host(e.node).ifname(e.index)}"
            )
        links.append(ends)
    if spec.collector is not None:
        links.append([str(spec.collector), "collector"])
    m = scaling.model
    collector: dict[str, Any] = {
        "ip": COLLECTOR_IP,
        "mac": COLLECTOR_MAC,  # listens on ip:udp_port
        "udp_port": TELEMETRY_REPORT_PORT,
        "report_src_ip": REPORT_SRC_IP,
    }
    if setup.collector_netns:
        collector["netns"] = setup.collector_netns
    controller: dict[str, Any] = {
        "name": "testbed",
        "grpc_addr": setup.grpc_addr,
        "counter_poll_s": 1.0,
        "rpc_timeout_s": 3.0,
        "int_latency_monitor": setup.int_latency_monitor,
        "probe_interval_s": setup.probe_interval_s,
        "reconnect_max_s": 2.0,
        "log_level": "info",
        "log_file": setup.log_file,
    }
    for key in ("metrics_addr", "web_addr"):
        if getattr(setup, key):
            controller[key] = getattr(setup, key)
    return {
        "controller": controller,
        "pipeline": {"p4info": p4info, "bmv2_json": bmv2_json},
        "model": {
            "name": m.describe(),
            "port_speed_gbps": m.port_speed_gbps,
            "scale": scaling.scale,
            "queue_depth_bytes": m.queue_bytes,
            # bmv2's depth (it counts packets only); the built-in switch's packet limit is
            # the byte depth in the smallest frames, the bytes bind (controller/queues.py)
            "queue_depth_packets": scaling.queue_packets(),
            "shared_buffer_bytes_per_port": m.buffer_per_port(),
            "buffer_alpha": m.buffer_alpha,
            "mean_packet_bytes": mean_packet_bytes(scaling),
            "cell_bytes": 1,
        },
        "int": {
            "dscp": INT_DSCP_DEFAULT,
            "instruction_bitmap": INT_BITMAP,
            "hop_budget": 8,
            "mtu": scaling.link_mtu,
            "collector": collector,
        },
        "ecn": {
            "kmin_bytes": setup.ecn.kmin_bytes,
            "kmax_bytes": setup.ecn.kmax_bytes,
            "pmax": setup.ecn.pmax,
        },
        "switches": sw_docs,
        "hosts": hosts,
        "links": links,
        "policy": {
            "interval_s": 1.0,
            "eta": 0.95,
            "default": {"rate_law": setup.rate_law, "params": dict(setup.law_params)},
            "push_caps": setup.caps,
        },
    }


def _port_doc(spec: FabricSpec, switch: str, port: int) -> int | dict[str, Any]:
    """A switch port as the controller's config lists it: with its link's own speed."""
    lk = spec.link_at(End(switch, port))
    if lk is None or lk.gbps is None:
        return port
    return {"port": port, "speed_gbps": lk.gbps}
