"""P4Runtime server of the built-in switch, driven by finsy (the controller's client) in process.

The switch runs `tests/p4/switch_features.p4` (compiled by p4c, committed) on a virtual
clock; packets go in with `receive()` and come out through `transmit`.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import finsy as fy
import grpc
import pytest
from finsy.p4entity import P4ValueSetMember
from finsy.proto import p4r, p4r_grpc
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether

from controller.common.ports import free_port
from testbed.switch.p4runtime import P4RuntimeService, serve
from testbed.switch.p4runtime.codec import RpcError
from testbed.switch.p4runtime.stream import Client
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

BUILD = Path(__file__).parent / "p4" / "build"
P4INFO = BUILD / "switch_features.p4info.txtpb"
JSON = BUILD / "switch_features.json"
ROUTER_MAC = "00:00:00:00:fe:01"
CPU_PORT = 255


class Harness:
    def __init__(self) -> None:
        self.sw = V1Switch(Clock(virtual=True), device_id=1, cpu_port=CPU_PORT)
        self.out: list[tuple[int, bytes]] = []
        self.service = P4RuntimeService(self.sw, 1)

        def transmit(port: int, data: bytes) -> None:
            if port == CPU_PORT:
                self.service.packet_in(data)
            else:
                self.out.append((port, data))

        self.sw.transmit = transmit
        self.addr = f"127.0.0.1:{free_port()}"
        self.server = serve(self.service, self.addr)

    def send(self, port: int, pkt: Any) -> None:
        self.sw.receive(port, bytes(pkt))
        self.sw.service()

    def options(self, **kw: Any) -> fy.SwitchOptions:
        return fy.SwitchOptions(p4info=P4INFO, p4blob=JSON, device_id=1, **kw)

    def run(self, body: Callable[[fy.Switch], Awaitable[None]], **kw: Any) -> None:
        async def main() -> None:
            async with fy.Switch("s1", self.addr, self.options(**kw)) as s:
                await body(s)

        asyncio.run(main())


@pytest.fixture
def h() -> Iterator[Harness]:
    if not JSON.exists():
        pytest.skip(f"{JSON} not built (make p4)")
    harness = Harness()
    yield harness
    harness.server.stop(0)


def udp(dst: str, sport: int = 1000, dport: int = 2000, ttl: int = 64) -> Any:
    return (
        Ether(dst=ROUTER_MAC, src="02:00:00:00:00:01")
        / IP(src="10.0.1.1", dst=dst, ttl=ttl)
        / UDP(sport=sport, dport=dport)
        / (b"x" * 20)
    )


def route(prefix: str, port: int, dmac: int = 0x020000000002) -> fy.P4TableEntry:
    return fy.P4TableEntry(
        "routes",
        match=fy.P4TableMatch(dst_addr=prefix),
        action=fy.P4TableAction("routed_set_nexthop", dmac=dmac, port=port),
    )


def test_routes_forward_and_count(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write([+route("10.0.2.0/24", 2), +route("10.0.0.0/8", 3)])
        h.send(1, udp("10.0.2.7"))
        h.send(1, udp("10.9.9.9"))
        h.send(1, udp("11.0.0.1"))  # no route: default drop
        h.send(1, udp("10.0.2.8", ttl=1))  # TTL expiring: dropped
        assert [p for p, _ in h.out] == [2, 3]
        out = Ether(h.out[0][1])
        assert out.dst == "02:00:00:00:00:02" and out[IP].ttl == 63
        fresh = IP(bytes(out[IP]))
        del fresh.chksum  # scapy recomputes it: the switch's must be the same
        assert IP(bytes(fresh)).chksum == out[IP].chksum
        query = fy.P4TableEntry("routes", counter_data=fy.P4CounterData())
        entries = [e async for e in s.read(query)]
        hits = {e.match["dst_addr"]: e.counter_data.packet_count for e in entries}
        assert sorted(hits.values()) == [1, 1]
        ports = [e async for e in s.read(fy.P4CounterEntry("port_rx", index=1))]
        assert ports[0].data.packet_count == 4

    h.run(body)


def test_direct_counters_read_whole_table_or_one_entry(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write([+route("10.0.2.0/24", 2), +route("10.0.0.0/8", 3)])
        h.send(1, udp("10.0.2.7"))
        h.send(1, udp("10.0.2.8"))
        h.send(1, udp("10.9.9.9"))
        every = [e async for e in s.read(fy.P4DirectCounterEntry("route_hits"))]
        hits = {e.table_entry.match["dst_addr"]: e.data.packet_count for e in every}
        assert sorted(hits.values()) == [1, 2]
        one = fy.P4DirectCounterEntry("route_hits", table_entry=route("10.0.2.0/24", 2))
        got = [e async for e in s.read(one)]
        assert [e.data.packet_count for e in got] == [2]

    h.run(body)


def test_write_errors_are_per_update(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write([+route("10.0.2.0/24", 2)])
        with pytest.raises(fy.P4ClientError) as exc:
            await s.write([+route("10.0.3.0/24", 3), +route("10.0.2.0/24", 4)], strict=False)
        details = exc.value.details  # the failed updates of the batch, by index
        assert list(details) == [1]
        assert details[1].canonical_code == fy.GRPCStatusCode.ALREADY_EXISTS
        # the good update of the batch was applied
        names = [e.match["dst_addr"] async for e in s.read(fy.P4TableEntry("routes"))]
        assert len(names) == 2
        with pytest.raises(fy.P4ClientError) as exc:
            await s.write([-route("10.0.99.0/24", 2)])
        assert exc.value.details[0].canonical_code == fy.GRPCStatusCode.NOT_FOUND

    h.run(body)


def test_unknown_table_and_bad_values_are_grpc_errors(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        te = p4r.TableEntry(table_id=0x02FFFFFF)
        with pytest.raises(fy.P4ClientError) as exc:
            await s.write([p4r.Update(type=p4r.Update.INSERT, entity=p4r.Entity(table_entry=te))])
        assert exc.value.details[0].canonical_code == fy.GRPCStatusCode.NOT_FOUND
        # a 9-bit port parameter given 10 bits
        raw = (+route("10.0.2.0/24", 1)).encode_update(s.p4info)
        raw.entity.table_entry.action.action.params[1].value = (1023).to_bytes(2, "big")
        with pytest.raises(fy.P4ClientError) as exc:
            await s.write([raw])
        assert exc.value.details[0].canonical_code == fy.GRPCStatusCode.OUT_OF_RANGE

    h.run(body)


def test_ternary_range_optional_acl_and_packet_in(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write(
            [
                +route("10.0.2.0/24", 2),
                +fy.P4TableEntry(
                    "acl",
                    match=fy.P4TableMatch(
                        src_addr=("10.0.1.0", "255.255.255.0"), dst_port=(5000, 5999), protocol=17
                    ),
                    priority=10,
                    action=fy.P4TableAction("send_to_cpu"),
                ),
                +fy.P4TableEntry(
                    "acl",
                    match=fy.P4TableMatch(dst_port=(5555, 5555)),
                    priority=20,
                    action=fy.P4TableAction("drop"),
                ),
            ]
        )
        packets: list[fy.P4PacketIn] = []

        async def collect() -> None:
            async for pkt in s.read_packets():
                packets.append(pkt)

        task = asyncio.create_task(collect())
        await asyncio.sleep(0.05)
        h.send(1, udp("10.0.2.7", dport=5001))  # to the CPU
        h.send(1, udp("10.0.2.7", dport=5555))  # higher-priority drop
        h.send(1, udp("10.0.2.7", dport=6000))  # routed
        for _ in range(50):
            if packets:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        assert [p for p, _ in h.out] == [2]
        assert len(packets) == 1
        assert packets[0]["ingress_port"] == 1
        assert Ether(packets[0].payload)[UDP].dport == 5001

    h.run(body)


def test_packet_out_with_and_without_metadata(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        frame = bytes(Ether(dst="02:00:00:00:00:09") / IP(dst="10.0.9.9") / ICMP())
        await s.write([fy.P4PacketOut(frame, egress_port=4, _pad=0)])
        for _ in range(50):
            if h.out:
                break
            await asyncio.sleep(0.02)
        assert h.out == [(4, frame)]
        # without metadata: a stream error, a counted drop, and the switch goes on
        await s.write([p4r.StreamMessageRequest(packet=p4r.PacketOut(payload=frame))])
        await asyncio.sleep(0.2)
        assert h.service.counters["packet_out_dropped"] == 1
        assert h.service.counters["packet_out"] == 1

    h.run(body)


def test_action_selector_groups_spread_flows(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        members = [
            +fy.P4ActionProfileMember(
                "ecmp_selector", member_id=i, action=fy.P4TableAction("set_nexthop", dmac=i, port=i)
            )
            for i in range(1, 5)
        ]
        group = +fy.P4ActionProfileGroup(
            "ecmp_selector", group_id=1, members=[fy.P4Member(i, weight=1) for i in range(1, 5)]
        )
        entry = +fy.P4TableEntry(
            "ecmp",
            match=fy.P4TableMatch(dst_addr="10.0.5.5"),
            action=fy.P4IndirectAction(group_id=1),
        )
        await s.write(members + [group, entry])
        for sport in range(400):
            h.send(1, udp("10.0.5.5", sport=1000 + sport))
        counts = {p: 0 for p in range(1, 5)}
        for p, _ in h.out:
            counts[p] += 1
        assert sum(counts.values()) == 400
        assert all(60 <= c <= 140 for c in counts.values()), counts
        groups = [g async for g in s.read(fy.P4ActionProfileGroup("ecmp_selector"))]
        assert len(groups) == 1 and len(groups[0].members) == 4
        with pytest.raises(fy.P4ClientError):
            await s.write([-fy.P4ActionProfileMember("ecmp_selector", member_id=1)])

    h.run(body)


def test_meter_register_and_default_action(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write([+route("10.0.2.0/24", 2)])
        # 1 packet burst, tiny rates: on a virtual clock the 2nd packet is over both rates
        await s.write(
            [
                fy.P4MeterEntry(
                    "port_meter", index=1, config=fy.P4MeterConfig(cir=1, cburst=1, pir=1, pburst=1)
                )
            ]
        )
        h.send(1, udp("10.0.2.7"))
        h.send(1, udp("10.0.2.7"))
        assert len(h.out) == 1
        regs = [r async for r in s.read(fy.P4RegisterEntry("rx_seen", index=1))]
        assert regs[0].data == 2
        await s.write([fy.P4RegisterEntry("rx_seen", index=1, data=100)])
        regs = [r async for r in s.read(fy.P4RegisterEntry("rx_seen", index=1))]
        assert regs[0].data == 100
        # default action: route everything else to port 7, then reset to the program's drop
        await s.write(
            [
                ~fy.P4TableEntry(
                    "routes",
                    is_default_action=True,
                    action=fy.P4TableAction("routed_set_nexthop", dmac=1, port=7),
                )
            ]
        )
        h.out.clear()
        h.send(3, udp("11.1.1.1"))
        assert [p for p, _ in h.out] == [7]
        await s.write([~fy.P4TableEntry("routes", is_default_action=True)])
        h.out.clear()
        h.send(3, udp("11.1.1.1"))
        assert h.out == []

    h.run(body)


def test_multicast_and_clone_sessions(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write(
            [
                +fy.P4MulticastGroupEntry(7, replicas=[(2, 1), (3, 2), (4, 3)]),
                +fy.P4TableEntry(
                    "l2_flood",
                    match=fy.P4TableMatch(dst_addr="ff:ff:ff:ff:ff:ff"),
                    action=fy.P4TableAction("flood", group=7),
                ),
                +fy.P4CloneSessionEntry(100, replicas=[5]),
                +route("10.0.2.0/24", 2),
                +fy.P4TableEntry(
                    "acl",
                    match=fy.P4TableMatch(dst_port=(7000, 7000)),
                    priority=5,
                    action=fy.P4TableAction("copy_to_cpu"),
                ),
            ]
        )
        h.send(1, Ether(dst="ff:ff:ff:ff:ff:ff") / b"hello")
        assert sorted(p for p, _ in h.out) == [2, 3, 4]
        h.out.clear()
        h.send(1, udp("10.0.2.7", dport=7000))  # routed + cloned (as received) to port 5
        assert sorted(p for p, _ in h.out) == [2, 5]
        clone = dict(h.out)[5]
        assert Ether(clone)[IP].ttl == 64  # the clone is the packet as it arrived
        groups = [g async for g in s.read(fy.P4MulticastGroupEntry())]
        assert [(g.multicast_group_id, len(g.replicas)) for g in groups] == [(7, 3)]
        sessions = [c async for c in s.read(fy.P4CloneSessionEntry())]
        assert [c.session_id for c in sessions] == [100]

    h.run(body)


def test_digest_with_ack(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write([+fy.P4DigestEntry("mac_learn_t", max_list_size=1, ack_timeout_ns=10**9)])
        got: list[Any] = []

        async def collect() -> None:
            async for dl in s.read_digests("mac_learn_t"):
                got.append(dl)

        task = asyncio.create_task(collect())
        await asyncio.sleep(0.05)
        h.send(1, udp("10.0.2.7"))
        h.send(1, udp("10.0.2.7"))  # same data, not acked yet: suppressed
        for _ in range(50):
            if got:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        task.cancel()
        assert len(got) == 1
        data = list(got[0])[0]
        assert data["ingress_port"] == 1

    h.run(body)


def test_value_set_extends_the_parser(h: Harness) -> None:
    async def body(s: fy.Switch) -> None:
        await s.write([+route("10.0.2.0/24", 2)])
        frame = bytearray(bytes(udp("10.0.2.7")))
        frame[12:14] = b"\x88\xb5"  # an EtherType the parser only knows through the value set
        h.send(1, bytes(frame))
        # not parsed as IPv4, so not routed: egress_spec stays 0 and v1model sends it to port 0
        assert [p for p, _ in h.out] == [0]
        await s.write([fy.P4ValueSetEntry("ip_ether_types", members=[P4ValueSetMember(0x88B5)])])
        h.send(1, bytes(frame))
        assert [p for p, _ in h.out] == [0, 2]

    h.run(body)


def test_arbitration_backup_cannot_write(h: Harness) -> None:
    async def body() -> None:
        async with fy.Switch("primary", h.addr, h.options(initial_election_id=20)) as s1:
            async with fy.Switch("backup", h.addr, h.options(initial_election_id=10)) as s2:
                await asyncio.sleep(0.1)
                assert s1.is_primary and not s2.is_primary
                with pytest.raises(fy.P4ClientError) as exc:
                    await s2.write([+route("10.0.2.0/24", 2)])
                assert exc.value.code == fy.GRPCStatusCode.PERMISSION_DENIED
                await s1.write([+route("10.0.2.0/24", 2)])
                entries = [e async for e in s2.read(fy.P4TableEntry("routes"))]  # reads are fine
                assert len(entries) == 1

    asyncio.run(body())


def test_reconnect_keeps_state_and_bad_config_is_refused(h: Harness) -> None:
    async def first(s: fy.Switch) -> None:
        await s.write([+route("10.0.2.0/24", 2)])

    h.run(first)

    async def second(s: fy.Switch) -> None:
        # same pipeline (finsy compares the cookie and does not push again): entries survive
        entries = [e async for e in s.read(fy.P4TableEntry("routes"))]
        assert len(entries) == 1

    h.run(second)
    channel = grpc.insecure_channel(h.addr)
    stub = p4r_grpc.P4RuntimeStub(channel)
    req = p4r.SetForwardingPipelineConfigRequest(
        device_id=1, action=p4r.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
    )
    req.election_id.low = 1
    req.config.p4_device_config = b'{"__meta__": {"version": [2, 23]}, "actions": [{}]}'
    with pytest.raises(grpc.RpcError) as exc:
        stub.SetForwardingPipelineConfig(req)
    # no stream holds election id 1: refused before even looking at the config
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert h.sw.ready
    caps = stub.Capabilities(p4r.CapabilitiesRequest())
    assert caps.p4runtime_api_version
    channel.close()


def test_a_controller_back_on_a_new_stream_takes_over_its_closed_one() -> None:
    # the server may still hold a stream its controller has closed (its thread not yet ended)
    # when the controller comes back with the same election id: the closed stream is gone,
    # an open one with that id is a second controller and is refused
    svc = P4RuntimeService(V1Switch(Clock(virtual=True), device_id=1, cpu_port=CPU_PORT), 1)
    streams = svc.streams
    req = p4r.MasterArbitrationUpdate(device_id=1)
    req.election_id.low = 10
    open_ = True
    old = Client(1, queue.Queue(), active=lambda: open_)
    streams.clients[1] = old
    streams._arbitrate(old, req)
    assert streams.primary() is old
    new = Client(2, queue.Queue())
    streams.clients[2] = new
    with pytest.raises(RpcError, match="already in use"):
        streams._arbitrate(new, req)  # the old stream is open: two controllers, one id
    open_ = False
    streams._arbitrate(new, req)
    assert streams.primary() is new and 1 not in streams.clients
    while old.queue.get_nowait() is not None:  # the closed stream is told to end
        pass
    assert new.queue.get_nowait().arbitration.status.code == 0  # OK: primary


def test_a_stream_that_has_not_arbitrated_is_not_told_of_a_new_primary() -> None:
    # a controller reconnecting opens its new stream before its old one's thread has ended:
    # the old one's end must not send the new stream an arbitration answer ("backup, no
    # primary") ahead of the answer to its own update (finsy then fails its handshake)
    svc = P4RuntimeService(V1Switch(Clock(virtual=True), device_id=1, cpu_port=CPU_PORT), 1)
    streams = svc.streams
    req = p4r.MasterArbitrationUpdate(device_id=1)
    req.election_id.low = 10
    old = Client(1, queue.Queue())
    streams.clients[1] = old
    streams._arbitrate(old, req)
    new = Client(2, queue.Queue())
    streams.clients[2] = new
    streams._close(old)
    assert new.queue.empty()
    streams._arbitrate(new, req)
    answer = new.queue.get_nowait().arbitration
    assert answer.status.code == 0 and answer.election_id.low == 10
    assert new.queue.empty()
