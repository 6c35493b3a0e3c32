"""Compile the NIC programs with bcc, adopt or create their pinned maps, and read/write them.

The struct layouts come from ebpf/xingmai.h through bcc (each table's .Key/.Leaf ctypes); the
map list, the counter names and the flag and enum values come from the same header
(controller/nic/bpf/header.py). Nothing here re-declares them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import logging
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from controller.nic.bpf import header, syscalls
from controller.nic.bpf.ringbuf import RingBuffer
from controller.nic.ratelaw import CcParams, Law

log = logging.getLogger("xingmai.agent.bpf")

EBPF_DIR = header.EBPF_DIR
HEADER = header.HEADER
KERNEL_HEADERS_CACHE = Path("/var/cache/xingmai/kernel-headers")

MAPS = header.pinned_maps()
RING_BUFFERS = header.ring_buffers()
PROG_PINS = {"sockops": "prog_sockops"}

_ORIGIN = header.enum("xm_rate_origin")
ORIGINS = {v: k.removeprefix("XM_ORIGIN_").lower() for k, v in _ORIGIN.items()}
ORIGIN_AGENT = _ORIGIN["XM_ORIGIN_AGENT"]
_PACING = header.enum("xm_pacing_mode")
PACING_HTB = _PACING["XM_PACING_HTB"]
PACING_EDT = _PACING["XM_PACING_EDT"]
_DEFINES = header.defines()
CTL_HAS_CAP = _DEFINES["XM_CTL_HAS_CAP"]
CTL_HAS_PARAMS = _DEFINES["XM_CTL_HAS_PARAMS"]
ALL_PORTS = _DEFINES["XM_ALL_ONES32"]  # xm_hop_key.port of a node's default speed
_EVENT = header.enum("xm_event_kind")
EV_RATE = _EVENT["XM_EV_RATE"]
EV_FLOW = _EVENT["XM_EV_FLOW"]


class BpfSetupError(RuntimeError):
    """The programs cannot be built or loaded here; the message says what to do."""


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    source: str
    function: str
    prog_type: int  # bcc.BPF.* program type


def program_specs() -> tuple[ProgramSpec, ...]:
    from bcc import BPF  # Debian's python3-bpfcc, exposed to the venv by `make install`

    return (
        ProgramSpec("tc", "tc_egress.c", "xm_tc_egress", BPF.SCHED_CLS),
        ProgramSpec("xdp", "xdp_ingress.c", "xm_xdp_ingress", BPF.XDP),
        ProgramSpec("sockops", "sockops.c", "xm_sockops", BPF.SOCK_OPS),
        # the far end of the wire under HTB (the emulation's veth peers; Agent.start)
        ProgramSpec("wire", "tc_wire.c", "xm_tc_wire", BPF.SCHED_CLS),
        # the NIC rig's rate-law stand-in (never attached; testbed/emu/nicrig.py)
        ProgramSpec("rig_rate_write", "rig_rate_write.c", "xm_rig_rate_write", BPF.XDP),
    )


def kernel_headers() -> str:
    """Point bcc at kernel headers (BCC_KERNEL_SOURCE) and return where they are.

    The running kernel's own build tree when present, else Debian's headers merged by
    `make install` into KERNEL_HEADERS_CACHE.
    """
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return os.environ["BCC_KERNEL_SOURCE"]
    own = Path("/lib/modules") / os.uname().release / "build"
    if (own / "include").exists():
        return str(own)
    if (KERNEL_HEADERS_CACHE / ".merged").exists():
        os.environ["BCC_KERNEL_SOURCE"] = str(KERNEL_HEADERS_CACHE)
        return str(KERNEL_HEADERS_CACHE)
    raise BpfSetupError(
        f"no kernel headers for {os.uname().release}: neither {own} nor {KERNEL_HEADERS_CACHE}"
        " exists; run `make kernel-headers` (or `make install`) in the xingmai checkout"
    )


def counter_names() -> list[str]:
    """XM_CNT_* names in enum order, without the prefix, lower case."""
    names = header.enum("xm_counter")
    return [n.removeprefix("XM_CNT_").lower() for n in names if n != "XM_CNT_MAX"]


_LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$')


def expand_includes(path: Path, seen: set[Path] | None = None) -> str:
    """`path`'s text with each `#include "..."` of ebpf/ replaced by that file's text, once per
    file, with #line directives so compiler messages name the real file and line."""
    seen = set() if seen is None else seen
    seen.add(path)
    name = path.relative_to(EBPF_DIR)
    out = [f'#line 1 "{name}"']
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = _LOCAL_INCLUDE.match(line)
        if m is None:
            out.append(line)
            continue
        inc = EBPF_DIR / m.group(1)
        if not inc.is_file():
            raise BpfSetupError(f'{name}:{n}: #include "{m.group(1)}" is not a file of {EBPF_DIR}')
        if inc not in seen:
            out.append(expand_includes(inc, seen))
        out.append(f'#line {n + 1} "{name}"')
    return "\n".join(out) + "\n"


