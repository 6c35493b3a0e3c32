"""The controller on a real (emulated) fabric: 2 leaves, 2 spines, 2 hosts per leaf, built-in
switches in their own processes, hosts in network namespaces, the collector's dataplane end in a
namespace of its own. The controller runs as a daemon from a config file.

- every host reaches every other; leaves hold ECMP groups over both spines; INT reports from
  the sink reach the collector and decode;
- dropping every 10th report on the way gives a lost count exactly equal to the drops;
- 4 flows through one bottleneck get caps of capacity x eta / 4 (within 5 %) at the agents;
- SIGKILL of the controller mid-traffic, then a restart: every entry read back is unchanged,
  the restarted controller writes nothing, and no flow's packets stop; a second controller
  with a lower election id stays a backup and takes over without writing.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import finsy as fy
import grpc
import pytest
import yaml

from controller.proto import controller_pb2 as pb
from controller.proto import controller_pb2_grpc as pb_grpc
from tests.controller_rig import (
    BMV2_JSON,
    P4INFO,
    Fabric,
    FakeHostAgent,
    Traffic,
    free_port,
    reachability,
)
from tests.faults import record

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(not P4INFO.exists(), reason=f"{P4INFO} not built (make p4)"),
]


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[Fabric]:
    with Fabric(tmp_path) as f:
        f.start_switches()
        yield f


def read_all(fabric: Fabric, name: str) -> list[str]:
    """Every table entry, member, group and clone session of a switch, read by a client that
    never becomes primary (election id 1), as sorted text."""
    sw = fabric.switches[name]
    opts = fy.SwitchOptions(
        p4info=P4INFO, p4blob=BMV2_JSON, device_id=sw.device_id, initial_election_id=1
    )

    async def body() -> list[str]:
        out: list[str] = []
        async with fy.Switch(f"reader-{name}", sw.addr, opts) as s:
            reader: Any = s
            wild: list[Any] = [
                fy.P4TableEntry(),
                fy.P4CloneSessionEntry(),
                fy.P4ActionProfileMember("ecmp_selector"),
                fy.P4ActionProfileGroup("ecmp_selector"),
                fy.P4TableEntry("switch_config", is_default_action=True),
                fy.P4TableEntry("report_collector", is_default_action=True),
            ]
            for w in wild:
                async for e in reader.read(w):
                    if isinstance(e, fy.P4TableEntry):
                        e.counter_data = None
                    out.append(repr(e))
        return sorted(out)

    return asyncio.run(body())


def groups(fabric: Fabric, name: str) -> list[Any]:
    sw = fabric.switches[name]
    opts = fy.SwitchOptions(
        p4info=P4INFO, p4blob=BMV2_JSON, device_id=sw.device_id, initial_election_id=1
    )

    async def body() -> list[Any]:
        async with fy.Switch(f"reader-{name}", sw.addr, opts) as s:
            reader: Any = s
            return [g async for g in reader.read(fy.P4ActionProfileGroup("ecmp_selector"))]

    return asyncio.run(body())


def telemetry(fabric: Fabric) -> Any:
    return fabric.stub().GetTelemetry(pb.GetTelemetryRequest(max_points=5), timeout=5)


def wait_for(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def test_reachability_ecmp_and_int_reports(fabric: Fabric) -> None:
    fabric.start_controller()
    st = fabric.wait_healthy()
    assert st.switches_connected == st.switches_primary == 4
    reach = reachability(fabric)
    assert len(reach) == 12 and all(reach.values()), reach
    for leaf in ("leaf1", "leaf2"):
        gs = groups(fabric, leaf)
        assert len(gs) == 1 and len(gs[0].members or []) == 2, gs  # one group: both spines
    for spine in ("spine1", "spine2"):
        assert groups(fabric, spine) == []
    # INT: h1 -> h3 crosses leaf1, a spine and leaf2 (the sink, which reports)
    tr = Traffic(fabric)
    try:
        rx = tr.receiver("h3", 4791, 6)
        sent = int(Traffic.result(tr.sender("h1", "10.0.2.1", 4791, 50001, 50, 2)))
        got = json.loads(Traffic.result(rx))
        assert sum(f["n"] for f in got.values()) == sent  # the host gets every packet
    finally:
        tr.close()
    tel = wait_for(lambda: (t := telemetry(fabric)).reports >= sent and t, 10, "reports")
    assert dict(tel.errors) == {}
    leaf2 = next(s for s in tel.switches if s.switch == "leaf2")
    assert (leaf2.received, leaf2.lost) == (sent, 0)
    flows = fabric.stub().ListFlows(pb.ListFlowsRequest(include_idle=True), timeout=5).flows
    f = next(f for f in flows if f.key.src_port == 50001)
    assert (f.src_host, f.dst_host, f.key.dst_port) == ("h1", "h3", 4791)
    assert f.links[0] == "h1:eth0" and f.links[-1] == "leaf2:1"
    assert f.links[1] in ("leaf1:3", "leaf1:4") and f.links[2].startswith("spine")
    links = {lk.name: lk for lk in tel.links}
    assert links["leaf2:1"].samples >= sent and links["leaf2:1"].latency_ns >= 0
    # port counters polled over P4Runtime give utilisation too
    wait_for(
        lambda: any(lk.util_counter >= 0 for lk in telemetry(fabric).links),
        10,
        "counter utilisation",
    )
    # SIGHUP with new ECN thresholds: exactly one modify per switch port, nothing else
    before = {s.name: s.written for s in _switches(fabric.stub())}
    fabric.write_config(fabric.config(ecn={"kmin_bytes": 30000, "kmax_bytes": 90000}))
    assert fabric.controller is not None
    fabric.controller.send_signal(signal.SIGHUP)
    wait_for(
        lambda: fabric.stub().GetStatus(pb.GetStatusRequest(), timeout=2).config_reloads,
        10,
        "reload",
    )
    after = {s.name: s.written for s in _switches(fabric.stub())}
    assert {n: after[n] - before[n] for n in after} == {
        n: len(sw.ports) for n, sw in fabric.switches.items()
    }


NTH_DROPPER = r"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>
BPF_ARRAY(counts, u64, 2);
int drop_nth(struct __sk_buff *skb) {
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != htons(ETH_P_IP)) return TC_ACT_OK;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP || ip->ihl != 5) return TC_ACT_OK;
    struct udphdr *udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end || udp->dest != htons(PORT)) return TC_ACT_OK;
    u32 k0 = 0, k1 = 1;
    u64 *seen = counts.lookup(&k0), *dropped = counts.lookup(&k1);
    if (!seen || !dropped) return TC_ACT_OK;
    u64 n = __sync_fetch_and_add(seen, 1) + 1;
    if (n % EVERY == 0) {
        __sync_fetch_and_add(dropped, 1);
        return TC_ACT_SHOT;
    }
    return TC_ACT_OK;
}
"""


