"""`xingmai-testbed peer ns3-hpcc` without the simulator: the files it writes for HPCC's ns-3
simulator (checked by hand against third.cc's reader), the parsers of its outputs on samples
written by hand in its formats (tests/data/ns3_hpcc/: fct.txt, qlen.txt, pfc.txt of a run on
tests/data/twin-fabric.yaml, whose nodes are 0-3 the hosts h1-h4 and 4-6 leaf1, leaf2,
spine1), and the error when the simulator is not where --sim says.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from testbed.experiment.schemes import parse_cc_profiles
from testbed.experiment.suite import payload_line_rate
from testbed.main import main
from testbed.model import Scaling
from testbed.peer.ns3_hpcc import (
    PeerError,
    byte_counter_notes,
    check_sim,
    cnp_notes,
    hist_p99,
    hist_peak,
    hosts_nic_bps,
    ns3_result,
    ns3_topology,
    parse_fct,
    parse_pfc,
    parse_qlen,
    peer_cc,
    side_by_side,
    twin_result,
    write_experiment,
)
from testbed.sim.run import load_flows
from testbed.topo import load, parse_choice

DATA = Path(__file__).parent / "data"
SAMPLES = DATA / "ns3_hpcc"


@pytest.fixture
def fabric():  # type: ignore[no-untyped-def]
    spec = load(DATA / "twin-fabric.yaml")
    return spec, Scaling(scale=1, max_hops=spec.longest_path_switches())


def test_topology_file(fabric) -> None:  # type: ignore[no-untyped-def]
    spec, scaling = fabric
    topo = ns3_topology(spec, scaling)
    # hosts first (their order), then switches; every link at 400G and the twin's 80 ns
    assert topo.text == (
        "7 3 6\n"
        "4 5 6\n"
        "0 4 400000000000bps 80ns 0\n"
        "1 4 400000000000bps 80ns 0\n"
        "2 5 400000000000bps 80ns 0\n"
        "3 5 400000000000bps 80ns 0\n"
        "4 6 400000000000bps 80ns 0\n"
        "5 6 400000000000bps 80ns 0\n"
    )
    # a node's devices count 1, 2, ... in the order of its links (0 is the loopback)
    assert topo.ports == {
        (4, 1): "leaf1:1",
        (4, 2): "leaf1:2",
        (4, 3): "leaf1:3",
        (5, 1): "leaf2:1",
        (5, 2): "leaf2:2",
        (5, 3): "leaf2:3",
        (6, 1): "spine1:1",
        (6, 2): "spine1:2",
    }


def test_topology_file_takes_each_links_own_speed_and_delay(fabric) -> None:  # type: ignore[no-untyped-def]
    spec, scaling = fabric
    first = dataclasses.replace(spec.links[0], gbps=100.0, delay_ns=500)
    mixed = dataclasses.replace(spec, links=(first, *spec.links[1:]))
    lines = ns3_topology(mixed, scaling).text.splitlines()
    assert lines[2] == "0 4 100000000000bps 500ns 0"
    assert lines[3] == "1 4 400000000000bps 80ns 0"


def test_hosts_on_links_of_their_own_speed(tmp_path: Path) -> None:
    """100G hosts under 400G uplinks: every link speed gets the ECN thresholds the controller
    programs at every port (a speed missing from the map gets 0 in the simulator: every
    queued packet marked), and the CC parameters are the hosts' NICs' (HPCC's W_AI at
    100G); hosts of different speeds are refused (it has one parameter set)."""
    spec = parse_choice("leafspine:2,2,4,100")
    scaling = Scaling(scale=1, max_hops=spec.longest_path_switches())
    nic = hosts_nic_bps(spec, scaling)
    assert nic == round(scaling.nic_rate(100e9))
    flows = load_flows(DATA / "twin-flows.csv", spec)
    hpcc = peer_cc("hpcc", scaling, parse_cc_profiles(""), {}, nic)
    write_experiment(spec, flows, "hpcc", scaling, tmp_path, hpcc)
    c = _config(tmp_path / "config.txt")
    assert c["KMIN_MAP"] == "2 100000000000 20 400000000000 20"
    assert c["KMAX_MAP"] == "2 100000000000 100 400000000000 100"
    assert c["PMAX_MAP"] == "2 100000000000 0.2 400000000000 0.2"
    # W_AI = the 100G NIC's line rate x (1 - 0.95) / 100 (the law's integer rounding)
    assert int(c["RATE_AI"].removesuffix("bps")) == pytest.approx(nic * 0.05 / 100, abs=2)
    first = dataclasses.replace(spec.links[0], gbps=None)
    mixed = dataclasses.replace(spec, links=(first, *spec.links[1:]))
    with pytest.raises(PeerError, match="different speeds"):
        hosts_nic_bps(mixed, scaling)


def test_both_sides_run_the_same_parameters_on_100g_hosts() -> None:
    """What the simulator is given is what the twin's NICs run: on 100G hosts under 400G
    uplinks both take the profile at the hosts' NIC rate (the twin's NICs once ran the
    model's 400G NIC's: TIMELY's T_low below the base RTT)."""
    from testbed.experiment.suite import SuiteConfig
    from testbed.sim.fabric import SimFabric
    from testbed.sim.suite import SimSuite

    spec = parse_choice("leafspine:1,1,3,100")
    scaling = Scaling(scale=1, max_hops=spec.longest_path_switches())
    nic = hosts_nic_bps(spec, scaling)
    profiles = parse_cc_profiles("dcqcn-hpcc-sim")
    cfg = dataclasses.replace(SuiteConfig.quick(), cc_profiles=profiles)
    suite = SimSuite(SimFabric(spec, scaling), cfg)
    suite.prepare()
    for name in ("timely", "dcqcn"):
        ours = suite.scheme_cc(name)
        theirs = peer_cc(name, scaling, profiles, {}, nic)
        assert set(ours) == {h.name for h in spec.hosts}
        for p in ours.values():  # the law's own struct and floor (the others' T may differ)
            assert getattr(p, name) == getattr(theirs, name)
            assert p.min_rate_bps == theirs.min_rate_bps
    assert suite.cnp_interval_s("dcqcn") == 0.0  # and a CNP per marked packet, as theirs


