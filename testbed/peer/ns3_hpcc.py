"""`xingmai-testbed peer ns3-hpcc --sim PATH RUNDIR`: one flow list in the twin and in HPCC's
ns-3 simulator, side by side.

HPCC's simulator (github.com/alibaba-edu/High-Precision-Congestion-Control, `simulation/`) is
not part of this repository: the user builds it and its flow-file driver (`scratch/third.cc`,
or a copy of it) and passes the driver's binary as PATH. This module writes the experiment as
that driver's input files, in its formats:

- `topology.txt`: `nodes switches links`, the switches' node ids, then one line per link
  `a b rate delay error_rate` (hosts are nodes 0..H-1 in the topology's order, switches follow);
- `flow.txt`: the number of flows, then `src dst pg dport bytes start_s`, by start time;
- `trace.txt`: the nodes whose packets it traces (none);
- `config.txt`: `KEY value` lines, our scheme's parameters in its names (`ns3_config`);

runs `PATH config.txt` in `RUNDIR/ns3/<scheme>/` and reads back what it writes:

- `fct.txt`: `sip dip sport dport size start_ns fct_ns standalone_fct_ns` per completed flow
  (addresses in hex, 0x0b000001 + node id x 256; dport names our flow: DPORT_BASE + its id);
- `qlen.txt`: blocks `time: T` then `switch port n0 n1 ...`: how many 100 ns samples saw the
  port's egress queue at 0, 1, 2 ... KB (a histogram over the run so far);
- `pfc.txt`: `time_ns node node_type port type` per PFC frame a device received (1 pause).

Our driver adds config keys to third.cc's (ENABLE_PFC, STOP_WHEN_DONE, QLEN_MON_INTERVAL,
QLEN_DUMP_INTERVAL, and TIMELY_ALPHA/BETA/TLOW/THIGH/MINRTT; docs/fidelity.md): third.cc
itself ignores keys it does not know, so its binary runs these files too, with PFC on, no
final queue dump and TIMELY at rdma-hw.cc's defaults.

The twin's side is a `xingmai-testbed run --engine sim --flows` run: the one `--twin DIR`
names, or one this command runs into `RUNDIR/twin`. The table has the `compare` layout (A: the
twin, B: ns-3), then every flow's FCT on both; `RUNDIR/peer.json` holds both.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from controller.config import EcnConfig
from controller.nic.ratelaw.base import UNIT
from controller.nic.ratelaw.params import DCQCN_CLAMP_ALWAYS, CcParams
from testbed.experiment.schemes import (
    SCHEMES,
    Scheme,
    add_ack_argument,
    add_cc_arguments,
    cc_config,
    cc_profile,
    check_ack_every,
    scheme,
)
from testbed.experiment.suite import flow_line_rate, host_nic_bps
from testbed.model import LINK_DELAY_MODEL_NS, Scaling
from testbed.topo import FabricSpec, parse_choice
from testbed.traffic import metrics as m
from testbed.traffic.generators import Flow

SIMULATOR = "alibaba-edu/High-Precision-Congestion-Control"
DPORT_BASE = 100  # a flow's dport in flow.txt is DPORT_BASE + its id: fct.txt names it by it
DATA_PG = 3  # the priority group HPCC's example flow files send data on
# HPCC's INT hop records encode the line rate as one of these (int-header.h): other link
# speeds print "IntHeader unknown rate" and corrupt HPCC's utilisation
INT_LINE_RATES = (25e9, 50e9, 100e9, 200e9, 400e9)
# CC_MODE of each of our schemes whose parameters map onto the simulator's (config_doc.txt;
# TIMELY's thresholds, RdmaHw attributes third.cc never sets, through our driver's TIMELY_*
# keys: third.cc itself would run rdma-hw.cc's defaults)
CC_MODES = {"dcqcn": 1, "dcqcn+pfc": 1, "hpcc": 3, "timely": 7}
QLEN_SAMPLE_NS = 100  # third.cc's queue sampling period
# a dump interval that divides no sample's time but 0 (third.cc reads it as a uint32)
NEVER_NS = 4_000_000_000


class PeerError(RuntimeError):
    """Something the user has to fix (a missing simulator, a topology it cannot take)."""


# ---- writing the experiment ------------------------------------------------------------------


@dataclass(frozen=True)
class Ns3Topology:
    text: str  # topology.txt
    node: dict[str, int]  # host or switch name -> the simulator's node id
    # (switch node id, device index) -> our switch port ("leaf1:3"): the simulator numbers a
    # node's devices 1, 2, ... in the order of the links that touch it (0 is the loopback)
    ports: dict[tuple[int, int], str]
    rates: tuple[int, ...] = ()  # the links' distinct rates, b/s


def _rate(bps: float) -> str:
    return f"{round(bps)}bps"


def _delay(ns: float) -> str:
    return f"{round(ns)}ns"


def ns3_topology(spec: FabricSpec, scaling: Scaling) -> Ns3Topology:
    """The fabric as topology.txt: every link at its own speed and delay, or the model's port
    speed and the twin's link delay (80 ns at scale 1, dilated like every time)."""
    node = {h.name: i for i, h in enumerate(spec.hosts)}
    for s in spec.switches:
        node[s.name] = len(node)
    nics: dict[str, int] = {}
    for lk in spec.links:
        for e in (lk.a, lk.b):
            if not spec.is_switch(e.node):
                nics[e.node] = nics.get(e.node, 0) + 1
    multi = sorted(h for h, n in nics.items() if n > 1)
    if multi:
        # third.cc gives a host one address, on its first device
        raise PeerError(f"HPCC's simulator takes one link per host; these have more: {multi}")
    delay_ns = LINK_DELAY_MODEL_NS * scaling.scale  # the twin's links' delay
    devices: dict[int, int] = {}
    ports: dict[tuple[int, int], str] = {}
    lines = [
        f"{len(node)} {len(spec.switches)} {len(spec.links)}",
        " ".join(str(node[s.name]) for s in spec.switches),
    ]
    for lk in spec.links:
        a, b = node[lk.a.node], node[lk.b.node]
        for e, n in ((lk.a, a), (lk.b, b)):
            devices[n] = devices.get(n, 0) + 1
            if spec.is_switch(e.node):
                ports[(n, devices[n])] = str(e)
        own_delay = None if lk.delay_ns is None else lk.delay_ns * scaling.scale
        rate = scaling.emulated_bps(lk.gbps)
        delay = delay_ns if own_delay is None else own_delay
        lines.append(f"{a} {b} {_rate(rate)} {_delay(delay)} 0")
    rates = tuple(sorted({round(scaling.emulated_bps(lk.gbps)) for lk in spec.links}))
    return Ns3Topology("\n".join(lines) + "\n", node, ports, rates)


