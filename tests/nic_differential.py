"""Generated traffic for the NIC's programs, and the drivers that run it through the native
programs (testbed/sim/nic_native.py) and their references (testbed/sim/nic_programs.py) side
by side: tests/test_nic_native.py runs a few seeds, `make fuzz` many (tests/fuzz/nic.py),
also under AddressSanitizer and UBSan."""

from __future__ import annotations

import functools
import random
from dataclasses import replace

from scapy.layers.inet import IP, UDP, IPOption_NOP
from scapy.layers.l2 import Ether

from controller.nic.ratelaw import CcParams, Law, RttProbe
from controller.nic.ratelaw.rtt import RTT_LAWS, tc_rtt_probe
from controller.wire.int_md import encode_stack
from testbed.packets.int_md import IntHop, IntMD, IntShim
from testbed.packets.roce import AETH, BTH, CNP
from testbed.sim.nic_native import NativeNic
from testbed.sim.nic_programs import ALL_PORTS, IntSource, ReferencePrograms
from tests.nic_fuzz_frames import fuzz_frames

LINE = 400_000_000_000
RTT_NS = 8_000
A, B = "10.0.1.1", "10.0.2.2"  # this NIC (the data sender) and the receiver
INT_DSCP = 0x17  # the agent's default is another: any DSCP the tests set
NODES = (11, 12, 13, 14)
SPEEDS = {(11, 3): 400_000_000_000, (12, 1): 100_000_000_000, (13, ALL_PORTS): 200_000_000_000}
INT_OFF = IntSource(False, INT_DSCP, 0, 0, 0)


@functools.lru_cache(maxsize=64)
def _ack_template(sport: int, nhops: int, bitmap: int) -> tuple[bytes, int]:
    """An ACK with `nhops` hops of INT (scapy builds the headers once), and where its stack
    starts: each ACK then takes its PSN and its hops' bytes (controller/wire's encoder). Its
    UDP checksum is none (0) and its ICRC the template's: the NIC's programs read neither
    (the transport checks the ICRC)."""
    frame = bytes(
        Ether()
        / IP(src=B, dst=A, ttl=64 - nhops)
        / UDP(sport=sport, dport=4791)
        / BTH(opcode=0x11, psn=0)
        / AETH(syndrome=0)
        / IntShim()
        / IntMD(
            instruction_bitmap=bitmap,
            remaining_hop_cnt=8 - nhops,
            hops=[IntHop(bitmap) for _ in range(nhops)],
        )
    )
    stack = 14 + 20 + 8 + 12 + 4 + 4 + 12
    return frame, stack


def ack(sport: int, psn: int, hops: list[dict[str, int]], bitmap: int) -> bytes:
    frame, stack = _ack_template(sport, len(hops), bitmap)
    out = bytearray(frame)
    out[14 + 20 + 6 : 14 + 20 + 8] = b"\0\0"
    out[14 + 20 + 8 + 9 : 14 + 20 + 8 + 12] = psn.to_bytes(3, "big")
    body = encode_stack(hops, bitmap)
    out[stack : stack + len(body)] = body
    return bytes(out)


def cnp(sport: int) -> bytes:
    return bytes(
        Ether() / IP(src=B, dst=A) / UDP(sport=sport, dport=4791) / BTH(opcode=0x81, dqpn=5) / CNP()
    )


class Flow:
    """One data flow's sender as tc sees it: bytes sent, next PSN, the RTT probe."""

    def __init__(self, sport: int, rng: random.Random):
        self.sport = sport
        self.rng = rng
        self.tx_bytes = rng.randrange(0, 1 << 20)
        self.snd_nxt = rng.randrange(0, 1 << 24)
        self.acked = self.snd_nxt
        self.probe = RttProbe()
        self.path = list(rng.sample(NODES, rng.randint(1, 3)))
        self.egress_ts = rng.randrange(0, 1 << 40)
        self.paced: int | None = None


