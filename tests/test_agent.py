"""xingmai-agent: CLI, gRPC API, clean shutdown, and restart after SIGKILL."""

from __future__ import annotations

import argparse
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.nic.agent.main import (
    build_parser,
    merged_settings,
    parse_bitmap,
    parse_duration_ns,
    parse_rate,
    parse_wire_peer,
)
from testbed.emu.nicrig import AgentProcess, NetnsPair, measure_udp_pacing
from tests.faults import record
from tests.tc_helpers import tc

root = [
    pytest.mark.root,
]


def test_cli_units_and_config(tmp_path: Path) -> None:
    assert parse_rate("100M") == 100_000_000 and parse_rate("1G") == 10**9
    assert parse_rate("250mbit") == 250_000_000 and parse_rate(5) == 5
    assert parse_duration_ns("100us") == 100_000 and parse_duration_ns("2ms") == 2_000_000
    assert parse_bitmap("0,1,2,3,5,7") == 0xF500 == parse_bitmap("0xf500")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("line_rate: 100M\ninterfaces: [eth9]\nrate_law: dcqcn\n")
    s = merged_settings(build_parser().parse_args(["--config", str(cfg), "--rate-law", "tita"]))
    assert s["line_rate"] == "100M" and s["interfaces"] == ["eth9"] and s["rate_law"] == "tita"
    assert parse_wire_peer("h1-eth0=/proc/42/ns/net:leaf1-eth3") == (
        "h1-eth0",
        "/proc/42/ns/net",
        "leaf1-eth3",
    )
    assert parse_wire_peer("h1-eth0=sw1:p3") == ("h1-eth0", "/run/netns/sw1", "p3")
    for bad in ("h1-eth0", "h1-eth0=ns", "=ns:p", "h1-eth0=ns:"):
        with pytest.raises(argparse.ArgumentTypeError, match="IFACE=NETNS:PEER"):
            parse_wire_peer(bad)
    cfg.write_text("line_rat: 100M\n")
    with pytest.raises(SystemExit, match="unknown keys"):
        merged_settings(build_parser().parse_args(["--config", str(cfg)]))


