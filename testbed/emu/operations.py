"""The operations side of a scenario on the emulation: the faults of a --faults file injected
at their times from the scenario's start, when its first job starts sending (the runner's
`on_start`; Testbed.apply_fault: the switches' traffic managers
through SwitchAdmin, a switch process killed by its PID), then healed; what the controller
localized (its GetSuspects: every suspect named since the scenario started, with the time it
was first named) and the fail-overs it did. testbed/sim/operations.py is the twin's side.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import grpc

from controller.health import Thresholds
from testbed import faults

if TYPE_CHECKING:
    from testbed.emu.network import Testbed

log = logging.getLogger("xingmai.testbed.operations")

HEAL_TIMEOUT_S = 60.0  # until every switch is programmed again and nothing is routed around


class EmuOperations:
    def __init__(self, tb: Testbed):
        self.tb = tb
        self.faults: list[faults.Fault] = []
        self.t0 = time.time()
        self._started = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.applied: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def begin(self) -> None:
        """Before the scenario: nothing applied; its clock starts with its traffic (`start`)."""
        self.t0 = time.time()  # until the traffic starts
        self._started = False
        self.applied, self.errors = [], []
        self._stop.clear()

    def start(self, t: float) -> None:
        """The scenario's first job starts at unix time `t` (its workers took seconds to get
        ready): the faults' times and what the controller named count from then, as on the
        twin, where the job starts at the scenario's start. Later jobs of the scenario change
        nothing."""
        if self._started:
            return
        self._started = True
        self.t0 = t
        if self.faults:
            self._thread = threading.Thread(target=self._play, name="faults", daemon=True)
            self._thread.start()

    def _play(self) -> None:
        for f in faults.expand(self.faults):
            if self._stop.wait(max(0.0, self.t0 + f.at - time.time())):
                return  # the scenario ended first
            t = time.time()
            try:
                self.tb.apply_fault(f)
            except Exception as exc:  # a fault that fails is reported, the run goes on
                self.errors.append(f"{f.describe()}: {exc}")
                log.error("fault not applied: %s: %s", f.describe(), exc)
                continue
            self.applied.append({**f.to_dict(), "applied_at": round(t - self.t0, 3)})
            self.tb.say(f"fault at {t - self.t0:.2f} s: {f.describe()}")

    def end(self) -> dict[str, list[dict[str, Any]]]:
        """Stop injecting, read what the controller named since the start, heal."""
        self._stop.set()
        if self.faults and not self._started:
            self.errors.append("the scenario started no job: no fault applied")
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        suspects, failovers = self._controller_view()
        if self.applied:
            self.tb.heal()
            self._wait_healed()
        return {
            "faults": self.applied + [{"error": e} for e in self.errors],
            "suspects": suspects,
            "failovers": failovers,
        }

    def _controller_view(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        from controller.proto import controller_pb2 as pb

        try:
            resp = self.tb.controller_stub().GetSuspects(pb.GetSuspectsRequest(), timeout=5)
        except grpc.RpcError as exc:
            return [{"error": f"GetSuspects: {exc.code().name}"}], []
        events = [json.loads(e.json) for e in resp.events]
        # the controller outlives the run: a suspect it named before, cleared and named again
        # in this run was first named in the run at its first naming event since the start
        # (still named from before the start: at the start)
        first: dict[tuple[str, str], float] = {}
        for ev in events:  # in the order they happened
            if ev.get("event") == "named" and ev.get("t", 0) >= self.t0:
                first.setdefault((ev["element"], ev["kind"]), ev["t"])
        named = [
            (s, first.get((s.element, s.kind), max(s.first_named_unix, self.t0)))
            for s in resp.named
            if s.last_named_unix >= self.t0
        ]
        suspects = [
            {
                "element": s.element,
                "kind": s.kind,
                "score": round(s.score, 3),
                "first_named": round(t - self.t0, 3),
                "evidence": s.evidence,
            }
            for s, t in sorted(named, key=lambda st: (-st[0].score, st[1]))
        ]
        failovers = []
        for ev in events:
            if ev.get("event") == "failover" and ev.get("t", 0) >= self.t0:
                failovers.append(
                    {
                        "t": round(ev["t"] - self.t0, 3),
                        "dead_links": ev["dead_links"],
                        "took_s": ev["took_s"],
                        "ok": ev["ok"],
                    }
                )
        return suspects, failovers

    def _wait_healed(self) -> None:
        """The next scenario starts on a whole fabric: every switch programmed, no link
        routed around, no suspect left from this one, and none of this one's evidence in the
        controller's windows (a NIC slowed to 70 % in one scenario, never named in it, was
        named 0.3 s into the next from the 2 s before it)."""
        from controller.proto import controller_pb2 as pb

        stub = self.tb.controller_stub()
        th = Thresholds()
        quiet_from = time.monotonic() + max(th.window_s, th.vote_window_s)
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                st = stub.GetStatus(pb.GetStatusRequest(), timeout=2)
                sus = stub.GetSuspects(pb.GetSuspectsRequest(), timeout=2)
                healed = st.healthy and not sus.dead_links and not sus.suspects
                if healed and time.monotonic() >= quiet_from:
                    return  # (suspects clear once their evidence is gone, in seconds)
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        log.warning("the fabric did not heal within %.0f s", HEAL_TIMEOUT_S)
