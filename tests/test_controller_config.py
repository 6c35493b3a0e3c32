"""The controller's config: the example loads, the topology's routes and links are right, and
every kind of bad input is a ConfigError naming the bad key."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import ConfigError, load, parse
from controller.topology import NextHop, Topology

EXAMPLE = Path(__file__).parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"


def example_doc() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_example_loads_with_resolved_paths_and_scaled_rates() -> None:
    cfg = load(EXAMPLE)
    assert [s.name for s in cfg.switches] == ["leaf1", "leaf2", "spine1", "spine2"]
    assert cfg.pipeline.p4info == EXAMPLE.parent / "../../p4src/build/xingmai.p4info.txtpb"
    assert cfg.int.instruction_bitmap == 0xF500 and cfg.int.dscp == 0x17
    assert cfg.policy.for_host("h8").params == {"eta": 0.9}
    assert cfg.policy.for_host("h1").rate_law == "tita"
    doc = example_doc()
    doc["hosts"][0]["agent"] = "unix:///run/xingmai/agents/h1/agent.sock"
    assert parse(doc, EXAMPLE.parent).hosts[0].agent == "unix:///run/xingmai/agents/h1/agent.sock"
    topo = Topology(cfg)
    assert topo.links["leaf1:5"].capacity_bps == pytest.approx(100e6)
    assert str(topo.links["leaf1:5"].rx) == "spine1:1"
    assert topo.links["h1:eth0"].rx.node == "leaf1"


def test_routes_are_shortest_paths_with_ecmp_over_spines() -> None:
    topo = Topology(load(EXAMPLE))
    leaf1 = topo.routes("leaf1")
    assert leaf1["10.0.1.2"] == (NextHop(2, "02:00:00:00:01:02"),)
    assert leaf1["10.0.2.3"] == (NextHop(5, "00:00:00:00:fe:03"), NextHop(6, "00:00:00:00:fe:04"))
    assert leaf1["10.0.100.1"] == (NextHop(7, "02:00:00:00:64:01"),)
    spine2 = topo.routes("spine2")
    assert spine2["10.0.1.1"] == (NextHop(1, "00:00:00:00:fe:01"),)
    assert spine2["10.0.100.1"] == (NextHop(1, "00:00:00:00:fe:01"),)
    assert len(spine2) == 9  # 8 hosts + the collector
    assert topo.host_ports("leaf2") == [(1, "h5"), (2, "h6"), (3, "h7"), (4, "h8")]


def test_partitioned_destination_is_left_out() -> None:
    doc = example_doc()
    doc["links"] = [lk for lk in doc["links"] if "leaf2:5" not in lk and "leaf2:6" not in lk]
    topo = Topology(parse(doc, EXAMPLE.parent))
    assert "10.0.2.1" not in topo.routes("leaf1")
    assert "10.0.2.1" in topo.routes("leaf2")


def _set(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    cur: Any = doc
    for p in path[:-1]:
        cur = cur[p]
    if value is _DELETE:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    "path,value,message",
    [
        (
            ["switches", 1, "ports", 0],
            {"port": 1, "speed_gbps": "fast"},
            "switches[1].ports[0].speed_gbps: expected a number, got 'fast'",
        ),
        (["switches", 0, "grpc_addr"], "nowhere", "switches[0].grpc_addr: expected HOST:PORT"),
        (["switches", 0, "node_id"], 3, "switches[2].node_id: 3 already used by leaf1"),
        (["switches", 0, "router_mac"], "00:11", "switches[0].router_mac: '00:11' is not a MAC"),
        (["switches", 0, "kind"], "tofino", "switches[0].kind: expected one of builtin, bmv2"),
        (["switches", 0, "kind"], "bmv2", "switches[0].thrift_port: required for a bmv2 switch"),
        (["switches", 0, "colour"], "red", "switches[0].colour: unknown key"),
        (["switches", 0, "name"], _DELETE, "switches[0].name: required"),
        (["hosts", 2, "nics", 0, "ip"], "10.0.1.300", "hosts[2].nics[0].ip: '10.0.1.300' is not"),
        (["hosts", 2, "nics", 0, "ip"], "10.0.1.1", "hosts[2].nics[0].ip: 10.0.1.1 used twice"),
        (["hosts", 0, "int"], "maybe", "hosts[0].int: expected one of switch, nic, none"),
        (["hosts", 0, "agent"], "unix:", "hosts[0].agent: 'unix:' names no socket path"),
        (["hosts", 0, "agent"], "agent-h1", "hosts[0].agent: expected HOST:PORT"),
        (["links", 0], ["h1:eth0"], "links[0]: expected [END, END]"),
        (["links", 0, 1], "leaf1:99", "links[0].b: switch leaf1 has no port 99"),
        (["links", 1, 1], "leaf1:1", "links[1].b: leaf1:1 is already linked (links[0])"),
        (["links", 0, 0], "h9:eth0", "links[0].a: no switch or host named 'h9'"),
        (["links", 0, 0], "h1:eth7", "links[0].a: host h1 has no NIC 'eth7'"),
        (["int", "dscp"], 64, "int.dscp: 64 out of range [0, 63]"),
        (["int", "instruction_bitmap"], True, "int.instruction_bitmap: expected an integer"),
        (
            ["int", "collector", "ip"],
            "collector.local",
            "int.collector.ip: 'collector.local' is not",
        ),
        (["int", "watchlist", 0, "src"], "10.0.0.1/8", "int.watchlist[0].src: '10.0.0.1/8' is not"),
        (["ecn", "kmax_bytes"], 10, "ecn.kmax_bytes: 10 is below kmin_bytes 20000"),
        (["policy", "eta"], 0, "policy.eta: 0 out of range (0"),
        (["policy", "hosts", "h9"], {"rate_law": "tita"}, "policy.hosts.h9: no such host"),
        (["policy", "default", "rate_law"], "cubic", "policy.default.rate_law: expected one of"),
        (["policy", "default", "params"], {"w_ai": "big"}, "policy.default.params.w_ai: expected"),
        (["policy", "default", "params"], {"w_ai": 5}, "policy.default.params.w_ai: tita has no"),
        (["policy", "default", "params"], {"eta": -1}, "policy.default.params.eta: -1 out of"),
        (["model", "scale"], 0.5, "model.scale: 0.5 out of range [1"),
        (["pipeline"], _DELETE, "pipeline: required"),
        (["controller", "election_id"], 0, "controller.election_id: 0 out of range"),
        (["controller", "tls"], {"cert": "a.pem", "key": "k.pem"}, "controller.tls.ca: required"),
    ],
)
def test_bad_values_name_their_key(path: list[Any], value: Any, message: str) -> None:
    doc = _set(example_doc(), path, value)
    with pytest.raises(ConfigError) as exc:
        parse(doc, EXAMPLE.parent)
    assert message in str(exc.value)


def test_unlinked_nic_and_non_mapping_and_unreadable_files(tmp_path: Path) -> None:
    doc = example_doc()
    doc["links"] = doc["links"][1:]
    with pytest.raises(ConfigError, match="host h1 NIC eth0 is not linked"):
        parse(doc, EXAMPLE.parent)
    with pytest.raises(ConfigError, match="<top>: expected a mapping"):
        parse(["not", "a", "mapping"])
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("switches: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load(empty)


def test_per_switch_pipeline_overrides_the_global_one() -> None:
    doc = example_doc()
    doc["switches"][3]["pipeline"] = {"p4info": "tna.p4info.txtpb", "bmv2_json": "tna.json"}
    cfg = parse(doc, EXAMPLE.parent)
    assert cfg.pipeline_of(cfg.switches[3]).p4info == EXAMPLE.parent / "tna.p4info.txtpb"
    assert cfg.pipeline_of(cfg.switches[0]) == cfg.pipeline
    doc["switches"][3]["pipeline"] = {"p4info": "x"}
    with pytest.raises(ConfigError, match=r"switches\[3\].pipeline.bmv2_json: required"):
        parse(doc, EXAMPLE.parent)


def test_tita_without_nic_int_is_warned_about() -> None:
    cfg = load(EXAMPLE)
    # the example's hosts are int: switch and h1..h7 run the default law, tita
    warned = cfg.warnings()
    assert any("h1" in w and "needs int: nic" in w for w in warned)
    nic = dataclasses.replace(
        cfg, hosts=tuple(dataclasses.replace(h, int_mode="nic") for h in cfg.hosts)
    )
    assert nic.warnings() == []
