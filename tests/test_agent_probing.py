"""The agent's prober (controller/nic/agent/probing.py): on the kernel's loopback its socket's
classic BPF filter gives it the probes, with and without INT, and none of the data, and its
thread sends probes at its pace and counts what comes back; two agents over a veth probe
each other through their NICs' programs (SetProbes, GetProbes, PauseProbes) and refuse bad
settings."""

from __future__ import annotations

import select
import socket
import time

import grpc
import pytest

from controller.nic.agent.probing import ProbeRunner, probe_filter
from controller.nic.prober import ProbeConfig, Prober
from controller.wire.int_md import INT_DSCP_DEFAULT, bitmap_bit
from testbed.emu.nicrig import AgentProcess, NetnsPair
from testbed.sim.nic_programs import IntSource, insert_int
from testbed.traffic.transport_core import TransportConfig, TransportCore

pytestmark = pytest.mark.root
LO = "127.0.0.1"


def test_the_filter_keeps_the_probes_with_and_without_int_and_no_data() -> None:
    assert len(probe_filter(None)) == 8 and len(probe_filter(INT_DSCP_DEFAULT)) == 20
    runner = ProbeRunner(Prober(LO, [], ProbeConfig(interval_s=1.0), seed=1), INT_DSCP_DEFAULT)
    sender = Prober(LO, [LO], ProbeConfig(interval_s=1.0, ports_per_peer=1), seed=3)
    src = IntSource(True, INT_DSCP_DEFAULT, bitmap_bit(0), 8, 9000)
    core = TransportCore(TransportConfig(local_ip=LO), seed=1)
    data = core.build(core.create_qp(7, LO, 7), 4, 7, 0, False, 50000, b"d" * 64)
    out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    try:
        probes = [p for _, p in (sender.next_probe(0), sender.next_probe(1))]  # type: ignore[misc]
        with_int = insert_int(probes[1], src)
        assert with_int is not None
        for pkt in (data, probes[0], insert_int(data, src), with_int):
            out.sendto(pkt, (LO, 0))
        got = []
        deadline = time.monotonic() + 2
        while len(got) < 2 and time.monotonic() < deadline:
            if select.select([runner.rx], [], [], 0.1)[0]:
                got.append(runner.rx.recv(65536))
        time.sleep(0.2)
        assert not select.select([runner.rx], [], [], 0)[0]  # nothing else: no data
        assert [runner.prober.receive_packet(p, INT_DSCP_DEFAULT) for p in got] == [True, True]
        [f] = runner.prober.flows.values()
        assert (f.received, f.lost) == (2, 0) and len(got[1]) > len(got[0])  # INT's
    finally:
        out.close()
        runner.stop()


def test_the_thread_probes_its_peers_and_counts_what_comes_back() -> None:
    runner = ProbeRunner(
        Prober(LO, [LO], ProbeConfig(interval_s=0.02, ports_per_peer=4), seed=1), None
    )
    runner.start()
    try:
        time.sleep(0.5)
    finally:
        runner.stop()
    snap = runner.snapshot()
    # 4 probe flows, each every 20 ms: a probe every 5 ms, about 100 in 0.5 s
    assert 50 <= snap["sent"] <= 120 and snap["send_errors"] == 0 and snap["malformed"] == 0
    assert len(snap["flows"]) == 4
    received = sum(f.received for f in snap["flows"])
    assert received >= snap["sent"] - 4 and sum(f.lost for f in snap["flows"]) == 0


def test_two_agents_probe_each_other_over_a_veth_and_refuse_bad_settings() -> None:
    with NetnsPair.create() as pair:
        with (
            AgentProcess(pair.a, pair.dev_a, 100_000_000) as a,
            AgentProcess(pair.b, pair.dev_b, 100_000_000) as b,
        ):
            pb = a.pb()
            for agent, me, peer in ((a, pair.ip_a, pair.ip_b), (b, pair.ip_b, pair.ip_a)):
                # INT on: the NIC's tc program puts INT headers (an empty stack) on the probes
                agent.stub().SetInt(pb.SetIntRequest(enabled=True), timeout=10)
                got = agent.stub().SetProbes(
                    pb.SetProbesRequest(
                        interval_s=0.02, local_ip=me, peers=[peer], ports_per_peer=4
                    ),
                    timeout=10,
                )
                assert got.flows == 4
            time.sleep(1.0)
            t = b.stub().GetProbes(pb.GetProbesRequest(), timeout=10)
            assert t.sent >= 100 and t.send_errors == 0 and t.malformed == 0
            assert len(t.flows) == 4 and {f.src_ip for f in t.flows} == {pair.ip_a}
            assert all(f.received >= 30 and f.lost == 0 and not f.hops for f in t.flows)
            stub = a.stub()
            text = b.stub().GetMetrics(pb.GetMetricsRequest(), timeout=10).text
            assert 'xingmai_agent_probes_total{what="received"}' in text
            assert 'xingmai_agent_probes_total{what="lost"} 0.0' in text
            assert "xingmai_agent_probe_flows 4.0" in text
            # paused, a sends nothing; sent again, its sequences go on: b counts no loss
            assert not stub.PauseProbes(pb.PauseProbesRequest(paused=True), timeout=10).probing
            time.sleep(0.2)
            sent = stub.GetProbes(pb.GetProbesRequest(), timeout=10).sent
            time.sleep(0.5)
            assert stub.GetProbes(pb.GetProbesRequest(), timeout=10).sent == sent
            assert stub.PauseProbes(pb.PauseProbesRequest(paused=False), timeout=10).probing
            time.sleep(0.5)
            assert stub.GetProbes(pb.GetProbesRequest(), timeout=10).sent >= sent + 50
            t = b.stub().GetProbes(pb.GetProbesRequest(), timeout=10)
            assert sum(f.lost for f in t.flows) == 0 and sum(f.received for f in t.flows) > 200
            with pytest.raises(grpc.RpcError) as err:
                stub.SetProbes(
                    pb.SetProbesRequest(interval_s=0.1, local_ip=pair.ip_a, peers=["nope"]),
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as err:
                stub.SetProbes(
                    pb.SetProbesRequest(
                        interval_s=0.1,
                        local_ip=pair.ip_a,
                        peers=[pair.ip_b] * 100,
                        ports_per_peer=64,
                    ),
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            stub.SetProbes(pb.SetProbesRequest(interval_s=0), timeout=10)  # off
            assert stub.GetProbes(pb.GetProbesRequest(), timeout=10).sent == 0


def test_probes_the_agents_socket_drops_are_counted_as_the_hosts() -> None:
    runner = ProbeRunner(Prober(LO, [], ProbeConfig(interval_s=1.0), seed=1), None)
    runner.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least
    sender = Prober(LO, [LO], ProbeConfig(interval_s=1.0, ports_per_peer=1), seed=3)
    out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    try:
        for burst in (200, 1):  # more than the socket holds, read only after; then one more
            for i in range(burst):
                out.sendto(sender.next_probe(i)[1], (LO, 0))  # type: ignore[index]
            time.sleep(0.2)
            runner._receive()
        [f] = runner.prober.flows.values()
        assert runner.rx_dropped > 0 and f.received + f.lost == 201
        assert f.lost == f.lost_local == runner.rx_dropped
    finally:
        out.close()
        runner.stop()
