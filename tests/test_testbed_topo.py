"""The testbed's topologies, their YAML format, the scaling of the switch model, and the
controller config the testbed writes (checked by the controller's own validator and routes).
No root needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.config import parse
from controller.topology import NextHop, Topology
from testbed.ctlconfig import ControllerSetup, SwitchAccess, controller_config
from testbed.emu.topo import FabricTopo, LeafSpineTopo, RailTopo, SingleTopo
from testbed.model import Scaling, SwitchModel
from testbed.topo import (
    COLLECTOR_NODE,
    End,
    FabricSpec,
    TopologyError,
    crossed,
    dump,
    from_doc,
    leafspine,
    load,
    parse_choice,
    rail,
    single,
)


def test_leafspine_addresses_ports_and_links() -> None:
    spec = leafspine(2, 2, 4)
    assert [s.name for s in spec.switches] == ["leaf1", "leaf2", "spine1", "spine2"]
    assert [s.node_id for s in spec.switches] == [1, 2, 3, 4]
    assert len({s.router_mac for s in spec.switches}) == 4
    assert [h.nics[0].ip for h in spec.hosts] == [
        f"10.0.{i}.{j}" for i in (1, 2) for j in (1, 2, 3, 4)
    ]
    assert spec.attachment("h6", 0) == End("leaf2", 2)
    # leaf i's uplink k is port H+k, the spine's port for leaf i is i
    uplinks = {
        (lk.a, lk.b)
        for lk in spec.links
        if lk.a.node.startswith("leaf") and lk.b.node.startswith("spine")
    }
    assert uplinks == {
        (End(f"leaf{i}", 4 + k), End(f"spine{k}", i)) for i in (1, 2) for k in (1, 2)
    }
    assert spec.collector == End("leaf1", 7)
    assert spec.switch_ports("leaf1") == [1, 2, 3, 4, 5, 6, 7]
    assert spec.switch_ports("spine2") == [1, 2]
    assert spec.longest_path_switches() == 3
    assert spec.host("h1").nics[0].gateway == "10.0.1.254"


def test_crossed_numbers_the_hosts_round_the_leaves() -> None:
    spec, plain = crossed(2, 1, 4), leafspine(2, 1, 4)
    assert spec.name == "crossed-2x1x4" and parse_choice("crossed:2,1,4") == spec
    assert [h.name for h in spec.hosts] == [f"h{n}" for n in range(1, 9)]
    assert spec.attachment("h1", 0) == End("leaf1", 1)
    assert spec.attachment("h2", 0) == End("leaf2", 1)
    assert spec.attachment("h3", 0) == End("leaf1", 2)

    # the same fabric, addresses and ports: only the hosts' numbers differ
    def wired(s: FabricSpec) -> set[tuple[str, End]]:
        return {(h.nics[0].ip, s.attachment(h.name, 0)) for h in s.hosts}

    assert wired(spec) == wired(plain)
    assert spec.switches == plain.switches and spec.collector == plain.collector
    # a ring in host order crosses the spine at every hop
    leaf = [spec.attachment(h.name, 0).node for h in spec.hosts]
    assert all(leaf[i] != leaf[(i + 1) % 8] for i in range(8))
    with pytest.raises(TopologyError, match="crossed: at least two hosts"):
        crossed(1, 1, 1)


def test_single_and_rail() -> None:
    s = single(3)
    assert [lk.b for lk in s.links] == [End("s1", 1), End("s1", 2), End("s1", 3)]
    assert s.longest_path_switches() == 1
    r = rail(nics=2, hosts=3, spines=1)
    assert [sw.name for sw in r.switches] == ["rail1", "rail2", "spine1"]
    # NIC i of every host sits on rail leaf i+1, at the host's number
    assert r.attachment("h2", 0) == End("rail1", 2) and r.attachment("h2", 1) == End("rail2", 2)
    assert [n.ip for n in r.host("h3").nics] == ["10.0.1.3", "10.0.2.3"]
    assert r.host("h3").ifname(1) == "h3-eth1"
    assert r.longest_path_switches() == 3  # rail1 - spine1 - rail2


def test_yaml_round_trip_and_short_form() -> None:
    spec = leafspine(2, 1, 2)
    again = from_doc(yaml.safe_load(dump(spec)))
    assert again == spec
    short = from_doc(
        {
            "switches": ["s1"],
            "hosts": [{"name": "a", "nics": ["10.9.0.1"]}, {"name": "b", "nics": ["10.9.0.2"]}],
            "links": [["a:0", "s1:1"], ["b:0", "s1:2"]],
        }
    )
    assert short.switch("s1").device_id == 1 and short.host("b").nics[0].mac == "02:00:0a:09:00:02"
    assert short.collector is None


def test_load_and_parse_choice(tmp_path: Path) -> None:
    f = tmp_path / "two.yaml"
    f.write_text(dump(single(2)))
    assert load(f) == single(2)
    assert parse_choice(str(f)) == single(2)
    assert parse_choice("leafspine:3,1,2") == leafspine(3, 1, 2)
    assert parse_choice("rail") == rail()
    with pytest.raises(TopologyError, match="not single"):
        parse_choice("ring:4")
    with pytest.raises(TopologyError, match="integers"):
        parse_choice("single:x")


@pytest.mark.parametrize(
    "doc, message",
    [
        (
            {"switches": ["s1"], "hosts": [{"name": "a", "nics": ["10.9.0.1"]}], "links": []},
            "host a NIC 0 is not linked",
        ),
        (
            {
                "switches": ["s1"],
                "hosts": [{"name": "a", "nics": ["10.9.0.1"]}],
                "links": [["a:0", "s1:600"]],
            },
            r"links\[0\]: port 600",
        ),
        (
            {
                "switches": ["s1"],
                "hosts": [{"name": "a", "nics": ["10.9.0.1"]}],
                "links": [["a:0", "s2:1"]],
            },
            "no switch or host named 's2'",
        ),
        (
            {
                "switches": ["s1"],
                "hosts": [{"name": "a", "nics": ["10.9.0.1"]}, {"name": "b", "nics": ["10.9.0.1"]}],
                "links": [["a:0", "s1:1"], ["b:0", "s1:2"]],
            },
            "addresses must be unique",
        ),
        (
            {
                "switches": ["s1"],
                "hosts": [{"name": "a", "nics": ["10.9.0.1"]}],
                "links": [["a:0", "s1:1"], ["a:0", "s1:2"]],
            },
            "linked twice",
        ),
        (
            {
                "switches": ["s1"],
                "hosts": [{"name": "col", "nics": ["10.9.0.1"]}],
                "links": [["col:0", "s1:1"]],
            },
            "reserved",
        ),
        (
            {"switches": ["s1"], "hosts": [{"name": "a", "nics": ["nope"]}], "links": []},
            r"hosts\[0\].nics\[0\]: 'nope' is not an IPv4",
        ),
        ({"switches": ["s1"], "hosts": [], "links": [], "colector": "s1:1"}, "unknown key"),
        ({"switches": ["a-very-long-switch-name"], "hosts": [], "links": []}, "at most 10"),
    ],
)
def test_bad_topologies_name_the_entry(doc: dict[str, object], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        from_doc(doc)


def test_mininet_topos_carry_ports_and_addressing() -> None:
    t = LeafSpineTopo(2, 1, 2)
    assert sorted(t.switches()) == ["leaf1", "leaf2", "spine1"]
    assert sorted(t.hosts()) == sorted(["h1", "h2", "h3", "h4", COLLECTOR_NODE])
    info = t.nodeInfo("leaf2")
    assert (info["device_id"], info["node_id"], info["router_mac"]) == (2, 2, "02:00:00:00:fe:02")
    nic = t.nodeInfo("h3")["nics"][0]
    assert nic["ip"] == "10.0.2.1" and nic["gateway"] == "10.0.2.254"
    assert nic["router_mac"] == "02:00:00:00:fe:02"  # h3 hangs off leaf2
    ports = {(a, b): (i["port1"], i["port2"]) for a, b, i in t.links(withInfo=True)}
    assert ports[("h3", "leaf2")] == (0, 1)
    assert ports[("leaf1", "spine1")] == (3, 1)
    assert ports[(COLLECTOR_NODE, "leaf1")] == (0, 4)
    assert len(SingleTopo(4).hosts()) == 5
    assert len(RailTopo(2, 3, 1).links()) == 2 * 3 + 2 + 1
    assert FabricTopo(spec=single(2)).spec == single(2)


def test_scaling_of_the_51_2t_model() -> None:
    s = Scaling(scale=20_000)
    assert s.link_bps == 20e6
    assert s.frame_bytes == 4096 + 58
    # the NIC leaves room for the INT a full frame picks up on 3 hops (16 + 3 * 28 bytes)
    assert s.nic_bps == pytest.approx(20e6 * 4154 / (4154 + 100))
    assert s.queue_packets() == 500_000 // 4154
    assert s.base_rtt_s == pytest.approx(0.020)
    assert "400G ports run at 20 Mb/s" in s.describe()
    assert Scaling(scale=4000, model=SwitchModel(queue_bytes=100_000)).link_bps == 100e6
    with pytest.raises(ValueError, match="too slow"):
        Scaling(scale=1e7)
    # v1model's 19-bit queue depth, in bytes on the built-in switch
    assert SwitchModel().queue_bytes < 1 << 19


def test_controller_config_for_a_booted_fabric_validates_and_routes() -> None:
    spec = leafspine(2, 2, 2)
    access = {
        s.name: SwitchAccess(f"169.254.7.{4 * i + 2}:9559", "builtin")
        for i, s in enumerate(spec.switches)
    }
    agents = {h.name: f"unix:///run/xingmai/agents/xmab-{h.name}/agent.sock" for h in spec.hosts}
    doc = controller_config(
        spec,
        Scaling(scale=20_000),
        access,
        agents,
        ControllerSetup(
            grpc_addr="127.0.0.1:50999", collector_netns="xmabcol", log_file="", rate_law="dcqcn"
        ),
        "/x/xingmai.p4info.txtpb",
        "/x/xingmai.json",
    )
    doc["controller"].pop("log_file")
    cfg = parse(yaml.safe_load(yaml.safe_dump(doc)))
    assert cfg.model.scale == 20_000 and cfg.emulated_bps(400) == 20e6
    assert cfg.policy.default.rate_law == "dcqcn" and cfg.policy.push_caps is False
    assert cfg.int.collector.netns == "xmabcol" and cfg.int.mtu == 9000
    assert {h.int_mode for h in cfg.hosts} == {"nic"}
    assert cfg.host("h3").nics[0].name == "h3-eth0"
    assert cfg.host("h3").agent == agents["h3"]
    topo = Topology(cfg)
    # leaf1 reaches h3 (on leaf2) over both spines; its own hosts directly
    routes = topo.routes("leaf1")
    assert routes["10.0.2.1"] == (NextHop(3, "02:00:00:00:fe:03"), NextHop(4, "02:00:00:00:fe:04"))
    assert routes["10.0.1.2"] == (NextHop(2, spec.host("h2").nics[0].mac),)
    assert "10.0.100.1" in routes  # the collector
    bmv2 = controller_config(
        spec,
        Scaling(),
        {k: SwitchAccess(v.grpc_addr, "bmv2", 9090) for k, v in access.items()},
        agents,
        ControllerSetup("127.0.0.1:1", None, ""),
        "/p",
        "/j",
    )
    bmv2["controller"].pop("log_file")
    assert parse(bmv2).switch("spine1").thrift_port == 9090
