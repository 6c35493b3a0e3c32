"""`make cli`: Mininet's CLI on the booted fabric, with the controller and the agents running,
and the project's own commands:

    flows [HOST]                 flows of the hosts' NICs: rate, who set it, CC state
    int HOST                     the INT stack of the last INT packet that reached HOST
    queue SWITCH[:PORT] [RATE]   show a switch's queues, or set a port's drain rate (e.g. 5M)
    policy [LAW]                 show or set every host's rate law (through the controller)
    scenario NAME                one scenario with the current law, summarised (incast,
                                 allreduce, alltoall, twojob, websearch)
    status                       the controller's view: switches, agents, slow loop, and
                                 where the fabric page and Prometheus are
    fault link SW:PORT down|up|loss 1%|rate 25%|delay 2ms    inject or remove a link fault
    fault switch SW kill|slow [5ms]|up                      a switch fault
    suspects                     the controller's ranked suspects, with their evidence

Mininet's own commands work as usual (`h1 ping h5`, `nodes`, `net`, `links`, ...), except
`iperf`/`iperfudp`: they run `killall -9 iperf`, which would reach every iperf on the machine.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from mininet.cli import CLI

from testbed import faults
from testbed.emu.network import Testbed, TestbedError
from testbed.emu.suite import EmuSuite
from testbed.experiment.suite import SCENARIOS, SuiteConfig, one_line
from testbed.model import fmt_rate


def _rate(text: str) -> float:
    from controller.nic.agent.main import parse_rate

    return float(parse_rate(text))


class TestbedCLI(CLI):  # type: ignore[misc]
    prompt = "xingmai> "

    def __init__(self, tb: Testbed, suite: EmuSuite, **kw: Any):
        self.tb = tb
        self.suite = suite  # its INT sampler watches every host from the start
        super().__init__(tb.net, **kw)

    # ---- Mininet commands that are unsafe on a shared machine ----

    def do_iperf(self, line: str) -> None:
        """Disabled: Mininet's iperf runs `killall -9 iperf` (every iperf on the machine).
        Run iperf3 by hand instead: h5 iperf3 -s -D; h1 iperf3 -c h5 -u -b 5M"""
        print(
            "iperf is disabled here (Mininet kills every iperf on the machine); use "
            "`h5 iperf3 -s -D` then `h1 iperf3 -c h5 -u -b 5M -t 5`"
        )

    do_iperfudp = do_iperf

    # ---- project commands ----

    def do_flows(self, line: str) -> None:
        """flows [HOST]: every flow the hosts' NICs know, with its rate and CC state."""
        from controller.proto import agent_pb2

        hosts = line.split() or list(self.tb.agents)
        law_names = {0: "?", 1: "none", 2: "tita", 3: "dcqcn", 4: "hpcc", 5: "timely", 6: "swift"}
        print(
            f"{'host':<5} {'flow':<40} {'rate':>12} {'by':<6} {'law':<6} {'U':>5} "
            f"{'tx MB':>8} {'idle s':>7}"
        )
        for h in hosts:
            if h not in self.tb.agents:
                print(f"no host {h!r}")
                continue
            try:
                resp = self.tb.agent_stub(h).ListFlows(agent_pb2.ListFlowsRequest(), timeout=3)
            except grpc.RpcError as exc:
                print(f"{h}: agent did not answer ({exc.code().name})")
                continue
            for f in resp.flows:
                k = f.flow
                name = f"{k.src_ip}:{k.src_port}->{k.dst_ip}:{k.dst_port}/{k.protocol}"
                util = f"{f.cc.utilization:.2f}" if f.law == 2 and f.cc.updates else "-"
                print(
                    f"{h:<5} {name:<40} {fmt_rate(f.rate_bps):>12} {f.rate_origin:<6} "
                    f"{law_names.get(f.law, '?'):<6} {util:>5} {f.tx_bytes / 1e6:>8.2f} "
                    f"{f.idle_s:>7.1f}"
                )

    def do_int(self, line: str) -> None:
        """int HOST: the INT stack of the last INT packet that arrived at HOST."""
        name = line.strip()
        if name not in self.tb.agents:
            print("usage: int HOST")
            return
        ip = self.tb.spec.host(name).nics[0].ip
        last = self.suite.sampler.last.get(ip) if self.suite.sampler else None
        if last is None:
            print(
                f"no INT packet has reached {name} yet: INT rides on the transport's data "
                f"packets (`scenario incast` sends to {self.tb.spec.hosts[0].name})"
            )
            return
        t, flow, hops = last
        print(
            f"INT of the packet {flow[0]}:{flow[2]} -> {flow[1]}, {time.monotonic() - t:.1f} "
            f"s ago, {len(hops)} hop records, newest first:"
        )
        for h in hops:
            lat = "-" if h.latency_ns is None else f"{h.latency_ns / 1e3:.0f} us"
            util = "-" if h.tx_util_ppm is None else f"{h.tx_util_ppm / 1e4:.1f} %"
            print(
                f"  {h.link:<10} queue {h.qocc_bytes:>7} B  hop latency {lat:>9}  "
                f"tx utilisation {util}"
            )

    def do_fault(self, line: str) -> None:
        """fault link SW:PORT down|up|loss P%|rate P%|delay Tms; fault switch SW kill|slow
        [Tms]|up: inject a fault (or remove it with up)."""
        try:
            f = faults.parse_command(self.tb.spec, line)
            self.tb.apply_fault(f)
        except (faults.FaultError, TestbedError) as exc:
            print(exc)
            return
        print(f"fault: {f.describe()}")

    def do_queue(self, line: str) -> None:
        """queue SWITCH[:PORT] [RATE]: show SWITCH's queues, or set PORT's drain rate."""
        args = line.split()
        if not args:
            print("usage: queue SWITCH[:PORT] [RATE]")
            return
        name, _, port = args[0].partition(":")
        try:
            sw = self.tb.switch_node(name)
        except (KeyError, AssertionError):
            print(f"no switch {name!r}")
            return
        if len(args) == 1:
            self._show_queues(sw)
            return
        if not port.isdigit():
            print("give the port: queue SWITCH:PORT RATE")
            return
        rate = _rate(args[1])
        try:
            self.tb.set_queue_rate(name, int(port), rate)
        except TestbedError as exc:
            print(exc)
            return
        print(
            f"{name}:{port} drains at {fmt_rate(rate)} (the controller sets the model's "
            "rate again when it re-programs the switch)"
        )

    def _show_queues(self, sw: Any) -> None:
        if sw.kind != "builtin":
            print("bmv2 does not report queue occupancy; `int HOST` shows it from INT")
            return
        from controller.proto import switch_pb2, switch_pb2_grpc

        with grpc.insecure_channel(sw.grpc_addr) as ch:
            qs = (
                switch_pb2_grpc.SwitchAdminStub(ch)
                .GetQueues(switch_pb2.GetQueuesRequest(), timeout=3)
                .queues
            )
        print(f"{'port':>4} {'rate':>12} {'depth':>9} {'now':>8} {'max':>8} {'dropped':>8}")
        for q in qs:
            print(
                f"{q.port:>4} {fmt_rate(q.rate_bps):>12} {q.depth_bytes:>9} "
                f"{q.occupancy_bytes:>8} {q.max_occupancy_bytes:>8} {q.dropped:>8}"
            )

    def do_policy(self, line: str) -> None:
        """policy [LAW]: show or set every host's rate law (via the controller)."""
        from controller.proto import controller_pb2 as pb

        law = line.strip()
        if law:
            try:
                hosts = self.tb.set_policy(law)
            except (ValueError, TestbedError, grpc.RpcError) as exc:
                print(exc)
                return
            print(f"{law} set on {len(hosts)} hosts")
            return
        p = self.tb.controller_stub().GetPolicy(pb.GetPolicyRequest(), timeout=3)
        print(
            f"default: {p.default.rate_law} {dict(p.default.params)}; eta {p.eta}; "
            f"per host: {dict((h, v.rate_law) for h, v in p.hosts.items()) or 'none'}"
        )

    def do_scenario(self, line: str) -> None:
        """scenario NAME (incast|allreduce|alltoall|twojob|websearch): one run with the
        current law, summarised."""
        name = line.strip()
        if name not in SCENARIOS:
            print(f"usage: scenario {'|'.join(SCENARIOS)}")
            return
        from controller.proto import controller_pb2 as pb

        law = self.tb.controller_stub().GetPolicy(pb.GetPolicyRequest(), timeout=3)
        if not self.suite.base_rtt_s:
            self.suite.base_rtt_s = self.suite._measure_base_rtt()
            self.suite.tita_t_s = self.tb.scaling.base_rtt_s  # what the agents started with
        rec = self.suite.run_one(law.default.rate_law, name)
        print(f"{name} under {law.default.rate_law}: {one_line(rec)}")

    def do_status(self, line: str) -> None:
        """status: the controller's view of the switches and agents."""
        from controller.proto import controller_pb2 as pb

        stub = self.tb.controller_stub()
        st = stub.GetStatus(pb.GetStatusRequest(), timeout=3)
        print(
            f"controller: healthy={st.healthy} switches {st.switches_connected}/"
            f"{st.switches} connected, agents {st.agents_reachable}/{st.agents} reachable, "
            f"slow loop runs {st.slow_loop_runs}"
        )
        for s in stub.ListSwitches(pb.ListSwitchesRequest(), timeout=3).switches:
            print(
                f"  {s.name:<8} {s.grpc_addr:<22} connected={s.connected} "
                f"programmed={s.programmed} queues_set={s.queues_set} {s.last_error}"
            )
        if self.tb.web_url:
            print(f"fabric page: {self.tb.web_url}")
        if self.tb.prometheus is not None:
            print(
                f"prometheus:  {self.tb.prometheus.url}/ (targets: "
                f"{self.tb.prometheus.url}/targets)"
            )

    def do_EOF(self, line: str) -> bool:  # noqa: N802 - cmd's name
        print()
        return True


def run_cli(tb: Testbed) -> None:
    print(__doc__.split("\n\n")[1])
    with EmuSuite(tb, SuiteConfig.quick()) as suite:
        TestbedCLI(tb, suite)