def _config(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


def test_experiment_files(fabric, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec, scaling = fabric
    flows = load_flows(DATA / "twin-flows.csv", spec)
    shipped = parse_cc_profiles("")
    hpcc = peer_cc("hpcc", scaling, shipped, {})
    write_experiment(spec, flows, "hpcc", scaling, tmp_path / "hpcc", hpcc)
    # by start time: src dst pg dport (100 + flow id) bytes start_s
    assert (tmp_path / "hpcc" / "flow.txt").read_text() == (
        "4\n2 0 3 100 300000 0.0\n3 0 3 101 300000 0.001\n0 3 3 102 50000 0.05\n"
        "1 2 3 103 8000 0.05\n"
    )
    assert (tmp_path / "hpcc" / "trace.txt").read_text() == "0\n"
    c = _config(tmp_path / "hpcc" / "config.txt")
    # the NIC's line rate: 400G x 4154 / (4154 + 16 + 3 x 28) = 390,597,085,xxx b/s
    assert c["CC_MODE"] == "3"
    assert c["U_TARGET"] == "0.95"
    assert c["MI_THRESH"] == "5"  # HPCC's maxStage
    assert c["RATE_AI"] == "195298542bps"  # W_AI = line rate x (1 - 0.95) / 100
    assert c["MIN_RATE"] == "390597085bps"  # line rate / 1000
    assert c["HAS_WIN"] == "1" and c["VAR_WIN"] == "0"  # B x T, fixed as ours
    assert c["INT_MULTI"] == "16"  # 400G / 25G
    assert c["ENABLE_PFC"] == "0"  # our hpcc is lossy
    assert c["PACKET_PAYLOAD_SIZE"] == "4096"
    assert c["L2_ACK_INTERVAL"] == "1"  # else flows below the interval never complete
    assert c["KMIN_MAP"] == "1 400000000000 20" and c["KMAX_MAP"] == "1 400000000000 100"
    assert c["PMAX_MAP"] == "1 400000000000 0.2"
    assert c["BUFFER_SIZE"] == "2"  # 3 ports x 500 KB = 1.43 MiB, rounded up
    assert c["TOPOLOGY_FILE"] == "topology.txt" and c["FCT_OUTPUT_FILE"] == "fct.txt"
    # the last start 0.05 s + 50 x 658 KB at 400G + 10 ms
    assert float(c["SIMULATOR_STOP_TIME"]) == pytest.approx(0.05 + 50 * 658000 * 8 / 400e9 + 0.01)
    assert c["STOP_WHEN_DONE"] == "1"

    # DCQCN as the twin runs it by default: NVIDIA's ConnectX values (dcqcn-nvidia), timers in us
    dcqcn = peer_cc("dcqcn+pfc", scaling, shipped, {})
    write_experiment(spec, flows, "dcqcn+pfc", scaling, tmp_path / "dcqcn", dcqcn)
    c = _config(tmp_path / "dcqcn" / "config.txt")
    assert c["CC_MODE"] == "1"
    assert c["ENABLE_PFC"] == "1"
    assert c["RATE_AI"] == "5000000bps" and c["RATE_HAI"] == "50000000bps"
    assert c["ALPHA_RESUME_INTERVAL"] == "1.0" and c["RP_TIMER"] == "300.0"
    assert c["RATE_DECREASE_INTERVAL"] == "4.0"
    assert c["EWMA_GAIN"] == "0.0048828125"  # dce_tcp_g 1019: 5/1024
    assert c["FAST_RECOVERY_TIMES"] == "1" and c["MIN_RATE"] == "1000000bps"
    assert c["CLAMP_TARGET_RATE"] == "0"  # clamp_tgt_rate 0: the target only after a timer rise
    # --cc-profile dcqcn-paper: the paper's 40G values x 9.765 (the NIC's rate / 40G), its
    # timers / 9.765
    paper = peer_cc("dcqcn+pfc", scaling, parse_cc_profiles("dcqcn-paper"), {})
    write_experiment(spec, flows, "dcqcn+pfc", scaling, tmp_path / "paper", paper)
    c = _config(tmp_path / "paper" / "config.txt")
    assert c["RATE_AI"] == "390597085bps" and c["RATE_HAI"] == "3905970850bps"
    assert c["ALPHA_RESUME_INTERVAL"] == "5.632" and c["RP_TIMER"] == "5.632"
    assert c["RATE_DECREASE_INTERVAL"] == "0.409"
    assert c["EWMA_GAIN"] == "0.00390625"  # g = 1/256
    assert c["FAST_RECOVERY_TIMES"] == "5"
    assert c["CLAMP_TARGET_RATE"] == "1"  # the paper's: every cut sets the target
    assert c["HAS_WIN"] == "0"


def test_unsupported(fabric, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec, scaling = fabric
    flows = load_flows(DATA / "twin-flows.csv", spec)
    shipped = parse_cc_profiles("")
    with pytest.raises(PeerError, match="no counterpart"):
        write_experiment(
            spec, flows, "tita", scaling, tmp_path, peer_cc("tita", scaling, shipped, {})
        )
    slow = Scaling(scale=20000, max_hops=3)
    with pytest.raises(PeerError, match="INT encodes only"):
        write_experiment(spec, flows, "hpcc", slow, tmp_path, peer_cc("hpcc", slow, shipped, {}))


def test_parsers() -> None:
    fct = parse_fct((SAMPLES / "fct.txt").read_text())
    assert [(f.src, f.dst, f.dport, f.size, f.start_ns, f.fct_ns) for f in fct] == [
        (2, 0, 100, 300000, 0, 12000),
        (3, 0, 101, 300000, 1000000, 9000),
    ]
    q = parse_qlen((SAMPLES / "qlen.txt").read_text())  # the last block only
    assert q == {(4, 1): [100, 0, 5, 0, 1], (4, 3): [20, 1], (6, 1): [30]}
    assert hist_peak(q[(4, 1)]) == 4000 and hist_p99(q[(4, 1)]) == 2000
    assert hist_peak(q[(4, 3)]) == 1000 and hist_p99(q[(4, 3)]) == 1000
    assert hist_peak(q[(6, 1)]) == 0
    assert parse_pfc((SAMPLES / "pfc.txt").read_text()) == [
        (15000, 4, 1, 3, 1),
        (17500, 4, 1, 3, 0),
    ]
    with pytest.raises(ValueError, match="fct.txt:1"):
        parse_fct("0b000201 0b000001 10000\n")


def test_result_of_samples(fabric) -> None:  # type: ignore[no-untyped-def]
    spec, scaling = fabric
    flows = load_flows(DATA / "twin-flows.csv", spec)
    r = ns3_result(SAMPLES, ns3_topology(spec, scaling), flows, [h.name for h in spec.hosts])
    assert r["flows"] == 4 and r["completed"] == 2
    assert [f["fct_s"] for f in r["per_flow"]] == [12e-6, 9e-6, None, None]
    assert r["completion_s"] == pytest.approx(0.001 + 9e-6)  # last finish - first start
    assert r["peak_port"] == "leaf1:1" and r["peak_queue_bytes"] == 4000
    assert r["peak_port_p99_bytes"] == 2000
    assert r["pauses"] == 1 and r["drops"] is None  # no stdout.txt beside the samples
    # slowdown: FCT over ns-3's own ideal (standalone_fct, 6.5 us): 12/6.5 and 9/6.5, both
    # flows of 300 KB
    sd = r["slowdown"]
    assert set(sd) == {"100K-1M", "all"} and sd["100K-1M"]["flows"] == 2
    assert sd["100K-1M"]["p50"] == pytest.approx((12 + 9) / 2 / 6.5)
    assert sd["all"]["p99"] == pytest.approx((9 + 0.99 * 3) / 6.5)


def test_twin_result_slowdown_against_its_own_ideal(fabric, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The twin's side: a flow's ideal is its bytes at the slower NIC's payload rate plus the
    run's measured base RTT; the table shows both sides' slowdown per size bucket."""
    spec, scaling = fabric
    run = {"scenario": "flows", "scheme": "hpcc", "repetition": 0, "drops": 0, "pauses": 0}
    doc = {"setup": {"base_rtt_s": 2e-6}, "runs": [run]}
    (tmp_path / "results.json").write_text(json.dumps(doc))
    (tmp_path / "flows.csv").write_text(
        "scenario,scheme,repetition,id,src,dst,bytes,start_s,fct_s\n"
        "flows,hpcc,0,0,h3,h1,300000,0.0,0.00002\n"
        "flows,hpcc,0,1,h4,h1,8000,0.0,\n"
    )
    r = twin_result(tmp_path, "hpcc", spec, scaling)
    line = payload_line_rate(scaling)  # every host of this fabric on the model's ports
    ideal = 300000 * 8 / line + 2e-6
    assert r["per_flow"][0]["ideal_s"] == pytest.approx(ideal)
    assert r["completed"] == 1 and r["slowdown"]["all"]["flows"] == 1
    assert r["slowdown"]["100K-1M"]["p50"] == pytest.approx(20e-6 / ideal)
    ns3 = ns3_result(
        SAMPLES,
        ns3_topology(spec, scaling),
        load_flows(DATA / "twin-flows.csv", spec),
        [h.name for h in spec.hosts],
    )
    table = side_by_side({"hpcc": {"twin": r, "ns3": ns3}}, ["head"])
    row = next(ln for ln in table.splitlines() if "sd p50 100K-1M" in ln).split()
    assert float(row[-3]) == pytest.approx(20e-6 / ideal, rel=1e-3)
    assert float(row[-2]) == pytest.approx(21 / 2 / 6.5, rel=1e-3)
    # a ratio beyond 15 % is marked, and the buckets that agree are counted
    ratio = (21 / 2 / 6.5) / (20e-6 / ideal)
    assert row[-1] == f"{ratio:.2f}" + ("" if abs(ratio - 1) <= 0.15 else "*")
    marks = [ln.split()[-1] for ln in table.splitlines() if " sd p" in ln and " all " not in ln]
    agree = sum(not m.endswith("*") for m in marks)
    assert f"per size bucket within 15%: {agree} of {len(marks)}" in table


def test_missing_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no" / "third"
    with pytest.raises(PeerError, match="not found: .*no/third does not exist"):
        check_sim(missing)
    rc = main(
        [
            "peer",
            "ns3-hpcc",
            "--sim",
            str(missing),
            "--flows",
            str(DATA / "twin-flows.csv"),
            "--topo",
            str(DATA / "twin-fabric.yaml"),
            str(tmp_path / "run"),
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert "HPCC's ns-3 simulator not found" in err and str(missing) in err
    assert not (tmp_path / "run").exists()  # nothing written, the twin not run


def test_a_byte_counter_the_simulator_lacks_is_named(fabric) -> None:  # type: ignore[no-untyped-def]
    spec, scaling = fabric
    flows = load_flows(DATA / "twin-flows.csv", spec)  # 300 KB the largest
    shipped = parse_cc_profiles("")
    params = {s: peer_cc(s, scaling, shipped, {}) for s in ("hpcc", "dcqcn")}
    [note] = byte_counter_notes(params, flows)
    assert note.startswith("NOTE dcqcn: the twin's DCQCN raises its rate every 32767 B")
    paper = {"dcqcn": peer_cc("dcqcn", scaling, parse_cc_profiles("dcqcn-paper"), {})}
    assert byte_counter_notes(paper, flows) == []  # 10 MiB: never within these flows
    sim = {"dcqcn": peer_cc("dcqcn", scaling, parse_cc_profiles("dcqcn-hpcc-sim"), {})}
    assert sim["dcqcn"].dcqcn.byte_counter == 0
    assert byte_counter_notes(sim, flows) == []  # 0: the counter is off, as theirs


def test_how_each_side_sends_cnps_is_named() -> None:
    """The header says how the twin's receivers spaced their CNPs under each DCQCN scheme
    (its DCQCN profile's notification point, from results.json) against the simulator's one
    with every ACK of a marked packet; nothing for schemes of other laws."""
    setup = {
        "cc_profiles": {
            "dcqcn": {"values": {"cnp_interval_ns": 5187}},
            "dcqcn+pfc": {"values": {"cnp_interval_ns": 0}},
            "hpcc": {"values": {"eta": 0.95}},
        }
    }
    [line] = cnp_notes(setup, ["hpcc", "dcqcn", "dcqcn+pfc"])
    assert line == (
        "CNPs: A dcqcn at most one per 5.187 us per flow, dcqcn+pfc one per marked packet; "
        "B one with every ACK of a marked packet"
    )
    assert cnp_notes(setup, ["hpcc"]) == []
    assert cnp_notes({}, ["dcqcn"]) == []  # a twin run from before profiles carried it


def test_timely_through_the_drivers_keys(fabric, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """TIMELY (the simulator's CC_MODE 7): its step and hyper step in RATE_AI and RATE_HAI,
    its thresholds in our driver's TIMELY_* keys, all the profile's at the NIC's rate (the
    paper's 10 Gb/s values scaled by 390.6 / 10)."""
    spec, scaling = fabric
    flows = load_flows(DATA / "twin-flows.csv", spec)
    timely = peer_cc("timely", scaling, parse_cc_profiles(""), {})
    write_experiment(spec, flows, "timely", scaling, tmp_path, timely)
    c = _config(tmp_path / "config.txt")
    t = timely.timely
    assert c["CC_MODE"] == "7" and c["HAS_WIN"] == "0"
    assert c["RATE_AI"] == f"{t.delta_bps}bps" and c["RATE_HAI"] == f"{5 * t.delta_bps}bps"
    assert t.delta_bps == pytest.approx(10e6 * scaling.nic_bps / 10e9, rel=1e-6)
    assert (c["TIMELY_ALPHA"], c["TIMELY_BETA"]) == ("0.875", "0.8")
    assert int(c["TIMELY_TLOW"]) == t.t_low_ns == int(50_000 * 10e9 / int(scaling.nic_bps))
    assert int(c["TIMELY_THIGH"]) == t.t_high_ns and int(c["TIMELY_MINRTT"]) == t.min_rtt_ns