def program_text(spec: ProgramSpec, pin_dir: Path) -> str:
    """The program with the project's headers (xingmai.h, lib/*.h) expanded in place: bcc only
    rewrites map accesses in the file it compiles, so the helpers that use maps must be part
    of its text."""
    return f'#define XM_PIN_DIR "{pin_dir}"\n' + expand_includes(EBPF_DIR / spec.source)


# ---- flow keys ------------------------------------------------------------------------------


class FlowKey(NamedTuple):
    """A flow as the controller names it (same order as controller.slowloop.FlowKey)."""

    src: str
    dst: str
    proto: int
    sport: int
    dport: int

    def __str__(self) -> str:
        return f"{self.src}:{self.sport}->{self.dst}:{self.dport}/{self.proto}"


def key_to_c(key: FlowKey, ctype: type) -> Any:
    k = ctype()
    k.saddr = int.from_bytes(socket.inet_aton(key.src), "little")
    k.daddr = int.from_bytes(socket.inet_aton(key.dst), "little")
    k.sport = socket.htons(key.sport)
    k.dport = socket.htons(key.dport)
    k.proto = key.proto
    return k


def key_from_c(k: Any) -> FlowKey:
    return FlowKey(
        socket.inet_ntoa(int(k.saddr).to_bytes(4, "little")),
        socket.inet_ntoa(int(k.daddr).to_bytes(4, "little")),
        int(k.proto),
        socket.ntohs(int(k.sport)),
        socket.ntohs(int(k.dport)),
    )


def cc_params_to_c(p: CcParams, c: Any) -> None:
    """Fill a `struct xm_cc_params` (ctypes) from CcParams."""
    c.law = int(p.law)
    c.min_rate_bps = p.min_rate_bps
    c.tita.wai_bps = p.tita.wai_bps
    c.tita.eta = p.tita.eta
    c.tita.max_stage = p.tita.max_stage
    c.tita.base_rtt_ns = p.tita.base_rtt_ns
    d = p.dcqcn
    c.dcqcn.rai_bps = d.rai_bps
    c.dcqcn.rhai_bps = d.rhai_bps
    c.dcqcn.byte_counter = d.byte_counter
    c.dcqcn.g = d.g
    c.dcqcn.alpha_timer_ns = d.alpha_timer_ns
    c.dcqcn.rate_timer_ns = d.rate_timer_ns
    c.dcqcn.cut_interval_ns = d.cut_interval_ns
    c.dcqcn.fast_recovery_steps = d.fast_recovery_steps
    c.dcqcn.clamp_target = d.clamp_target
    for name in ("wai_bps", "eta", "max_stage", "base_rtt_ns"):
        setattr(c.hpcc, name, getattr(p.hpcc, name))
    for name in ("delta_bps", "alpha", "beta", "t_low_ns", "t_high_ns", "min_rtt_ns", "hai_steps"):
        setattr(c.timely, name, getattr(p.timely, name))
    for name in ("ai_bytes", "beta", "max_mdf", "base_target_ns", "per_hop_ns", "sender_ttl"):
        setattr(c.swift, name, getattr(p.swift, name))


