"""The daemon's operations loop: poll every switch's health and counters, localize faults
(controller/health.py), and fail over: a dead link or switch leaves the ECMP groups that use it
(the routes are re-computed without it and every live switch is reconciled: only the
difference is written), and comes back when it is alive again.

What one poll reads from a switch: SwitchAdmin GetHealth, GetStatus's answer (the switch is
alive; each port's link status) and GetQueues' (each port's latency monitor) in one call, and
the P4 port counters `port_tx`/`port_rx` of the configured ports over P4Runtime. bmv2 has
no SwitchAdmin: its liveness is its P4Runtime channel and its counters; its ports' status is
not read. Every `NIC_POLL_S` it also reads each host agent's NIC counters (GetNicCounters:
the slow-NIC rule) and, with `controller.probe_interval_s` set, its prober's tallies
(GetProbes: the probe rule); an agent that does not answer is skipped (counted in
`nic_polls_failed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import finsy as fy
import grpc

from controller import p4names as P
from controller.health import (
    Localizer,
    NicSample,
    PortSample,
    Suspect,
    SwitchSample,
    probe_tallies,
)
from controller.slowloop import AgentError
from controller.topology import Topology

if TYPE_CHECKING:
    from controller.daemon import Daemon
    from controller.switches import SwitchSession

log = logging.getLogger("xingmai.controller.operations")

POLL_S = 0.1  # seconds between polls of every switch
NIC_POLL_S = 0.5  # seconds between polls of every host agent's NIC counters


def _cancelling() -> bool:
    """Whether the running task is being cancelled (a CancelledError raised in it is then
    its own stop; otherwise a call it awaited was cancelled by someone else)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass(frozen=True)
class PollFailed:
    """Why a switch's poll gave no sample: `refused` (its channel is down, or a call was
    refused or failed: it is gone) or late (a call timed out); `answered` if some call of the
    poll was answered (it is alive)."""

    reason: str
    refused: bool
    answered: bool = False