@pytest.mark.parametrize("_", [0], ids=["lifecycle"])
@pytest.mark.slow
@pytest.mark.root
def test_agent_api_and_clean_shutdown(_: int) -> None:
    with NetnsPair.create() as pair:
        wire = ("--wire-peer", f"{pair.dev_a}={pair.b}:{pair.dev_b}")
        agent = AgentProcess(pair.a, pair.dev_a, 100_000_000, extra=wire).start()
        try:
            pb, stub = agent.pb(), agent.stub()
            st = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            # under HTB the far end of the wire stamps departures, in the peer's namespace
            wired = "xm_tc_wire" in tc(pair.b, "filter", "show", "dev", pair.dev_b, "ingress")
            assert wired == (st.pacing_mode == "htb")
            if wired:
                subprocess.run(
                    ["ip", "netns", "exec", pair.a, "ping", "-c", "2", "-i", "0.2", pair.ip_b],
                    capture_output=True,
                )
                text = stub.GetMetrics(pb.GetMetricsRequest(), timeout=10).text
                seen = {
                    s.labels.get("reason"): s.value
                    for fam in text_string_to_metric_families(text)
                    for s in fam.samples
                    if s.name == "xingmai_nic_packets_total"
                }
                assert seen["wire_packets"] >= 2
            assert st.healthy and st.pacing_mode in ("htb", "edt") and st.pacing_detail
            if st.pacing_mode == "htb":
                assert "sch_fq" in st.pacing_detail
            assert st.line_rate_bps == 100_000_000 and st.host_law.law == pb.RATE_LAW_TITA
            assert st.host_law.tita.w_ai_bps == 5_000_000 and not st.adopted_pins  # (1-eta) x line
            assert (
                "xdp"
                in subprocess.run(
                    ["ip", "-n", pair.a, "link", "show", pair.dev_a], capture_output=True, text=True
                ).stdout
            )
            assert "xm_tc_egress" in tc(pair.a, "filter", "show", "dev", pair.dev_a, "egress")
            # per-flow law, cap and weight; effective parameters come back filled in
            key = pair.udp_key(6000)
            eff = stub.SetRateLaw(
                pb.SetRateLawRequest(
                    flow=agent.flow(key),
                    config=pb.RateLawConfig(
                        law=pb.RATE_LAW_DCQCN, dcqcn=pb.DcqcnParams(rai_bps=123_000)
                    ),
                ),
                timeout=10,
            )
            assert eff.effective.dcqcn.rai_bps == 123_000
            assert eff.effective.dcqcn.rate_timer_ns == 22_000_000  # scaled default
            agent.set_cap(key, 30_000_000)
            stub.SetWeights(
                pb.SetWeightsRequest(weights=[pb.FlowWeight(flow=agent.flow(key), weight=3)]),
                timeout=10,
            )
            watch = stub.WatchRates(pb.WatchRatesRequest(flows=[agent.flow(key)]), timeout=20)
            got = stub.SetRate(
                pb.SetRateRequest(flow=agent.flow(key), rate_bps=90_000_000), timeout=10
            )
            assert got.rate_bps == 30_000_000  # bounded by the cap
            # the stream starts with the current rates, then changes: the new rate shows either
            # as a change made by the agent or, if it won the race with the subscription, as
            # the flow's current rate
            seen = []
            for change in watch:
                seen.append((change.rate_bps, change.origin))
                if change.rate_bps == 30_000_000:
                    break
            watch.cancel()
            assert seen[-1] in ((30_000_000, "agent"), (30_000_000, "current")), seen
            flows = {f.flow.src_port: f for f in agent.flows()}
            f = flows[6000]
            assert (f.cap_bps, f.weight, f.law, f.rate_bps) == (
                30_000_000,
                3,
                pb.RATE_LAW_DCQCN,
                30_000_000,
            )
            assert f.paced_rate_bps == 30_000_000 or st.pacing_mode == "edt"
            # bad input is refused with a reason
            bad = pb.FlowKey(src_ip="10.0.0.1", dst_ip="nope", protocol=17, src_port=1, dst_port=2)
            with pytest.raises(grpc.RpcError) as err:
                stub.SetCaps(pb.SetCapsRequest(caps=[pb.FlowCap(flow=bad, cap_bps=1)]), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as err:
                stub.SetRateLaw(
                    pb.SetRateLawRequest(
                        config=pb.RateLawConfig(law=pb.RATE_LAW_TITA, tita=pb.TitaParams(eta=1.5))
                    ),
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            text = stub.GetMetrics(pb.GetMetricsRequest(), timeout=10).text
            assert "xingmai_nic_packets_total" in text and "xingmai_agent_info" in text
            if st.pacing_mode == "htb":  # the slow-NIC rule's inputs, to replay it
                exported = {
                    s.name: s.value
                    for fam in text_string_to_metric_families(text)
                    for s in fam.samples
                }
                later = stub.GetNicCounters(pb.GetNicCountersRequest(), timeout=10)
                assert 0 <= exported["xingmai_agent_nic_sent_bytes_total"] <= later.tx_bytes
                assert 0 <= exported["xingmai_agent_nic_waiting_bits_total"] <= later.waiting_bits
                assert exported["xingmai_agent_nic_paused_seconds_total"] == 0
            # ClearFlows: a fresh NIC for the next run; the controller's settings stay
            other = pair.udp_key(6001)
            stub.SetRate(pb.SetRateRequest(flow=agent.flow(other), rate_bps=40_000_000), timeout=10)
            assert {f.flow.src_port: f.rate_bps for f in agent.flows()}[6001] == 40_000_000
            cleared = stub.ClearFlows(pb.ClearFlowsRequest(), timeout=10).cleared
            assert cleared == 2  # the two flows' rates
            after = {f.flow.src_port: f for f in agent.flows()}
            assert 6001 not in after
            kept = after[6000]  # its cap, weight and law, at its ceiling again
            assert (kept.cap_bps, kept.weight, kept.law, kept.rate_bps) == (
                30_000_000,
                3,
                pb.RATE_LAW_DCQCN,
                30_000_000,
            )
            assert kept.paced_rate_bps == 0  # no class until it sends or is rated again
        finally:
            rc = agent.stop(signal.SIGTERM)
        assert rc == 0, agent.log_tail()
        # everything it made is gone, and only that
        assert (
            "xdp"
            not in subprocess.run(
                ["ip", "-n", pair.a, "link", "show", pair.dev_a], capture_output=True, text=True
            ).stdout
        )
        assert "xm_tc_egress" not in tc(pair.a, "filter", "show", "dev", pair.dev_a, "egress")
        assert "htb" not in tc(pair.a, "qdisc", "show", "dev", pair.dev_a)
        assert "clsact" not in tc(pair.b, "qdisc", "show", "dev", pair.dev_b)  # the wire's
        assert not agent.pin_dir.exists()
        assert not (Path("/run/xingmai/agents") / agent.name).exists()


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.root
def test_sigkill_keeps_pacing_and_restart_adopts_pins() -> None:
    with NetnsPair.create() as pair:
        # with its wire's far end in the peer namespace: a restarted agent removes the clsact
        # the killed one made there
        extra = ("--no-int", "--wire-peer", f"{pair.dev_a}={pair.b}:{pair.dev_b}")
        first = AgentProcess(pair.a, pair.dev_a, 1_000_000_000, extra=extra).start()
        name = first.name
        try:
            m = measure_udp_pacing(pair, first, 20_000_000, duration_s=2.0, sport=7000)
            assert abs(m["error"]) <= 0.05
            before = {f.flow.src_port: f for f in first.flows()}
            first.stop(signal.SIGKILL)
            # no agent: the flow is still paced at its last rate
            m2 = measure_udp_pacing_without_agent(pair, 7000)
            assert abs(m2 / 20_000_000 - 1) <= 0.05
            assert (first.pin_dir / "xm_rates").exists()
            # a new agent of the same name adopts the pins instead of resetting them
            second = AgentProcess(pair.a, pair.dev_a, 1_000_000_000, name=name, extra=extra).start()
        except BaseException:
            first.cleanup_after_kill()
            raise
        try:
            st = second.stub().GetStatus(second.pb().GetStatusRequest(), timeout=10)
            assert st.adopted_pins
            after = {f.flow.src_port: f for f in second.flows()}
            f0, f1 = before[7000], after[7000]
            assert (f1.cap_bps, f1.rate_bps, f1.law) == (f0.cap_bps, f0.rate_bps, f0.law)
            assert f1.tx_bytes > f0.tx_bytes  # counters kept and still counting
            assert f1.paced_rate_bps == 20_000_000  # its HTB class was adopted
            m3 = measure_udp_pacing(pair, second, 20_000_000, duration_s=2.0, sport=7000)
            record(
                "agent_sigkill_restart",
                cap_bps=20_000_000,
                error_before=round(m["error"], 4),
                error_without_agent=round(m2 / 20_000_000 - 1, 4),
                error_after_restart=round(m3["error"], 4),
                pacer_drops=m3["pacer_drops"],
                adopted_pins=st.adopted_pins,
            )
            assert abs(m3["error"]) <= 0.05 and m3["pacer_drops"] == 0
        finally:
            assert second.stop(signal.SIGTERM) == 0, second.log_tail()
        assert not second.pin_dir.exists()
        assert "htb" not in tc(pair.a, "qdisc", "show", "dev", pair.dev_a)
        assert "clsact" not in tc(pair.b, "qdisc", "show", "dev", pair.dev_b)


def measure_udp_pacing_without_agent(pair: NetnsPair, sport: int) -> float:
    from testbed.emu.nicrig import udp_receiver, udp_sender

    with udp_receiver(pair) as box:
        udp_sender(pair, sport, 2.0).communicate(timeout=60)
    rx = box["reception"]
    time.sleep(0)
    return rx.rate_bps(rx.first_ns + 500_000_000, rx.last_ns - 200_000_000)


@pytest.mark.slow
@pytest.mark.root
def test_agent_api_refuses_what_it_cannot_take() -> None:
    """Issue 18 defect 7: an unknown law enum was INTERNAL; SetCaps applied the first cap of a
    request that failed; 8 open WatchRates streams took all 8 server threads (GetStatus timed
    out); SetRate for 1,500 flows that never existed made 1,500 HTB classes."""
    with NetnsPair.create() as pair:
        agent = AgentProcess(pair.a, pair.dev_a, 100_000_000).start()
        try:
            pb, stub = agent.pb(), agent.stub()
            with pytest.raises(grpc.RpcError) as err:
                stub.SetRateLaw(pb.SetRateLawRequest(config=pb.RateLawConfig(law=77)), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            good, bad = agent.flow(pair.udp_key(6100)), agent.flow(pair.udp_key(6101))
            with pytest.raises(grpc.RpcError) as err:
                stub.SetCaps(
                    pb.SetCapsRequest(
                        caps=[
                            pb.FlowCap(flow=good, cap_bps=10_000_000),
                            pb.FlowCap(flow=bad, cap_bps=0),
                        ]
                    ),
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert not [f for f in agent.flows() if f.cap_bps], "a failed SetCaps applied a cap"
            # a cap slower than the pacer can pace (HTB's 32-bit tick tables): refused, not
            # INTERNAL (the fuzzer found it)
            with pytest.raises(grpc.RpcError) as err:
                stub.SetCaps(
                    pb.SetCapsRequest(caps=[pb.FlowCap(flow=good, cap_bps=20)]), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # every watcher the agent admits leaves threads for the unary calls
            streams = [stub.WatchRates(pb.WatchRatesRequest(), timeout=30) for _ in range(12)]
            time.sleep(1.0)
            t0 = time.monotonic()
            assert stub.GetStatus(pb.GetStatusRequest(), timeout=5).healthy
            assert time.monotonic() - t0 < 2
            refused = sum(
                1 for s in streams if s.done() and s.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            for s in streams:
                s.cancel()
            assert refused == 12 - 8
            # settings for flows that never sent are bounded, and so are the HTB classes
            accepted = 0
            for sport in range(20_000, 21_500):
                try:
                    stub.SetRate(
                        pb.SetRateRequest(flow=agent.flow(pair.udp_key(sport)), rate_bps=5_000_000),
                        timeout=10,
                    )
                    accepted += 1
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
            assert 200 <= accepted <= 256
            classes = tc(pair.a, "class", "show", "dev", pair.dev_a).count("class htb")
            assert classes <= 256 + 2, classes
            assert stub.GetStatus(pb.GetStatusRequest(), timeout=5).healthy
        finally:
            rc = agent.stop(signal.SIGTERM)
        assert rc == 0, agent.log_tail()