class NthDropper:
    """tc-BPF at the collector interface's ingress: drops every `every`-th report."""

    def __init__(self, fabric: Fabric, every: int):
        from testbed.traffic.impair import _bcc

        BPF = _bcc()  # noqa: N806 - bcc's class
        self.ns = fabric.collector_ns
        self.ifname = fabric.collector_if
        self.bpf = BPF(
            text=NTH_DROPPER.encode(),
            cflags=[f"-DPORT={fabric.collector_port}", f"-DEVERY={every}"],
        )
        fn = self.bpf.load_func(b"drop_nth", BPF.SCHED_CLS)
        self.mount = Path(tempfile.mkdtemp(prefix="xc-drop-", dir="/run"))
        subprocess.run(["mount", "-t", "bpf", "bpf", str(self.mount)], check=True)
        from bcc import libbcc

        pin = self.mount / "prog"
        assert libbcc.lib.bpf_obj_pin(fn.fd, str(pin).encode()) == 0
        nsenter = ["nsenter", f"--net=/run/netns/{self.ns}"]
        subprocess.run([*nsenter, "tc", "qdisc", "add", "dev", self.ifname, "clsact"], check=True)
        subprocess.run(
            [
                *nsenter,
                "tc",
                "filter",
                "add",
                "dev",
                self.ifname,
                "ingress",
                "bpf",
                "da",
                "object-pinned",
                str(pin),
            ],
            check=True,
        )

    def counts(self) -> tuple[int, int]:
        t = self.bpf[b"counts"]
        return int(t[t.Key(0)].value), int(t[t.Key(1)].value)

    def close(self) -> None:
        subprocess.run(
            [
                "nsenter",
                f"--net=/run/netns/{self.ns}",
                "tc",
                "qdisc",
                "del",
                "dev",
                self.ifname,
                "clsact",
            ],
            capture_output=True,
        )
        subprocess.run(["umount", str(self.mount)], capture_output=True)
        self.mount.rmdir()
        self.bpf.cleanup()


