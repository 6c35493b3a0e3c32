"""The scapy harness CLI: craft, decode, and inject/capture against a live transport."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from scapy.layers.inet import ICMP
from scapy.utils import rdpcap

from controller.wire.roce import OP_ACK
from testbed.harness import main
from testbed.packets import AETH, BTH, IntShim, decode, parse_int, verify_icrc
from testbed.traffic.netns import NetnsLan
from tests.transport_responder import QPN, finish, start_responder


def test_craft_writes_a_pcap_that_decodes_back(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "data.pcap"
    assert (
        main(["craft", "data", "--int-hops", "3", "--count", "2", "--psn", "10", "--out", str(out)])
        == 0
    )
    assert "INT hops=3" in capsys.readouterr().out
    pkts = rdpcap(str(out))
    assert len(pkts) == 2
    for psn, pkt in zip((10, 11), pkts, strict=True):
        p = decode(bytes(pkt))
        info = parse_int(p)
        assert info is not None and [h["node_id"] for h in info["hops"]] == [3, 2, 1]
        assert p[BTH].psn == psn
        frame = bytes(pkt)
        int_len = 4 + 4 * frame[14 + 20 + 8 + 1]
        transport = frame[14 + 28 + int_len :]
        assert verify_icrc(frame[14:34], 49152, 4791, transport)  # ICRC without the INT bytes
    assert main(["decode", str(out)]) == 0
    assert capsys.readouterr().out.count("INT hops=3") == 2


@pytest.mark.root
def test_send_and_capture_against_a_transport(tmp_path: Path) -> None:
    with NetnsLan(2) as lan:
        a, b = lan.hosts
        mac = subprocess.run(
            ["ip", "-n", b.netns, "-br", "link", "show", b.ifname],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[2]
        # the responder must outlive the harness's start (Python + scapy: 4 s of wall time
        # measured on a loaded 2-core machine, where 3 s lost the packet)
        proc = start_responder(b, a, 10.0)
        out = tmp_path / "reply.pcap"
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "testbed.harness",
                "--netns",
                a.netns,
                "send",
                "--iface",
                a.ifname,
                "data",
                "--src",
                a.ip,
                "--dst",
                b.ip,
                "--dst-mac",
                mac,
                "--qpn",
                str(QPN),
                "--sport",
                "50001",
                "--int-hops",
                "3",
                "--capture",
                "1",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        res = finish(proc)
    assert res["qp"]["int_echoes_sent"] == 1
    acks = [decode(bytes(p)) for p in rdpcap(str(out))]
    # (the injecting host has no UDP socket on 4791, so it also answers ICMP port-unreachable
    # quoting the ACK: not an ACK)
    acks = [p for p in acks if ICMP not in p and BTH in p and p[BTH].opcode == OP_ACK]
    assert len(acks) == 1 and AETH in acks[0] and IntShim in acks[0]
    assert "INT hops=3" in cli.stdout
