"""The twin's NIC on its eBPF programs themselves: ebpf/tc_egress.c and ebpf/xdp_ingress.c
compiled for this process.

`NativeNic` has the interface of the Python reference of both programs
(testbed/sim/nic_programs.py `ReferencePrograms`: egress, ingress, SetRate) and, for the rate
laws alone, `ReferenceNic`'s `on_frame` (controller/nic/ratelaw/reference.py); it runs the C
the kernel runs (testbed/sim/nic_native.c gives it maps and helpers), so the twin's INT source
and rate laws are the NIC's own, not a third copy. The references stay, and
tests/test_nic_native.py holds them equal, frame for frame and state for state.

The struct layouts Python writes and reads are xingmai.h's, parsed by cffi from the header
after the preprocessor (nothing re-declared here), and checked against the compiler's sizes
when the library loads. The build is cached as the native switch pipeline's is
(testbed/switch/native/build.py); where it cannot be built (no C compiler, no ebpf/ sources
beside an installed package) `NativeNic.load()` raises BuildError with the reason in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controller.nic.bpf.header import EBPF_DIR, HEADER, defines
from controller.nic.ratelaw import CcParams, CcState, Law, RttProbe
from controller.nic.ratelaw.base import HopRecord
from controller.nic.ratelaw.reference import parse_feedback
from controller.wire.int_md import MD_LEN, SHIM_LEN
from testbed.sim.nic_programs import FlowStats, IntSource
from testbed.switch.native.build import BuildError, build, compiler, load

SHIM = Path(__file__).with_name("nic_native.c")
PROGRAMS = ("xdp_ingress.c", "tc_egress.c")
INT_GROWTH = SHIM_LEN + MD_LEN  # what tc's INT source inserts
EGRESS_ROOM = 1 << 14  # the egress buffer kept: a jumbo frame with INT and more
# the structs whose sizes the C reports (xm_nic_sizeof), in its order
SIZED = (
    "struct xm_host_config",
    "struct xm_flow_stats",
    "struct xm_flow_ctl",
    "struct xm_rate",
    "struct xm_cc_state",
    "struct xm_flow_key",
    "struct xm_hop_key",
)
_API = """
struct xm_nic;
struct xm_nic *xm_nic_new(void);
void xm_nic_free(struct xm_nic *nic);
int xm_nic_map_id(const char *name);
void *xm_nic_map_get(struct xm_nic *nic, int id, const void *key, int create);
int xm_nic_map_delete(struct xm_nic *nic, int id, const void *key);
void xm_nic_map_clear(struct xm_nic *nic, int id);
uint32_t xm_nic_map_count(struct xm_nic *nic, int id);
size_t xm_nic_sizeof(int which);
int xm_nic_xdp(struct xm_nic *nic, const uint8_t *frame, uint32_t len, uint64_t now_ns);
uint32_t xm_nic_tc(struct xm_nic *nic, uint8_t *buf, uint32_t len, uint32_t room,
                   uint64_t now_ns);
int xm_nic_rx(struct xm_nic *nic, const uint8_t *frame, uint32_t len, uint64_t now_ns,
              const struct xm_flow_key *key, uint64_t *rate);
int xm_nic_host_rx(struct xm_nic *nic, const uint8_t *frame, uint32_t len, uint64_t now_ns,
                   uint64_t *rate);
int xm_nic_feedback(struct xm_nic *nic, const uint8_t *frame, uint32_t len, uint64_t now_ns,
                    const struct xm_flow_key *key, uint64_t tx_bytes, uint32_t snd_nxt_psn,
                    uint32_t psn_valid, uint32_t probe_seq, uint32_t probe_psn,
                    uint64_t probe_ns, uint64_t paced_bps, uint64_t *rate);
