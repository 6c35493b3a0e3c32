"""The `Controller` gRPC service (controller/proto/controller.proto) over the daemon's state."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

import grpc

from controller.config import RATE_LAW_PARAMS, RATE_LAWS, LawPolicy
from controller.proto import controller_pb2 as pb
from controller.proto import controller_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from controller.daemon import Daemon


def _nan(v: float | int | None) -> float:
    return math.nan if v is None else float(v)


def _policy_pb(p: LawPolicy) -> Any:
    return pb.Policy(rate_law=p.rate_law, params=dict(p.params))


def flow_label(key: tuple[str, str, int, int, int]) -> str:
    """A flow's name on the fabric page and in the metrics: src:sport>dst:dport/proto."""
    src, dst, proto, sport, dport = key
    return f"{src}:{sport}>{dst}:{dport}/{proto}"


def list_flows(d: Daemon, include_idle: bool = False) -> Any:
    """The flows the collector sees (recently reported) and those the agents report, with
    path, cap and rate: ListFlows' answer, and what the flow metrics export."""
    out = pb.ListFlowsResponse()
    now = time.monotonic()
    col, loop = d.collector, d.slowloop
    idle = d.cfg.policy.flow_idle_s
    seen = set()
    for rec in list(col.flows.values()):
        if not include_idle and now - rec.last_seen > idle:
            continue
        cap = loop.caps.get(rec.key)
        src, dst, proto, sport, dport = rec.key
        out.flows.add(
            key=pb.FlowKey(src_ip=src, dst_ip=dst, protocol=proto, src_port=sport, dst_port=dport),
            src_host=rec.src_host or "",
            dst_host=rec.dst_host or "",
            links=rec.links,
            bottleneck=(cap.bottleneck or "") if cap else "",
            cap_bps=cap.cap_bps if cap else 0.0,
            cap_pushed=cap.pushed if cap else False,
            rate_bps=cap.rate_bps if cap else 0.0,
            reports=rec.reports,
            idle_s=now - rec.last_seen,
            max_qocc_bytes=rec.max_qocc_bytes,
            latency_ns=rec.latency_ns,
            latency_max_ns=rec.latency_max_ns,
            path_changes=rec.path_changes,
            loss_reports=rec.loss_reports,
            reporter=rec.reporter,
        )
        seen.add(rec.key)
    for key, cap in list(loop.caps.items()):  # flows known from the agents only
        if key in seen:
            continue
        src, dst, proto, sport, dport = key
        out.flows.add(
            key=pb.FlowKey(src_ip=src, dst_ip=dst, protocol=proto, src_port=sport, dst_port=dport),
            src_host=cap.host,
            dst_host=d.topo.ip_owner.get(dst, ""),
            links=cap.links,
            bottleneck=cap.bottleneck or "",
            cap_bps=cap.cap_bps,
            cap_pushed=cap.pushed,
            rate_bps=cap.rate_bps,
        )
    return out