def hosts_nic_bps(spec: FabricSpec, scaling: Scaling) -> int:
    """The hosts' NIC line rate, as the twin runs them (each at its own link's speed): the
    simulator takes one set of CC parameters for every NIC, so they must all be one."""
    rates = {round(host_nic_bps(spec, scaling, h.name)) for h in spec.hosts}
    if len(rates) != 1:
        raise PeerError(
            f"hosts on links of different speeds ({sorted(rates)} b/s NICs): HPCC's simulator "
            "takes one set of CC parameters for every NIC"
        )
    return rates.pop()


def ns3_flows(flows: list[Flow]) -> str:
    """flow.txt: by start time (the driver reads it in order), hosts by node id (= their
    index in the topology), data on priority group 3, dport naming our flow."""
    if flows and max(f.id for f in flows) + DPORT_BASE > 0xFFFF:
        raise PeerError("flow.txt's dport carries the flow id: at most 65435 flows")
    lines = [str(len(flows))]
    for f in sorted(flows, key=lambda f: (f.start, f.id)):
        lines.append(f"{f.src} {f.dst} {DATA_PG} {DPORT_BASE + f.id} {f.size} {f.start!r}")
    return "\n".join(lines) + "\n"


def buffer_mb(spec: FabricSpec, scaling: Scaling) -> int:
    """BUFFER_SIZE (MiB, one shared buffer per switch): the memory our per-port queues add up
    to on the switch with the most ports (theirs is shared by all ports, ours is per egress
    port; the same total is the closest mapping)."""
    linked: dict[str, int] = {}
    for lk in spec.links:
        for e in (lk.a, lk.b):
            if spec.is_switch(e.node):
                linked[e.node] = linked.get(e.node, 0) + 1
    most = max(linked.values(), default=1)
    return max(1, math.ceil(most * scaling.model.queue_bytes / 2**20))