"""
_TYPES = (
    "typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; "
    "typedef uint64_t __u64; typedef int32_t __s32; typedef int64_t __s64;\n"
)
_UAPI = re.compile(r"^#include <uapi/linux/([\w.]+)>", re.M)
# Warnings off for the eBPF code, written for clang's BPF target: its unrolling pragmas (gcc
# knows none), loop counters compared across signedness (the verifier bounds them), and a
# path with a `*` in a comment
EBPF_WARNINGS_OFF = ("-Wunknown-pragmas", "-Wsign-compare", "-Wcomment")


def source() -> str:
    """The shim with the programs and the project's headers expanded in place of their
    includes (one self-contained text: the cache's .c beside the object is what ran). The
    kernel's uapi headers become the system's; the shim has its own struct xdp_md and
    __sk_buff."""
    # the loader reads the eBPF headers when it loads: only where they are
    from controller.nic.bpf.loader import expand_includes

    pragmas = "".join(f'#pragma GCC diagnostic ignored "{w}"\n' for w in EBPF_WARNINGS_OFF)
    text = SHIM.read_text()
    for name in PROGRAMS:
        include = f'#include "{name}"\n'
        if include not in text:
            raise BuildError(f"{SHIM.name} has no {include.strip()!r} to expand")
        program = _UAPI.sub(
            lambda m: "" if m.group(1) == "bpf.h" else f"#include <linux/{m.group(1)}>",
            expand_includes(EBPF_DIR / name),
        )
        text = text.replace(include, program)
    return pragmas + text


def header_cdef() -> str:
    """xingmai.h's declarations after the preprocessor: its structs and enums, for cffi."""
    try:
        res = subprocess.run(
            [compiler(), "-E", "-P", str(HEADER)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"the C preprocessor failed to run: {exc}") from exc
    if res.returncode != 0:
        raise BuildError(f"the C preprocessor failed on {HEADER.name}: {res.stderr[:200]}")
    return _TYPES + res.stdout


@functools.lru_cache(maxsize=1)
def library() -> tuple[Any, Any]:
    """(ffi, lib) of the native program, built once per process (and cached across them)."""
    if not all((EBPF_DIR / name).is_file() for name in PROGRAMS):
        raise BuildError(f"the NIC's eBPF sources are not here ({EBPF_DIR})")
    text = source()
    digest = hashlib.sha256(text.encode()).hexdigest()
    so = build(text, digest, stem="nic")
    ffi, lib = load(header_cdef() + _API, so)
    for i, name in enumerate(SIZED):
        if ffi.sizeof(name) != lib.xm_nic_sizeof(i):
            raise BuildError(
                f"{name}: {ffi.sizeof(name)} bytes as cffi lays xingmai.h out, "
                f"{lib.xm_nic_sizeof(i)} as the compiler does"
            )
    return ffi, lib


def _key_bytes(ffi: Any, key: tuple[int, int, int, int, int]) -> Any:
    """A struct xm_flow_key of a flow key tuple (addresses as network-order ints, ports host
    order): addresses and ports kept as on the wire."""
    saddr, daddr, sport, dport, proto = key
    k = ffi.new("struct xm_flow_key *")
    k.saddr = int.from_bytes(saddr.to_bytes(4, "big"), "little")
    k.daddr = int.from_bytes(daddr.to_bytes(4, "big"), "little")
    k.sport = socket.htons(sport)
    k.dport = socket.htons(dport)
    k.proto = proto
    return k


class NativeNic:
    """The compiled programs of one host: the flows' counters and law states live in their
    maps (`flow_stats`, `state`). `hop_speeds`: (node id, port) -> bit/s of the ports INT
    reports (port ALL_PORTS: the node's default), as the agent writes xm_hop_speed;
    `int_source`: the agent's SetInt (None: INT off)."""

    def __init__(
        self,
        line_rate_bps: int,
        params: CcParams,
        hop_speeds: Mapping[tuple[int, int], int] | None = None,
        int_source: IntSource | None = None,
    ):
        self.ffi, self.lib = library()
        nic = self.lib.xm_nic_new()
        if nic == self.ffi.NULL:
            raise MemoryError("the native NIC's maps")
        self._nic = self.ffi.gc(nic, self.lib.xm_nic_free)
        self._id = {
            n: self.lib.xm_nic_map_id(n.encode())
            for n in ("xm_config", "xm_flows", "xm_rates", "xm_cc", "xm_ctl", "xm_hop_speed")
        }
        if min(self._id.values()) < 0:
            raise BuildError(f"the program lacks a map the NIC writes: {self._id}")
        self.line_rate_bps = line_rate_bps
        self._psn_valid = defines()["XM_FLOW_PSN_VALID"]
        zero = self.ffi.new("uint32_t *", 0)
        self._config = self.ffi.cast(
            "struct xm_host_config *", self._get("xm_config", zero, create=False)
        )
        self._config.line_rate_bps = line_rate_bps
        if int_source is not None:
            c = self._config
            c.int_enabled = int(int_source.enabled)
            c.int_dscp = int_source.dscp
            c.int_bitmap = int_source.bitmap
            c.int_hop_budget = int_source.hop_budget
            c.int_max_frame = int_source.max_frame
        self.params = params
        for (node, port), bps in (hop_speeds or {}).items():
            hk = self.ffi.new("struct xm_hop_key *", {"node_id": node, "port": port})
            self.ffi.cast("uint64_t *", self._get("xm_hop_speed", hk))[0] = bps
        self._keys: dict[tuple[int, int, int, int, int], Any] = {}
        self._ctl: set[tuple[int, int, int, int, int]] = set()
        self._rate = self.ffi.new("uint64_t *")
        self._egress_buf = self.ffi.new("uint8_t[]", EGRESS_ROOM)

    @property
    def params(self) -> CcParams:
        return self._params

    @params.setter
    def params(self, params: CcParams) -> None:
        from controller.nic.bpf.loader import cc_params_to_c

        self._params = params
        cc_params_to_c(params, self._config.cc)

    def _get(self, table: str, key: Any, create: bool = True) -> Any:
        v = self.lib.xm_nic_map_get(self._nic, self._id[table], key, int(create))
        if v == self.ffi.NULL:
            raise MemoryError(f"the native NIC's {table} is full")
        return v

    def _key(self, key: tuple[int, int, int, int, int]) -> Any:
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = _key_bytes(self.ffi, key)
        return k

    def on_frame(
        self,
        frame: bytes,
        *,
        now_ns: int,
        tx_bytes: int,
        snd_nxt_psn: int | None,
        cap_bps: int | None = None,
        weight: int = 1,
        params: CcParams | None = None,
        rtt_probe: RttProbe | None = None,
        paced_bps: int | None = None,
    ) -> int | None:
        """ReferenceNic.on_frame on the program (the laws' differential test: the flow's
        counters come from the caller, as the reference takes them)."""
        fb = parse_feedback(frame)
        if fb is None:
            self.lib.xm_nic_xdp(self._nic, frame, len(frame), now_ns)
            return None
        key = fb.key
        k = self._key(key)
        if cap_bps is not None or weight != 1 or params is not None:
            self._set_ctl(key, k, cap_bps, weight, params)
        elif key in self._ctl:
            self.lib.xm_nic_map_delete(self._nic, self._id["xm_ctl"], k)
            self._ctl.discard(key)
        probe = rtt_probe or RttProbe()
        handled = self.lib.xm_nic_feedback(
            self._nic,
            frame,
            len(frame),
            now_ns,
            k,
            tx_bytes,
            snd_nxt_psn or 0,
            int(snd_nxt_psn is not None),
            probe.seq,
            probe.psn,
            probe.sent_ns,
            paced_bps or 0,
            self._rate,
        )
        return int(self._rate[0]) if handled else None

    # ---- the twin's calls: the programs on the frames, the maps theirs ----

    def egress(self, frame: bytes, now_ns: int) -> bytes:
        """tc egress on a frame the host sends (Ethernet header first): INT inserted into a
        data packet, the flow's counters and RTT probe in xm_flows."""
        room = len(frame) + INT_GROWTH
        # one buffer for every frame (a new one per frame cost a third of this call)
        buf = self._egress_buf if room <= EGRESS_ROOM else self.ffi.new("uint8_t[]", room)
        self.ffi.memmove(buf, frame, len(frame))
        n = self.lib.xm_nic_tc(self._nic, buf, len(frame), room, now_ns)
        return frame if n == len(frame) else self.ffi.buffer(buf, n)[:]

    def tc_entry(self) -> tuple[int, int, int]:
        """(tc egress's C function, this NIC's state, the room tc needs past a frame), as
        addresses: for C built apart that runs tc on its frames (the native transport core's
        `frame_sender`); valid while this NIC lives."""
        fn = self.ffi.cast("uintptr_t", self.ffi.addressof(self.lib, "xm_nic_tc"))
        return int(fn), int(self.ffi.cast("uintptr_t", self._nic)), INT_GROWTH

    def ingress(self, frame: bytes, now_ns: int, key: tuple[int, int, int, int, int]) -> int | None:
        """XDP on a frame of the flow `key` (the caller read it from the headers): the flow's
        rate after it, None when it was no feedback the law acted on."""
        if self.lib.xm_nic_rx(self._nic, frame, len(frame), now_ns, self._key(key), self._rate):
            return int(self._rate[0])
        return None

    def set_rate(self, key: tuple[int, int, int, int, int], rate_bps: int) -> None:
        """The agent's SetRate: the flow's rate in xm_rates (0: none)."""
        k = self._key(key)
        if rate_bps:
            self.ffi.cast("struct xm_rate *", self._get("xm_rates", k)).rate_bps = rate_bps
        else:
            self.lib.xm_nic_map_delete(self._nic, self._id["xm_rates"], k)

    def flow_stats(self, key: tuple[int, int, int, int, int]) -> FlowStats | None:
        """What tc counted of the flow (struct xm_flow_stats), as the reference keeps it."""
        v = self.lib.xm_nic_map_get(self._nic, self._id["xm_flows"], self._key(key), 0)
        if v == self.ffi.NULL:
            return None
        st = self.ffi.cast("struct xm_flow_stats *", v)
        valid = st.flags & self._psn_valid
        return FlowStats(
            int(st.tx_bytes),
            int(st.snd_nxt_psn) if valid else None,
            RttProbe(int(st.rtt_probe_seq), int(st.rtt_probe_psn), int(st.rtt_probe_ns)),
        )

    def _set_ctl(
        self,
        key: tuple[int, int, int, int, int],
        k: Any,
        cap_bps: int | None,
        weight: int,
        params: CcParams | None,
    ) -> None:
        from controller.nic.bpf.loader import CTL_HAS_CAP, CTL_HAS_PARAMS, cc_params_to_c

        ctl = self.ffi.cast("struct xm_flow_ctl *", self._get("xm_ctl", k))
        ctl.flags = (CTL_HAS_CAP if cap_bps is not None else 0) | (
            CTL_HAS_PARAMS if params is not None else 0
        )
        ctl.cap_bps = cap_bps or 0
        ctl.weight = weight
        if params is not None:
            cc_params_to_c(params, ctl.params)
        self._ctl.add(key)

    def state(self, key: tuple[int, int, int, int, int]) -> CcState | None:
        """The flow's law state (struct xm_cc_state) as the reference's CcState."""
        v = self.lib.xm_nic_map_get(self._nic, self._id["xm_cc"], self._key(key), 0)
        if v == self.ffi.NULL:
            return None
        c = self.ffi.cast("struct xm_cc_state *", v)
        values = {
            f.name: int(getattr(c, f.name))
            for f in dataclasses.fields(CcState)
            if f.name not in ("law", "hops")
        }
        hops = [
            HopRecord(
                **{h.name: int(getattr(c.hops[i], h.name)) for h in dataclasses.fields(HopRecord)}
            )
            for i in range(len(c.hops))
        ]
        return CcState(law=Law(int(c.law)), hops=hops, **values)

    def reset(self) -> None:
        """Every flow forgotten (a new job): tc's, the rates', the laws' and the controls'."""
        for table in ("xm_flows", "xm_rates", "xm_cc", "xm_ctl"):
            self.lib.xm_nic_map_clear(self._nic, self._id[table])
        self._ctl.clear()
        self._keys.clear()

    def __len__(self) -> int:
        """Flows with a law's state."""
        return int(self.lib.xm_nic_map_count(self._nic, self._id["xm_cc"]))
