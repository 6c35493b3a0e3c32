"""The switch model the fabric emulates, and how it is scaled onto veths and two cores.

A 51.2T-class switch (128 x 400G, as Tomahawk 5 / Spectrum-4 class parts) cannot be run at its
speed in software: every port and NIC runs at the model speed divided by one *scale factor*
(400G / 20000 = 20 Mb/s by default). Rates scale; bytes do not (a queue of 100 KB is 100 KB in
the model and in the emulation), so time stretches by the same factor wherever a quantity is a
rate (DCQCN's timers are dilated this way by the host agent). The factor is printed at start.

The NIC's line rate is set a little below the link rate: the NIC paces frames as the
transport hands them over, while switch ports also carry the INT bytes the NIC and every hop
add. With this headroom a single flow at line rate never builds a queue by itself, as on a
real fabric whose NICs account for INT overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Frame overhead of the transport (testbed.traffic.transport): Ethernet 14, IPv4 20, UDP 8,
# BTH 12, ICRC 4, around each packet's payload.
TRANSPORT_OVERHEAD = 14 + 20 + 8 + 12 + 4
INT_HEADER_BYTES = 4 + 12  # shim + MD header the NIC inserts


BUFFERS = ("shared", "static")


# Switches on the path the model's base RTT is for: a leaf-spine's longest (leaf, spine, leaf)
BASE_RTT_PATH_SWITCHES = 3

# Propagation delay of every link in the model that sets none of its own (about 16 m of
# fiber), dilated by the scale like every time of the model: with 4 KB frames at 400G it makes
# the leaf-spine's longest path's base RTT about the model's 1 us. The twin's wires and the
# emulation's delay lines (the built-in switch's --wire) both add it.
LINK_DELAY_MODEL_NS = 80
# The emulation's links: "model", the built-in switches hold each frame for its link's
# serialization and delay; "none", a veth's (at once). The first is the default.
LINK_TIMES = ("model", "none")


@dataclass(frozen=True)
class SwitchModel:
    """What one switch of the modelled fabric is (model units, before scaling)."""

    name: str = "51.2T"
    ports: int = 128
    port_speed_gbps: float = 400.0
    # The packet buffer, bytes (not scaled). "shared": one buffer for the switch's queues
    # with a dynamic threshold per queue (a queue admits while it holds at most
    # `buffer_alpha` times what is free), as 51.2T parts have: NVIDIA's Spectrum-4 (SN5600)
    # has 128 MB for its 128 x 400G (docs/fidelity.md names the sources); a switch of the
    # fabric using N of its ports gets N/128 of it (the part's other ports are assumed as
    # busy). PFC's XOFF is dynamic too: `pfc_alpha` of the free pool, HPCC's simulator's
    # 1/8. "static": each egress queue holds at most `queue_bytes` (v1model's 19-bit
    # queue-depth fields, which the built-in switch fills in bytes, read at most 512 KiB: the
    # static queue stays below that; a shared buffer's deeper queue reads as 512 KiB).
    buffer: str = "shared"
    buffer_bytes: int = 128_000_000
    buffer_alpha: float = 1.0
    pfc_alpha: float = 0.125
    queue_bytes: int = 500_000
    # Base RTT of a leaf-spine of such switches (host - leaf - spine - leaf - host and back:
    # BASE_RTT_PATH_SWITCHES switches)
    base_rtt_us: float = 1.0

    def __post_init__(self) -> None:
        if self.buffer not in BUFFERS:
            raise ValueError(f"buffer {self.buffer!r} is not one of {', '.join(BUFFERS)}")

    def describe(self) -> str:
        return f"{self.name} ({self.ports} x {self.port_speed_gbps:g}G)"

    @property
    def shared(self) -> bool:
        return self.buffer == "shared"

    @property
    def qdepth_unit(self) -> str:
        """What the built-in switch's enq_qdepth / deq_qdepth count: bytes, or cells where a
        shared buffer's queue can pass the 512 KiB that 19 bits of bytes hold."""
        return "cells" if self.shared else "bytes"

    def buffer_per_port(self) -> int:
        """A port's share of the shared buffer (0: static queues)."""
        return self.buffer_bytes // self.ports if self.shared else 0

    def pfc_buffer(self, ports: int) -> tuple[int, float]:
        """What PFC's thresholds divide among a switch's `ports` ports and its dynamic alpha
        (testbed/switch/pfc.py `pfc_thresholds`): its share of the part's shared buffer with
        `pfc_alpha`, or (static) one egress queue's depth, which no queue then exceeds, with
        a static XOFF (0)."""
        if self.shared:
            return self.buffer_per_port() * ports, self.pfc_alpha
        return self.queue_bytes, 0.0


DEFAULT_MODEL = SwitchModel()


