"""The datapath's events reach the agent through the ring buffer (root): XDP's rate writes and
tc's new flows are records of xm_events with the map's values, and an agent follows a
datapath rate change without scanning the rate map while idle."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from controller.nic.bpf.loader import EV_FLOW, EV_RATE, FlowKey, key_from_c
from controller.nic.bpf.syscalls import prog_test_run
from testbed.emu.nicrig import AgentProcess, NetnsPair, RateMapWriter, standalone_nic
from testbed.packets.roce import BTH, CNP

pytestmark = [pytest.mark.root]

A, B = "10.0.1.1", "10.0.2.2"  # this NIC's host and its peer


def test_xdp_rate_writes_and_tc_new_flows_are_ring_records() -> None:
    with standalone_nic(100_000_000, law="dcqcn") as nic:
        ring, record = nic.events()
        try:
            assert ring.read() == []
            # tc: the first packet of a flow makes its xm_flows entry and says so, once
            data = bytes(
                Ether()
                / IP(src=A, dst=B)
                / UDP(sport=50100, dport=4791)
                / BTH(opcode=0x04, psn=1)
                / Raw(b"x" * 100)
            )
            for _ in range(3):
                assert prog_test_run(nic.fd("tc"), data).retval == 0
            (rec,) = ring.wait(1.0)
            ev = record.from_buffer_copy(rec)
            assert int(ev.kind) == EV_FLOW and int(ev.rate.rate_bps) == 0
            key = FlowKey(A, B, 17, 50100, 4791)
            assert key_from_c(ev.key) == key
            # XDP: a CNP cuts the flow's DCQCN rate: the record carries what the map holds
            cnp = bytes(
                Ether() / IP(src=B, dst=A) / UDP(sport=50100, dport=4791) / BTH(opcode=0x81) / CNP()
            )
            assert prog_test_run(nic.fd("xdp"), cnp).retval == 2
            (rec,) = ring.wait(1.0)
            ev = record.from_buffer_copy(rec)
            rate = nic.get("xm_rates", key)
            assert int(ev.kind) == EV_RATE and key_from_c(ev.key) == key
            assert int(ev.rate.rate_bps) == int(rate.rate_bps) < 100_000_000
            assert int(ev.rate.stamp_ns) == int(rate.stamp_ns) > 0
            # every write is one record: a second CNP cuts again (or is held: no write)
            assert prog_test_run(nic.fd("xdp"), cnp).retval == 2
            after = int(nic.get("xm_rates", key).rate_bps)
            recs = [record.from_buffer_copy(r) for r in ring.read()]
            if after == int(rate.rate_bps):
                assert recs == []
            else:
                assert [int(r.rate.rate_bps) for r in recs] == [after]
            # a waiting reader is woken by wake(), not by a timeout
            t0 = time.monotonic()
            threading.Timer(0.2, ring.wake).start()
            assert ring.wait(5.0) == [] and time.monotonic() - t0 < 2.0
            assert nic.counter("event_lost") == 0
        finally:
            ring.close()


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_agent_follows_a_datapath_rate_and_sleeps_while_idle() -> None:
    with NetnsPair.create() as pair:
        with AgentProcess(pair.a, pair.dev_a, 1_000_000_000, extra=("--no-int",)) as agent:
            assert agent.proc is not None
            key = pair.udp_key(5301)
            agent.set_rate_law("none", key)
            pb = agent.pb()
            stream = agent.stub().WatchRates(pb.WatchRatesRequest(), timeout=20)
            got: list[Any] = []

            def watch() -> None:
                try:
                    for change in stream:
                        got.append(change)
                except Exception:  # the stream is cancelled at the end
                    pass

            th = threading.Thread(target=watch, daemon=True)
            th.start()
            time.sleep(1.0)  # the agent settles after its start and the RPCs
            # idle: the old 2 ms scan of the rate map kept an agent at 5-10 % of a core
            cpu0, t0 = _cpu_s(agent.proc.pid), time.monotonic()
            time.sleep(3.0)
            idle = (_cpu_s(agent.proc.pid) - cpu0) / (time.monotonic() - t0)
            assert idle < 0.02, f"idle agent used {idle:.1%} of a core"
            writer = RateMapWriter(agent.pin_dir)
            try:
                before = time.monotonic_ns()
                writer(key, 123_000_000)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and not any(
                    c.rate_bps == 123_000_000 for c in got
                ):
                    time.sleep(0.01)
            finally:
                writer.close()
                stream.cancel()
            change = next(c for c in got if c.rate_bps == 123_000_000)
            assert change.flow.src_port == 5301 and change.origin == "agent"
            assert before <= change.time_ns <= time.monotonic_ns()  # the kernel's write time
            seen = time.monotonic_ns()
            flows = {(f.flow.src_port, f.paced_rate_bps) for f in agent.flows()}
            assert (5301, 123_000_000) in flows  # its HTB class runs at the new rate
            # the pacer's lag behind the write: one observation, under the time it took to
            # see it
            text = agent.stub().GetMetrics(pb.GetMetricsRequest(), timeout=10).text
            lag = {
                (s.name, s.labels.get("le")): s.value
                for fam in text_string_to_metric_families(text)
                for s in fam.samples
                if fam.name == "xingmai_agent_rate_apply_lag_seconds"
            }
            assert lag[("xingmai_agent_rate_apply_lag_seconds_count", None)] == 1, lag
            assert (
                0
                <= lag[("xingmai_agent_rate_apply_lag_seconds_sum", None)]
                <= ((seen - before) / 1e9)
            )
            assert lag[("xingmai_agent_rate_apply_lag_seconds_bucket", "+Inf")] == 1


def test_map_reads_go_in_chunks_and_miss_nothing() -> None:
    from controller.nic.bpf.loader import lookup_all

    with standalone_nic(100_000_000) as nic:
        t = nic.table("xm_rates")
        assert lookup_all(t) == []
        for i in range(700):  # more than two chunks of 256
            nic.set_rate(FlowKey(A, B, 17, 10_000 + i, 4791), 1_000_000 + i, 1)
        got = {key_from_c(k): int(v.rate_bps) for k, v in lookup_all(t)}
        assert got == {key_from_c(k): int(v.rate_bps) for k, v in t.items()}
        assert len(got) == 700 and got[FlowKey(A, B, 17, 10_699, 4791)] == 1_000_699
        assert {k for k, _ in nic.items("xm_rates")} == set(got)