def feedback(flow: Flow, law: Law, bitmap: int, rng: random.Random, cnps: float) -> bytes:
    """The next ACK (or, under DCQCN, a CNP with probability `cnps`) of `flow`, its hops' INT
    drawn at random: queues from empty to deep, utilisation around eta, now and then a path
    change."""
    if law == Law.DCQCN and rng.random() < cnps:
        return cnp(flow.sport)
    if rng.random() < 0.05:
        flow.path = list(rng.sample(NODES, rng.randint(1, 3)))
    flow.egress_ts += rng.choice((0, rng.randrange(100, 20_000)))
    flow.acked = (flow.acked + rng.randint(0, 8)) & 0xFFFFFF
    hops = [
        {
            "node_id": node,
            "l1_ingress_port": 1,
            "l1_egress_port": rng.choice((1, 3, 9)),
            "hop_latency": rng.randrange(0, 50_000),
            "queue_id": 0,
            "queue_occupancy": rng.choice((0, 0, rng.randrange(0, 1 << 20), 0xFFFFFF)),
            "egress_ts": (flow.egress_ts - 37 * i) & ((1 << 64) - 1),
            "tx_util": rng.choice((rng.randrange(0, 1_400_000), 950_000, 0xFFFFFFFF)),
        }
        for i, node in enumerate(flow.path)
    ]
    if bitmap != 0xF500:
        for h in hops:
            del h["tx_util"]
    return ack(flow.sport, flow.acked, hops, bitmap)


def params_for(law: Law, rng: random.Random) -> CcParams:
    prm = CcParams.defaults(law, LINE, RTT_NS)
    if law == Law.DCQCN and rng.random() < 0.5:
        # timers short enough that many periods elapse between feedback packets
        prm = replace(prm, dcqcn=replace(prm.dcqcn, rate_timer_ns=2_000, alpha_timer_ns=3_000))
    if law == Law.DCQCN:  # when a cut sets the target: every cut, after a timer increase, never
        prm = replace(prm, dcqcn=replace(prm.dcqcn, clamp_target=rng.choice((1, 2, 0, 3))))
    return prm


