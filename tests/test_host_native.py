"""The twin's hosts with their per-packet loop in C (testbed/sim/host_native.c) against
SimHost's Python on the same native switches, NICs and transport cores (`host_pipeline`
alone switched): every job gives the same results, counters, events, rate events and INT
captures, including the paths a host takes rarely (feedback queued behind data, a law
cutting rates, drops and timeouts on a small buffer, a collective whose schedule reads its
NIC's rates between completions, frames that are not for it), and a job the C does not run
is SimHost's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controller.nic.ratelaw import Law
from testbed.experiment.suite import report_settings, tita_window, transport_settings
from testbed.model import Scaling, model_with_buffer
from testbed.sim.fabric import SimFabric
from testbed.sim.host_native import NativeSimHost
from testbed.topo import leafspine
from testbed.traffic.generators import Flow

SPEC = leafspine(2, 2, 2)


def _fabric(host: str, buffer: str = "shared", law: Law = Law.TITA) -> SimFabric:
    scaling = Scaling(
        model=model_with_buffer(buffer), scale=1.0, max_hops=SPEC.longest_path_switches()
    )
    fab = SimFabric(SPEC, scaling, seed=3, host_pipeline=host)
    if host == "native" and not isinstance(next(iter(fab.hosts.values())), NativeSimHost):
        pytest.skip(f"the hosts in C do not run here: {sorted(fab.host_native_reasons)}")
    fab.set_law(law, round(scaling.base_rtt_s * 1e9))
    return fab


def _transport(fab: SimFabric) -> dict[str, Any]:
    """TiTa's window, and the receiving NICs INT sinks reporting to the collector (as the
    suites run them)."""
    s = fab.scaling
    return transport_settings(s, tita_window(s, s.base_rtt_s)) | report_settings(SPEC, s)


def _incast(fab: SimFabric, size: int = 300_000, bounded: bool = True) -> dict[str, Any]:
    """3:1; `bounded`: each sender's window TiTa's B*T, else the default (DCQCN's)."""
    flows = [Flow(id=i, src=i, dst=0, size=size, start=i * 2e-6) for i in range(1, 4)]
    return {
        "kind": "flows",
        "flows": [f.as_dict() for f in flows],
        "transport": _transport(fab) if bounded else transport_settings(fab.scaling),
        "timeout": 1.0,
        "seed": 2,
    }


def _allreduce(fab: SimFabric) -> dict[str, Any]:
    # two channels on one NIC, adaptive, one message in flight on each: the schedule reads
    # each flow's rate at every pick, and traces what it read
    return {
        "kind": "collective",
        "collective": "allreduce",
        "algorithm": "ring",
        "schedule": "adaptive",
        "channels": 2,
        "size": 1 << 20,
        "chunk": 16 << 10,
        "depth": 1,
        "trace_rates": True,
        "iters": 2,
        "compute": 2e-6,
        "transport": _transport(fab),
        "timeout": 1.0,
        "seed": 4,
        "payload": "size",
    }


def _ring(fab: SimFabric) -> dict[str, Any]:
    """The suites' all-reduce: adaptive, one channel, no trace (its job reads no rates)."""
    return {**_allreduce(fab), "channels": 1, "trace_rates": False, "depth": 8}


def _longlived(fab: SimFabric) -> dict[str, Any]:
    flows = [Flow(id=i, src=i, dst=(i + 2) % 4, size=0, start=0.0) for i in range(4)]
    return {
        "kind": "longlived",
        "flows": [f.as_dict() for f in flows],
        "duration": 40e-6,
        "message": 64 << 10,
        "transport": _transport(fab),
        "timeout": 1.0,
    }


def _observe(fab: SimFabric, job: dict[str, Any]) -> dict[str, Any]:
    fab.begin()
    out = fab.run_job(fab.traffic_hosts(), job)
    cap, events = fab.end()
    return {
        "results": out.results,
        "counters": out.counters,
        "events": fab.loop.events,
        "now": fab.loop.now_ns,
        "rate_events": [dataclasses.astuple(e) for e in events],
        "capture": cap,
        "ports": fab.port_counters(),
        "nics": {n: h.nic_counters() for n, h in fab.hosts.items()},
        "dropped": {n: (h.rx_dropped, h.tx_too_big) for n, h in fab.hosts.items()},
        "collector": (fab.collector.node_summary(), fab.collector.int_waits()),
    }


def _fanout(fab: SimFabric) -> dict[str, Any]:
    """40 flows from host 0 (10 slots to each other host), all starting at once: the NIC's
    first kick looks up 40 new flows in one pass, growing the pacer's table (which moves)
    while it holds the earliest flow found so far."""
    flows = [
        Flow(id=i, src=0, dst=1 + i % 3, size=20_000, start=0.0, slot=i // 3) for i in range(40)
    ]
    return {
        "kind": "flows",
        "flows": [f.as_dict() for f in flows],
        "transport": _transport(fab),
        "timeout": 1.0,
        "seed": 5,
    }


JOBS = {
    "incast": _incast,
    "allreduce": _allreduce,
    "ring": _ring,
    "longlived": _longlived,
    "fanout": _fanout,
}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_host_in_c_runs_a_job_as_the_python_host_does(job: str) -> None:
    c, py = _fabric("native"), _fabric("reference")
    a, b = _observe(c, JOBS[job](c)), _observe(py, JOBS[job](py))
    assert c.host_in_use == {"native"} and py.host_in_use == {"reference"}
    assert a == b
    assert a["rate_events"] and a["capture"].hops  # the law moved rates; INT was recorded
    assert sum(sum(c["reports"].values()) for c in a["counters"]) > 0  # the sinks reported


def test_drops_and_timeouts_on_a_small_buffer_are_the_same() -> None:
    # no rate law: three senders at line rate into one port
    c, py = _fabric("native", "static", Law.NONE), _fabric("reference", "static", Law.NONE)
    a, b = _observe(c, _incast(c, 600_000, False)), _observe(py, _incast(py, 600_000, False))
    assert a == b
    # the buffer dropped: go-back-N resent, after NAKs and timeouts
    assert sum(c["retransmits"] for c in a["counters"]) > 0
    assert sum(c["timeouts"] + c["naks_received"] for c in a["counters"]) > 0


def test_frames_not_for_the_host_are_counted_alike() -> None:
    """Frames a switch delivers that are not the host's transport's: too short, not IPv4, for
    another address, not RoCE; then a job runs on as before."""
    runs = []
    for host in ("native", "reference"):
        fab = _fabric(host)
        name = SPEC.hosts[0].name
        h0 = fab.hosts[name]
        att = SPEC.attachment(name, 0)
        wire = fab.switches[att.node].wires[att.index]  # the leaf's port towards h0
        eth = h0.eth[6:12] + h0.eth[:6] + b"\x08\x00"
        ip = bytearray(28)
        ip[0], ip[9] = 0x45, 17
        ip[16:20] = h0.addr
        frames = [
            eth[:12] + b"\x86\xdd" + bytes(40),  # IPv6
            eth + bytes(10),  # too short
            eth + bytes(ip[:16]) + b"\x0a\x09\x09\x09" + bytes(ip[20:]),  # another address
            eth + bytes(ip),  # UDP to port 0
        ]
        for f in frames:
            wire.send(f, fab.loop.now_ns)
        fab.loop.run()
        runs.append((h0.rx_dropped, _observe(fab, _incast(fab))))
    assert runs[0] == runs[1]
    assert runs[0][0] == 4


def test_a_job_with_pfc_runs_the_python_host_and_says_why() -> None:
    fab = _fabric("native", law=Law.DCQCN)
    fab.set_pfc(True)
    py = _fabric("reference", law=Law.DCQCN)
    py.set_pfc(True)
    assert _observe(fab, _incast(fab)) == _observe(py, _incast(py))
    assert fab.host_in_use == {"reference"} and fab.host_native_reasons == {"PFC"}