def cc_params_from_c(c: Any) -> CcParams:
    from controller.nic.ratelaw import DcqcnParams, SwiftParams, TimelyParams, TitaParams

    def fields(struct: Any, cls: type) -> dict[str, int]:
        return {f.name: int(getattr(struct, f.name)) for f in dataclasses.fields(cls)}

    return CcParams(
        law=Law(int(c.law)) if int(c.law) in set(Law) else Law.NONE,
        min_rate_bps=int(c.min_rate_bps),
        tita=TitaParams(
            wai_bps=int(c.tita.wai_bps),
            eta=int(c.tita.eta),
            max_stage=int(c.tita.max_stage),
            base_rtt_ns=int(c.tita.base_rtt_ns),
        ),
        hpcc=TitaParams(**fields(c.hpcc, TitaParams)),
        timely=TimelyParams(**fields(c.timely, TimelyParams)),
        swift=SwiftParams(**fields(c.swift, SwiftParams)),
        dcqcn=DcqcnParams(
            rai_bps=int(c.dcqcn.rai_bps),
            rhai_bps=int(c.dcqcn.rhai_bps),
            byte_counter=int(c.dcqcn.byte_counter),
            g=int(c.dcqcn.g),
            alpha_timer_ns=int(c.dcqcn.alpha_timer_ns),
            rate_timer_ns=int(c.dcqcn.rate_timer_ns),
            cut_interval_ns=int(c.dcqcn.cut_interval_ns),
            fast_recovery_steps=int(c.dcqcn.fast_recovery_steps),
            clamp_target=int(c.dcqcn.clamp_target),
        ),
    )


def lookup_all(t: Any, chunk: int = 256) -> list[tuple[Any, Any]]:
    """Every (key, value) of a hash table, read `chunk` entries per BPF_MAP_LOOKUP_BATCH.

    bcc's items_lookup_batch() allocates (and zeroes) room for max_entries keys and values
    on every call: 65,536 of them here, 20 MB for xm_cc, some 10 ms of CPU per call even for
    an empty map. Read the entries that exist, in chunks."""
    from bcc.libbcc import lib

    keys, values = (t.Key * chunk)(), (t.Leaf * chunk)()
    token, count = ctypes.c_uint32(0), ctypes.c_uint32(0)
    out: list[tuple[Any, Any]] = []
    first = True
    while True:
        count.value = chunk
        res = lib.bpf_lookup_batch(
            t.map_fd,
            None if first else ctypes.byref(token),
            ctypes.byref(token),
            ctypes.byref(keys),
            ctypes.byref(values),
            ctypes.byref(count),
        )
        err = ctypes.get_errno()
        # copies out of the buffers (their elements may be plain ints: a u32 value's)
        ks, vs = ctypes.sizeof(t.Key), ctypes.sizeof(t.Leaf)
        for i in range(count.value):
            out.append(
                (t.Key.from_buffer_copy(keys, i * ks), t.Leaf.from_buffer_copy(values, i * vs))
            )
        if res == 0:
            first = False
            continue
        if err == errno.ENOENT:  # the last chunk
            return out
        if err == errno.ENOSPC and count.value == 0:  # a hash bucket holds more: grow
            return lookup_all(t, chunk * 4)
        raise OSError(err, f"BPF_MAP_LOOKUP_BATCH: {os.strerror(err)}")


# ---- the programs and their maps ------------------------------------------------------------