def ns3_config(
    name: str,
    scaling: Scaling,
    files: dict[str, str],
    stop_s: float,
    mon_start_ns: int,
    buffer: int,
    cc: CcParams,
    ecn: EcnConfig | None = None,
    link_rates: tuple[int, ...] = (),
) -> str:
    """config.txt for scheme `name`: our parameters (`cc`, what the twin's NICs run: the
    scheme's CC profile at the NIC's line rate, `peer_cc`; the controller's ECN thresholds, the
    model's MTU) in the simulator's keys; docs/fidelity.md has the table. `files` maps
    TOPOLOGY_FILE etc. to paths; `link_rates` the topology's link rates (b/s; default the
    model's port rate), each of which needs its ECN thresholds."""
    sch: Scheme = scheme(name)
    ecn = ecn or EcnConfig()  # the controller's thresholds
    if name not in CC_MODES:
        known = ", ".join(sorted(CC_MODES))
        raise PeerError(f"scheme {name!r} has no counterpart in HPCC's simulator (it has {known})")
    rate = round(scaling.link_bps)
    rates = link_rates or (rate,)
    odd = [r for r in rates if not any(math.isclose(r, ok) for ok in INT_LINE_RATES)]
    if sch.law == "hpcc" and odd:
        raise PeerError(
            f"HPCC's INT encodes only 25/50/100/200/400G links, not {odd[0]:g} b/s "
            "(run at --scale 1, 2, 4, 8 or 16)"
        )
    p = cc
    d, h, t = p.dcqcn, p.hpcc, p.timely
    mtu = scaling.transport_mtu
    keys: list[tuple[str, Any]] = [
        ("ENABLE_QCN", 1),  # ECN marking, as the controller programs every egress queue
        ("USE_DYNAMIC_PFC_THRESHOLD", 1),
        ("ENABLE_PFC", int(sch.lossless)),
        ("PACKET_PAYLOAD_SIZE", mtu),
        *files.items(),
        ("SIMULATOR_STOP_TIME", f"{stop_s!r}"),
        ("STOP_WHEN_DONE", 1),
        ("CC_MODE", CC_MODES[name]),
        # DCQCN (CC_MODE 1): timers in us; no byte counter in theirs
        ("ALPHA_RESUME_INTERVAL", d.alpha_timer_ns / 1000),
        ("RATE_DECREASE_INTERVAL", d.cut_interval_ns / 1000),
        # 1: every cut sets the target; 0: only after a timer increase (rpTimeStage != 0)
        ("CLAMP_TARGET_RATE", int(bool(d.clamp_target & DCQCN_CLAMP_ALWAYS))),
        ("RP_TIMER", d.rate_timer_ns / 1000),
        ("EWMA_GAIN", d.g / UNIT),
        ("FAST_RECOVERY_TIMES", d.fast_recovery_steps),
        # the additive increase: DCQCN's R_AI, HPCC's W_AI as a rate (their rate-based HPCC
        # adds RATE_AI per update, as our law adds W_AI / T)
        # TIMELY (mode 7) adds RATE_AI per RTT and RATE_HAI after 5 such increases, ours delta
        # and hai_steps x delta
        ("RATE_AI", _rate({"hpcc": h.wai_bps, "timely": t.delta_bps}.get(sch.law, d.rai_bps))),
        ("RATE_HAI", _rate(t.hai_steps * t.delta_bps if sch.law == "timely" else d.rhai_bps)),
        ("MIN_RATE", _rate(p.min_rate_bps)),
        ("DCTCP_RATE_AI", "1000Mb/s"),
        ("ERROR_RATE_PER_LINK", "0.0000"),
        # their receiver ACKs every packet once a flow has L2_ACK_INTERVAL bytes in, and
        # never before (ReceiveUdp resets the milestone on each packet): a flow shorter than
        # the interval would never complete, so 1, every packet, as the twin's receivers do
        # under `peer` unless its --ack-every says otherwise
        ("L2_CHUNK_SIZE", mtu),
        ("L2_ACK_INTERVAL", 1),
        ("L2_BACK_TO_ZERO", 0),  # go-back-N from the NAK'd PSN, as our transport
        # a window of B x T where ours bounds a flow to one BDP, else none (they have no
        # window of a fixed packet count); ours stays B x T whatever the rate, so VAR_WIN 0
        # (HPCC's paper and their run.py shrink it with the rate: VAR_WIN 1)
        ("HAS_WIN", int(sch.bdp_window)),
        ("GLOBAL_T", 1),
        ("VAR_WIN", 0),
        ("FAST_REACT", 1),  # react to every ACK, as our NIC runs the law on each
        ("U_TARGET", f"{h.eta / UNIT:.6g}"),  # eta in our fixed point, to 6 digits
        ("MI_THRESH", h.max_stage),
        ("INT_MULTI", max(1, math.ceil(rate / 25e9))),  # their run.py: bandwidth / 25G
        ("MULTI_RATE", 0),
        ("SAMPLE_FEEDBACK", 0),
        ("PINT_LOG_BASE", 1.05),
        ("PINT_PROB", 1.0),
        ("RATE_BOUND", 1),
        ("ACK_HIGH_PRIO", 0),  # our ACKs share the data queue
        ("LINK_DOWN", "0 0 0"),
        ("ENABLE_TRACE", 0),
        # ECN thresholds in KB (ConfigEcn multiplies by 1000), per link speed: the same at
        # every port, as the controller programs ours (a speed the map lacks gets 0 there:
        # its optimized build compiles the assert away, and every queued packet is marked)
        ("KMAX_MAP", _per_rate(rates, round(ecn.kmax_bytes / 1000))),
        ("KMIN_MAP", _per_rate(rates, round(ecn.kmin_bytes / 1000))),
        ("PMAX_MAP", _per_rate(rates, ecn.pmax)),
        ("BUFFER_SIZE", buffer),
        ("QLEN_MON_START", mon_start_ns),
        ("QLEN_MON_END", round(stop_s * 1e9)),
        ("QLEN_MON_INTERVAL", QLEN_SAMPLE_NS),
        ("QLEN_DUMP_INTERVAL", NEVER_NS),
    ]
    if sch.law == "timely":
        if t.hai_steps != 5:
            raise PeerError(
                f"the simulator's TIMELY enters HAI after 5 increases, not {t.hai_steps}"
            )
        keys += [  # our driver's keys (docs/fidelity.md); times in ns
            ("TIMELY_ALPHA", f"{t.alpha / UNIT:.6g}"),
            ("TIMELY_BETA", f"{t.beta / UNIT:.6g}"),
            ("TIMELY_TLOW", t.t_low_ns),
            ("TIMELY_THIGH", t.t_high_ns),
            ("TIMELY_MINRTT", t.min_rtt_ns),
        ]
    return "".join(f"{k} {v}\n" for k, v in keys)


