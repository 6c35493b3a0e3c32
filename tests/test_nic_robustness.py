"""10,000 random and truncated packets at the XDP and tc hooks change no flow's state (root).

First through BPF_PROG_TEST_RUN (any length, down to an Ethernet header), then as real frames
on a veth while an agent runs: the agent must keep serving and keep its flows as they were.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import time

import pytest

from controller.nic.bpf.loader import FlowKey, counter_names
from controller.nic.bpf.syscalls import BpfError, prog_test_run
from testbed.emu.nicrig import AgentProcess, NetnsPair, standalone_nic
from tests.nic_fuzz_frames import A, B, fuzz_frames, templates

pytestmark = [
    pytest.mark.root,
]

FLOW = FlowKey(A, B, 17, 40001, 4791)
STATE_MAPS = ("xm_rates", "xm_cc", "xm_ctl", "xm_class", "xm_config")


def snapshot(nic) -> dict[str, list[tuple[object, bytes]]]:  # type: ignore[no-untyped-def]
    out = {}
    for name in STATE_MAPS:
        t = nic.table(name)
        out[name] = sorted((bytes(k), bytes(v)) for k, v in t.items())
    return out


def test_counter_names_match_the_counter_map() -> None:
    with standalone_nic() as nic:
        assert len(counter_names()) == nic.table("xm_counters").max_entries


def test_random_and_truncated_packets_change_no_state() -> None:
    with standalone_nic(100_000_000, law="tita") as nic:
        # a flow with real state: data sent, then valid feedback
        tmpl = templates()
        st = nic.new_value("xm_flows")
        st.tx_bytes, st.snd_nxt_psn, st.flags = 10_000, 20, 1
        nic.put("xm_flows", FLOW, st)
        for _ in range(3):
            assert prog_test_run(nic.fd("xdp"), tmpl[0]).retval == 2
        before = snapshot(nic)
        assert before["xm_cc"] and before["xm_rates"]
        c0 = nic.counter_values()
        frames = fuzz_frames(10_000)
        unbuildable = 0
        for f in frames:
            assert prog_test_run(nic.fd("xdp"), f).retval == 2  # XDP_PASS, always
            try:
                assert prog_test_run(nic.fd("tc"), f).retval == 0  # TC_ACT_OK, always
            except BpfError as exc:
                # the kernel builds no skb shorter than Ethernet + its L3 header (so none
                # such ever reaches tc on an interface either)
                assert exc.errno == errno.EINVAL and len(f) < 14 + 40
                unbuildable += 1
        assert snapshot(nic) == before
        c1 = nic.counter_values()
        assert c1["xdp_packets"] - c0["xdp_packets"] == len(frames)
        assert c1["tc_packets"] - c0["tc_packets"] == len(frames) - unbuildable
        assert unbuildable < len(frames) // 4
        # the drops were counted by reason, not lost
        for reason in ("xdp_malformed", "xdp_not_ipv4", "tc_malformed", "tc_not_ipv4"):
            assert c1[reason] > c0[reason], reason


SENDER = r"""
import socket, sys
from controller.common.netns import enter_netns
from tests.nic_fuzz_frames import fuzz_frames
enter_netns(sys.argv[1])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[2], 0))
sent = 0
for f in fuzz_frames(int(sys.argv[3]), seed=int(sys.argv[4])):
    try:
        s.send(f.ljust(14, b"\0"))
        sent += 1
    except OSError:
        pass
print(sent)
"""


@pytest.mark.slow
def test_agent_keeps_serving_through_random_frames() -> None:
    with NetnsPair.create() as pair, AgentProcess(pair.a, pair.dev_a, 100_000_000) as agent:
        key = pair.udp_key(40001)
        agent.set_rate_law("none", key)
        agent.set_cap(key, 7_000_000)

        def ours() -> list[tuple[int, int, int]]:
            return [
                (f.flow.src_port, f.rate_bps, f.cap_bps)
                for f in agent.flows()
                if (f.flow.src_ip, f.flow.dst_ip, f.flow.protocol, f.flow.src_port, f.flow.dst_port)
                == key
            ]

        before = ours()
        assert before == [(40001, 7_000_000, 7_000_000)]
        for netns, dev, seed in ((pair.b, pair.dev_b, 1), (pair.a, pair.dev_a, 2)):
            # from b: into the agent's XDP; from a: out through its tc hook
            out = subprocess.run(
                [sys.executable, "-c", SENDER, netns, dev, "10000", str(seed)],
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            ).stdout
            assert int(out.strip()) > 9000
        time.sleep(0.2)
        status = agent.stub().GetStatus(agent.pb().GetStatusRequest(), timeout=10)
        assert status.healthy
        assert status.counters["xdp_packets"] >= 9000 and status.counters["tc_packets"] >= 9000
        assert ours() == before
