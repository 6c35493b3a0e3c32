"""Unit tests of the built-in switch's parts: hashes, tables, meters, traffic manager, JSON
loading errors."""

from __future__ import annotations

import json
import struct

import pytest

from testbed.switch import hashes
from testbed.switch.externs import GREEN, RED, YELLOW, Meter, ValueSet
from testbed.switch.program import LoadError, Program
from testbed.switch.tables import ActionCall, ActionProfile, Entry, MatchTable, TableError
from testbed.switch.traffic_manager import Clock, TrafficManager
from testbed.switch.v1model import V1Switch

CHECK = b"123456789"


def test_hash_check_values() -> None:
    # Catalogue check values of the CRC models bmv2 implements.
    assert hashes.get_hash("crc16")(CHECK) == 0xBB3D  # CRC-16/ARC
    assert hashes.get_hash("crc32")(CHECK) == 0xCBF43926  # CRC-32/ISO-HDLC
    assert hashes.get_hash("crcCCITT")(CHECK) == 0x29B1  # CRC-16/CCITT-FALSE
    assert hashes.get_hash("crc16_custom")(CHECK) == 0xBB3D
    assert hashes.get_hash("crc32_custom")(CHECK) == 0xCBF43926
    assert hashes.get_hash("crc8_custom")(CHECK) == 0xF4  # CRC-8/SMBUS
    assert hashes.get_hash("identity")(b"\x01\x02") == 0x0102
    assert hashes.get_hash("xor16")(b"\x12\x34\x56") == 0x1234 ^ 0x5600


def test_csum16_is_the_ipv4_header_checksum() -> None:
    hdr = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert hashes.csum16(hdr) == 0xB861
    # a header carrying its checksum sums to zero
    assert hashes.csum16(hdr[:10] + struct.pack("!H", 0xB861) + hdr[12:]) == 0


def test_round_robin_and_unknown() -> None:
    rr = hashes.get_hash("round_robin")
    assert [rr(b"") for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError):
        hashes.get_hash("md5")


def call(aid: int) -> ActionCall:
    return ActionCall(aid, lambda p, ad: None, ())


def test_exact_table() -> None:
    t = MatchTable("t", ["exact", "exact"], [8, 16], 2)
    t.add(Entry((1, 2), 0, call=call(1)))
    assert t.lookup((1, 2)).call.action_id == 1
    assert t.lookup((1, 3)) is None
    with pytest.raises(TableError) as e:
        t.add(Entry((1, 2), 0, call=call(2)))
    assert e.value.code == "ALREADY_EXISTS"
    with pytest.raises(TableError) as e:
        t.add(Entry((256, 0), 0, call=call(2)))
    assert e.value.code == "OUT_OF_RANGE"
    t.add(Entry((3, 3), 0, call=call(2)))
    with pytest.raises(TableError) as e:
        t.add(Entry((4, 4), 0, call=call(2)))
    assert e.value.code == "RESOURCE_EXHAUSTED"
    t.delete((1, 2))
    assert t.lookup((1, 2)) is None
    with pytest.raises(TableError):
        t.delete((1, 2))


def test_lpm_longest_prefix_wins() -> None:
    t = MatchTable("r", ["lpm"], [32], 0)
    t.add(Entry(((0x0A000000, 8),), 0, call=call(1)))
    t.add(Entry(((0x0A010000, 16),), 0, call=call(2)))
    t.add(Entry(((0, 0),), 0, call=call(3)))
    assert t.lookup((0x0A010203,)).call.action_id == 2
    assert t.lookup((0x0A020304,)).call.action_id == 1
    assert t.lookup((0x0B000000,)).call.action_id == 3
    # P4Runtime rejects value bits past the prefix; bmv2's CLI masks them.
    with pytest.raises(TableError):
        t.add(Entry(((0x0A0B0C0D, 24),), 0, call=call(4)), strict=True)
    t.add(Entry(((0x0A0B0C0D, 24),), 0, call=call(4)))
    assert t.find(((0x0A0B0C00, 24),)) is not None