def stop_time_s(flows: list[Flow], link_bps: float) -> float:
    """SIMULATOR_STOP_TIME: the last start plus 50 times what all the bytes take on one link
    and 10 ms (STOP_WHEN_DONE ends the run at the last completion before that)."""
    last = max((f.start for f in flows), default=0.0)
    total = sum(f.size for f in flows)
    return last + 50 * total * 8 / link_bps + 0.01


def byte_counter_notes(params: dict[str, CcParams], flows: list[Flow]) -> list[str]:
    """What the simulator's DCQCN cannot run: a byte counter (its rate increases come from
    its timer alone), a line per scheme whose counter fires within the largest flow."""
    largest = max((f.size for f in flows), default=0)
    out = []
    for name, p in params.items():
        if scheme(name).law == "dcqcn" and 0 < p.dcqcn.byte_counter < largest:  # 0: off
            out.append(
                f"NOTE {name}: the twin's DCQCN raises its rate every {p.dcqcn.byte_counter} B "
                "sent as well as by its timer; the simulator's has no byte counter (to compare "
                "the laws alone, with the simulator's CNP on every marked packet: --cc-set "
                "'dcqcn.byte_counter=1000000000 B,dcqcn.cnp_interval_ns=0 us')"
            )
    return out


def cnp_notes(twin_setup: dict[str, Any], schemes: Sequence[str]) -> list[str]:
    """How each side's receivers send CNPs under the DCQCN schemes: the twin's at most one
    per flow per its DCQCN profile's spacing (results.json's cc_profiles), the simulator's
    with every ACK of a marked packet."""
    profiles = twin_setup.get("cc_profiles", {})
    parts = []
    for name in schemes:
        ns = profiles.get(name, {}).get("values", {}).get("cnp_interval_ns")
        if scheme(name).law != "dcqcn" or ns is None:
            continue
        every = "one per marked packet" if ns == 0 else f"at most one per {ns / 1e3:g} us per flow"
        parts.append(f"{name} {every}")
    if not parts:
        return []
    return [f"CNPs: A {', '.join(parts)}; B one with every ACK of a marked packet"]


def _per_rate(rates: tuple[int, ...], value: Any) -> str:
    """A KMIN_MAP-style value: the count, then `rate value` for each rate."""
    return " ".join([str(len(rates)), *(f"{r} {value}" for r in rates)])


def peer_cc(
    name: str,
    scaling: Scaling,
    profiles: dict[str, str],
    cc_set: dict[str, dict[str, str]],
    nic_bps: int | None = None,
) -> CcParams:
    """The parameters the twin's NICs run scheme `name` with (as the suite sets them: its CC
    profile, `--cc-set` over it, at the NICs' line rate, `nic_bps` or the model's NIC's, the
    model's base RTT and the scale), which the simulator's config takes."""
    prof = cc_profile(name, profiles, cc_set)
    nic = int(scaling.nic_bps) if nic_bps is None else nic_bps
    return prof.cc_params(nic, round(scaling.base_rtt_s * 1e9), scaling.scale)


def write_experiment(
    spec: FabricSpec,
    flows: list[Flow],
    name: str,
    scaling: Scaling,
    out: Path,
    cc: CcParams,
) -> Ns3Topology:
    """The simulator's input files for scheme `name` in `out`; its outputs will go there."""
    out.mkdir(parents=True, exist_ok=True)
    topo = ns3_topology(spec, scaling)
    (out / "topology.txt").write_text(topo.text)
    (out / "flow.txt").write_text(ns3_flows(flows))
    (out / "trace.txt").write_text("0\n")
    files = {
        "TOPOLOGY_FILE": "topology.txt",
        "FLOW_FILE": "flow.txt",
        "TRACE_FILE": "trace.txt",
        "TRACE_OUTPUT_FILE": "mix.tr",
        "FCT_OUTPUT_FILE": "fct.txt",
        "PFC_OUTPUT_FILE": "pfc.txt",
        "QLEN_MON_FILE": "qlen.txt",
    }
    start_ns = round(min((f.start for f in flows), default=0.0) * 1e9)
    cfg = ns3_config(
        name,
        scaling,
        files,
        stop_time_s(flows, scaling.link_bps),
        start_ns,
        buffer_mb(spec, scaling),
        cc,
        link_rates=topo.rates,
    )
    (out / "config.txt").write_text(cfg)
    return topo