class NicBpf:
    """The NIC programs compiled against one pin directory (a bpffs folder).

    Maps that are already pinned there are adopted (bcc opens the pin instead of creating a
    map), after checking that their layout is the one this header describes.
    """

    def __init__(self, pin_dir: Path, programs: tuple[str, ...] = ("tc", "xdp", "sockops")):
        self.pin_dir = Path(pin_dir)
        self.headers = kernel_headers()
        self.adopted = any((self.pin_dir / m).exists() for m in MAPS)
        from bcc import BPF

        self.modules: dict[str, Any] = {}
        self.functions: dict[str, Any] = {}
        for spec in program_specs():
            if spec.name not in programs:
                continue
            try:
                b = BPF(
                    text=program_text(spec, self.pin_dir).encode(),
                    cflags=[f"-I{EBPF_DIR}", "-Wno-unused-function"],
                )
            except Exception as exc:
                raise BpfSetupError(
                    f"bcc could not compile {spec.source} (kernel headers: {self.headers}): {exc}"
                ) from exc
            self._check_layouts(b)
            try:
                self.functions[spec.name] = b.load_func(spec.function.encode(), spec.prog_type)
            except Exception as exc:
                raise BpfSetupError(f"the kernel refused {spec.function}: {exc}") from exc
            self.modules[spec.name] = b
        self.tables = next(iter(self.modules.values()))
        self.counters = counter_names()

    def _check_layouts(self, b: Any) -> None:
        for name in MAPS:
            t = b.get_table(name.encode())
            info = syscalls.map_info(t.map_fd)
            leaf = getattr(t, "sLeaf", t.Leaf)  # per-CPU tables: one CPU's value
            want = (ctypes.sizeof(t.Key), ctypes.sizeof(leaf), int(t.max_entries))
            if name in RING_BUFFERS:  # records, no keys or values: only the size
                want = (0, 0, int(t.max_entries))
            have = (info.key_size, info.value_size, info.max_entries)
            if want != have:
                raise BpfSetupError(
                    f"pinned map {self.pin_dir / name} has key/value/entries {have}, this "
                    f"agent's header says {want}: it was made by an incompatible build; stop "
                    f"the agent that owns it or remove the pins in {self.pin_dir}"
                )

    def fd(self, program: str) -> int:
        return int(self.functions[program].fd)

    def close(self) -> None:
        for b in self.modules.values():
            b.cleanup()
        self.modules.clear()

    # ---- typed access ----

    def table(self, name: str) -> Any:
        return self.tables[name.encode()]

    def key(self, flow: FlowKey) -> Any:
        return key_to_c(flow, self.table("xm_rates").Key)

    def config(self) -> Any:
        return self.table("xm_config")[ctypes.c_uint(0)]

    def write_config(self, cfg: Any) -> None:
        self.table("xm_config")[ctypes.c_uint(0)] = cfg

    def counter(self, name: str) -> int:
        """One of the per-reason counters (summed over CPUs)."""
        return int(sum(self.table("xm_counters")[ctypes.c_uint(self.counters.index(name))]))

    def events(self) -> tuple[RingBuffer, Any]:
        """The datapath's event ring (xm_events) and its record's ctypes (struct xm_event)."""
        t = self.table("xm_events")
        return RingBuffer(int(t.map_fd), int(t.max_entries)), t.Leaf

    def counter_values(self) -> dict[str, int]:
        t = self.table("xm_counters")
        out = {}
        for i, name in enumerate(self.counters):
            out[name] = int(sum(t[ctypes.c_uint(i)]))
        return out

    def items(self, name: str) -> Iterator[tuple[FlowKey, Any]]:
        t = self.table(name)
        try:
            pairs = lookup_all(t)
        except OSError:  # batch ops missing for this map type: one by one
            pairs = list(t.items())
        for k, v in pairs:
            yield key_from_c(k), v

    def get(self, name: str, flow: FlowKey) -> Any | None:
        t = self.table(name)
        try:
            return t[key_to_c(flow, t.Key)]
        except KeyError:
            return None

    def put(self, name: str, flow: FlowKey, value: Any) -> None:
        t = self.table(name)
        t[key_to_c(flow, t.Key)] = value

    def delete(self, name: str, flow: FlowKey) -> bool:
        t = self.table(name)
        try:
            del t[key_to_c(flow, t.Key)]
            return True
        except KeyError:
            return False

    def new_value(self, name: str) -> Any:
        return self.table(name).Leaf()

    def set_rate(self, flow: FlowKey, rate_bps: int, now_ns: int) -> None:
        r = self.new_value("xm_rates")
        r.rate_bps = rate_bps
        r.stamp_ns = now_ns
        r.origin = ORIGIN_AGENT
        self.put("xm_rates", flow, r)

    def set_hop_speed(self, node_id: int, port: int | None, speed_bps: int) -> None:
        t = self.table("xm_hop_speed")
        k = t.Key()
        k.node_id = node_id
        k.port = ALL_PORTS if port is None else port
        t[k] = ctypes.c_ulonglong(speed_bps)

    def pin_program(self, program: str) -> Path:
        path = self.pin_dir / PROG_PINS[program]
        if path.exists():
            path.unlink()
        syscalls.obj_pin(self.fd(program), str(path))
        return path

    def remove_pins(self) -> list[Path]:
        """Unlink every pin this agent's programs use (maps and pinned programs)."""
        removed = []
        for name in (*MAPS, *PROG_PINS.values()):
            p = self.pin_dir / name
            if p.exists():
                p.unlink()
                removed.append(p)
        return removed