def test_ternary_and_range_priority() -> None:
    t = MatchTable("acl", ["ternary", "range"], [8, 16], 0)
    t.add(Entry(((0x10, 0xF0), (0, 100)), 10, call=call(1)))
    t.add(Entry(((0x12, 0xFF), (50, 60)), 20, call=call(2)))
    assert t.lookup((0x12, 55)).call.action_id == 2  # higher priority wins
    assert t.lookup((0x12, 70)).call.action_id == 1
    assert t.lookup((0x22, 70)) is None
    with pytest.raises(TableError):
        t.add(Entry(((0, 0), (0, 1)), 0, call=call(3)))  # ternary needs a priority
    t.delete(((0x12, 0xFF), (50, 60)), 20)
    assert t.lookup((0x12, 55)).call.action_id == 1  # the cache followed the delete


def test_action_selector_spreads_and_respects_weights() -> None:
    keys = iter(range(100000))
    prof = ActionProfile("sel", 0, lambda p: hashes.crc16(next(keys).to_bytes(4, "big")))
    for m in range(4):
        prof.add_member(m, call(m))
    prof.set_group(1, [(0, 1), (1, 1), (2, 1), (3, 1)], create=True)
    counts = [0] * 4
    for _ in range(4000):
        counts[prof.resolve(None, None, 1).action_id] += 1
    assert all(850 <= c <= 1150 for c in counts), counts
    prof.set_group(1, [(0, 3), (1, 1)])
    counts = [0] * 4
    for _ in range(4000):
        counts[prof.resolve(None, None, 1).action_id] += 1
    assert 2700 <= counts[0] <= 3300 and counts[2] == counts[3] == 0
    with pytest.raises(TableError) as e:
        prof.delete_member(0)
    assert e.value.code == "FAILED_PRECONDITION"


def test_meter_two_rate_three_colour() -> None:
    m = Meter()
    m.set_rates([(0.001, 2), (0.002, 4)])  # 1000 and 2000 packets/s, bursts 2 and 4
    colours = [m.execute(0, 1) for _ in range(5)]
    assert colours == [GREEN, GREEN, YELLOW, YELLOW, RED]
    # after a second both buckets are full again
    assert m.execute(1_000_000, 1) == GREEN
    with pytest.raises(ValueError):
        m.set_rates([(0.002, 1), (0.001, 1)])
    assert Meter().execute(0, 1500) == GREEN  # unconfigured


def test_value_set_padding() -> None:
    vs = ValueSet("vs", [12, 4])
    vs.values.add(vs.padded(0xABC5))
    assert vs.contains(0x0ABC05, None)
    assert vs.contains(0x0ABC07, 0xFFFF00)
    assert not vs.contains(0x0ABC06, None)


def test_traffic_manager_rate_depth_and_priority() -> None:
    clock = Clock(virtual=True)
    tm = TrafficManager(clock, nb_queues=2)
    tm.set_rate(1, bps=8e6)  # 1 MB/s: a 1000-byte packet every ms
    tm.set_depth(1, pkts=3)
    assert [tm.enqueue(1, 0, i, 1000, 0) for i in range(3)] == [(0, 0), (1, 1000), (2, 2000)]
    assert tm.enqueue(1, 0, 99, 1000, 0) is None  # tail drop
    assert tm.port(1).dropped == 1
    assert tm.occupancy(1, 0) == (3, 3000)
    out = tm.dequeue_ready(clock.now_ns())
    assert [(pkt, left, start) for _, _, pkt, _, left, start in out] == [(0, 2, 0)]  # busy 1 ms
    assert tm.next_departure_ns() == 1_000_000
    tm.enqueue(1, 1, "high", 1000, 0)
    clock.advance(1_000_000)
    # leaves when the port is free again, though it came at 0
    assert [(pkt, start) for _, _, pkt, _, _, start in tm.dequeue_ready(clock.now_ns())] == [
        ("high", 1_000_000)
    ]
    clock.advance(10_000_000)
    assert [(pkt, start) for _, _, pkt, _, _, start in tm.dequeue_ready(clock.now_ns())] == [
        (1, 2_000_000),
        (2, 3_000_000),
    ]
    tm.set_depth(2, nbytes=1500)
    assert tm.enqueue(2, 0, "a", 1000, 0) is not None
    assert tm.enqueue(2, 0, "b", 1000, 0) is None


def test_load_errors_are_clear() -> None:
    with pytest.raises(LoadError, match="version"):
        Program({"__meta__": {"version": [3, 0]}})
    with pytest.raises(LoadError):
        Program({"__meta__": {"version": [2, 23]}})  # missing sections
    sw = V1Switch()
    with pytest.raises(LoadError, match="not valid JSON"):
        sw.load(b"{nope")
    assert not sw.ready


