"""tc egress as INT source, driven with BPF_PROG_TEST_RUN (root)."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from controller.nic.bpf.loader import FlowKey
from controller.nic.bpf.syscalls import prog_test_run
from testbed.emu.nicrig import standalone_nic
from testbed.packets.int_md import IntMD, IntShim, decode
from testbed.packets.roce import AETH, BTH, CNP

pytestmark = [
    pytest.mark.root,
]

VECTORS = Path(__file__).parent / "data" / "int_v21.json"
TC_ACT_OK = 0


@pytest.fixture(scope="module")
def nic():  # type: ignore[no-untyped-def]
    with standalone_nic(line_rate_bps=100_000_000) as bpf:
        yield bpf


def _run_tc(nic, frame: bytes) -> bytes:  # type: ignore[no-untyped-def]
    res = prog_test_run(nic.fd("tc"), frame)
    assert res.retval == TC_ACT_OK
    return res.data_out


def test_int_source_reproduces_the_golden_vector(nic) -> None:  # type: ignore[no-untyped-def]
    vec = next(v for v in json.loads(VECTORS.read_text())["vectors"] if v["name"] == "no_hops_yet")
    golden = bytes.fromhex(vec["hex"])
    # the same frame before the NIC: ECT(0), DSCP 0, no INT, the UDP checksum the host computed
    g = Ether(golden)
    plain = (
        Ether(src=g.src, dst=g.dst)
        / IP(src=g[IP].src, dst=g[IP].dst, tos=0x02, ttl=g[IP].ttl, id=g[IP].id, flags="DF")
        / UDP(sport=g[UDP].sport, dport=4791)
        / Raw(bytes.fromhex(vec["decoded"]["payload_hex"]))
    )
    out = _run_tc(nic, bytes(plain))
    assert out == golden


def test_int_source_on_a_transport_data_packet(nic) -> None:  # type: ignore[no-untyped-def]
    data = (
        Ether()
        / IP(src="10.0.1.1", dst="10.0.2.2", tos=(10 << 2) | 2)
        / UDP(sport=49999, dport=4791)
        / BTH(opcode=0x04, dqpn=7, psn=1234)
        / Raw(b"x" * 200)
    )
    raw = bytes(data)
    out = _run_tc(nic, raw)
    assert len(out) == len(raw) + 16
    pkt = decode(out, int_dscp=0x17)
    ip = pkt[IP]
    assert ip.tos >> 2 == 0x17 and ip.tos & 3 == 2  # INT DSCP, ECN kept
    assert ip.len == len(raw) - 14 + 16
    recomputed = IP(bytes(ip)[: ip.ihl * 4])
    del recomputed.chksum
    assert IP(bytes(recomputed)).chksum == ip.chksum
    assert pkt[UDP].len == len(raw) - 14 - 20 + 16 and pkt[UDP].chksum == 0
    shim, md = pkt[IntShim], pkt[IntMD]
    assert shim.type == 1 and shim.length == 3 and shim.dscp == 10  # original DSCP kept
    assert md.ver == 2 and md.hop_ml == 7 and md.remaining_hop_cnt == 8
    assert md.instruction_bitmap == 0xF500 and not md.hops
    assert pkt[BTH].opcode == 0x04 and pkt[BTH].psn == 1234
    # the flow is counted with its INT bytes and its next PSN
    st = nic.get("xm_flows", FlowKey("10.0.1.1", "10.0.2.2", 17, 49999, 4791))
    assert st is not None and st.int_packets == 1 and st.tx_bytes == len(out)
    assert st.snd_nxt_psn == 1235
    # HTB mode: classified into the default class (no class of its own yet)
    assert nic.counter_values()["tc_htb_default"] >= 1


@pytest.mark.parametrize(
    "frame, reason",
    [
        (
            Ether()
            / IP(src="10.0.1.1", dst="10.0.2.2")
            / UDP(sport=1, dport=4791)
            / BTH(opcode=0x11)
            / AETH(),
            None,
        ),  # ACK: never INT
        (
            Ether()
            / IP(src="10.0.1.1", dst="10.0.2.2")
            / UDP(sport=1, dport=4791)
            / BTH(opcode=0x81)
            / CNP(),
            None,
        ),  # CNP: never INT
        (
            Ether()
            / IP(src="10.0.1.1", dst="10.0.2.2")
            / UDP(sport=1, dport=5000)
            / Raw(b"\x00" * 40),
            None,
        ),  # not the transport
        (
            Ether()
            / IP(src="10.0.1.1", dst="10.0.2.2", options=b"\x01\x01\x01\x00")
            / UDP(sport=1, dport=4791)
            / BTH(opcode=0x04)
            / Raw(b"a"),
            "tc_int_ip_options",
        ),
        (
            Ether()
            / IP(src="10.0.1.1", dst="10.0.2.2")
            / UDP(sport=1, dport=4791)
            / BTH(opcode=0x04)
            / Raw(b"a" * 1460),
            "tc_int_no_room",
        ),  # would pass the MTU
        (
            Ether()
            / IP(src="10.0.1.1", dst="10.0.2.2", tos=0x17 << 2)
            / UDP(sport=1, dport=4791)
            / BTH(opcode=0x04)
            / Raw(b"a"),
            "tc_int_already_marked",
        ),
    ],
)
def test_int_source_leaves_other_packets_alone(nic, frame, reason) -> None:  # type: ignore[no-untyped-def]
    before = nic.counter_values()
    raw = bytes(frame)
    assert _run_tc(nic, raw) == raw
    after = nic.counter_values()
    assert after["tc_int_inserted"] == before["tc_int_inserted"]
    if reason:
        assert after[reason] == before[reason] + 1


# struct __sk_buff (192 bytes since Linux 5.16's hwtstamp; a test run's ctx out must hold it
# whole): len, pkt_type, mark, queue_mapping, protocol, vlan_present, vlan_tci, vlan_proto,
# priority (offset 32), ...
_SKB_CTX = 192
_SKB_PRIORITY = 32


def _htb_class(nic, frame: bytes) -> int:  # type: ignore[no-untyped-def]
    """The HTB class tc egress put `frame` in (skb->priority)."""
    res = prog_test_run(nic.fd("tc"), frame, ctx=bytes(_SKB_CTX))
    assert res.retval == TC_ACT_OK
    return int.from_bytes(res.ctx_out[_SKB_PRIORITY : _SKB_PRIORITY + 4], "little")


def test_feedback_leaves_in_the_default_class_not_its_flows(nic) -> None:  # type: ignore[no-untyped-def]
    """A responder's ACKs, NAKs and CNPs carry the 5-tuple of its own data the other way; in
    that flow's HTB class they waited behind its data at its rate (on the emulation, a flow
    at R_min held its peer's last ACKs for seconds, until the peer's timer fired). Data goes
    to its flow's class; feedback of the same 5-tuple to the default class, as the twin's NIC
    sends it."""
    key = FlowKey("10.0.1.1", "10.0.2.2", 17, 49123, 4791)
    flow_class = 0x10005
    nic.put("xm_class", key, ctypes.c_uint(flow_class))
    head = Ether() / IP(src=key.src, dst=key.dst) / UDP(sport=key.sport, dport=4791)
    try:
        data = head / BTH(opcode=0x04, dqpn=7, psn=5) / Raw(b"x" * 200)
        assert _htb_class(nic, bytes(data)) == flow_class
        for fb in (
            head / BTH(opcode=0x11, psn=5) / AETH(),  # ACK
            head / BTH(opcode=0x11, psn=5) / AETH(syndrome=0x60),  # NAK (PSN sequence error)
            head / BTH(opcode=0x81) / CNP(),
        ):
            assert _htb_class(nic, bytes(fb)) == nic.config().default_classid, fb.summary()
    finally:
        nic.delete("xm_class", key)