# ---- reading its outputs ---------------------------------------------------------------------


@dataclass(frozen=True)
class FctLine:
    src: int  # node ids
    dst: int
    sport: int
    dport: int
    size: int
    start_ns: int
    fct_ns: int
    standalone_ns: int


def ip_node(hex_ip: str) -> int:
    """third.cc's node_id_to_ip inverted: 0x0b000001 + node id x 256 (ip_to_node_id)."""
    return (int(hex_ip, 16) >> 8) & 0xFFFF


def parse_fct(text: str) -> list[FctLine]:
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        f = line.split()
        if not f:
            continue
        if len(f) != 8:
            raise ValueError(f"fct.txt:{n}: expected 8 fields, got {len(f)}")
        out.append(
            FctLine(ip_node(f[0]), ip_node(f[1]), *(int(x) for x in f[2:]))  # type: ignore[arg-type]
        )
    return out


def parse_qlen(text: str) -> dict[tuple[int, int], list[int]]:
    """The last histogram in qlen.txt, per (switch node, device): counts per KB."""
    last: dict[tuple[int, int], list[int]] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        f = line.split()
        if not f:
            continue
        if f[0] == "time:":
            last = {}
            continue
        if len(f) < 2:
            raise ValueError(f"qlen.txt:{n}: expected 'switch port counts...'")
        last[(int(f[0]), int(f[1]))] = [int(x) for x in f[2:]]
    return last


def parse_pfc(text: str) -> list[tuple[int, int, int, int, int]]:
    """pfc.txt's lines: (time_ns, node, node_type, device, type: 1 pause, 0 resume)."""
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        f = line.split()
        if not f:
            continue
        if len(f) != 5:
            raise ValueError(f"pfc.txt:{n}: expected 5 fields, got {len(f)}")
        a, b, c, d, e = (int(x) for x in f)
        out.append((a, b, c, d, e))
    return out


def hist_peak(counts: list[int]) -> int:
    """The largest queue a histogram saw, bytes (its KB bin's floor)."""
    nz = [i for i, c in enumerate(counts) if c]
    return nz[-1] * 1000 if nz else 0


def hist_p99(counts: list[int]) -> int:
    total = sum(counts)
    if not total:
        return 0
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= 0.99 * total:
            return i * 1000
    return (len(counts) - 1) * 1000


# ---- both sides in one shape -----------------------------------------------------------------


def summarise(
    flows: list[dict[str, Any]],
    queues: dict[str, dict[str, float]],
    drops: int | None,
    pauses: int | None,
) -> dict[str, Any]:
    """Both simulators' figures computed the same way from per-flow FCTs and per-port queue
    (p99, max): completion = the last finish less the first start; FCT slowdown = FCT / the
    side's own ideal FCT of the flow (`ideal_s`), its p50 and p99 per size bucket
    (testbed.traffic.metrics.SIZE_BUCKETS) and over all completed flows."""
    done = [f for f in flows if f["fct_s"] is not None]
    fcts = np.asarray([f["fct_s"] for f in done]) if done else None
    peak_port = max(queues, key=lambda p: queues[p]["max"], default="")
    return {
        "flows": len(flows),
        "completed": len(done),
        "completion_s": (
            max(f["start_s"] + f["fct_s"] for f in done) - min(f["start_s"] for f in flows)
            if done
            else None
        ),
        "fct_p50_s": float(np.percentile(fcts, 50)) if fcts is not None else None,
        "fct_p99_s": float(np.percentile(fcts, 99)) if fcts is not None else None,
        "fct_max_s": float(fcts.max()) if fcts is not None else None,
        "peak_port": peak_port,
        "peak_queue_bytes": queues[peak_port]["max"] if peak_port else 0.0,
        "peak_port_p99_bytes": queues[peak_port]["p99"] if peak_port else 0.0,
        "drops": drops,
        "pauses": pauses,
        "slowdown": slowdown_by_size(done),
        "per_flow": flows,
        "queues": queues,
    }