def drive_laws(law: Law, seed: int, frames: int = 400) -> int:
    """XDP's laws, native and reference, through the same generated feedback; every state
    compared (AssertionError at the first difference). Returns how many frames changed a rate
    (the run exercised the law)."""
    rng = random.Random(seed)
    prm = params_for(law, rng)
    ref = ReferencePrograms(LINE, prm, SPEEDS, INT_OFF).laws
    nat = NativeNic(LINE, prm, SPEEDS)
    flows = [Flow(40000 + i, rng) for i in range(3)]
    bitmap = rng.choice((0xF500, 0xF400, 0xD400))
    cap = LINE // 3 if seed % 3 == 2 else None  # the controller's cap
    weight = 2 if seed % 3 == 1 else 1  # its weight (scales the additive increases)
    for f in flows:
        if rng.random() < 0.5:
            f.paced = LINE // rng.randint(2, 8)  # a declared start rate
    junk = fuzz_frames(20, seed)
    now = rng.randrange(1 << 30, 1 << 40)
    changed = 0
    for i in range(frames):
        dt = rng.choice((rng.randrange(0, 2 * RTT_NS), rng.randrange(0, 200 * RTT_NS)))
        now += dt
        f = rng.choice(flows)
        cnps = 0.3 if (i // 100) % 2 == 0 else 0.0  # congested, then quiet: DCQCN recovers
        # what tc sent since: bytes (at up to the line rate, or a burst of several of DCQCN's
        # byte counts: its hyper increase below the ceiling), PSNs, the RTT probe
        sent = rng.choice(
            (int(dt * LINE / 8e9 * rng.random() / len(flows)), rng.randrange(40 << 20))
        )
        for _ in range(min(6, sent // 4096)):
            if law in RTT_LAWS:
                tc_rtt_probe(f.probe, ref.state(fb_key(f)), f.snd_nxt, now - rng.randrange(RTT_NS))
            f.snd_nxt = (f.snd_nxt + 1) & 0xFFFFFF
        f.tx_bytes += sent
        frame = junk[i % len(junk)] if rng.random() < 0.05 else feedback(f, law, bitmap, rng, cnps)
        if i == frames // 2 and rng.random() < 0.5:
            other = rng.choice([x for x in Law if x not in (law, Law.NONE)])
            ref.params = nat.params = CcParams.defaults(other, LINE, RTT_NS)  # SetRateLaw
        kw = {
            "now_ns": now,
            "tx_bytes": f.tx_bytes,
            "snd_nxt_psn": f.snd_nxt if rng.random() < 0.9 else None,
            "cap_bps": cap,
            "weight": weight,
            "rtt_probe": f.probe,
            "paced_bps": f.paced,
        }
        want = ref.on_frame(frame, **kw)
        got = nat.on_frame(frame, **kw)
        assert got == want, f"law {law.name}, seed {seed}, frame {i}: rate {got} vs {want}"
        for g in flows:
            assert nat.state(fb_key(g)) == ref.state(fb_key(g)), (
                f"law {law.name}, seed {seed}, frame {i}: state of {g.sport}"
            )
        if want is not None and want != f.paced:
            changed += 1
            f.paced = want
    return changed


def fb_key(f: Flow) -> tuple[int, int, int, int, int]:
    """The flow's key as the NICs keep it (addresses as network-order ints)."""
    a, b = (int.from_bytes(bytes(map(int, ip.split("."))), "big") for ip in (A, B))
    return (a, b, f.sport, 4791, 17)


@functools.lru_cache(maxsize=1024)
def _data_template(sport: int, opcode: int, size: int, tos: int, options: bool) -> bytes:
    ip = IP(src=A, dst=B, tos=tos)
    if options:
        ip.options = [IPOption_NOP()] * 4
    bth = BTH(opcode=opcode, psn=0)
    return bytes(Ether() / ip / UDP(sport=sport, dport=4791, chksum=0) / bth / (b"x" * size))


def data_frame(rng: random.Random, sport: int, psn: int, opcode: int) -> bytes:
    """A frame the transport sends: RoCE data (or an ACK, a CNP) of a size around the link's
    MTU with and without room for INT, now and then with the INT DSCP already set or with IP
    options (scapy builds each kind once; the PSN is patched in)."""
    size = rng.choice((0, 64, 1024, 4036, 4037, 4096))  # 4037: one byte short of room for INT
    tos = rng.choice((0, 0, 0x68, INT_DSCP << 2))
    options = rng.random() < 0.05
    out = bytearray(_data_template(sport, opcode, size, tos, options))
    bth = 14 + (24 if options else 20) + 8
    out[bth + 9 : bth + 12] = psn.to_bytes(3, "big")
    return bytes(out)


def drive_tc(law: Law, seed: int, frames: int = 1500) -> int:
    """tc egress, native and reference, on the same generated frames the host sends, with
    XDP's feedback between them as in the twin (the RTT probe waits for the law's sample):
    the bytes tc sends and each flow's counters compared (AssertionError at the first
    difference). Returns how many frames got INT (the run exercised the INT source)."""
    rng = random.Random(seed)
    src = IntSource(True, INT_DSCP, rng.choice((0xF500, 0xD400)), 8, 4096 + 14)
    prm = CcParams.defaults(law, LINE, RTT_NS)
    nat = NativeNic(LINE, prm, SPEEDS, src)
    ref = ReferencePrograms(LINE, prm, SPEEDS, src)
    flows = [Flow(41000 + i, rng) for i in range(3)]
    junk = fuzz_frames(30, 11)
    now = 1 << 32
    inserted = 0
    for i in range(frames):
        now += rng.randrange(0, 3 * RTT_NS)
        f = rng.choice(flows)
        if rng.random() < 0.05:
            frame = junk[i % len(junk)]
        else:
            opcode = rng.choice((0x00, 0x0A, 0x04, 0x11, 0x81))
            frame = data_frame(rng, f.sport, f.snd_nxt, opcode)
            f.snd_nxt = (f.snd_nxt + 1) & 0xFFFFFF
        out, want = nat.egress(frame, now), ref.egress(frame, now)
        assert out == want, f"{law.name}, seed {seed}, frame {i}: tc sent different bytes"
        inserted += len(out) > len(frame)
        for g in flows:
            assert nat.flow_stats(fb_key(g)) == ref.flow_stats(fb_key(g)), (
                f"{law.name}, seed {seed}, frame {i}"
            )
        if rng.random() < 0.3:  # an ACK comes back: the law takes its RTT sample
            fb = feedback(g := rng.choice(flows), law, 0xF500, rng, 0.2)
            now += rng.randrange(RTT_NS)
            key = fb_key(g)
            assert nat.ingress(fb, now, key) == ref.ingress(fb, now, key), (
                f"{law.name}, seed {seed}, frame {i}"
            )
            assert nat.state(key) == ref.state(key)
    return inserted