class Operations:
    def __init__(self, daemon: Daemon, poll_s: float = POLL_S):
        self.d = daemon
        self.poll_s = poll_s
        self.loc = Localizer(daemon.topo, daemon.cfg.model.mean_packet_bytes, on_event=self._event)
        self.dead: frozenset[str] = frozenset()
        self.failovers = 0
        self._losses_seen = 0  # the collector's loss events given to the localizer
        self.links_removed = 0  # links taken out of the routes (reroutes), over all fail-overs
        self.links_restored = 0
        self.rounds_late = 0  # poll rounds that no switch answered whole in time (skipped)
        self.nic_polls_failed = 0  # agents' GetNicCounters that failed or timed out
        self.probe_polls_failed = 0  # agents' GetProbes that failed or timed out
        self.rounds_failed = 0  # rounds that raised (a bug): logged with their traceback
        self.rounds = 0  # rounds run, whatever their end: a loop that stopped stops counting
        self._late_streak = 0
        self._last_round = time.monotonic()  # when the last poll round ended
        # a poll's two SwitchAdmin calls and its counter read, each at most a second, and slack
        self.poll_limit_s = 3 * min(1.0, daemon.cfg.controller.rpc_timeout_s) + 0.5
        self.failover_writes_s: list[float] = []  # how long each fail-over's writes took
        self.events: list[dict[str, Any]] = []  # named/cleared/failover, bounded
        self._channels: dict[str, grpc.aio.Channel] = {}
        # why each switch's last poll failed (None: it answered), logged when it changes
        self._poll_failed: dict[str, str | None] = {}
        # the localizer's clock is monotonic; suspects are reported in unix time
        self._unix_offset = time.time() - time.monotonic()

    def unix(self, t: float) -> float:
        return t + self._unix_offset

    def _event(self, what: str, s: Suspect) -> None:
        self._log_event(
            {
                "event": what,
                "element": s.element,
                "kind": s.kind,
                "score": round(s.score, 3),
                "t": round(self.unix(s.last_named), 3),
                "evidence": s.evidence,
            }
        )

    def _log_event(self, ev: dict[str, Any]) -> None:
        self.events.append(ev)
        del self.events[:-1000]

    async def run(self) -> None:
        # the agents on a loop of their own: a switch poll that waits for a late switch
        # (up to a second) must not space out the NICs' readings
        nics = asyncio.create_task(self._nic_loop())
        try:
            while True:
                await asyncio.sleep(self.poll_s)
                self.rounds += 1
                try:
                    await self.tick()
                except (grpc.RpcError, fy.P4ClientError, OSError) as exc:
                    log.warning("operations poll failed", extra={"error": str(exc)})
                except asyncio.CancelledError:
                    if _cancelling():
                        raise  # this loop is being stopped
                    # a call the round awaited was cancelled under it (grpc.aio cancels the
                    # calls on a channel that closes: a switch's session ending), not this loop
                    self.rounds_failed += 1
                    log.exception("operations round failed: a call was cancelled under it")
                except Exception:  # a bug in one round must not end localization and fail-over
                    self.rounds_failed += 1
                    log.exception("operations round failed")
        finally:
            nics.cancel()
            for ch in self._channels.values():
                await ch.close()

    async def _nic_loop(self) -> None:
        while True:
            await asyncio.sleep(NIC_POLL_S)
            try:
                await self.poll_nics()
                if self.d.cfg.controller.probe_interval_s > 0:
                    await self.poll_probes()
            except Exception:  # a bug in one round must not end the NICs' readings
                log.exception("reading the agents' NIC counters failed")

    async def tick(self) -> None:
        sessions = list(self.d.sessions.values())
        if self.loc.topo.cfg is not self.d.cfg:  # a reload: a new fabric to watch
            self.loc = Localizer(
                self.d.topo, self.d.cfg.model.mean_packet_bytes, on_event=self._event
            )
        results = await asyncio.gather(*(self._poll_within(s) for s in sessions))
        now = time.monotonic()
        failed = [r for r in results if isinstance(r, PollFailed)]
        if failed and len(failed) == len(results) and not any(f.refused for f in failed):
            # No switch gave its sample in time and none refused: the controller was late (its
            # loop or its CPU), or the box starved every switch's process at once (2 cores
            # under load stalled 5 s: the leaves timed out, the spines answered part), not
            # every switch failing together. Not evidence against any of them; those that
            # answered part of their poll are alive.
            if self._late_streak == 0:
                log.warning(
                    "no switch answered a poll in time: this controller or its box was late"
                )
            self.loc.paused(now - self._last_round)
            for s, result in zip(sessions, results, strict=True):
                if isinstance(result, PollFailed) and result.answered:
                    self.loc.alive(s.name, now)
            self._last_round = now
            self.rounds_late += 1
            self._late_streak += 1
            return
        if self._late_streak:
            log.info("polls answered again", extra={"rounds_late": self._late_streak})
            self._late_streak = 0
        self._last_round = now
        for s, result in zip(sessions, results, strict=True):
            why = result.reason if isinstance(result, PollFailed) else None
            if why != self._poll_failed.get(s.name):
                self._poll_failed[s.name] = why
                if why is None:
                    log.info("switch answers polls again", extra={"switch": s.name})
                else:
                    log.warning("switch poll failed", extra={"switch": s.name, "error": why})
            if isinstance(result, SwitchSample):
                self.loc.observe(result)
                # it answered this round: alive now, whenever its sample was taken (a loop
                # that stalled after its answer, before the others', is the controller late)
                self.loc.alive(s.name, now)
            elif result.refused:
                self.loc.unreachable(s.name, now)
            elif result.answered:
                self.loc.alive(s.name, now)
            # a poll that timed out, alone: the switch is late; silent long enough, unreachable
        losses, self._losses_seen = self.d.collector.losses_since(self._losses_seen)
        for loss in losses:
            self.loc.path_loss(loss)
        if self.d.cfg.controller.int_latency_monitor:
            self.loc.int_waits(now, self.d.collector.int_waits())
        self.loc.evaluate(now)
        dead = frozenset(self.loc.dead_links())
        if dead != self.dead or any(s.topo.down != dead for s in sessions):
            await self._failover(dead, sessions)

    async def poll_nics(self) -> None:
        """Every host agent's NIC counters, to the localizer (the slow-NIC rule)."""
        agents = list(self.d.agents.values())
        timeout = min(1.0, self.d.cfg.controller.rpc_timeout_s)
        results = await asyncio.gather(
            *(asyncio.wait_for(a.nic_counters(), timeout) for a in agents),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, NicSample):
                self.loc.nic(r)
            elif isinstance(r, AgentError | TimeoutError | OSError):
                self.nic_polls_failed += 1
            else:
                raise r

    async def poll_probes(self) -> None:
        """Every agent's probe receivers' tallies, to the localizer (the probe rule)."""
        agents = list(self.d.agents.values())
        timeout = min(1.0, self.d.cfg.controller.rpc_timeout_s)
        results = await asyncio.gather(
            *(asyncio.wait_for(a.probe_flows(), timeout) for a in agents),
            return_exceptions=True,
        )
        owner = self.d.topo.ip_owner
        for a, r in zip(agents, results, strict=True):
            if isinstance(r, tuple):
                t, flows = r
                self.loc.probes(probe_tallies(t, a.host, flows, owner, self.d.collector.path_links))
            elif isinstance(r, AgentError | TimeoutError | OSError):
                self.probe_polls_failed += 1
            else:
                raise r

    def _channel(self, s: SwitchSession) -> grpc.aio.Channel:
        ch = self._channels.get(s.name)
        if ch is None:
            ch = self._channels[s.name] = grpc.aio.insecure_channel(s.sw.grpc_addr)
        return ch

    async def _poll_within(self, s: SwitchSession) -> SwitchSample | PollFailed:
        """`_poll`, bounded as a whole: each of its calls has a deadline, but a loop that
        waits on one poll that never returns stops localizing every switch."""
        try:
            async with asyncio.timeout(self.poll_limit_s):
                return await self._poll(s)
        except TimeoutError:
            return PollFailed(f"no answer within {self.poll_limit_s:g} s", refused=False)

    async def _poll(self, s: SwitchSession) -> SwitchSample | PollFailed:
        """The switch's sample, or why it gave none."""
        from controller.proto import switch_pb2, switch_pb2_grpc

        ports = {p.port: {} for p in s.sw.ports}  # type: dict[int, dict[str, Any]]
        timeout = min(1.0, self.d.cfg.controller.rpc_timeout_s)
        if s.sw.kind == "builtin" and self.d.cfg.controller.p4runtime_tls is None:
            stub = switch_pb2_grpc.SwitchAdminStub(self._channel(s))
            try:
                got = await stub.GetHealth(switch_pb2.GetHealthRequest(), timeout=timeout)
            except grpc.RpcError as exc:
                code = exc.code()
                late = code == grpc.StatusCode.DEADLINE_EXCEEDED
                return PollFailed(f"SwitchAdmin: {code.name}", refused=not late)
            answered = True
            st, qs = got.status, got.queues
            for p in st.ports:
                if p.port in ports:
                    ports[p.port].update(up=not p.down, rx_errors=p.rx_errors)
            for q in qs.queues:
                if q.port in ports:
                    ports[q.port].update(
                        departures=q.departures,
                        wait_ns=q.wait_ns,
                        expected_wait_ns=q.expected_wait_ns,
                        paused_ns=q.pfc_paused_ns,
                    )
        else:
            answered = False
        sw = s.switch
        if sw is None or not s.health.connected:
            return PollFailed("P4Runtime channel down", refused=True, answered=answered)
        reader: Any = sw
        try:
            async with asyncio.timeout(timeout):
                # the channel's own state, read right before the read (our session's flag
                # follows it a moment later): a read on a channel gone down fails finsy's
                # assert, which once ended this loop at a switch killed mid-poll
                if not sw.is_up:
                    return PollFailed("P4Runtime channel down", refused=True, answered=answered)
                # both counters in one Read: each RPC costs the switch's gRPC server about
                # half a millisecond of CPU, ten times a second
                keys = {P.CTR_PORT_TX: "tx_packets", P.CTR_PORT_RX: "rx_packets"}
                wanted = [fy.P4CounterEntry(ctr, index=p) for ctr in keys for p in ports]
                async for ent in reader.read(wanted):
                    if ent.data is not None and ent.index in ports:
                        key = keys.get(sw.p4info.counters[ent.counter_id].name)
                        if key is not None:
                            ports[ent.index][key] = ent.data.packet_count
        except TimeoutError:
            why = f"P4Runtime counter read: no answer within {timeout:g} s"
            return PollFailed(why, refused=False, answered=answered)
        except asyncio.CancelledError:
            if _cancelling():
                raise
            # finsy closed the session's channel (the switch went away) while the read was
            # in flight: grpc.aio cancels the calls of a channel that closes
            why = "P4Runtime counter read: the session's channel closed under it"
            return PollFailed(why, refused=True, answered=answered)
        except (fy.P4ClientError, grpc.RpcError) as exc:
            why = f"P4Runtime counter read: {type(exc).__name__}: {exc}"
            return PollFailed(why, refused=True, answered=answered)
        return SwitchSample(
            s.name, time.monotonic(), {p: PortSample(p, **v) for p, v in ports.items()}
        )

    async def _failover(self, dead: frozenset[str], sessions: list[SwitchSession]) -> None:
        t0 = time.monotonic()
        added, removed = dead - self.dead, self.dead - dead
        topo = Topology(self.d.cfg, down=dead)
        alive = []
        for s in sessions:
            s.topo = topo
            if s.switch is not None and s.health.connected:
                alive.append(s)
        ok = await asyncio.gather(*(s.reconcile() for s in alive))
        took = time.monotonic() - t0
        self.dead = dead
        self.failovers += 1
        self.links_removed += len(added)
        self.links_restored += len(removed)
        self.failover_writes_s.append(took)
        del self.failover_writes_s[:-100]
        ev = {
            "event": "failover",
            "t": round(self.unix(t0), 3),
            "dead_links": sorted(dead),
            "removed": sorted(added),
            "restored": sorted(removed),
            "switches": [s.name for s in alive],
            "ok": all(ok),
            "took_s": round(took, 3),
        }
        self._log_event(ev)
        log.warning(
            "fail-over: routes re-computed", extra={k: v for k, v in ev.items() if k != "event"}
        )