def link_latency_s(base_rtt_s: float, path_switches: int = BASE_RTT_PATH_SWITCHES) -> float:
    """One link's share of a base RTT measured over a path of `path_switches` switches
    (path_switches + 1 links each way): its propagation and a frame's serialization, which a
    message's last byte takes per link on top of its time at the bottleneck's rate (the flow
    engine's per-step latency)."""
    if base_rtt_s < 0 or path_switches < 0:
        raise ValueError("a base RTT >= 0 over a path of >= 0 switches")
    return base_rtt_s / (2 * (path_switches + 1))


def model_with_buffer(buffer: str) -> SwitchModel:
    """The default switch model with its buffer shared or static (`--buffer`)."""
    return replace(DEFAULT_MODEL, buffer=buffer)


DEFAULT_SCALE = 20_000.0


@dataclass(frozen=True)
class Scaling:
    """The model at `scale`: emulated rates, the NIC's headroom and the transport's MTU."""

    model: SwitchModel = DEFAULT_MODEL
    scale: float = DEFAULT_SCALE
    transport_mtu: int = 4096  # payload bytes per packet (RoCE's 4096 MTU)
    link_mtu: int = 9000  # IP MTU of every emulated link (jumbo frames carry 4096 + INT)
    int_hop_bytes: int = 28  # per-hop INT record of the default bitmap 0xF500
    max_hops: int = BASE_RTT_PATH_SWITCHES  # switches on the longest path (leaf-spine: 3)

    def __post_init__(self) -> None:
        if self.scale < 1:
            raise ValueError(f"scale {self.scale} must be at least 1")
        if self.link_bps < 1e5:
            raise ValueError(
                f"scale {self.scale:g} leaves {self.link_bps:g} b/s per link: too slow to emulate"
            )

    @property
    def link_bps(self) -> float:
        """Emulated speed of every switch port (model speed / scale)."""
        return self.model.port_speed_gbps * 1e9 / self.scale

    def emulated_bps(self, gbps: float | None) -> float:
        """A link of `gbps` in the model (None: the switch model's ports) at this scale."""
        return self.link_bps if gbps is None else gbps * 1e9 / self.scale

    def nic_rate(self, link_bps: float) -> float:
        """The line rate of a NIC on a link of `link_bps`: less the INT bytes a full frame
        picks up on the longest path, so that a NIC at line rate fits its link."""
        return link_bps * self.frame_bytes / self.wire_frame_bytes

    @property
    def frame_bytes(self) -> int:
        """A full transport frame as the NIC sees it (no INT)."""
        return self.transport_mtu + TRANSPORT_OVERHEAD

    @property
    def wire_frame_bytes(self) -> int:
        """A full transport frame on the longest path's last link, with its INT."""
        return self.frame_bytes + INT_HEADER_BYTES + self.max_hops * self.int_hop_bytes

    @property
    def nic_bps(self) -> float:
        """NIC line rate: the link rate less the INT bytes a full frame picks up on the
        longest path, so that a NIC at line rate fits its link."""
        return self.nic_rate(self.link_bps)

    def link_delay_ns(self, model_ns: int | None = None) -> int:
        """A link's propagation delay at this scale: its own in the model (None: the
        model's LINK_DELAY_MODEL_NS), dilated."""
        return round((LINK_DELAY_MODEL_NS if model_ns is None else model_ns) * self.scale)

    @property
    def base_rtt_s(self) -> float:
        """The model's base RTT, dilated like every other time (TiTa's T)."""
        return self.model.base_rtt_us * 1e-6 * self.scale

    def queue_packets(self) -> int:
        """Queue depth in packets for targets that count packets (bmv2), full frames."""
        return max(1, self.model.queue_bytes // self.frame_bytes)

    def describe(self) -> str:
        return (
            f"switch model {self.model.describe()}, scale 1/{self.scale:g}: "
            f"{self.model.port_speed_gbps:g}G ports run at {fmt_rate(self.link_bps)}, "
            f"NICs at {fmt_rate(self.nic_bps)}; {self.buffer_text()}; "
            f"MTU {self.transport_mtu} B payload; base RTT "
            f"{self.model.base_rtt_us:g} us -> {self.base_rtt_s * 1e3:g} ms"
        )

    def buffer_text(self) -> str:
        m = self.model
        if m.shared:
            return (
                f"buffer shared, {m.buffer_per_port() // 1000} KB per port, "
                f"alpha {m.buffer_alpha:g} (PFC {m.pfc_alpha:g})"
            )
        return f"queues {m.queue_bytes // 1000} KB per port"


def fmt_rate(bps: float) -> str:
    for unit, div in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bps >= div:
            return f"{bps / div:.4g} {unit}"
    return f"{bps:.4g} b/s"
