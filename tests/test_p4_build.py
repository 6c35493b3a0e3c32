"""The committed P4 build: it matches its sources (stamp), loads into the built-in switch, and
exposes the control-plane API the controller is written against (p4src/README.md)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from finsy.proto import p4i
from google.protobuf import text_format

from testbed import p4build
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

BUILD = p4build.P4SRC.build
README = p4build.P4SRC.root / "README.md"

# The API the controller relies on: table -> (match fields, actions); action -> params.
TABLES = {
    "ipv4_routes": ({"ipv4_dst": "LPM"}, {"set_next_id", "no_route"}),
    "next_hops": ({"next_id": "EXACT"}, {"route", "NoAction"}),
    "acl": (
        {
            "ingress_port": "TERNARY",
            "eth_type": "TERNARY",
            "eth_dst": "TERNARY",
            "ipv4_dst": "TERNARY",
            "ip_proto": "TERNARY",
            "l4_dport": "TERNARY",
        },
        {"punt_to_cpu", "deny", "permit"},
    ),
    "int_watchlist": (
        {
            "ipv4_src": "TERNARY",
            "ipv4_dst": "TERNARY",
            "ip_proto": "TERNARY",
            "l4_sport": "TERNARY",
            "l4_dport": "TERNARY",
        },
        {"mark_to_source", "no_source"},
    ),
    "int_sink_ports": ({"port": "EXACT"}, {"set_sink", "NoAction"}),
    "report_collector": ({}, {"set_collector", "no_collector"}),
    "switch_config": ({}, {"set_switch_config"}),
    "port_config": ({"port": "EXACT"}, {"set_port_config"}),
    "ecn_thresholds": ({"port": "EXACT"}, {"set_ecn_thresholds", "NoAction"}),
}
ACTIONS = {
    "set_next_id": ["next_id"],
    "route": ["port", "smac", "dmac"],
    "mark_to_source": ["instruction_bitmap", "hop_budget", "domain_id"],
    "set_collector": ["src_mac", "dst_mac", "src_addr", "dst_addr", "dport"],
    "set_switch_config": ["node_id", "hw_id", "qdepth_unit", "tx_util_shift"],
    "set_port_config": ["tx_util_mult", "mtu"],
    "set_ecn_thresholds": ["kmin_bytes", "kmax_bytes", "pmax_scaled"],
}
COUNTERS = {
    "port_rx",
    "port_tx",
    "drops",
    "ecn_marks",
    "int_status",
    "int_source_events",
    "int_transit_events",
    "int_sink_events",
}
DIRECT_COUNTERS = {"ipv4_routes_counter", "acl_counter", "int_watchlist_counter"}


def load_p4info() -> p4i.P4Info:
    return text_format.Parse((BUILD / "xingmai.p4info.txtpb").read_text(), p4i.P4Info())


@pytest.mark.parametrize("project", p4build.PROJECTS, ids=lambda p: p.rel(p.root))
def test_stamp_matches_sources_and_outputs(project: p4build.Project) -> None:
    problems = p4build.check(project)
    assert not problems, "\n".join(problems)


def test_stamp_check_notices_a_changed_source(tmp_path: Path) -> None:
    """The check is not vacuous: a copy of p4src with one byte changed fails it."""
    copy = tmp_path / "p4src"
    shutil.copytree(p4build.P4SRC.root, copy)
    project = dataclasses.replace(p4build.P4SRC, root=copy)
    assert p4build.check(project) == []
    routing = copy / "control" / "routing.p4"
    routing.write_text(routing.read_text() + "\n")
    assert any("control/routing.p4 changed" in p for p in p4build.check(project))
    (copy / "control" / "orphan.p4").write_text("// not included anywhere\n")
    assert any("orphan.p4" in p for p in p4build.check(project))
    out = copy / "build" / "xingmai.json"
    out.write_text(out.read_text().replace('"xingmai.p4"', '"edited.p4"', 1))
    assert any("xingmai.json differs" in p for p in p4build.check(project))


def test_stamp_records_the_compiler() -> None:
    stamp = json.loads(p4build.P4SRC.stamp.read_text())
    entry = stamp["targets"]["bmv2"]
    assert entry["compiler"] == "p4c-bm2-ss"
    assert entry["compiler_version"].strip()
    assert set(entry["sources"]) >= {"xingmai.p4", "parser.p4", "control/int_transit.p4"}


def test_program_loads_into_the_builtin_switch() -> None:
    sw = V1Switch(Clock(virtual=True), device_id=1, cpu_port=255, qdepth_unit="bytes")
    sw.load((BUILD / "xingmai.json").read_bytes())
    assert sw.compiled is not None
    names = set(sw.compiled.tables)
    assert any(n.endswith("ipv4_routes") for n in names)


def test_p4info_exposes_the_documented_api() -> None:
    info = load_p4info()
    readme = README.read_text()
    tables = {t.preamble.alias: t for t in info.tables}
    actions = {a.preamble.alias: a for a in info.actions}
    for name, (fields, acts) in TABLES.items():
        assert name in tables, f"table {name} missing from P4Info"
        assert f"`{name}`" in readme, f"table {name} undocumented in p4src/README.md"
        t = tables[name]
        got = {f.name: p4i.MatchField.MatchType.Name(f.match_type) for f in t.match_fields}
        assert {k: v for k, v in got.items() if k in fields} == fields, (name, got)
        by_id = {a.preamble.id: a.preamble.alias for a in info.actions}
        assert {by_id[r.id] for r in t.action_refs} == acts, name
    for name, params in ACTIONS.items():
        assert [p.name for p in actions[name].params] == params, name
        assert f"`{name}`" in readme or f"`{name}(" in readme, f"action {name} undocumented"
    assert {c.preamble.alias for c in info.counters} >= COUNTERS
    assert {c.preamble.alias for c in info.direct_counters} >= DIRECT_COUNTERS
    for name in COUNTERS | DIRECT_COUNTERS:
        assert f"`{name}`" in readme, f"counter {name} undocumented"
    assert {p.preamble.alias for p in info.action_profiles} == {"ecmp_selector"}
    meta = {m.preamble.name: [x.name for x in m.metadata] for m in info.controller_packet_metadata}
    assert meta == {"packet_in": ["ingress_port", "reason"], "packet_out": ["egress_port"]}


def control_plane_api(info: p4i.P4Info) -> dict[str, dict]:
    """What a controller programs, by P4Info alias: tables (match fields, actions, size),
    actions (parameters), counters, registers, action profiles, packet-in/out headers. Ids and
    full names (which carry each architecture's control names) are left out: P4Runtime
    clients resolve aliases."""
    action_alias = {a.preamble.id: a.preamble.alias for a in info.actions}
    table_alias = {t.preamble.id: t.preamble.alias for t in info.tables}
    kind = p4i.MatchField.MatchType.Name
    return {
        "tables": {
            t.preamble.alias: (
                sorted((f.name, kind(f.match_type), f.bitwidth) for f in t.match_fields),
                sorted(action_alias[r.id] for r in t.action_refs),
                t.size,
                t.const_default_action_id and action_alias[t.const_default_action_id],
            )
            for t in info.tables
        },
        "actions": {
            a.preamble.alias: [(p.name, p.bitwidth) for p in a.params]
            for a in info.actions
            if a.preamble.alias in {action_alias[r.id] for t in info.tables for r in t.action_refs}
        },
        "counters": {c.preamble.alias: (c.spec.unit, c.size) for c in info.counters},
        "direct_counters": {
            c.preamble.alias: table_alias[c.direct_table_id] for c in info.direct_counters
        },
        "registers": {
            r.preamble.alias: (r.type_spec.bitstring.bit.bitwidth, r.size) for r in info.registers
        },
        "action_profiles": {
            p.preamble.alias: (p.with_selector, sorted(table_alias[i] for i in p.table_ids))
            for p in info.action_profiles
        },
        "packet_io": {
            m.preamble.name: [(x.name, x.bitwidth) for x in m.metadata]
            for m in info.controller_packet_metadata
        },
    }


@pytest.mark.parametrize(
    "target", [t for t in p4build.P4SRC.targets if t.kind == "tofino"], ids=lambda t: t.name
)
def test_tofino_p4info_is_the_bmv2_api(target: p4build.Target) -> None:
    """One controller drives both: the Tofino build exposes the same tables, actions,
    parameters (names and widths), counters, registers, action profile and packet-in/out
    headers as the v1model build."""
    bmv2 = control_plane_api(load_p4info())
    tofino = control_plane_api(
        text_format.Parse((BUILD / target.outputs["p4info"]).read_text(), p4i.P4Info())
    )
    for part, want in bmv2.items():
        got = tofino[part]
        diff = {
            k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)
        }
        assert not diff, f"{target.name} {part} differ (bmv2, tofino): {diff}"
    assert set(bmv2["tables"]) >= set(TABLES)


def _fake_bf_p4c_output(tmp: Path, egress_stages: list[int], n_stages: int) -> None:
    """The parts of a bf-p4c output folder the resource summary reads."""
    logs = tmp / p4build.TOFINO_OUTDIR / "pipe" / "logs"
    logs.mkdir(parents=True)
    (tmp / p4build.TOFINO_OUTDIR / "bfrt.json").write_text("{}")
    tables = [{"gress": "egress", "stage_allocation": [{"stage_number": n}]} for n in egress_stages]
    tables.append({"gress": "ingress", "stage_allocation": [{"stage_number": -1}]})
    (logs / "mau.json").write_text(json.dumps({"tables": tables}))
    (logs / "resources.json").write_text(json.dumps({"resources": {"mau": {"nStages": n_stages}}}))
    (logs / "metrics.json").write_text(
        json.dumps(
            {
                "target": "tofino",
                "phv": {
                    "normal": [{"bit_width": 32, "containers_occupied": 2, "bits_occupied": 40}]
                },
                "mau": {"srams": 1, "tcams": 2, "map_rams": 3, "logical_tables": 4},
                "parser": {"ingress": {"tcam_rows": 5}, "egress": {"tcam_rows": 6}},
            }
        )
    )


def test_tofino_summary_counts_stages_and_refuses_an_overflow(tmp_path: Path) -> None:
    """The summary gives the pipeline depth per gress (the parser's port-metadata table, stage
    -1, is no MAU stage); a build placed in more stages than the device has is refused."""
    target = next(t for t in p4build.P4SRC.targets if t.kind == "tofino")
    fits, over = tmp_path / "fits", tmp_path / "over"
    _fake_bf_p4c_output(fits, [0, 3, 11], 12)
    p4build._collect_tofino_outputs(target, fits)
    summary = json.loads((fits / target.outputs["resources"]).read_text())
    assert summary["mau_stages_used"] == {"egress": 12}
    assert summary["phv"] == {"32b": {"containers": 2, "bits": 40}}
    _fake_bf_p4c_output(over, [0, 12], 12)
    with pytest.raises(RuntimeError, match="more MAU stages"):
        p4build._collect_tofino_outputs(target, over)
    bare = tmp_path / "bare" / p4build.TOFINO_OUTDIR / "pipe" / "logs"
    bare.mkdir(parents=True)  # what bf-p4c leaves without its summary-log tool
    with pytest.raises(RuntimeError, match=r"no logs/metrics.json under .*p4c-build-logs"):
        p4build._collect_tofino_outputs(target, tmp_path / "bare")