def slowdown_by_size(done: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """FCT slowdown's p50 and p99 (and the flows counted) per size bucket, and over `all`,
    of completed flows with their ideal FCT."""

    def pcts(sel: list[dict[str, Any]]) -> dict[str, float]:
        sd = np.asarray([f["fct_s"] / f["ideal_s"] for f in sel])
        return {
            "flows": len(sel),
            "p50": float(np.percentile(sd, 50)),
            "p99": float(np.percentile(sd, 99)),
        }

    out = {label: pcts(sel) for label, sel in m.by_size(done, lambda f: int(f["bytes"]))}
    if done:
        out["all"] = pcts(done)
    return out


def ns3_result(out: Path, topo: Ns3Topology, flows: list[Flow], names: list[str]) -> dict:
    """What the simulator wrote in `out`, as `summarise` takes it."""
    fct = {ln.dport - DPORT_BASE: ln for ln in parse_fct(_read(out / "fct.txt"))}
    per_flow = []
    for f in sorted(flows, key=lambda f: f.id):
        ln = fct.get(f.id)
        per_flow.append(
            {
                "id": f.id,
                "src": names[f.src],
                "dst": names[f.dst],
                "bytes": f.size,
                "start_s": f.start,
                "fct_s": None if ln is None else ln.fct_ns / 1e9,
                # its own ideal: base RTT + the flow's bytes with headers at the path's
                # slowest link (third.cc's standalone_fct)
                "ideal_s": None if ln is None else ln.standalone_ns / 1e9,
            }
        )
    queues = {}
    for key, counts in parse_qlen(_read(out / "qlen.txt")).items():
        port = topo.ports.get(key)
        if port is not None and any(counts):
            queues[port] = {"p99": float(hist_p99(counts)), "max": float(hist_peak(counts))}
    pauses = sum(1 for *_, kind in parse_pfc(_read(out / "pfc.txt")) if kind == 1)
    # the simulator prints one "Drop: ... Headroom full" line per frame its MMU drops
    log = out / "stdout.txt"
    drops = log.read_text().count("Drop:") if log.exists() else None
    return summarise(per_flow, queues, drops, pauses)


def _read(p: Path) -> str:
    if not p.exists():
        raise PeerError(f"the simulator wrote no {p.name} in {p.parent} (see stdout.txt there)")
    return p.read_text()


def twin_result(run_dir: Path, name: str, spec: FabricSpec, scaling: Scaling) -> dict[str, Any]:
    """A twin --flows run's figures for scheme `name`: results.json and flows.csv. A flow's
    ideal FCT is the suite's (its bytes at the slower NIC's payload rate + the run's
    measured base RTT)."""
    doc = json.loads((run_dir / "results.json").read_text())
    base_rtt = float(doc["setup"]["base_rtt_s"])
    runs = [r for r in doc["runs"] if r["scenario"] == "flows" and r["scheme"] == name]
    if not runs:
        raise PeerError(f"{run_dir}: no 'flows' run of scheme {name!r} (run it with --flows)")
    r = runs[0]
    per_flow = []
    with (run_dir / "flows.csv").open() as fh:
        for row in csv.DictReader(fh):
            if (
                row["scenario"] == "flows"
                and row["scheme"] == name
                and int(row.get("repetition") or 0) == r.get("repetition", 0)
            ):
                size = int(row["bytes"])
                line = flow_line_rate(spec, scaling, row["src"], row["dst"])
                per_flow.append(
                    {
                        "id": int(row["id"]),
                        "src": row["src"],
                        "dst": row["dst"],
                        "bytes": size,
                        "start_s": float(row["start_s"]),
                        "fct_s": float(row["fct_s"]) if row["fct_s"] else None,
                        "ideal_s": m.ideal_fct(size, line, base_rtt),
                    }
                )
    queues = {
        port: {"p99": q["p99"], "max": q["max"]} for port, q in r.get("queue_by_link", {}).items()
    }
    return summarise(per_flow, queues, r.get("drops"), r.get("pauses"))


# ---- the table -------------------------------------------------------------------------------

ROWS = (  # (label, field, scale to the shown unit)
    ("completed", "completed", 1.0),
    ("time us", "completion_s", 1e6),
    ("FCT p50 us", "fct_p50_s", 1e6),
    ("FCT p99 us", "fct_p99_s", 1e6),
    ("FCT max us", "fct_max_s", 1e6),
    ("peak queue KB", "peak_queue_bytes", 1e-3),
    ("its p99 KB", "peak_port_p99_bytes", 1e-3),
    ("drops", "drops", 1.0),
    ("pauses", "pauses", 1.0),
)


AGREE = 0.15  # issue 27's bound on B/A - 1: a ratio beyond it is marked *


def within(va: float | None, vb: float | None) -> bool | None:
    """Whether B is within AGREE of A (None: a side has no figure)."""
    if not va or vb is None:
        return None
    return abs(vb / va - 1) <= AGREE


def _row(name: str, label: str, va: float | None, vb: float | None, k: float = 1.0) -> str:
    shown = " ".join(f"{'-':>10}" if v is None else f"{v * k:>10.4g}" for v in (va, vb))
    ratio = f"{'-':>6}"
    if va and vb is not None:
        ratio = f"{vb / va:>6.2f}" + ("" if within(va, vb) else "*")
    return f"{'flows':<10} {name:<9} {label:<18} {shown} {ratio}"


def side_by_side(results: dict[str, dict[str, dict[str, Any]]], head: list[str]) -> str:
    """`compare`'s layout: A the twin, B ns-3, B/A (`*` beyond issue 27's 15 %), with the FCT
    slowdown's p50 and p99 per size bucket (`sd p50 100K-1M`: flows of 100 KB to 1 MB) and how
    many of those agree; then each flow's FCT on both."""
    lines = [*head, ""]
    top = f"{'scenario':<10} {'scheme':<9} {'metric':<18} {'A':>10} {'B':>10} {'B/A':>6}"
    lines += [top, "-" * len(top)]
    for name, sides in results.items():
        a, b = sides["twin"], sides["ns3"]
        for label, key, k in ROWS:
            lines.append(_row(name, label, a.get(key), b.get(key), k))
        lines.append(
            f"{'':<10} {'':<9} {'peak port':<18} {a['peak_port'] or '-':>10} "
            f"{b['peak_port'] or '-':>10}"
        )
        sa, sb = a["slowdown"], b["slowdown"]
        seen = set(sa) | set(sb)
        for bucket in [*(lb for lb in m.bucket_labels() if lb in seen), "all"]:
            ba, bb = sa.get(bucket, {}), sb.get(bucket, {})
            lines.append(_row(name, f"flows {bucket}", ba.get("flows"), bb.get("flows")))
            for q in ("p50", "p99"):
                lines.append(_row(name, f"sd {q} {bucket}", ba.get(q), bb.get(q)))
        agree = [
            within(sa[bk].get(q), sb[bk].get(q))
            for bk in set(sa) & set(sb) - {"all"}
            for q in ("p50", "p99")
        ]
        counted = [x for x in agree if x is not None]
        lines.append(
            f"{'':<10} {name:<9} slowdown p50 and p99 per size bucket within "
            f"{AGREE:.0%}: {sum(counted)} of {len(counted)}"
        )
        lines.append("")
    lines.append("FCT per flow, us (A: the twin, B: ns-3)")
    top = f"{'scheme':<9} {'id':>4} {'src':>5} {'dst':>5} {'bytes':>9} {'A':>9} {'B':>9} {'B/A':>6}"
    lines += [top, "-" * len(top)]
    for name, sides in results.items():
        b_by = {f["id"]: f for f in sides["ns3"]["per_flow"]}
        for f in sides["twin"]["per_flow"]:
            va, vb = f["fct_s"], b_by.get(f["id"], {}).get("fct_s")
            ratio = f"{vb / va:>6.2f}" if va and vb is not None else f"{'-':>6}"
            lines.append(
                f"{name:<9} {f['id']:>4} {f['src']:>5} {f['dst']:>5} {f['bytes']:>9} "
                + " ".join(f"{'-':>9}" if v is None else f"{v * 1e6:>9.2f}" for v in (va, vb))
                + f" {ratio}"
            )
    return "\n".join(lines)


# ---- running it ------------------------------------------------------------------------------


def check_sim(sim: Path) -> Path:
    """PATH, resolved; a PeerError naming what is missing otherwise."""
    if not sim.exists():
        raise PeerError(
            f"HPCC's ns-3 simulator not found: {sim} does not exist. Build {SIMULATOR}'s "
            "simulation/ and its flow-file driver (scratch/third.cc or a copy) outside this "
            "repository and pass the driver's binary (docs/fidelity.md, 'Beside HPCC's ns-3 "
            "simulator')"
        )
    if not sim.is_file() or not os.access(sim, os.X_OK):
        raise PeerError(f"HPCC's ns-3 simulator: {sim} is not an executable file")
    return sim.resolve()


def sim_env(sim: Path) -> dict[str, str]:
    """The environment to run `sim` in: waf leaves ns-3's libraries in its build directory,
    two levels above a scratch program (build/scratch/NAME), and sets no rpath."""
    env = dict(os.environ)
    libs = sim.parent.parent
    if any(libs.glob("libns3*.so")):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            x for x in (str(libs), env.get("LD_LIBRARY_PATH", "")) if x
        )
    return env


