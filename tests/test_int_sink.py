"""The receiving NIC as INT sink (controller/nic/int_sink.py): the Telemetry Reports it makes
are the golden vector's format, number themselves, fire on the triggers they say (sampled,
queue, latency, path change, a PSN gap) and no more; the collector counts the ones lost on the
way and builds the per-flow path and latency view from them; in the twin they flow through the
fabric to the collector during a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP

from controller.collector import Collector
from controller.config import load
from controller.nic.int_sink import REPORT_BURST_BYTES, REPORT_HEADERS, IntSink, SinkConfig
from controller.topology import Topology
from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.telemetry_report import (
    DROP_REASON_PSN_GAP,
    decode,
    encode_report,
    nic_node_id,
    report_size,
)
from testbed.packets import int_packet

VECTORS = Path(__file__).parent / "data" / "int_v21.json"
EXAMPLE = Path(__file__).parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"
H1, H5 = "10.0.1.1", "10.0.2.1"  # leaf1's first host, leaf2's first host in EXAMPLE


def hop(node: int, inp: int, outp: int, qocc: int = 0, lat: int = 1000) -> dict[str, Any]:
    return {
        "node_id": node,
        "l1_ingress_port": inp,
        "l1_egress_port": outp,
        "hop_latency": lat,
        "queue_id": 0,
        "queue_occupancy": qocc,
        "egress_ts": 5_000,
        "tx_util": 0,
    }


def packet(hops: list[dict[str, Any]], sport: int = 49152) -> bytes:
    """An INT data packet as the receiving NIC gets it (IPv4 on), newest hop first."""
    pkt = int_packet(
        src_ip=H1, dst_ip=H5, sport=sport, hops=hops, payload=b"\x04" + bytes(15) + bytes(64)
    )
    return bytes(pkt[IP])


# h1 -> h5 over spine1: leaf1 (node 1) in 1 out 5, spine1 (node 3) in 1 out 2, leaf2 (2) in 5 out 1
PATH_SPINE1 = [hop(2, 5, 1), hop(3, 1, 2), hop(1, 1, 5)]
PATH_SPINE2 = [hop(2, 6, 1), hop(4, 1, 2), hop(1, 1, 6)]


def test_encoder_reproduces_the_golden_report() -> None:
    doc = json.loads(VECTORS.read_text())
    vec = next(v for v in doc["vectors"] if v["kind"] == "telemetry_report_v2")
    r = vec["decoded"]["reports"][0]
    md = decode(bytes.fromhex(vec["hex"])).reports[0].sink
    data = encode_report(
        hw_id=0,
        seq=vec["decoded"]["seq"],
        node_id=vec["decoded"]["node_id"],
        inner=bytes.fromhex(r["inner"]),
        rep_md_bits=r["rep_md_bits"],
        metadata={
            "l1_ingress_port": md.in_port,
            "l1_egress_port": md.out_port,
            "hop_latency": md.latency_ns,
            "queue_id": md.queue_id,
            "queue_occupancy": md.qocc,
        },
        tracked=bool(r["F"]),
    )
    assert data.hex() == vec["hex"]
    # its size, known before it is made (what the NICs' report budget checks)
    assert report_size(len(bytes.fromhex(r["inner"])), r["rep_md_bits"]) == len(data)
    assert report_size(40) == len(encode_report(hw_id=0, seq=0, node_id=1, inner=bytes(40)))


def test_sink_reports_on_its_triggers_with_increasing_sequence_numbers() -> None:
    sink = IntSink(
        H5,
        SinkConfig(sample_s=0.1, queue_bytes=20_000, latency_ns=50_000, event_gap_s=0.02),
        INT_DSCP_DEFAULT,
    )
    int_off = 28  # IPv4 (20) + UDP (8)
    sent: list[tuple[float, bytes]] = []

    def feed(t: float, hops: list[dict[str, Any]], lost: bool = False) -> bytes | None:
        pkt = packet(hops)
        rep = sink.loss(pkt, int_off, t) if lost else sink.observe(pkt, int_off, t)
        if rep is not None:
            sent.append((t, rep))
        return rep

    assert feed(0.0, PATH_SPINE1) is not None  # a new flow
    for i in range(1, 10):  # quiet, same path, within the sampling interval
        assert feed(0.01 * i, PATH_SPINE1) is None
    assert feed(0.1, PATH_SPINE1) is not None  # sampled
    congested = [hop(2, 5, 1), hop(3, 1, 2, qocc=30_000), hop(1, 1, 5)]
    assert feed(0.11, congested) is not None  # a queue over 20 KB: at once
    assert feed(0.12, congested) is None  # still congested: at most every 20 ms
    assert feed(0.135, congested) is not None
    slow = [hop(2, 5, 1), hop(3, 1, 2, lat=60_000), hop(1, 1, 5)]
    assert feed(0.14, PATH_SPINE1) is None  # quiet again: the condition ended
    assert feed(0.145, slow) is not None  # hop latencies over 50 us: a new one, at once
    assert feed(0.15, PATH_SPINE2) is not None  # the path changed
    assert feed(0.16, PATH_SPINE2) is None
    assert feed(0.17, PATH_SPINE2) is None
    # the transport found the gap before this packet a loss: reported whatever the sampling
    assert feed(0.171, PATH_SPINE2, lost=True) is not None
    assert feed(0.172, PATH_SPINE2) is None  # the loss is no reason to sample
    assert dict(sink.reports) == {
        "new": 1,
        "sample": 1,
        "queue": 2,
        "latency": 1,
        "path": 1,
        "loss": 1,
    }
    assert sink.errors == {}
    decoded = [decode(rep) for _, rep in sent]
    assert [d.seq for d in decoded] == list(range(len(sent)))
    for dg in decoded:
        assert (dg.node_id, dg.hw_id) == (nic_node_id(H5), 0)
        (rep,) = dg.reports
        assert rep.flow is not None and rep.flow.astuple() == (H1, H5, 17, 49152, 4791)
        assert rep.tracked
        assert len(rep.hops) == 3
    flags = [(r.reports[0].congested, r.reports[0].dropped) for r in decoded]
    assert flags == [(False, False)] * 2 + [(True, False)] * 3 + [(False, False), (False, True)]
    assert [h.node_id for h in decoded[5].reports[0].hops] == [2, 4, 1]  # the new path
    loss = decoded[-1].reports[0]
    assert loss.sink.drop_reason == DROP_REASON_PSN_GAP
    assert [h.qocc for h in decoded[2].reports[0].hops] == [0, 30_000, 0]


def test_sink_counts_what_it_cannot_read() -> None:
    sink = IntSink(H5, SinkConfig(), INT_DSCP_DEFAULT)
    good = packet(PATH_SPINE1)
    assert sink.observe(good[:30], 28, 0.0) is None
    bad = bytearray(good)
    bad[28] = 0x20  # shim type 2: not INT-MD
    assert sink.observe(bytes(bad), 28, 0.0) is None
    assert sum(sink.errors.values()) == 2 and sink.seq == 0


def test_the_report_budget_holds_back_all_but_loss_reports() -> None:
    # 8,000 b/s: a report of a 3-hop path (and its 42 bytes of headers) every ~0.2 s; the
    # bucket holds one
    size = REPORT_HEADERS + len(
        IntSink(H5, SinkConfig(), INT_DSCP_DEFAULT).observe(packet(PATH_SPINE1), 28, 0.0) or b""
    )
    sink = IntSink(
        H5, SinkConfig(sample_s=1e-9, budget_bps=8_000, burst_bytes=size), INT_DSCP_DEFAULT
    )
    got = [sink.observe(packet(PATH_SPINE1), 28, 0.001 * i) for i in range(10)]
    assert [r is not None for r in got] == [True] + [False] * 9  # the burst, then nothing
    assert dict(sink.suppressed) == {"sample": 9} and sink.seq == 1  # no number taken
    assert sink.loss(packet(PATH_SPINE1), 28, 0.011) is not None  # loss reports always go
    refill = size * 8 / 8_000  # seconds to earn one report
    assert sink.observe(packet(PATH_SPINE1), 28, 0.009 + refill * 0.9) is None
    rep = sink.observe(packet(PATH_SPINE1), 28, 0.009 + refill * 1.05)
    assert rep is not None and decode(rep).seq == 2  # numbered on from the ones sent
    assert dict(sink.reports) == {"new": 1, "sample": 1, "loss": 1}
    # seconds later the bucket is full again, not more: one report's worth
    later = [sink.observe(packet(PATH_SPINE1), 28, 5.0 + 1e-6 * i) for i in range(3)]
    assert [r is not None for r in later] == [True, False, False]
    with pytest.raises(ValueError, match="budget_bps"):
        SinkConfig(budget_bps=-1.0)


def test_the_nics_reports_take_at_most_their_share_of_the_collectors_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an all-to-all of 1 MiB per rank on 16 hosts: 240 flows, each reporting while it meets
    # the uplinks' queues; without the budget the reports take more than a fifth of the
    # collector's port (docs/operations.md: at 64 hosts the all-to-all waits on them)
    from dataclasses import replace

    from testbed.experiment import suite as experiment
    from testbed.experiment.suite import SuiteConfig
    from testbed.model import Scaling
    from testbed.sim.fabric import SimFabric
    from testbed.sim.suite import SimSuite
    from testbed.topo import leafspine

    spec = leafspine(4, 2, 4)
    assert spec.collector is not None
    cfg = replace(
        SuiteConfig.quick(), schemes=("none",), scenarios=("alltoall",), alltoall_bytes=1 << 20
    )

    def run() -> tuple[float, float, dict[str, Any]]:  # the share, the time, the reports
        s = Scaling(scale=20, max_hops=spec.longest_path_switches())
        suite = SimSuite(SimFabric(spec, s), cfg)
        [rec] = suite.run()
        assert rec.correct
        to_collector = suite.fab.port_counters()[str(spec.collector)].tx_bytes
        return to_collector * 8 / (s.link_bps * rec.completion_s), rec.completion_s, rec.telemetry

    bound = experiment.REPORT_SHARE
    share, took, tel = run()
    nics = len(spec.hosts)
    burst = nics * REPORT_BURST_BYTES * 8 / (20e9 * took)  # every bucket full at the start
    assert 0.8 * bound < share <= bound + burst
    assert tel["lost"] == 0 and tel["received"] == sum(tel["sent"].values())
    assert tel["suppressed"].get("queue", 0) > 0 and "loss" not in tel["suppressed"]
    monkeypatch.setattr(experiment, "REPORT_SHARE", 0.0)  # no budget
    unbounded, _, tel = run()
    assert unbounded > 2 * bound and tel["suppressed"] == {}


def nic_reports(n: int, skip: set[int], path: list[dict[str, Any]]) -> list[bytes]:
    sink = IntSink(H5, SinkConfig(sample_s=1e-9), INT_DSCP_DEFAULT)
    out = []
    for i in range(n):
        pkt = packet(path)
        rep = sink.loss(pkt, 28, float(i)) if i == n - 1 else sink.observe(pkt, 28, float(i))
        assert rep is not None
        if i not in skip:
            out.append(rep)
    return out


def test_collector_counts_lost_nic_reports_and_builds_the_flow_view() -> None:
    topo = Topology(load(EXAMPLE))
    col = Collector(topo)
    slow = [hop(2, 5, 1, lat=2000), hop(3, 1, 2, qocc=8000, lat=9000), hop(1, 1, 5, lat=1000)]
    reps = nic_reports(20, skip={3, 4, 11}, path=slow)
    for i, rep in enumerate(reps):
        col.ingest(rep, now=float(i))
    (node,) = col.node_summary()
    assert (node["name"], node["received"], node["lost"]) == ("h5", 17, 3)
    assert col.errors == {}
    flow = col.flows[(H1, H5, 17, 49152, 4791)]
    assert flow.links == ["h1:eth0", "leaf1:5", "spine1:2", "leaf2:1"]
    assert (flow.src_host, flow.dst_host, flow.reporter) == ("h1", "h5", "h5")
    assert flow.latency_ns == 12_000 and flow.max_qocc_bytes == 8000
    assert flow.path_changes == 0 and flow.loss_reports == 1
    (ev,) = col.loss_events
    assert ev.links == tuple(flow.links) and ev.max_qocc_bytes == 8000
    assert col.links["spine1:2"].latency_ns == 9000
    # the flow moves to spine2 with packets lost (the report says so): one path change, the
    # new links; the loss counts for the path it left
    old_links = tuple(flow.links)
    for rep in nic_reports(1, set(), PATH_SPINE2):
        col.ingest(rep, now=30.0)
    assert flow.path_changes == 1 and flow.loss_reports == 2
    assert flow.links == ["h1:eth0", "leaf1:6", "spine2:2", "leaf2:1"]
    assert col.loss_events[-1].links == old_links


def test_reports_flow_to_the_collector_in_a_twin_run() -> None:
    from testbed.experiment.suite import report_settings, transport_settings
    from testbed.model import Scaling
    from testbed.sim.fabric import SimFabric
    from testbed.topo import leafspine
    from testbed.traffic.generators import Flow

    spec = leafspine(2, 2, 2)
    s = Scaling(scale=20_000, max_hops=spec.longest_path_switches())
    fab = SimFabric(spec, s)
    hosts = fab.traffic_hosts()
    flows = [Flow(id=i, src=i, dst=(i + 2) % 4, size=200_000, start=0.0) for i in range(4)]
    tr = {**transport_settings(s), **report_settings(spec, s)}
    fab.run_job(
        hosts,
        {"kind": "flows", "flows": [f.as_dict() for f in flows], "transport": tr, "timeout": 30},
    )
    col = fab.collector
    reporters = {n["name"]: n for n in col.node_summary()}
    assert set(reporters) == {h.name for h in hosts}  # every receiver reported
    assert all(n["lost"] == 0 and n["received"] >= 2 for n in reporters.values())
    assert col.errors == {}
    assert len(col.flows) == 4
    for f in col.flows.values():
        src, dst = fab.topo.destinations[f.key[0]], fab.topo.destinations[f.key[1]]
        assert f.links[0] == str(src.endpoint)  # the sender's uplink ...
        assert f.links[-1] == str(dst.attached)  # ... to the receiver's downlink
        assert len(f.links) == 4 and f.latency_ns > 0 and f.reporter == f.dst_host


def tail_drops(loop: str) -> tuple[Any, dict[str, Any]]:
    """An incast that overflows h1's downlink on the twin (`loop`: its event loop), and what
    each switch dropped and reported."""
    from testbed.experiment.suite import report_settings, transport_settings
    from testbed.model import Scaling, model_with_buffer
    from testbed.sim.fabric import SimFabric
    from testbed.topo import leafspine
    from testbed.traffic.generators import Flow

    spec = leafspine(2, 2, 2)
    # the static buffer (500 KB per queue), which this incast overflows: the shared default
    # absorbs it
    static = model_with_buffer("static")
    s = Scaling(model=static, scale=20_000, max_hops=spec.longest_path_switches())
    fab = SimFabric(spec, s, loop_pipeline=loop)
    hosts = fab.traffic_hosts()
    # an incast with no rate law and 64 packets in flight per flow: h1's downlink overflows
    flows = [Flow(id=i, src=i, dst=0, size=1_000_000, start=0.0) for i in (1, 2, 3)]
    tr = {**transport_settings(s, window=64), **report_settings(spec, s)}
    res = fab.run_job(
        hosts,
        {"kind": "flows", "flows": [f.as_dict() for f in flows], "transport": tr, "timeout": 60},
    )
    seen = {
        name: (
            sim.sw.drop_reports.sent,
            sim.sw.drop_reports.suppressed,
            sim.sw.stats.dropped,
            sim.sw.drop_counts(),
        )
        for name, sim in fab.switches.items()
    }
    col = fab.collector
    seen["collector"] = (col.drop_reasons, {k: lt.drops_reported for k, lt in col.links.items()})
    seen["job"] = (res.results, res.counters, fab.loop.now_ns)
    return fab, seen


def test_switches_report_their_tail_drops_to_the_collector() -> None:
    from controller.wire.telemetry_report import DROP_REASON_TM_QUEUE_FULL
    from testbed.switch.drop_reports import HW_ID_TM

    fab, _ = tail_drops("native")
    hosts = fab.traffic_hosts()
    downlink = str(fab.topo.destinations[hosts[0].ip].attached)  # leaf1's port to h1
    col = fab.collector
    sent = {n: sw.sw.drop_reports.sent for n, sw in fab.switches.items()}
    for name, sim in fab.switches.items():
        rep = sim.sw.drop_reports
        dropped = sim.sw.stats.dropped.get("queue_full", 0)
        assert rep.sent + rep.suppressed == dropped, name  # each drop reported or held back
        if rep.sent:
            tm = next(n for n in col.nodes.values() if n.name == name).seq[HW_ID_TM]
            assert (tm.received, tm.lost) == (rep.sent, 0), name
    assert sent[downlink.split(":")[0]] > 0  # h1's downlink overflowed, and said so
    assert col.links[downlink].drops_reported > 0
    assert col.drop_reasons == {DROP_REASON_TM_QUEUE_FULL: sum(sent.values())}
    assert sum(lt.drops_reported for lt in col.links.values()) == sum(sent.values())
    assert sum(f.drops_reported for f in col.flows.values()) == sum(sent.values())
    assert col.errors == {}


def test_tail_drops_on_the_c_loop_as_on_the_python_loop() -> None:
    """The C loop's switch hops hold back the drops whose report the pacing holds back (no
    Python per such drop): the same drops, reports, counters and job on both loops."""
    native_fab, native = tail_drops("native")
    if native_fab.loop_in_use != "native":
        pytest.skip("the native pipeline does not build here (no C compiler)")
    held = sum(sim.sw.stats._hop.queue_full for sim in native_fab.switches.values())
    assert held > 0  # the C handled drops alone
    python_fab, python = tail_drops("reference")
    assert python_fab.loop_in_use == "reference"
    assert native == python