def minimal_program(prims: list[dict]) -> dict:
    """A hand-written bmv2 JSON: one parser state extracting Ethernet, one action."""
    return {
        "__meta__": {"version": [2, 23]},
        "header_types": [
            {
                "name": "eth_t",
                "id": 0,
                "fields": [["dst", 48, False], ["src", 48, False], ["type", 16, False]],
            },
            {
                "name": "standard_metadata",
                "id": 1,
                "fields": [
                    ["ingress_port", 9, False],
                    ["egress_spec", 9, False],
                    ["egress_port", 9, False],
                    ["instance_type", 32, False],
                    ["packet_length", 32, False],
                    ["mcast_grp", 16, False],
                    ["_padding", 3, False],
                ],
            },
        ],
        "headers": [
            {
                "name": "standard_metadata",
                "id": 0,
                "header_type": "standard_metadata",
                "metadata": True,
            },
            {"name": "eth", "id": 1, "header_type": "eth_t", "metadata": False},
        ],
        "parsers": [
            {
                "name": "parser",
                "id": 0,
                "init_state": "start",
                "parse_states": [
                    {
                        "name": "start",
                        "id": 0,
                        "parser_ops": [
                            {"op": "extract", "parameters": [{"type": "regular", "value": "eth"}]}
                        ],
                        "transition_key": [],
                        "transitions": [
                            {"type": "default", "value": None, "mask": None, "next_state": None}
                        ],
                    }
                ],
            }
        ],
        "deparsers": [{"name": "deparser", "id": 0, "order": ["eth"], "primitives": []}],
        "actions": [{"name": "act", "id": 0, "runtime_data": [], "primitives": prims}],
        "pipelines": [
            {
                "name": "ingress",
                "id": 0,
                "init_table": "t",
                "action_profiles": [],
                "tables": [
                    {
                        "name": "t",
                        "id": 0,
                        "key": [],
                        "match_type": "exact",
                        "type": "simple",
                        "max_size": 1,
                        "with_counters": False,
                        "support_timeout": False,
                        "direct_meters": None,
                        "action_ids": [0],
                        "actions": ["act"],
                        "base_default_next": None,
                        "next_tables": {"act": None},
                        "default_entry": {
                            "action_id": 0,
                            "action_const": True,
                            "action_data": [],
                            "action_entry_const": True,
                        },
                    }
                ],
                "conditionals": [],
            },
            {
                "name": "egress",
                "id": 1,
                "init_table": None,
                "action_profiles": [],
                "tables": [],
                "conditionals": [],
            },
        ],
    }


def test_unknown_primitive_is_a_load_error_and_the_old_program_stays() -> None:
    sw = V1Switch(Clock(virtual=True))
    good = minimal_program(
        [
            {
                "op": "assign",
                "parameters": [
                    {"type": "field", "value": ["standard_metadata", "egress_spec"]},
                    {"type": "hexstr", "value": "0x0002"},
                ],
            }
        ]
    )
    sw.load(good)
    with pytest.raises(LoadError, match="unsupported primitive 'teleport'"):
        sw.load(minimal_program([{"op": "teleport", "parameters": []}]))
    out: list[tuple[int, bytes]] = []
    sw.transmit = lambda port, data: out.append((port, data))
    frame = bytes(range(14)) + b"payload"
    sw.receive(1, frame)
    sw.service()
    assert out == [(2, frame)]


def test_truncated_packet_is_parsed_as_far_as_it_goes() -> None:
    sw = V1Switch(Clock(virtual=True))
    sw.load(
        json.dumps(
            minimal_program(
                [
                    {
                        "op": "assign",
                        "parameters": [
                            {"type": "field", "value": ["standard_metadata", "egress_spec"]},
                            {"type": "hexstr", "value": "0x0003"},
                        ],
                    }
                ]
            )
        )
    )
    out: list[tuple[int, bytes]] = []
    sw.transmit = lambda port, data: out.append((port, data))
    for n in (0, 1, 13):  # shorter than Ethernet: PacketTooShort, header stays invalid
        sw.receive(1, bytes(n))
    sw.receive(1, bytes(14))
    sw.service()
    # v1model does not drop on parser errors; the short ones leave as they came
    assert [len(d) for _, d in out] == [0, 1, 13, 14]