def test_every_tenth_report_dropped_is_counted_exactly(fabric: Fabric) -> None:
    fabric.start_controller()
    fabric.wait_healthy()
    dropper = NthDropper(fabric, 10)
    tr = Traffic(fabric)
    try:
        # 95 reports from leaf2: the 10th, 20th, ... 90th are dropped, the last one is not
        rx = tr.receiver("h3", 4791, 8)
        sent = int(Traffic.result(tr.sender("h1", "10.0.2.1", 4791, 50002, 40, 95 / 40 - 0.01)))
        assert sent == 95
        Traffic.result(rx)
        seen, dropped = wait_for(
            lambda: (c := dropper.counts())[0] >= sent and c, 10, "reports at the dropper"
        )
    finally:
        tr.close()
        dropper.close()
    assert (seen, dropped) == (95, 9)
    tel = wait_for(
        lambda: (t := telemetry(fabric)).reports >= seen - dropped and t,
        10,
        "reports at the collector",
    )
    leaf2 = next(s for s in tel.switches if s.switch == "leaf2")
    assert leaf2.received == seen - dropped
    assert leaf2.lost == dropped


def test_four_flows_through_one_bottleneck_get_quarter_caps(fabric: Fabric) -> None:
    agents = {h.name: FakeHostAgent(h.name) for h in fabric.hosts}
    try:
        doc = fabric.config(policy={"interval_s": 0.5, "flow_idle_s": 3.0})
        for h in doc["hosts"]:
            h["agent"] = agents[h["name"]].addr
        fabric.start_controller(fabric.write_config(doc))
        fabric.wait_healthy()
        tr = Traffic(fabric)
        try:
            rx = tr.receiver("h3", 4791, 8)
            senders = [
                tr.sender(h, "10.0.2.1", 4791, sport, 30, 4)
                for h, sport in (("h1", 50011), ("h1", 50012), ("h2", 50013), ("h2", 50014))
            ]
            want = 100e6 * 0.95 / 4

            def capped() -> bool:
                caps = [c for a in agents.values() for c in a.caps.values()]
                return len(caps) == 4 and all(abs(c - want) <= 0.05 * want for c in caps)

            wait_for(capped, 15, f"caps {[a.caps for a in agents.values()]}")
            caps = {name: dict(a.caps) for name, a in agents.items()}
            flows = fabric.stub().ListFlows(pb.ListFlowsRequest(), timeout=5).flows
            for s in senders:
                Traffic.result(s)
            Traffic.result(rx)
        finally:
            tr.close()
        assert {k[3] for k in caps["h1"]} == {50011, 50012}
        assert {k[3] for k in caps["h2"]} == {50013, 50014}
        assert caps["h3"] == {} and caps["h4"] == {}
        assert agents["h1"].int is not None and agents["h1"].int.enabled is False
        assert agents["h1"].law is not None and agents["h1"].hop_speeds
        capped_flows = [f for f in flows if f.cap_bps]
        assert len(capped_flows) == 4 and all(f.cap_pushed for f in capped_flows)
        # the receiver's downlink carries all four: it (or a link as full) is the bottleneck
        assert all(f.links[-1] == "leaf2:1" for f in capped_flows)
    finally:
        for a in agents.values():
            a.close()


