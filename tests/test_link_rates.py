"""Links with a rate and a delay of their own: a fabric of 100G hosts under 400G uplinks, or a
slow scale-up link, written down in the topology and honoured by the controller's config and
the twin (its wires, its NICs' line rates, the switches' port rates)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from testbed.ctlconfig import controller_config
from testbed.experiment.suite import flow_line_rate, payload_line_rate
from testbed.model import TRANSPORT_OVERHEAD, Scaling
from testbed.sim.fabric import SimFabric
from testbed.topo import End, TopologyError, dump, from_doc, leafspine, load, parse_choice
from testbed.traffic.generators import Flow

DOC = {
    "switches": ["s1"],
    "hosts": [{"name": "h1", "nics": ["10.0.1.1"]}, {"name": "h2", "nics": ["10.0.1.2"]}],
    "links": [["h1:0", "s1:1", {"gbps": 100}], ["h2:0", "s1:2", {"delay_ns": 5000}]],
}


def test_yaml_round_trip_and_lookups(tmp_path: Path) -> None:
    spec = from_doc(DOC, "mixed")
    lk = spec.link_at(End("s1", 1))
    assert lk is not None and (lk.gbps, lk.delay_ns) == (100.0, None)
    assert spec.link_gbps(End("h1", 0), 400.0) == 100.0
    assert spec.link_gbps(End("s1", 2), 400.0) == 400.0
    (tmp_path / "t.yaml").write_text(dump(spec))
    assert load(tmp_path / "t.yaml") == spec


@pytest.mark.parametrize(
    ("third", "message"),
    [
        ({"gbps": 0}, "gbps 0 is not a speed"),
        ({"gbps": "fast"}, "gbps 'fast' is not a speed"),
        ({"delay_ns": -1}, "delay_ns -1 is not whole ns"),
        ({"delay_ns": 1.5}, "delay_ns 1.5 is not whole ns"),
        ({"speed": 100}, "the third element is a mapping of gbps and delay_ns"),
    ],
)
def test_bad_link_parameters_are_named(third: dict[str, object], message: str) -> None:
    doc = {**DOC, "links": [["h1:0", "s1:1", third], ["h2:0", "s1:2"]]}
    with pytest.raises(TopologyError, match=f"links\\[0\\]: {message}"):
        from_doc(doc)


def test_the_controller_config_carries_the_ports_speed() -> None:
    from testbed.ctlconfig import ControllerSetup, SwitchAccess

    spec = from_doc(DOC)
    doc = controller_config(
        spec,
        Scaling(scale=1),
        {"s1": SwitchAccess("127.0.0.1:1", "builtin")},
        {},
        ControllerSetup(grpc_addr="127.0.0.1:2", collector_netns=None, log_file=""),
        "p",
        "j",
    )
    assert doc["switches"][0]["ports"] == [{"port": 1, "speed_gbps": 100.0}, 2]


def test_the_twin_runs_each_link_at_its_own_rate_and_delay() -> None:
    spec = from_doc(DOC)
    s = Scaling(scale=1, max_hops=1)
    fab = SimFabric(spec, s)
    # the 100G host's NIC and its downlink run at 100G; the other's link at the model's 400G
    assert fab.hosts["h1"].line_rate_bps == pytest.approx(s.nic_rate(100e9))
    assert fab.hosts["h2"].line_rate_bps == pytest.approx(s.nic_bps)
    assert fab.switches["s1"].sw.tm.ports[1].rate_bps == pytest.approx(100e9)
    assert (
        fab.switches["s1"].wires[2].delay_ns == 5000 and fab.switches["s1"].wires[1].delay_ns == 80
    )
    hosts = fab.traffic_hosts()
    size = 4_000_000
    out = fab.run_job(
        hosts,
        {
            "kind": "flows",
            "flows": [Flow(0, 0, 1, size, 0.0).as_dict()],
            "seed": 1,
            "transport": {"mtu": s.transport_mtu, "window": 1000},
            "timeout": 1.0,
        },
    )
    fct = out.results[0]["sent"][0]["fct"]
    # the 100G host sends 4 MB at its NIC's 100G: at least 320 us (80 us at 400G)
    assert 320e-6 < fct < 400e-6, fct


def test_leafspine_with_hosts_on_links_of_their_own_speed() -> None:
    spec = parse_choice("leafspine:20,4,16,100")
    assert spec.name == "leafspine-20x4x16-100g"
    assert (len(spec.hosts), len(spec.switches), len(spec.links)) == (320, 24, 320 + 80)
    # the hosts' links at 100G, the leaves' uplinks at the switch model's speed
    assert spec.link_gbps(End("h1", 0), 400.0) == 100.0
    assert spec.link_gbps(End("leaf1", 17), 400.0) == 400.0
    assert parse_choice("leafspine:2,2,4").links[0].gbps is None
    with pytest.raises(TopologyError, match="host link speed 0"):
        parse_choice("leafspine:2,2,4,0")


def test_a_flows_ideal_rate_is_its_slower_nic() -> None:
    """The FCT slowdown's ideal: size over the slower of the two NICs' payload rates (each at
    its own link's speed), not the model's NIC."""
    spec = from_doc(DOC)  # h1 on a 100G link, h2 on the model's 400G
    s = Scaling(scale=1, max_hops=1)
    per_payload = s.transport_mtu / (s.transport_mtu + TRANSPORT_OVERHEAD)
    assert flow_line_rate(spec, s, "h1", "h2") == pytest.approx(s.nic_rate(100e9) * per_payload)
    assert flow_line_rate(spec, s, "h2", "h1") == flow_line_rate(spec, s, "h1", "h2")
    both400 = leafspine(1, 1, 2)
    assert flow_line_rate(both400, s, "h1", "h2") == pytest.approx(payload_line_rate(s))


def test_websearch_offers_its_load_of_the_hosts_own_nics(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's WebSearch draws its arrivals at the load of the hosts' NICs, each at its
    own link's speed: 100G hosts under 400G switch ports get a quarter of the bytes."""
    import testbed.experiment.suite as suite_mod
    from testbed.experiment.suite import SuiteConfig
    from testbed.sim.suite import SimSuite

    seen: list[float] = []

    def drawn(cfg: SuiteConfig, hosts: int, nic_bps: float, seconds: float) -> list[Flow]:
        seen.append(nic_bps)
        raise RuntimeError("the arrivals' rate seen")

    monkeypatch.setattr(suite_mod, "websearch_flows", drawn)
    spec = parse_choice("leafspine:1,1,2,100")
    s = Scaling(scale=20, max_hops=spec.longest_path_switches())
    cfg = dataclasses.replace(SuiteConfig.quick(), schemes=("none",), scenarios=("websearch",))
    try:
        SimSuite(SimFabric(spec, s), cfg).run()
    except RuntimeError:
        pass  # the suite may record the error or pass it on: the rate is what matters
    assert seen == [pytest.approx(s.nic_rate(100e9 / 20))]


def test_each_nic_runs_its_law_at_its_own_line_rate() -> None:
    """A scheme's CC profile is resolved at each host NIC's line rate: a 100G host's TIMELY
    thresholds and increase are a 100G NIC's (the twin's 100G hosts once ran the 400G NIC's,
    T_low below their base RTT), its neighbour's at the model's 400G; the B*T window is the
    hosts' link's, and results.json's record says which rates the values are for."""
    from controller.nic.ratelaw.profiles import load_profile
    from testbed.experiment.suite import SuiteConfig, tita_window
    from testbed.sim.suite import SimSuite

    spec = from_doc(DOC)  # h1 on a 100G link, h2 on the model's 400G
    s = Scaling(scale=1, max_hops=spec.longest_path_switches())
    fab = SimFabric(spec, s)
    cfg = dataclasses.replace(SuiteConfig.quick(), schemes=("timely",), scenarios=("incast",))
    suite = SimSuite(fab, cfg)
    suite.prepare()
    suite.use_scheme("timely")
    prof = load_profile("timely-paper")
    t_ns = round(suite.tita_t_s * 1e9)
    for name in ("h1", "h2"):
        host = fab.hosts[name]
        assert host.nic.params == prof.cc_params(host.line_rate_bps, t_ns, s.scale)
    slow, fast = fab.hosts["h1"].nic.params.timely, fab.hosts["h2"].nic.params.timely
    assert slow.t_low_ns == pytest.approx(4 * fast.t_low_ns, rel=1e-3)
    assert fast.delta_bps == pytest.approx(4 * slow.delta_bps, rel=1e-3)
    rec = suite.cc_records["timely"]
    assert rec["nic_bps"] == fab.hosts["h2"].line_rate_bps
    by_rate = rec["values_by_nic_bps"]
    assert by_rate[str(fab.hosts["h1"].line_rate_bps)]["t_low_ns"] == slow.t_low_ns
    # one window for all: the fastest host's B*T, so that none is held below its own
    assert suite.hosts_link_bps() == s.link_bps
    assert suite.window("hpcc") == tita_window(s, suite.tita_t_s, ack_every=2)


def test_a_fabric_of_100g_hosts_resolves_everything_at_100g() -> None:
    """Hosts all on 100G links under 400G switch ports: the laws, the B*T window, the
    receivers' CNP interval and the incast's declared start are a 100G NIC's."""
    from testbed.experiment.suite import SuiteConfig, tita_window, transport_settings
    from testbed.sim.suite import SimSuite

    spec = parse_choice("leafspine:1,1,3,100")
    s = Scaling(scale=1, max_hops=spec.longest_path_switches())
    fab = SimFabric(spec, s)
    suite = SimSuite(fab, dataclasses.replace(SuiteConfig.quick(), schemes=("hpcc",)))
    suite.prepare()
    cc = suite.scheme_cc("hpcc")
    nic = s.nic_rate(100e9)
    assert {p.hpcc for p in cc.values()} == {cc["h1"].hpcc}
    assert suite.cc_records["hpcc"]["nic_bps"] == int(nic)
    assert "values_by_nic_bps" not in suite.cc_records["hpcc"]
    assert suite.window("hpcc") == tita_window(s, suite.tita_t_s, 100e9, ack_every=2)
    assert suite.window("hpcc") < tita_window(s, suite.tita_t_s, ack_every=2)
    assert suite.hosts_link_bps() == 100e9
    assert suite.cnp_interval_s("dcqcn") == pytest.approx(
        4 * transport_settings(s)["cnp_interval"], rel=1e-3
    )
    suite._scheme = "tita"
    assert suite._incast_start_rate() == pytest.approx(nic / 2)


def test_the_emulation_pushes_each_agent_its_own_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The emulation sets one policy for every agent where the hosts' NICs run at one rate,
    one per host (SetPolicy's `host`) where they differ, under every scheme: NVIDIA's DCQCN,
    alike at every rate, after TIMELY's per-host policies once went to the default, which
    the hosts' own TIMELY policies outranked."""
    import testbed.emu.suite as emu_suite
    from controller.nic.ratelaw.profiles import load_profile, policy_params

    calls: list[tuple[str, dict[str, float], str]] = []

    class FakeTestbed:
        def set_policy(self, law: str, params: dict[str, float], host: str = "") -> list[str]:
            calls.append((law, params, host))
            return [host] if host else ["h1", "h2"]

    monkeypatch.setattr(emu_suite.time, "sleep", lambda s: None)
    suite = object.__new__(emu_suite.EmuSuite)
    suite.tb = FakeTestbed()  # type: ignore[assignment]
    prof = load_profile("timely-paper")
    slow, fast = prof.cc_params(96_000_000_000, 2000), prof.cc_params(385_000_000_000, 2000)
    alike = {"h1": 385e9, "h2": 385e9}
    suite.nic_rates = lambda: alike  # type: ignore[method-assign]
    assert suite._set_policy("timely", {"h1": fast, "h2": fast}) == 2
    assert calls == [("timely", policy_params(fast), "")]
    calls.clear()
    suite.nic_rates = lambda: {"h1": 96e9, "h2": 385e9}  # type: ignore[method-assign]
    assert suite._set_policy("timely", {"h1": slow, "h2": fast}) == 2
    assert calls == [
        ("timely", policy_params(slow), "h1"),
        ("timely", policy_params(fast), "h2"),
    ]
    calls.clear()
    nvidia = load_profile("dcqcn-nvidia")
    same = nvidia.cc_params(96_000_000_000, 2000)
    assert same.dcqcn == nvidia.cc_params(385_000_000_000, 2000).dcqcn  # absolute values
    assert suite._set_policy("dcqcn", {"h1": same, "h2": same}) == 2
    assert [host for _, _, host in calls] == ["h1", "h2"]


def test_the_rto_stays_above_the_deepest_queue_the_buffer_admits() -> None:
    """A timer below a queue's delay resends (go-back-N: a window) packets that are only
    waiting: the RTO is twice the longest any one queue of the fabric can take to drain, at
    the rate of its port (a 100G host's downlink drains four times slower than a 400G one),
    and never below the floor it had (1 s at the emulation's scale, 50 us at the model's)."""
    from testbed.experiment.suite import RTO_QUEUES, deepest_queue_s, transport_settings
    from testbed.model import model_with_buffer

    # one switch of two ports, its 100G port the slower: the shared buffer's two ports'
    # shares, of which alpha / (1 + alpha) = 1/2 to one queue, drain at 100G
    spec = from_doc(DOC, "mixed")
    s = Scaling(scale=1.0, max_hops=1)
    share = s.model.buffer_per_port() * 2 * s.model.buffer_alpha / (1 + s.model.buffer_alpha)
    assert deepest_queue_s(spec, s) == pytest.approx(share * 8 / 100e9)
    rto = transport_settings(s, deepest_queue=deepest_queue_s(spec, s))["rto"]
    assert rto == pytest.approx(RTO_QUEUES * share * 8 / 100e9) and rto > 50e-6
    # the fat-tree of HPCC's paper: the ToR with the collector's port beside its 20 links,
    # its 100G host ports
    fat = parse_choice("fattree")
    q = deepest_queue_s(fat, s)
    assert q == pytest.approx(21 * s.model.buffer_per_port() / 2 * 8 / 100e9)
    assert transport_settings(s, deepest_queue=q)["rto_max"] == 4 * RTO_QUEUES * q
    # a static queue at the emulation's scale: the floor
    static = Scaling(model=model_with_buffer("static"), scale=20_000.0, max_hops=3)
    q = deepest_queue_s(leafspine(2, 2, 4), static)
    assert q == pytest.approx(static.model.queue_bytes * 8 / static.link_bps)
    assert transport_settings(static, deepest_queue=q)["rto"] == 1.0
    assert transport_settings(s)["rto"] == pytest.approx(50e-6)


def test_the_emulations_rto_stays_above_what_its_cpus_hold_back() -> None:
    """The emulation's transports wait for a CPU (up to 91 ms measured at 1 Gb/s per port),
    and a peer's timer below that resent windows that were not lost: its RTO has a floor
    of its own in wall time, which binds at 1 Gb/s per port, not at 100 or 20 Mb/s (the
    deepest queue drains slower there); the twin has none."""
    from testbed.emu.suite import EMU_RTO_FLOOR_S, EmuSuite
    from testbed.experiment.suite import SuiteConfig, deepest_queue_s, transport_settings
    from testbed.sim.suite import SimSuite

    assert EmuSuite.rto_floor_s == EMU_RTO_FLOOR_S and SimSuite.rto_floor_s == 0.0
    spec = leafspine(2, 2, 4)
    for scale, binds in ((400.0, True), (4000.0, False), (20_000.0, False)):
        s = Scaling(scale=scale, max_hops=3)
        q = deepest_queue_s(spec, s)
        plain = transport_settings(s, deepest_queue=q)["rto"]
        floored = transport_settings(s, deepest_queue=q, rto_floor=EMU_RTO_FLOOR_S)
        assert floored["rto"] == pytest.approx(EMU_RTO_FLOOR_S if binds else plain)
        assert (plain < EMU_RTO_FLOOR_S) == binds
        assert floored["rto_max"] == 4 * floored["rto"]
    # the twin at the model's speed: untouched
    assert transport_settings(Scaling(scale=1.0, max_hops=3))["rto"] == pytest.approx(50e-6)
    # a suite's transports and its record take the engine's floor
    s = Scaling(scale=400.0, max_hops=3)
    suite = SimSuite(SimFabric(spec, s), SuiteConfig.quick())
    suite.rto_floor_s = EMU_RTO_FLOOR_S
    assert suite.rto_s() == EMU_RTO_FLOOR_S
    assert suite.transport("none", 64)["rto"] == EMU_RTO_FLOOR_S


def test_the_window_holds_the_frames_a_receiver_waits_for_before_it_acks() -> None:
    """B*T and the ACK interval's frames but one: a packet's ACK leaves only with the
    ACK interval's last packet (TiTa's every two; Swift's every one: B*T alone)."""
    from testbed.experiment.suite import tita_window

    s = Scaling()
    bdp = tita_window(s, 0.02)
    assert bdp == math.ceil(s.link_bps * 0.02 / 8 / s.frame_bytes)
    assert tita_window(s, 0.02, ack_every=2) == bdp + 1
    assert tita_window(s, 0.02, ack_every=4) == bdp + 3
