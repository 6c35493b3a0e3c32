"""The lossless mode on the simulated twin: dcqcn+pfc loses nothing on the incast where DCQCN
drops, the victim flow that shares the incast's upstream ports stalls under PFC, and a NIC
that keeps pausing is found and stopped by the PFC watchdog (and spreads without it).

These run on the static buffer (500 KB per queue, a static XOFF): the quick suite's loads fill
it, where the 51.2T part's shared buffer (the default) absorbs the quick incast without a
drop or, at the emulated scale, a pause (docs/fidelity.md; its own PFC in
test_shared_buffer.py)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from controller.proto import switch_pb2
from testbed.experiment.suite import STALL_FRAMES, RunRecord, SuiteConfig
from testbed.model import Scaling, model_with_buffer
from testbed.sim.fabric import SimFabric
from testbed.sim.suite import SimSuite
from testbed.topo import leafspine


def run(schemes: tuple[str, ...], scenario: str, **cfg: Any) -> tuple[SimFabric, list[RunRecord]]:
    spec = leafspine(2, 2, 4)
    scaling = Scaling(
        model=model_with_buffer("static"), scale=20_000, max_hops=spec.longest_path_switches()
    )
    fab = SimFabric(spec, scaling)
    suite_cfg = SuiteConfig(
        **{
            **SuiteConfig.quick().__dict__,
            "schemes": schemes,
            "scenarios": (scenario,),
            # every flow from line rate: the bursts that fill the queues PFC guards
            "proactive_start": False,
            **cfg,
        }
    )
    suite = SimSuite(fab, suite_cfg)
    records = suite.run()
    return suite.fab, records  # the last run's fabric (every run has a fresh one)


def test_dcqcn_pfc_loses_nothing_on_the_incast_where_dcqcn_drops() -> None:
    fab, (lossy, lossless) = run(("dcqcn", "dcqcn+pfc"), "incast")
    assert lossy.drops > 0 and lossy.pauses == 0
    assert lossless.drops == 0
    assert lossless.flows_completed == lossless.flows == 7
    assert lossless.pauses > 0 and lossless.paused_s > 0
    # the receiver's leaf paused its host ports and its spine ports; the senders' NICs held
    leaf1 = [p for p in lossless.pfc_by_port if p.startswith("leaf1:")]
    assert leaf1 and all(lossless.pfc_by_port[p]["xoff_sent"] > 0 for p in leaf1)
    nics = [p for p, d in lossless.pfc_by_port.items() if p.startswith("h")]
    assert nics and all(lossless.pfc_by_port[p]["paused_ns"] > 0 for p in nics)
    # SwitchAdmin reports the same counters
    q = fab.switches["leaf1"].admin.GetQueues(switch_pb2.GetQueuesRequest(), None)
    sent = {s.port: s.pfc_xoff_sent for s in q.queues}
    assert sum(sent.values()) == sum(lossless.pfc_by_port[p]["xoff_sent"] for p in leaf1)
    st = fab.switches["leaf1"].admin.GetStatus(switch_pb2.GetStatusRequest(), None)
    assert st.pfc_enabled


def test_the_victim_flow_stalls_behind_the_incast_under_pfc() -> None:
    _, (lossy, lossless) = run(("dcqcn", "dcqcn+pfc"), "victim")
    stall_s = STALL_FRAMES * Scaling(scale=20_000).frame_bytes * 8 / 20e6
    assert lossless.drops == 0
    # its own path is idle, yet pauses of the incast's upstream ports hold it
    assert lossless.victim_stalls is not None and lossless.victim_stalls >= 3
    assert lossless.victim_longest_gap_s is not None
    assert lossless.victim_longest_gap_s > 2 * stall_s
    assert lossy.victim_stalls is not None and lossy.victim_longest_gap_s is not None
    assert lossy.victim_longest_gap_s < lossless.victim_longest_gap_s


def test_a_pfc_storm_is_found_and_stopped_by_the_watchdog() -> None:
    _, (watched,) = run(("dcqcn+pfc",), "storm")
    _, (unwatched,) = run(("dcqcn+pfc",), "storm", pfc_watchdog=False)
    assert watched.pfc_storms == 1 and watched.pfc_restored == 1
    stuck = watched.pfc_by_port["leaf1:2"]  # the storming host's downlink
    assert stuck["storms"] == 1 and stuck["watchdog_drops"] > 0
    assert watched.flows_completed == watched.flows  # the stuck flow too, after the storm
    assert unwatched.pfc_storms == 0
    assert unwatched.victim_longest_gap_s is not None and watched.victim_longest_gap_s
    # without the watchdog the storm spreads and holds the victim for most of the storm
    assert unwatched.victim_longest_gap_s > 2 * watched.victim_longest_gap_s
    assert unwatched.paused_s > 2 * watched.paused_s


class Abort(Exception):
    pass


class Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Abort(code, details)


@pytest.mark.parametrize(
    "req",
    [
        switch_pb2.SetPfcRequest(enable=True, xoff_bytes=1000, xon_bytes=1000),
        switch_pb2.SetPfcRequest(enable=True, xoff_bytes=1000, xon_bytes=10, quanta=70000),
        switch_pb2.SetPfcRequest(enable=True, xoff_bytes=1000, priority_mask=1 << 8),
        switch_pb2.SetPfcRequest(
            enable=True, xoff_bytes=1000, watchdog_poll_ns=10, watchdog_action="alert"
        ),
    ],
)
def test_set_pfc_refuses_what_it_cannot_take(req: Any) -> None:
    spec = leafspine(2, 1, 2)
    scaling = Scaling(
        model=model_with_buffer("static"), scale=20_000, max_hops=spec.longest_path_switches()
    )
    fab = SimFabric(spec, scaling)
    admin = fab.switches["leaf1"].admin
    with pytest.raises(Abort) as exc:
        admin.SetPfc(req, Context())
    assert exc.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert fab.switches["leaf1"].sw.tm.pfc is None
