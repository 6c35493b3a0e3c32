"""The NIC rig: pacing accuracy and rate-change latency of the eBPF NIC (xingmai-agent).

Two network namespaces joined by a veth; the agent runs on the sender's side. A UDP sender
(dport 4791, fixed-size datagrams, blocking socket) or iperf3 (TCP) sends as fast as it can;
the agent paces the flow at the rate under test. The receiver timestamps every datagram in
the kernel (SO_TIMESTAMPNS) and counts frame bytes in 1 ms bins.

- pacing accuracy: achieved rate over the steady part of a run vs the set rate, for rates
  across a decade, UDP (HTB class) and TCP (sock_ops SO_MAX_PACING_RATE), and the pacer's
  drops (HTB class drop counters, which must stay 0: pacing delays);
- rate-change latency: the rate is changed during a run (by a gRPC call, or by writing the
  rate map directly, the way the XDP rate law does); latency is the time from the change to
  the first 1 ms bin from which every 10-bin window holds the new rate within 10 %, counted
  from the moment the update was made (the RPC returned, the map write returned); the time
  including the RPC itself is reported next to it.

The same functions back tests/test_nic_*.py and tests/test_agent.py and `make bench`
(testbed/benchmarks/nic.py, which records the figures). Rates are frame bits per second
(Ethernet header included), as the agent defines them; for TCP, iperf3's goodput is reported
next to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.roce import ROCE_UDP_PORT
from testbed.traffic.netns import NetnsLan

UDP_PAYLOAD = 1400
FRAME_OVERHEAD = 14 + 20 + 8  # Ethernet + IPv4 + UDP
BIN_NS = 1_000_000
SEQ = struct.Struct("!Q")  # the sender's datagram number, at the start of its payload
SO_TIMESTAMPNS = 35
SO_SNDBUFFORCE = 32
SENDER_SNDBUF = 512 << 10
PY = sys.executable


def sh(cmd: list[str] | str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, shell=isinstance(cmd, str), check=check, capture_output=True, text=True
    )


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid() % 10000}{random.randrange(1000):03d}"


# ---- namespaces ---------------------------------------------------------------------------


@dataclass
class NetnsPair:
    """Two network namespaces, `a` (sender, with the agent) and `b`, joined by a veth."""

    a: str
    b: str
    dev_a: str
    dev_b: str
    ip_a: str
    ip_b: str

    @classmethod
    @contextlib.contextmanager
    def create(cls, subnet: int | None = None) -> Iterator[NetnsPair]:
        """The two hosts of a `NetnsLan(2)` (the one namespace rig), on 10.231.<subnet>.0/24."""
        net = subnet if subnet is not None else random.randrange(1, 250)
        with NetnsLan(2, subnet=f"10.231.{net}", prefix=unique("xn")) as lan:
            a, b = lan.hosts
            yield cls(a.netns, b.netns, a.ifname, b.ifname, a.ip, b.ip)

    def udp_key(self, sport: int) -> tuple[str, str, int, int, int]:
        return (self.ip_a, self.ip_b, 17, sport, ROCE_UDP_PORT)


# ---- the agent ----------------------------------------------------------------------------


@dataclass
class AgentProcess:
    """xingmai-agent in namespace `netns`, with its own bpffs and run folder."""

    netns: str
    interface: str
    line_rate_bps: int
    name: str = field(default_factory=lambda: unique("xmagent"))
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def socket_path(self) -> Path:
        return Path("/run/xingmai/agents") / self.name / "agent.sock"

    @property
    def pin_dir(self) -> Path:
        return Path("/run/xingmai/bpffs") / self.name

    def start(self, timeout_s: float = 60.0) -> AgentProcess:
        self.log_path = Path(f"/tmp/{self.name}.log")
        cmd = [
            PY,
            "-m",
            "controller.nic.agent.main",
            "--name",
            self.name,
            "--netns",
            self.netns,
            "--interface",
            self.interface,
            "--line-rate",
            str(self.line_rate_bps),
            *self.extra,
        ]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                self.stub().GetStatus(self.pb().GetStatusRequest(), timeout=1)
                return self
            except Exception:
                time.sleep(0.2)
        raise RuntimeError(f"agent not serving after {timeout_s} s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text()[-n:] if self.log_path else ""
        except OSError:
            return ""

    @staticmethod
    def pb() -> Any:
        from controller.proto import agent_pb2

        return agent_pb2

    def stub(self) -> Any:
        import grpc

        from controller.proto import agent_pb2_grpc

        ch = grpc.insecure_channel(f"unix://{self.socket_path}")
        return agent_pb2_grpc.HostAgentStub(ch)

    def flow(self, key: tuple[str, str, int, int, int]) -> Any:
        src, dst, proto, sport, dport = key
        return self.pb().FlowKey(
            src_ip=src, dst_ip=dst, protocol=proto, src_port=sport, dst_port=dport
        )

    def set_rate_law(self, law: str, key: tuple[str, str, int, int, int] | None = None) -> None:
        pb = self.pb()
        laws = {"none": pb.RATE_LAW_NONE, "tita": pb.RATE_LAW_TITA, "dcqcn": pb.RATE_LAW_DCQCN}
        req = pb.SetRateLawRequest(config=pb.RateLawConfig(law=laws[law]))
        if key is not None:
            req.flow.CopyFrom(self.flow(key))
        self.stub().SetRateLaw(req, timeout=10)

    def set_cap(self, key: tuple[str, str, int, int, int], cap_bps: int) -> None:
        pb = self.pb()
        self.stub().SetCaps(
            pb.SetCapsRequest(caps=[pb.FlowCap(flow=self.flow(key), cap_bps=cap_bps)]), timeout=10
        )

    def flows(self) -> list[Any]:
        return list(self.stub().ListFlows(self.pb().ListFlowsRequest(), timeout=10).flows)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if rc == 0 and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        return rc

    def cleanup_after_kill(self) -> None:
        """What a SIGKILLed agent leaves (for a test that does not restart it): its pins and
        mount. The interfaces go away with their namespace."""
        with contextlib.suppress(OSError):
            for p in self.pin_dir.iterdir():
                with contextlib.suppress(OSError):
                    p.unlink()
        sh(["umount", str(self.pin_dir)], check=False)
        with contextlib.suppress(OSError):
            self.pin_dir.rmdir()
        shutil.rmtree(Path("/run/xingmai/agents") / self.name, ignore_errors=True)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        if self.proc is not None and self.proc.returncode not in (0, None):
            self.cleanup_after_kill()
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


# ---- the programs without an agent (BPF_PROG_TEST_RUN) -------------------------------------


@contextlib.contextmanager
def standalone_nic(
    line_rate_bps: int = 1_000_000_000,
    law: str = "tita",
    base_rtt_ns: int = 100_000,
    int_enabled: bool = True,
    mtu: int = 1500,
    programs: tuple[str, ...] = ("tc", "xdp"),
) -> Iterator[Any]:
    """The NIC's programs (tc and XDP unless `programs` says) compiled against a private
    bpffs, configured like an agent would, attached nowhere: tests drive them with
    BPF_PROG_TEST_RUN."""
    from controller.nic.agent import netdev
    from controller.nic.bpf.loader import NicBpf, cc_params_to_c
    from controller.nic.ratelaw import CcParams, Law

    pin = Path("/run/xingmai/bpffs") / unique("xmnic")
    mounted = netdev.mount_bpffs(pin)
    bpf = None
    try:
        bpf = NicBpf(pin, programs=programs)
        cfg = bpf.config()
        cfg.line_rate_bps = line_rate_bps
        cc_params_to_c(CcParams.defaults(Law[law.upper()], line_rate_bps, base_rtt_ns), cfg.cc)
        cfg.int_enabled = int(int_enabled)
        cfg.int_dscp = INT_DSCP_DEFAULT
        cfg.int_bitmap = 0xF500
        cfg.int_hop_budget = 8
        cfg.int_max_frame = mtu + 14
        cfg.default_classid = 0x1FFFE
        bpf.write_config(cfg)
        yield bpf
    finally:
        if bpf is not None:
            bpf.remove_pins()
            bpf.close()
        if mounted:
            netdev.umount(pin)
        with contextlib.suppress(OSError):
            pin.rmdir()


# ---- traffic (run in the namespaces by `python -m testbed.emu.nicrig ...`) -------------


def _enter(netns: str) -> None:
    from controller.common.netns import enter_netns

    enter_netns(netns)


def receiver_main(args: argparse.Namespace) -> None:
    """Count datagrams in 1 ms bins of their kernel receive time (CLOCK_MONOTONIC); prints
    one JSON document when the sender has been quiet for a second."""
    _enter(args.netns)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((args.ip, ROCE_UDP_PORT))
    s.settimeout(args.first_timeout)
    rt_minus_mono = time.time_ns() - time.monotonic_ns()
    print("ready", flush=True)
    bins: dict[int, int] = {}
    n = 0
    first = last = 0
    # each sender numbers its datagrams (SEQ): one that arrives after a later one of its
    # source port was reordered on the way
    newest: dict[int, int] = {}
    reordered = 0
    try:
        while True:
            data, anc, _, addr = s.recvmsg(65535, 64)
            if len(data) >= SEQ.size:
                (seq,) = SEQ.unpack_from(data)
                if seq < newest.get(addr[1], -1):
                    reordered += 1
                else:
                    newest[addr[1]] = seq
            s.settimeout(1.0)
            t = 0
            for level, typ, raw in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", raw[:16])
                    t = sec * 1_000_000_000 + nsec - rt_minus_mono
            t = t or time.monotonic_ns()
            b = t // BIN_NS
            bins[b] = bins.get(b, 0) + len(data) + FRAME_OVERHEAD
            n += 1
            first = first or t
            last = t
    except TimeoutError:
        pass
    doc = {"packets": n, "first_ns": first, "last_ns": last, "bins": bins, "reordered": reordered}
    print(json.dumps(doc), flush=True)


def sender_main(args: argparse.Namespace) -> None:
    """Blocking UDP sender: the pacer's backpressure (socket buffer) sets its speed."""
    _enter(args.netns)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # A send buffer of ~450 frames (the kernel doubles the value) instead of the default ~90:
    # at 20 Mb/s that is 250 ms of backlog, so the pacer does not run dry while a loaded
    # machine leaves the sender unscheduled; still under the pacer queue's 1000 packets,
    # so the backlog waits in the socket, not in a queue that drops.
    s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, SENDER_SNDBUF)
    s.bind((args.ip, args.sport))
    payload = bytearray(max(args.payload, SEQ.size))
    dst = (args.dst, ROCE_UDP_PORT)
    end = time.monotonic() + args.duration
    n = 0
    while time.monotonic() < end:
        SEQ.pack_into(payload, 0, n)
        s.sendto(payload, dst)
        n += 1
    print(json.dumps({"sent": n}), flush=True)