@pytest.mark.fault
def test_sigkill_restart_keeps_entries_and_traffic(fabric: Fabric) -> None:
    fabric.start_controller()
    fabric.wait_healthy()
    before = {name: read_all(fabric, name) for name in fabric.switches}
    assert all(before.values())
    tr = Traffic(fabric)
    backup = None
    try:
        rx3 = tr.receiver("h3", 7000, 16)
        rx4 = tr.receiver("h4", 7000, 16)
        s1 = tr.sender("h1", "10.0.2.1", 7000, 51001, 100, 12)
        s2 = tr.sender("h2", "10.0.2.2", 7000, 51002, 100, 12)
        time.sleep(2)
        assert fabric.controller is not None
        fabric.controller.send_signal(signal.SIGKILL)
        fabric.controller.wait()
        fabric.controller = None
        time.sleep(1)
        fabric.start_controller()
        st = fabric.wait_healthy()
        assert st.switches_primary == 4
        sws = fabric.stub().ListSwitches(pb.ListSwitchesRequest(), timeout=5).switches
        assert [(s.name, s.written, s.write_failures) for s in sws] == [
            (s.name, 0, 0) for s in sws
        ]  # adopted: nothing rewritten
        # a second controller with a lower election id: a backup that writes nothing
        backup_port = free_port()
        backup_cfg = fabric.config(
            controller={"name": "backup", "election_id": 5, "grpc_addr": f"127.0.0.1:{backup_port}"}
        )
        backup_cfg["int"]["collector"]["listen"] = f"0.0.0.0:{free_port(socket.SOCK_DGRAM)}"
        path = fabric.tmp / "backup.yaml"
        path.write_text(yaml.safe_dump(backup_cfg))
        backup = subprocess.Popen(
            [*_daemon_argv(path), "--log-file", str(fabric.tmp / "backup.log")],
            cwd=Path(__file__).parents[1],
        )
        bstub = pb_grpc.ControllerStub(grpc.insecure_channel(f"127.0.0.1:{backup_port}"))
        wait_for(
            lambda: _switches(bstub) and all(s.connected for s in _switches(bstub)),
            20,
            "backup connected",
        )
        assert not any(s.primary for s in _switches(bstub))
        assert all(s.primary for s in _switches(fabric.stub()))  # we are still primary
        results = [json.loads(Traffic.result(r)) for r in (rx3, rx4)]
        sent = [int(Traffic.result(s)) for s in (s1, s2)]
        # the primary goes away: the backup takes over, finds nothing to write
        assert fabric.stop_controller() == 0
        wait_for(
            lambda: all(s.primary and s.programmed for s in _switches(bstub)),
            20,
            "backup took over",
        )
        assert [(s.written, s.write_failures) for s in _switches(bstub)] == [(0, 0)] * 4
    finally:
        tr.close()
        if backup is not None and backup.poll() is None:
            backup.terminate()
            backup.wait(timeout=15)
    after = {name: read_all(fabric, name) for name in fabric.switches}
    assert after == before
    record(
        "controller_sigkill_restart",
        switches_primary_after=st.switches_primary,
        entries_rewritten=sum(s.written for s in sws),
        entries_changed=int(after != before),
        packets_sent=sent,
        packets_received=[next(iter(r.values()))["n"] for r in results],
        max_gap_s=[round(next(iter(r.values()))["max_gap"], 3) for r in results],
        backup_writes=0,
    )
    for got, n in zip(results, sent, strict=True):
        (flow,) = got.values()
        assert flow["n"] == n, (flow, n)  # none lost
        assert flow["max_gap"] < 0.2, flow  # and none stopped (one packet every 10 ms)


@pytest.mark.fault
def test_restarted_switch_is_programmed_again(fabric: Fabric) -> None:
    """A switch process killed and started again comes back empty: the controller finds it,
    writes its pipeline, entries and queue settings again (SwitchAdmin, as the primary), and
    every host reaches every other again."""
    from controller.proto import switch_pb2, switch_pb2_grpc

    fabric.start_controller()
    fabric.wait_healthy()
    before = read_all(fabric, "leaf1")
    sw = fabric.switches["leaf1"]
    with grpc.insecure_channel(sw.addr) as ch:
        rates = {
            q.port: q.rate_bps
            for q in switch_pb2_grpc.SwitchAdminStub(ch)
            .GetQueues(switch_pb2.GetQueuesRequest(), timeout=5)
            .queues
        }
    assert rates and all(rates.values())
    assert sw.proc is not None
    sw.proc.kill()
    sw.proc.wait()
    t0 = time.monotonic()
    fabric.start_switch(sw)
    fabric._wait_tcp(sw.grpc_port, sw)
    wait_for(
        lambda: [
            s
            for s in _switches(fabric.stub())
            if s.name == "leaf1"
            and s.connected
            and s.programmed
            and s.queues_set
            and s.connects >= 2
        ],
        60,
        "leaf1 programmed again",
    )
    wait_for(lambda: read_all(fabric, "leaf1") == before, 30, "leaf1's entries back")
    reprogram_s = time.monotonic() - t0
    with grpc.insecure_channel(sw.addr) as ch:
        again = {
            q.port: q.rate_bps
            for q in switch_pb2_grpc.SwitchAdminStub(ch)
            .GetQueues(switch_pb2.GetQueuesRequest(), timeout=5)
            .queues
        }
    assert again == rates
    reach = reachability(fabric)
    record(
        "switch_restart",
        reprogram_s=round(reprogram_s, 2),
        entries=len(before),
        queue_ports=len(rates),
        pairs_reachable=sum(reach.values()),
        pairs=len(reach),
    )
    assert all(reach.values()), reach


def _switches(stub: Any) -> list[Any]:
    try:
        return list(stub.ListSwitches(pb.ListSwitchesRequest(), timeout=2).switches)
    except grpc.RpcError:
        return []


def _daemon_argv(config: Path) -> list[str]:
    import sys

    return [sys.executable, "-m", "controller.daemon", "--config", str(config)]
