"""The controller's configuration as frozen dataclasses: what one YAML file says, once it is
valid (controller/config/validate.py reads and checks it).

Rates: every port has a *model* speed (the 51.2T-class switch, e.g. 400 Gb/s) and the fabric
runs at model speed / `model.scale` (e.g. 400G / 4000 = 100 Mb/s on veths). Capacities the
controller computes with (queue rates, max-min caps, utilisation) are the emulated ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from controller.proto import agent_pb2
from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.roce import ROCE_UDP_PORT

SWITCH_KINDS = ("builtin", "bmv2")
INT_MODES = ("switch", "nic", "none")
# the rate laws by name, as the agents' API declares them (agent.proto's RateLaw; the NIC's
# `enum xm_law` and controller.nic.ratelaw.Law hold the same, tests/test_wire_sources.py)
RATE_LAWS: tuple[str, ...] = tuple(
    name.removeprefix("RATE_LAW_").lower() for name, value in agent_pb2.RateLaw.items() if value
)
# Parameters of each rate law, as the host agent names them (controller/proto/agent.proto).
RATE_LAW_PARAMS: dict[str, frozenset[str]] = {
    "tita": frozenset({"eta", "w_ai_bps", "max_stage", "base_rtt_ns", "min_rate_bps"}),
    # HPCC takes TiTa's parameter set (its own values); Swift's target scales with T
    "hpcc": frozenset({"eta", "w_ai_bps", "max_stage", "base_rtt_ns", "min_rate_bps"}),
    "timely": frozenset(
        {
            "alpha",
            "beta",
            "delta_bps",
            "t_low_ns",
            "t_high_ns",
            "min_rtt_ns",
            "hai_steps",
            "min_rate_bps",
        }
    ),
    # base_rtt_ns (T) sets the target's defaults; the others, Swift's own values
    "swift": frozenset(
        {
            "base_rtt_ns",
            "ai_bytes",
            "beta",
            "max_mdf",
            "base_target_ns",
            "per_hop_ns",
            "sender_ttl",
            "min_rate_bps",
        }
    ),
    "dcqcn": frozenset(
        {
            "g",
            "rai_bps",
            "rhai_bps",
            "byte_counter_bytes",
            "alpha_timer_ns",
            "rate_timer_ns",
            "cut_interval_ns",
            "fast_recovery_steps",
            "clamp_target",
            "min_rate_bps",
        }
    ),
    "none": frozenset({"min_rate_bps"}),
}


# ---- the configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class TlsConfig:
    """mTLS material: our certificate and key, and the CA that signs the peers'."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class ControllerSection:
    name: str = "xingmai-controller"
    grpc_addr: str = "127.0.0.1:50100"
    metrics_addr: str | None = None
    web_addr: str | None = None  # the fabric page (controller.web); no authentication
    election_id: int = 10
    tls: TlsConfig | None = None  # the Controller gRPC listener (clients must present a cert)
    p4runtime_tls: TlsConfig | None = None  # our client side towards the switches
    log_level: str = "info"
    log_file: Path | None = None
    counter_poll_s: float = 1.0
    reconnect_max_s: float = 8.0
    rpc_timeout_s: float = 2.0
    series_points: int = 600  # bounded length of every time series
    # localize slow links from INT's hop latency against the queue INT saw (controller/
    # health.py): right where hop latency is the switch's (hardware timestamps, the twin),
    # off where a software switch's hop latency also holds its process's backlog
    int_latency_monitor: bool = True
    # the agents' active probers (controller/nic/prober.py): each probe flow's interval in
    # seconds, 0 off; every host probes up to 32 others from 8 source ports each
    probe_interval_s: float = 0.0


@dataclass(frozen=True)
class PipelineConfig:
    p4info: Path
    bmv2_json: Path


@dataclass(frozen=True)
class ModelConfig:
    """The switch model and its scaling onto the emulation."""

    name: str = "51.2T"
    port_speed_gbps: float = 400.0
    scale: float = 4000.0  # emulated rate = model rate / scale
    queue_depth_bytes: int = 150_000  # emulated, per egress queue
    # a buffer shared by a switch's queues, this much per port (0: static queue depths) with
    # a dynamic threshold per queue: it admits while it holds at most alpha x what is free
    shared_buffer_bytes_per_port: int = 0
    buffer_alpha: float = 1.0
    queue_depth_packets: int = 128
    mean_packet_bytes: int = 1000  # bmv2 sets queue rates in packets/s
    cell_bytes: int = 1  # INT occupancy multiplier: 1 when the target counts bytes