@dataclass
class Reception:
    packets: int
    first_ns: int
    last_ns: int
    bins: dict[int, int]  # 1 ms bin (monotonic ns // 1e6) -> frame bytes
    reordered: int = 0  # datagrams that came after a later one of the same sender

    def rate_bps(self, start_ns: int, end_ns: int) -> float:
        b0, b1 = start_ns // BIN_NS, end_ns // BIN_NS
        total = sum(v for k, v in self.bins.items() if b0 <= k < b1)
        return total * 8 / ((b1 - b0) * BIN_NS / 1e9)


@contextlib.contextmanager
def udp_receiver(pair: NetnsPair, first_timeout_s: float = 10.0) -> Iterator[dict[str, Any]]:
    """Start the receiver in `pair.b`; the yielded dict gets a "reception" when it ends."""
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "testbed.emu.nicrig",
            "receiver",
            "--netns",
            pair.b,
            "--ip",
            pair.ip_b,
            "--first-timeout",
            str(first_timeout_s),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"receiver failed: {proc.stderr.read() if proc.stderr else ''}")
    box: dict[str, Any] = {}
    try:
        yield box
        out, err = proc.communicate(timeout=first_timeout_s + 30)
        doc = json.loads(out.strip().splitlines()[-1])
        box["reception"] = Reception(
            doc["packets"],
            doc["first_ns"],
            doc["last_ns"],
            {int(k): v for k, v in doc["bins"].items()},
            int(doc.get("reordered", 0)),
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def udp_sender(
    pair: NetnsPair, sport: int, duration_s: float, payload: int = UDP_PAYLOAD
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            PY,
            "-m",
            "testbed.emu.nicrig",
            "sender",
            "--netns",
            pair.a,
            "--ip",
            pair.ip_a,
            "--dst",
            pair.ip_b,
            "--sport",
            str(sport),
            "--duration",
            str(duration_s),
            "--payload",
            str(payload),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---- measurements -------------------------------------------------------------------------


def htb_drops(netns: str, dev: str) -> int:
    out = sh(["tc", "-n", netns, "-s", "class", "show", "dev", dev]).stdout
    total = 0
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Sent") and "dropped" in line:
            total += int(line.split("dropped")[1].split(",")[0])
    return total


def measure_udp_pacing(
    pair: NetnsPair, agent: AgentProcess, rate_bps: int, duration_s: float = 3.0, sport: int = 5000
) -> dict[str, float]:
    """Achieved rate of a UDP flow capped at `rate_bps` (law none), steady part of the run."""
    key = pair.udp_key(sport)
    agent.set_rate_law("none", key)
    agent.set_cap(key, rate_bps)
    drops0 = htb_drops(pair.a, pair.dev_a)
    with udp_receiver(pair) as box:
        snd = udp_sender(pair, sport, duration_s)
        snd.communicate(timeout=duration_s + 30)
    rx: Reception = box["reception"]
    # skip the first 0.5 s (HTB's initial burst, process start) and the last 0.2 s
    start = rx.first_ns + 500_000_000
    end = rx.last_ns - 200_000_000
    achieved = rx.rate_bps(start, end)
    return {
        "set_bps": rate_bps,
        "achieved_bps": round(achieved),
        "error": achieved / rate_bps - 1,
        "pacer_drops": htb_drops(pair.a, pair.dev_a) - drops0,
        "packets": rx.packets,
    }


def measure_tcp_pacing(
    pair: NetnsPair, agent: AgentProcess, rate_bps: int, duration_s: float = 4.0, cport: int = 40000
) -> dict[str, float]:
    """iperf3 goodput of a TCP flow capped at `rate_bps` (sock_ops SO_MAX_PACING_RATE)."""
    port = 5201 + cport % 1000
    key = (pair.ip_a, pair.ip_b, 6, cport, port)
    agent.set_cap(key, rate_bps)
    server = subprocess.Popen(
        ["ip", "netns", "exec", pair.b, "iperf3", "-s", "-1", "-p", str(port), "-B", pair.ip_b],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        out = sh(
            [
                "ip",
                "netns",
                "exec",
                pair.a,
                "iperf3",
                "-c",
                pair.ip_b,
                "-p",
                str(port),
                "--cport",
                str(cport),
                "-B",
                pair.ip_a,
                "-t",
                str(duration_s),
                "-O",
                "1",
                "-J",
            ]
        ).stdout
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
        if server.poll() is None:
            server.kill()
            server.wait()
    doc = json.loads(out)
    goodput = doc["end"]["sum_received"]["bits_per_second"]
    retrans = doc["end"]["sum_sent"].get("retransmits", 0)
    return {
        "set_bps": rate_bps,
        "goodput_bps": round(goodput),
        "error": goodput / rate_bps - 1,
        "retransmits": retrans,
        "pacer_drops": htb_drops(pair.a, pair.dev_a),
    }


def hold_latency_ms(
    rx: Reception,
    change_ns: int,
    new_rate_bps: int,
    window: int = 10,
    tolerance: float = 0.10,
    hold_bins: int = 60,
) -> float | None:
    """First bin (ms after the change) from which every `window`-bin mean, for `hold_bins`
    bins, is within `tolerance` of the new rate."""
    b0 = change_ns // BIN_NS
    last = rx.last_ns // BIN_NS
    per_bin = new_rate_bps / 8 / 1000  # bytes per 1 ms bin at the new rate

    def ok(start: int) -> bool:
        mean = sum(rx.bins.get(b, 0) for b in range(start, start + window)) / window
        return abs(mean / per_bin - 1) <= tolerance

    for t in range(0, 200):
        s = b0 + t
        if s + hold_bins + window > last:
            return None
        if all(ok(s + d) for d in range(hold_bins)):
            return float(t)
    return None


def measure_rate_change(
    pair: NetnsPair,
    agent: AgentProcess,
    before_bps: int,
    after_bps: int,
    via: str,
    sport: int = 5100,
    map_writer: Any = None,
) -> dict[str, Any]:
    """Change a running UDP flow's rate (via "grpc" SetRate or "map": a direct rate map write,
    picked up by the agent's sync loop) and measure when the receiver sees the new rate."""
    key = pair.udp_key(sport)
    agent.set_rate_law("none", key)
    agent.set_cap(key, before_bps)
    with udp_receiver(pair) as box:
        snd = udp_sender(pair, sport, 2.5)
        time.sleep(1.2)
        t_change = time.monotonic_ns()
        if via == "grpc":
            pb = agent.pb()
            agent.stub().SetCaps(
                pb.SetCapsRequest(caps=[pb.FlowCap(flow=agent.flow(key), cap_bps=after_bps)]),
                timeout=10,
            )
        else:
            # the XDP rate law's way: write the rate map; raise the cap first so the agent
            # does not bound the new rate
            if after_bps > before_bps:
                req = agent.pb().ClearCapsRequest(flows=[agent.flow(key)])
                agent.stub().ClearCaps(req, timeout=10)
                t_change = time.monotonic_ns()
            map_writer(key, after_bps)
        t_done = time.monotonic_ns()
        snd.communicate(timeout=30)
    rx: Reception = box["reception"]
    before = rx.rate_bps(t_change - 700_000_000, t_change - 100_000_000)
    after = rx.rate_bps(t_change + 200_000_000, rx.last_ns - 100_000_000)
    return {
        "via": via,
        "from_bps": before_bps,
        "to_bps": after_bps,
        "measured_before_bps": round(before),
        "measured_after_bps": round(after),
        "call_ms": round((t_done - t_change) / 1e6, 3),
        # from the moment the update was made (RPC returned / map written) ...
        "latency_ms": hold_latency_ms(rx, t_done, after_bps),
        # ... and from the moment it was asked for (includes the RPC itself)
        "latency_from_request_ms": hold_latency_ms(rx, t_change, after_bps),
    }


class RateMapWriter:
    """Writes a flow's rate into an agent's maps from outside the agent, as XDP's rate laws
    do: the rate map and the event that tells the agent (ebpf/rig_rate_write.c, run with
    BPF_PROG_TEST_RUN)."""

    def __init__(self, pin_dir: Path):
        from controller.nic.bpf.loader import NicBpf

        self.bpf = NicBpf(pin_dir, programs=("rig_rate_write",))

    def __call__(self, key: tuple[str, str, int, int, int], rate_bps: int) -> None:
        from controller.nic.bpf.loader import ORIGIN_AGENT, FlowKey, key_to_c
        from controller.nic.bpf.syscalls import prog_test_run

        t = self.bpf.table("xm_events")
        ev = t.Leaf()
        ev.key = key_to_c(FlowKey(*key), type(ev.key))
        ev.rate.rate_bps, ev.rate.origin = rate_bps, ORIGIN_AGENT
        run = prog_test_run(self.bpf.fd("rig_rate_write"), bytes(ev))
        if run.retval != 2:  # XDP_PASS
            raise RuntimeError(f"the rig's rate write returned {run.retval}")

    def close(self) -> None:
        self.bpf.close()


def _cli() -> None:
    ap = argparse.ArgumentParser(description="NIC rig traffic helpers (run inside namespaces)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("receiver")
    r.add_argument("--netns", required=True)
    r.add_argument("--ip", required=True)
    r.add_argument("--first-timeout", type=float, default=10.0)
    s = sub.add_parser("sender")
    s.add_argument("--netns", required=True)
    s.add_argument("--ip", required=True)
    s.add_argument("--dst", required=True)
    s.add_argument("--sport", type=int, required=True)
    s.add_argument("--duration", type=float, required=True)
    s.add_argument("--payload", type=int, default=UDP_PAYLOAD)
    args = ap.parse_args()
    if args.cmd == "receiver":
        receiver_main(args)
    else:
        sender_main(args)


if __name__ == "__main__":
    _cli()