def run_ns3(sim: Path, out: Path, timeout_s: float) -> float:
    """Run the simulator on `out`/config.txt in `out`; its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with (out / "stdout.txt").open("w") as log:
        proc = subprocess.run(
            [str(sim), "config.txt"],
            cwd=out,
            env=sim_env(sim),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = (out / "stdout.txt").read_text().splitlines()[-5:]
        raise PeerError(f"{sim} exited with {proc.returncode} in {out}: " + " | ".join(tail))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_twin(args: argparse.Namespace, out: Path, schemes: tuple[str, ...]) -> None:
    """`xingmai-testbed run --engine sim --flows FILE --schemes ...` into `out`."""
    from testbed.experiment.suite import SuiteConfig
    from testbed.sim.run import run_sim

    cfg = SuiteConfig(
        schemes=schemes,
        scenarios=("flows",),
        seed=args.seed,
        ack_every=args.ack_every,
        **cc_config(args),
    )
    ns = argparse.Namespace(
        topo=args.topo,
        scale=args.scale,
        run_dir=out,
        flows=args.flows,
        faults=None,
        fault_list=[],
    )
    run_sim(ns, cfg)


def add_parser(sub: Any) -> None:
    peer = sub.add_parser("peer", help="a flow list in another simulator beside the twin")
    which = peer.add_subparsers(dest="peer", required=True)
    p = which.add_parser(
        "ns3-hpcc",
        help="HPCC's ns-3 simulator (built by you: --sim PATH)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("run_dir", type=Path, metavar="RUNDIR", help="where both runs' files go")
    p.add_argument(
        "--sim",
        type=Path,
        required=True,
        metavar="PATH",
        help="the simulator's flow-file driver (e.g. simulation/build/scratch/third)",
    )
    p.add_argument(
        "--flows",
        type=Path,
        required=True,
        help="a flow list (CSV: src,dst,bytes,start_s), as run --flows",
    )
    p.add_argument("--topo", default="leafspine:2,2,4", help="as run --topo")
    p.add_argument(
        "--schemes", default="hpcc,dcqcn", help=f"comma-separated, of {', '.join(sorted(CC_MODES))}"
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="as run --scale (default 1: the model's 400G; HPCC needs 25-400G)",
    )
    p.add_argument("--seed", type=int, default=1, help="the twin's seed")
    add_cc_arguments(p)
    # the simulator's receivers ACK every packet (see write_config): so do the twin's, unless
    # told otherwise
    add_ack_argument(p, default=1)
    p.add_argument(
        "--twin",
        type=Path,
        help="an existing twin run of the same --flows, --topo and --scale "
        "(default: run the twin into RUNDIR/twin)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds one simulator run may take (default 3600)",
    )


def cmd_peer(args: argparse.Namespace) -> int:
    from testbed.sim.run import load_flows

    try:
        sim = check_sim(args.sim)
        schemes = tuple(s for s in args.schemes.split(",") if s)
        bad = [s for s in schemes if s not in SCHEMES or s not in CC_MODES]
        if bad:
            raise PeerError(
                f"schemes without a counterpart in HPCC's simulator: {bad} "
                f"(it has {', '.join(sorted(CC_MODES))})"
            )
        try:
            check_ack_every(args.ack_every)
        except ValueError as exc:
            raise PeerError(str(exc)) from None
        spec = parse_choice(args.topo)
        scaling = Scaling(scale=args.scale, max_hops=spec.longest_path_switches())
        flows = load_flows(args.flows, spec)
        run_dir: Path = args.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            cc = cc_config(args)
        except ValueError as exc:  # a profile or setting it does not know
            raise PeerError(str(exc)) from None
        # every input first: a scheme or fabric it cannot take fails before anything runs
        nic = hosts_nic_bps(spec, scaling)
        params = {s: peer_cc(s, scaling, cc["cc_profiles"], cc["cc_set"], nic) for s in schemes}
        topos = {
            s: write_experiment(spec, flows, s, scaling, run_dir / "ns3" / s, params[s])
            for s in schemes
        }
        twin_dir = args.twin
        if twin_dir is None:
            twin_dir = run_dir / "twin"
            run_twin(args, twin_dir, schemes)
        names = [h.name for h in spec.hosts]
        results: dict[str, dict[str, dict[str, Any]]] = {}
        cpu: dict[str, float] = {}
        for s in schemes:
            out = run_dir / "ns3" / s
            t0 = time.monotonic()
            cpu[s] = run_ns3(sim, out, args.timeout)
            print(
                f"ns-3 {s}: {time.monotonic() - t0:.1f} s wall, {cpu[s]:.1f} s CPU", file=sys.stderr
            )
            results[s] = {
                "twin": twin_result(twin_dir, s, spec, scaling),
                "ns3": ns3_result(out, topos[s], flows, names),
            }
    except PeerError as exc:
        print(f"xingmai-testbed peer: {exc}", file=sys.stderr)
        return 1
    twin_doc = json.loads((twin_dir / "results.json").read_text())
    # what the twin's receivers did (an existing --twin run may have had its schemes' own)
    twin_ack = twin_doc.get("setup", {}).get("suite", {}).get("ack_every")
    head = [
        f"A: {twin_dir}  (the twin, {spec.name}, {scaling.describe()}, {twin_doc.get('date')})",
        f"B: {run_dir / 'ns3'}  ({SIMULATOR}, {sim})",
        "queues: A the INT records of arriving packets (per departure), B 100 ns samples "
        "(1 KB bins)",
        "ACKs: A every "
        + (
            f"{twin_ack} packet(s)"
            if twin_ack
            else "N packets, each scheme's own N: "
            + ", ".join(f"{s} {scheme(s).ack_every}" for s in schemes)
        )
        + ", B every packet",
    ]
    head += cnp_notes(twin_doc.get("setup", {}), schemes)
    head += byte_counter_notes(params, flows)
    text = side_by_side(results, head)
    print(text)
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "simulator": {"repository": SIMULATOR, "binary": str(sim), "cpu_s": cpu},
        "twin_run": str(twin_dir),
        "flows_file": str(args.flows),
        "topology": spec.name,
        "scale": scaling.scale,
        "twin_ack_every": twin_ack,
        "results": results,
        "table": text,
    }
    (run_dir / "peer.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\npeer.json: {run_dir / 'peer.json'}")
    return 0