class ControllerService(pb_grpc.ControllerServicer):  # type: ignore[misc]
    def __init__(self, daemon: Daemon):
        self.d = daemon

    async def GetSuspects(self, request: Any, context: Any) -> Any:
        import json

        ops = self.d.operations

        def suspect(s: Any) -> Any:
            return pb.Suspect(
                element=s.element,
                kind=s.kind,
                score=s.score,
                evidence=s.evidence,
                first_named_unix=ops.unix(s.first_named),
                last_named_unix=ops.unix(s.last_named),
            )

        return pb.GetSuspectsResponse(
            suspects=[suspect(s) for s in ops.loc.ranked()],
            named=[suspect(s) for s in ops.loc.named.values()],
            dead_links=sorted(ops.dead),
            failovers=ops.failovers,
            events=[pb.OperationsEvent(json=json.dumps(e)) for e in ops.events],
        )

    async def GetTopology(self, request: Any, context: Any) -> Any:
        cfg, topo = self.d.cfg, self.d.topo
        out = pb.Topology(model=cfg.model.name, scale=cfg.model.scale)
        for s in cfg.switches:
            si = out.switches.add(
                name=s.name,
                grpc_addr=s.grpc_addr,
                device_id=s.device_id,
                node_id=s.node_id,
                kind=s.kind,
            )
            for p in s.ports:
                peer = topo.peer(s.name, p.port)
                si.ports.add(
                    port=p.port,
                    speed_bps=topo.port_speed_bps(s.name, p.port),
                    model_speed_bps=p.speed_gbps * 1e9,
                    peer=str(peer) if peer else "",
                )
        for h in cfg.hosts:
            hi = out.hosts.add(name=h.name, agent=h.agent or "", int_mode=h.int_mode)
            for n in h.nics:
                att = topo.links.get(f"{h.name}:{n.name}")
                hi.nics.add(name=n.name, ip=n.ip, mac=n.mac, attached_to=str(att.rx) if att else "")
        for name, dl in sorted(topo.links.items()):
            out.links.add(
                name=name, to=str(dl.rx), capacity_bps=dl.capacity_bps, **{"from": str(dl.tx)}
            )
        return out

    async def ListSwitches(self, request: Any, context: Any) -> Any:
        out = pb.ListSwitchesResponse()
        for name, sess in self.d.sessions.items():
            h = sess.health
            out.switches.add(
                name=name,
                grpc_addr=sess.sw.grpc_addr,
                connected=h.connected,
                primary=h.primary,
                programmed=h.programmed,
                connects=h.connects,
                last_error=h.last_error,
                entries=h.entries,
                written=h.written,
                write_failures=h.write_failures,
                last_reconcile_unix=h.last_reconcile,
                queues_set=h.queues_set,
                packet_ins=dict(h.packet_ins),
            )
        return out

    async def ListFlows(self, request: Any, context: Any) -> Any:
        return list_flows(self.d, request.include_idle)

    async def GetTelemetry(self, request: Any, context: Any) -> Any:
        col = self.d.collector
        out = pb.TelemetrySnapshot(
            datagrams=col.datagrams,
            reports=col.reports,
            errors=dict(col.errors),
            flows=len(col.flows),
            flows_evicted=col.flows_evicted,
            punted=col.punted,
            drop_reports=col.drop_reports,
            loss_events=len(col.loss_events),
        )
        for n in col.node_summary():
            out.switches.add(
                node_id=n["node_id"],
                switch=n["name"],
                received=n["received"],
                lost=n["lost"],
                reordered=n["reordered"],
                duplicates=n["duplicates"],
                resets=n["resets"],
                last_seq=n["last_seq"],
            )
        k = request.max_points
        for name, lt in sorted(col.links.items()):
            ls = out.links.add(
                name=name,
                capacity_bps=lt.capacity_bps,
                qocc_bytes=-1 if lt.qocc_bytes is None else lt.qocc_bytes,
                qocc_max_bytes=lt.qocc_max_bytes,
                latency_ns=-1 if lt.latency_ns is None else lt.latency_ns,
                util_int=-1.0 if lt.util_int is None else lt.util_int,
                util_counter=-1.0 if lt.util_counter is None else lt.util_counter,
                samples=lt.samples,
                drops_reported=lt.drops_reported,
            )
            if k:
                for t, q, lat, u in list(lt.int_series)[-k:]:
                    ls.int_series.add(
                        t_unix=t, qocc_bytes=_nan(q), latency_ns=_nan(lat), util=_nan(u)
                    )
                for t, _bps, u in list(lt.counter_series)[-k:]:
                    ls.counter_series.add(
                        t_unix=t, qocc_bytes=math.nan, latency_ns=math.nan, util=u
                    )
        return out

    async def SetPolicy(self, request: Any, context: Any) -> Any:
        law = request.policy.rate_law
        if law not in RATE_LAWS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"rate_law must be one of {', '.join(RATE_LAWS)}, got {law!r}",
            )
        host = request.host
        policy = self.d.slowloop.policy
        if host and host not in self.d.slowloop.agents:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no host {host!r} with an agent")
        if request.HasField("eta") and not 0 < request.eta <= 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "eta must be in (0, 1]")
        for k, v in request.policy.params.items():
            if k not in RATE_LAW_PARAMS[law]:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{law} has no parameter {k!r}"
                )
            if not math.isfinite(v) or v < 0:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"parameter {k} must be a finite number >= 0"
                )
        new = LawPolicy(law, dict(request.policy.params))
        if host:
            hosts = dict(policy.hosts)
            hosts[host] = new
            policy = dataclasses.replace(policy, hosts=hosts)
        else:
            policy = dataclasses.replace(policy, default=new)
        if request.HasField("eta"):
            policy = dataclasses.replace(policy, eta=request.eta)
        if request.HasField("auto_tune"):
            policy = dataclasses.replace(policy, auto_tune=request.auto_tune)
        self.d.slowloop.set_policy(policy)
        await self.d.slowloop.step()  # push now, and say who took it
        resp = pb.SetPolicyResponse()
        for h, st in self.d.slowloop.state.items():
            if host and h != host:
                continue
            if st.policy_pushed == self.d.slowloop.host_policy(h):
                resp.pushed_to.append(h)
            else:
                resp.failed.append(h)
        return resp

    async def GetPolicy(self, request: Any, context: Any) -> Any:
        p = self.d.slowloop.policy
        return pb.GetPolicyResponse(
            default=_policy_pb(p.default),
            hosts={h: _policy_pb(v) for h, v in p.hosts.items()},
            eta=p.eta,
            auto_tune=p.auto_tune,
            interval_s=p.interval_s,
        )

    async def GetStatus(self, request: Any, context: Any) -> Any:
        d = self.d
        hs = [s.health for s in d.sessions.values()]
        states = d.slowloop.state.values()
        return pb.GetStatusResponse(
            name=d.cfg.controller.name,
            uptime_s=time.monotonic() - d.started,
            switches=len(hs),
            switches_connected=sum(h.connected for h in hs),
            switches_primary=sum(h.primary for h in hs),
            agents=len(d.slowloop.agents),
            agents_reachable=sum(st.reachable for st in states),
            slow_loop_runs=d.slowloop.runs,
            config_reloads=d.reloads,
            config_reload_failures=d.reload_failures,
            config_file=str(d.config_path),
            healthy=d.healthy(),
        )