@dataclass(frozen=True)
class CollectorConfig:
    # the daemon's UDP server; by default the address reports are sent to (ip:udp_port), not
    # every address of the host
    listen: str | None = None
    netns: str | None = None  # open that socket in this network namespace (/run/netns/NAME)
    ip: str = "10.0.100.1"  # where switches address reports (in the dataplane)
    mac: str = "02:00:00:00:64:01"
    udp_port: int = 32766
    clone_session: int = 500
    report_src_ip: str = "10.0.100.254"  # source address of reports

    @property
    def bind(self) -> str:
        """HOST:PORT the collector's socket binds."""
        return self.listen or f"{self.ip}:{self.udp_port}"


@dataclass(frozen=True)
class WatchEntry:
    """One INT source watchlist rule (for hosts whose INT is done by the switch)."""

    src: str = "0.0.0.0/0"
    dst: str = "0.0.0.0/0"
    proto: int | None = None
    dport: int | None = None


@dataclass(frozen=True)
class IntConfig:
    dscp: int = INT_DSCP_DEFAULT
    instruction_bitmap: int = 0xF500  # bits 0,1,2,3,5,7
    hop_budget: int = 8
    domain_id: int = 0
    mtu: int = 1500
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    watchlist: tuple[WatchEntry, ...] = (WatchEntry(proto=17, dport=ROCE_UDP_PORT),)


@dataclass(frozen=True)
class EcnConfig:
    """ECN marking at every egress queue (the DCQCN baseline's signal): RED-like between
    kmin and kmax bytes, up to probability pmax. Bytes, not scaled with the model."""

    kmin_bytes: int = 20_000
    kmax_bytes: int = 100_000
    pmax: float = 0.2


@dataclass(frozen=True)
class PortConfig:
    port: int
    speed_gbps: float  # model speed


@dataclass(frozen=True)
class SwitchConfig:
    name: str
    grpc_addr: str
    device_id: int
    node_id: int
    router_mac: str
    ports: tuple[PortConfig, ...]
    kind: str = "builtin"
    thrift_port: int | None = None  # bmv2: queue rates through simple_switch_CLI
    cpu_port: int = 255
    pipeline: PipelineConfig | None = None  # this switch's own artifacts (default: the global)

    def port(self, num: int) -> PortConfig | None:
        return next((p for p in self.ports if p.port == num), None)


@dataclass(frozen=True)
class NicConfig:
    name: str
    ip: str
    mac: str


@dataclass(frozen=True)
class HostConfig:
    name: str
    nics: tuple[NicConfig, ...]
    agent: str | None = None  # HostAgent gRPC address
    int_mode: str = "nic"  # who is INT source and sink for this host: nic, switch or none


@dataclass(frozen=True)
class Endpoint:
    """One end of a link: a switch port, a host NIC, or the collector."""

    node: str
    port: int | None = None  # switch port
    nic: str | None = None  # host NIC

    def __str__(self) -> str:
        if self.port is not None:
            return f"{self.node}:{self.port}"
        if self.nic is not None:
            return f"{self.node}:{self.nic}"
        return self.node


@dataclass(frozen=True)
class LinkConfig:
    a: Endpoint
    b: Endpoint


@dataclass(frozen=True)
class LawPolicy:
    rate_law: str = "tita"
    params: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyConfig:
    interval_s: float = 1.0
    eta: float = 0.95
    flow_idle_s: float = 3.0  # a flow not reported for this long leaves the computation
    default: LawPolicy = field(default_factory=LawPolicy)
    hosts: Mapping[str, LawPolicy] = field(default_factory=dict)
    auto_tune: bool = False
    push_caps: bool = True

    def for_host(self, host: str) -> LawPolicy:
        return self.hosts.get(host, self.default)


@dataclass(frozen=True)
class Config:
    controller: ControllerSection
    pipeline: PipelineConfig
    model: ModelConfig
    int: IntConfig
    ecn: EcnConfig
    switches: tuple[SwitchConfig, ...]
    hosts: tuple[HostConfig, ...]
    links: tuple[LinkConfig, ...]
    policy: PolicyConfig
    source: Path | None = None

    def switch(self, name: str) -> SwitchConfig:
        for s in self.switches:
            if s.name == name:
                return s
        raise KeyError(name)

    def host(self, name: str) -> HostConfig:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def pipeline_of(self, sw: SwitchConfig) -> PipelineConfig:
        return sw.pipeline or self.pipeline

    def emulated_bps(self, speed_gbps: float) -> float:
        return speed_gbps * 1e9 / self.model.scale

    def warnings(self) -> list[str]:
        """Settings that are valid but cannot do what they ask for."""
        out = []
        for i, h in enumerate(self.hosts):
            # TiTa runs on the INT stack the receiver echoes; only a NIC INT source gets it
            law = self.policy.for_host(h.name).rate_law
            if law in ("tita", "hpcc") and h.int_mode != "nic":
                out.append(
                    f"hosts[{i}] ({h.name}): the {law} rate law needs int: nic, not "
                    f"{h.int_mode!r} (without the NIC as INT source no INT is echoed "
                    "to it, and its rate stays at line rate)"
                )
        return out
