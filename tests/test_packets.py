"""scapy layers and byte codecs of testbed/packets against the golden vectors and each other."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw, raw

from controller.wire.int_md import hop_ml_words, looks_like_int_echo
from controller.wire.roce import (
    AETH_NAK_PSN_SEQ_ERR,
    OP_ACK,
    OP_CNP,
    OP_SEND_FIRST,
    OP_SEND_ONLY,
    is_nak,
    pack_aeth,
    pack_bth,
    unpack_aeth,
    unpack_bth,
)
from controller.wire.telemetry_report import decode_report_metadata, encode_report_metadata
from testbed.packets import (
    AETH,
    BTH,
    CNP,
    IntHop,
    IntMD,
    IntShim,
    TelemetryReportGroup,
    TelemetryReportIndividual,
    decode,
    decode_stack,
    encode_stack,
    icrc,
    int_packet,
    parse_int,
    parse_report,
    verify_icrc,
)

VECTORS = json.loads((Path(__file__).parent / "data" / "int_v21.json").read_text())
INT_VECTORS = [v for v in VECTORS["vectors"] if v["kind"] == "int_md_udp"]
REPORT_VECTORS = [v for v in VECTORS["vectors"] if v["kind"] == "telemetry_report_v2"]
BITMAP = VECTORS["instruction_bitmap"]

HOP3 = {
    "node_id": 3,
    "l1_ingress_port": 2,
    "l1_egress_port": 1,
    "hop_latency": 900,
    "queue_id": 0,
    "queue_occupancy": 1500,
    "egress_ts": 1004500,
    "tx_util": 400000,
}


def test_vector_set_is_complete() -> None:
    assert len(INT_VECTORS) == 4 and len(REPORT_VECTORS) == 1
    assert BITMAP == 0xF500 and hop_ml_words(BITMAP) == 7


@pytest.mark.parametrize("vec", INT_VECTORS, ids=lambda v: v["name"])
def test_int_vector_decodes_to_its_fields(vec: dict) -> None:
    frame = bytes.fromhex(vec["hex"])
    parsed = parse_int(decode(frame, int_dscp=vec["int_dscp"]))
    assert parsed is not None
    assert parsed["md"] == vec["decoded"]["md"]
    assert parsed["hops"] == vec["decoded"]["hops"]
    assert parsed["payload"].hex() == vec["decoded"]["payload_hex"]
    assert parsed["shim"]["length"] * 4 == 12 + 28 * len(vec["decoded"]["hops"])


@pytest.mark.parametrize("vec", INT_VECTORS, ids=lambda v: v["name"])
def test_int_vector_fields_reencode_to_its_bytes(vec: dict) -> None:
    frame = bytes.fromhex(vec["hex"])
    outer = decode(frame, int_dscp=None)  # only the outer headers' values are taken from it
    md = vec["decoded"]["md"]
    built = int_packet(
        src_mac=outer[Ether].src,
        dst_mac=outer[Ether].dst,
        src_ip=outer[IP].src,
        dst_ip=outer[IP].dst,
        ttl=outer[IP].ttl,
        ip_id=outer[IP].id,
        sport=outer[UDP].sport,
        int_dscp=vec["int_dscp"],
        hops=vec["decoded"]["hops"],
        bitmap=md["bitmap"],
        remaining_hop_cnt=md["remaining_hop_cnt"],
        d=md["D"],
        e=md["E"],
        m=md["M"],
        domain_id=md["domain_id"],
        ds_instruction=md["ds_instruction"],
        ds_flags=md["ds_flags"],
        payload=bytes.fromhex(vec["decoded"]["payload_hex"]),
    )
    assert raw(built) == frame
    # and the dissected packet rebuilds to the same bytes
    assert raw(decode(frame, int_dscp=vec["int_dscp"])) == frame


def test_int_stack_codec_matches_vectors() -> None:
    three = next(v for v in INT_VECTORS if v["name"] == "three_hops_newest_first")
    frame = bytes.fromhex(three["hex"])
    stack = frame[14 + 20 + 8 + 4 + 12 : -16]
    assert decode_stack(stack, BITMAP) == three["decoded"]["hops"]
    assert encode_stack(three["decoded"]["hops"], BITMAP) == stack


def test_without_int_dscp_the_packet_is_not_parsed_as_int() -> None:
    frame = bytes.fromhex(INT_VECTORS[1]["hex"])
    assert IntShim in decode(frame)  # default DSCP 0x17
    assert IntShim in Ether(frame)  # plain dissection uses the default too
    assert IntShim not in decode(frame, int_dscp=None)
    assert IntShim not in decode(frame, int_dscp=0x2E)
    assert BTH in decode(frame, int_dscp=None)


@pytest.mark.parametrize("vec", REPORT_VECTORS, ids=lambda v: v["name"])
def test_report_vector_decodes_and_reencodes(vec: dict) -> None:
    data = bytes.fromhex(vec["hex"])
    got = parse_report(data)
    want = vec["decoded"]
    assert {k: got[k] for k in ("ver", "seq", "node_id")} == {
        k: want[k] for k in ("ver", "seq", "node_id")
    }
    assert got["hw_id"] == 0
    assert len(got["reports"]) == len(want["reports"]) == 1
    g, w = got["reports"][0], want["reports"][0]
    assert {k: (v.hex() if isinstance(v, bytes) else v) for k, v in g.items()} == w
    assert decode_report_metadata(g["rep_md_bits"], g["metadata"]) == {
        "l1_ingress_port": 2,
        "l1_egress_port": 1,
        "hop_latency": 900,
        "queue_id": 0,
        "queue_occupancy": 1500,
    }
    # re-encode: explicit lengths, and lengths left for the layer to compute
    for explicit in (True, False):
        rep = TelemetryReportIndividual(
            rep_type=w["rep_type"],
            in_type=w["in_type"],
            report_len=w["report_len_words"] if explicit else None,
            md_len=w["md_len_words"] if explicit else None,
            d=w["D"],
            q=w["Q"],
            f=w["F"],
            i=w["I"],
            rep_md_bits=w["rep_md_bits"],
            domain_id=w["domain_id"],
            ds_md_bits=w["ds_md_bits"],
            ds_md_status=w["ds_md_status"],
            metadata=bytes.fromhex(w["metadata"]),
            inner=bytes.fromhex(w["inner"]),
        )
        grp = TelemetryReportGroup(ver=want["ver"], seq=want["seq"], node_id=want["node_id"])
        assert raw(grp / rep) == data
    # the inner packet decodes down to the INT stack the sink received
    inner = TelemetryReportGroup(data)[TelemetryReportIndividual].inner_packet()
    parsed = parse_int(inner)
    assert parsed is not None and parsed["md"]["remaining_hop_cnt"] == 6
    assert [h["node_id"] for h in parsed["hops"]] == [2, 1]


def test_report_metadata_roundtrip_and_bit15_drop_reason() -> None:
    bits = 0x7000 | 0x0001
    vals = {
        "l1_ingress_port": 4,
        "l1_egress_port": 9,
        "hop_latency": None,
        "queue_id": 3,
        "queue_occupancy": 77,
        "drop_queue_id": 3,
        "drop_reason": 71,
        "drop_padding": 0,
    }
    data = encode_report_metadata(bits, vals)
    assert len(data) == 16 and data[4:8] == b"\xff" * 4
    assert decode_report_metadata(bits, data) == vals


def test_report_with_several_reports_and_length_to_end() -> None:
    r1 = TelemetryReportIndividual(
        rep_md_bits=0x2000, metadata=(500).to_bytes(4, "big"), inner=b"\x45" + b"\x00" * 21
    )  # padded to 24 bytes
    r2 = TelemetryReportIndividual(report_len=0xFF, md_len=0, inner=b"\x45" + b"\x01" * 300)
    data = raw(TelemetryReportGroup(seq=7, node_id=9) / r1 / r2)
    got = parse_report(data)
    assert [r["report_len_words"] for r in got["reports"]] == [2 + 1 + 6, 0xFF]
    assert got["reports"][0]["inner"] == b"\x45" + b"\x00" * 23
    assert got["reports"][1]["inner"] == b"\x45" + b"\x01" * 300 + b"\x00" * 3


def test_stack_codec_not_available_and_ds_metadata() -> None:
    hop = dict(HOP3, hop_latency=None, egress_ts=None)
    stack = encode_stack([hop, HOP3], BITMAP)
    assert len(stack) == 56
    assert stack[8:12] == b"\xff" * 4 and stack[16:24] == b"\xff" * 8
    assert decode_stack(stack, BITMAP) == [hop, HOP3]
    # Hop ML larger than the baseline: the extra words are domain-specific metadata.
    ds = encode_stack([dict(HOP3, ds_metadata=b"\x00\x00\x00\x2a")], BITMAP, hop_ml=8)
    assert decode_stack(ds, BITMAP, hop_ml=8) == [dict(HOP3, ds_metadata=b"\x00\x00\x00\x2a")]
    # every defined bit has a field; bit 15 (checksum complement) stays last
    full = encode_stack([{"node_id": 1, "checksum_complement": 0xFFFE}], 0x8001)
    assert full == b"\x00\x00\x00\x01\x00\x00\xff\xfe"


@pytest.mark.parametrize(
    "hops, bitmap, hop_ml, message",
    [
        ([{"node_id": 1}], 0xC000, None, "missing"),
        ([dict(HOP3, l1_ingress_port=1 << 16)], BITMAP, None, "does not fit"),
        ([HOP3], BITMAP, 6, "Hop ML"),
    ],
)
def test_stack_encode_rejects_bad_hops(
    hops: list, bitmap: int, hop_ml: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        encode_stack(hops, bitmap, hop_ml)


def test_a_hop_read_in_one_unpack_is_the_unit_by_unit_read() -> None:
    """decode_units reads a whole hop record of a bitmap in one struct unpack: the same fields,
    in the same order, all-ones units None, as reading it unit by unit (the path any other
    table, and a record cut short, take)."""
    import random

    from controller.wire.int_md import HOP_METADATA, decode_units

    rng = random.Random(7)
    for _ in range(3000):
        bitmap = rng.randrange(1 << 16)
        size = sum(
            sum(w for _, w in HOP_METADATA[b]) // 8 for b in range(16) if bitmap & (0x8000 >> b)
        )
        data = bytes(rng.choice([0, 0xFF, rng.randrange(256)]) for _ in range(size + 2))
        fast = decode_units(data, bitmap)
        by_unit = decode_units(data, bitmap, dict(HOP_METADATA))  # not the table: unit by unit
        assert fast == by_unit and list(fast) == list(by_unit)


def test_stack_decode_rejects_partial_hop() -> None:
    with pytest.raises(ValueError, match="whole number"):
        decode_stack(b"\x00" * 30, BITMAP)


def test_scapy_hop_layer_agrees_with_codec() -> None:
    hop = IntHop(BITMAP, **dict(HOP3, tx_util=None))
    assert raw(hop) == encode_stack([dict(HOP3, tx_util=None)], BITMAP)
    assert hop.to_dict() == dict(HOP3, tx_util=None)


def test_truncated_int_stack_does_not_crash_dissection() -> None:
    frame = raw(
        int_packet(
            src_ip="10.0.0.1",
            dst_ip="10.0.0.2",
            sport=1000,
            hops=[HOP3],
            payload=BTH(opcode=OP_SEND_ONLY, dqpn=5, psn=1) / (b"x" * 40),
        )
    )
    # Shim claims a longer stack than the packet holds: no exception, the INT is still there.
    bad = bytearray(frame)
    bad[14 + 20 + 8 + 1] = 200
    pkt = decode(bytes(bad))
    assert IntShim in pkt


# ---- RoCE headers ---------------------------------------------------------------------------


def _roce(payload_layers, tos: int = 0b10) -> Ether:
    return (
        Ether()
        / IP(src="10.1.0.1", dst="10.1.0.2", tos=tos, flags="DF")
        / UDP(sport=50123, dport=4791)
        / payload_layers
    )


def test_bth_roundtrip_and_struct_codec_agree() -> None:
    pkt = _roce(BTH(opcode=OP_SEND_FIRST, dqpn=0xABCDE, psn=0xFFFFFE, ackreq=1) / (b"d" * 1024))
    frame = raw(pkt)
    back = Ether(frame)
    assert back[BTH].opcode == OP_SEND_FIRST and back[BTH].dqpn == 0xABCDE
    assert back[BTH].psn == 0xFFFFFE and back[BTH].ackreq == 1
    assert bytes(back[BTH].payload) == b"d" * 1024
    bth = frame[14 + 28 : 14 + 28 + 12]
    assert bth == pack_bth(OP_SEND_FIRST, 0xABCDE, 0xFFFFFE, True)
    u = unpack_bth(bth)
    assert (u.opcode, u.dqpn, u.psn, u.ackreq, u.pkey) == (
        OP_SEND_FIRST,
        0xABCDE,
        0xFFFFFE,
        True,
        0xFFFF,
    )
    with pytest.raises(ValueError):
        unpack_bth(bth[:11])


def test_aeth_ack_nak_roundtrip() -> None:
    for syndrome in (0x00, 0x1F, AETH_NAK_PSN_SEQ_ERR):
        pkt = _roce(BTH(opcode=OP_ACK, dqpn=7, psn=1234) / AETH(syndrome=syndrome, msn=99))
        back = Ether(raw(pkt))
        assert back[AETH].syndrome == syndrome and back[AETH].msn == 99
        assert raw(back[AETH])[:4] == pack_aeth(syndrome, 99)
        assert unpack_aeth(pack_aeth(syndrome, 99)) == (syndrome, 99)
        assert is_nak(syndrome) == (syndrome == AETH_NAK_PSN_SEQ_ERR)


def test_cnp_roundtrip() -> None:
    frame = raw(_roce(BTH(opcode=OP_CNP, dqpn=0x42, psn=0) / CNP()))
    back = Ether(frame)
    assert CNP in back and back[BTH].dqpn == 0x42 and back[CNP].reserved == b"\x00" * 16
    assert len(frame) == 14 + 20 + 8 + 12 + 16 + 4


def test_ack_with_int_echo_decodes_as_echo() -> None:
    data = int_packet(
        src_ip="10.0.0.1",
        dst_ip="10.0.0.2",
        sport=1000,
        hops=[HOP3, HOP3],
        payload=BTH(opcode=OP_SEND_ONLY, dqpn=5, psn=1) / b"x",
    )
    echo = raw(data[IntShim])[: 4 + 12 + 56]
    ack = Ether(raw(_roce(BTH(opcode=OP_ACK, dqpn=9, psn=1) / AETH() / Raw(echo))))
    assert IntMD in ack[AETH]
    assert ack[IntMD].hop_dicts() == [HOP3, HOP3]
    assert looks_like_int_echo(echo) and not looks_like_int_echo(echo[:-4])
    # a truncated echo stays raw bytes instead of a mis-parsed INT header
    short = Ether(raw(_roce(BTH(opcode=OP_ACK, dqpn=9, psn=1) / AETH() / Raw(echo[:-4]))))
    assert IntShim not in short and short[Raw].load == echo[:-4]


def test_icrc_verifies_and_excludes_int() -> None:
    bth = BTH(opcode=OP_SEND_ONLY, dqpn=0x11, psn=77) / (b"p" * 100)
    plain = raw(_roce(bth))
    ip_hdr, transport = plain[14:34], plain[42:]
    assert verify_icrc(ip_hdr, 50123, 4791, transport)
    # ECN/DSCP/TTL and FECN/BECN are masked: remarking on the path keeps the ICRC valid
    remarked = bytearray(ip_hdr)
    remarked[1] = 0x03
    remarked[8] = 1
    assert verify_icrc(bytes(remarked), 50123, 4791, transport)
    t2 = bytearray(transport)
    t2[4] |= 0xC0
    assert verify_icrc(ip_hdr, 50123, 4791, bytes(t2))
    # a flipped payload bit does not verify
    t2[20] ^= 1
    assert not verify_icrc(ip_hdr, 50123, 4791, bytes(t2))
    # INT inserted on the path leaves the ICRC as the sender computed it
    with_int = raw(
        int_packet(
            src_ip="10.1.0.1",
            dst_ip="10.1.0.2",
            sport=50123,
            hops=[HOP3],
            payload=BTH(opcode=OP_SEND_ONLY, dqpn=0x11, psn=77) / (b"p" * 100),
            ip_id=1,
            src_mac="00:00:00:00:00:00",
        )
    )
    assert with_int[-4:] == icrc(ip_hdr, 50123, 4791, transport[:-4])


def test_icrc_matches_scapy_contrib_roce() -> None:
    # An independent implementation of the same ICRC (scapy's contrib module, which binds
    # UDP 4791 itself, so it runs in its own interpreter).
    frame = raw(_roce(BTH(opcode=OP_SEND_ONLY, dqpn=0x123, psn=4242, ackreq=1) / (b"q" * 64)))
    code = (
        "import sys\n"
        "from scapy.contrib.roce import BTH\n"
        "from scapy.layers.l2 import Ether\n"
        "from scapy.packet import raw\n"
        "p = Ether(bytes.fromhex(sys.argv[1])); p[BTH].icrc = None\n"
        "print(raw(p)[-4:].hex())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, frame.hex()], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == frame[-4:].hex()
