"""The packet replication engine: multicast groups and clone sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from finsy.proto import p4r

from testbed.switch.p4runtime.codec import (
    CLONE_MGID_BASE,
    MAX_CLONE_SESSIONS,
    MAX_COS,
    MAX_REPLICAS,
    MAX_RID,
    RpcError,
)
from testbed.switch.v1model import CloneSession

if TYPE_CHECKING:
    from testbed.switch.p4runtime.service import P4RuntimeService

U = p4r.Update
DEFAULT_PORT_BITS = 9  # v1model's egress_spec when no program is loaded


class Replication:
    def __init__(self, svc: P4RuntimeService):
        self.svc = svc

    def _max_port(self) -> int:
        std = self.svc.switch.std
        return int(std.m_egress_spec) if std is not None else (1 << DEFAULT_PORT_BITS) - 1

    def replicas(self, replicas: Any) -> list[tuple[int, int]]:
        """(port, instance) pairs, each a port the switch has and an instance v1model
        carries; no pair twice (P4Runtime: replicas are a set)."""
        if len(replicas) > MAX_REPLICAS:
            raise RpcError("RESOURCE_EXHAUSTED", f"at most {MAX_REPLICAS} replicas")
        max_port = self._max_port()
        out: list[tuple[int, int]] = []
        for r in replicas:
            if r.WhichOneof("port_kind") == "port":
                if not r.port:
                    raise RpcError("INVALID_ARGUMENT", "replica port: empty bytes")
                port = int.from_bytes(r.port, "big")
            else:
                port = int(r.egress_port)
            if port > max_port:
                raise RpcError("OUT_OF_RANGE", f"replica port {port} is not in [0, {max_port}]")
            if r.instance > MAX_RID:
                raise RpcError(
                    "OUT_OF_RANGE", f"replica instance {r.instance} is not in [0, {MAX_RID}]"
                )
            out.append((port, r.instance))
        if len(set(out)) != len(out):
            raise RpcError("INVALID_ARGUMENT", "a replica (port, instance) is given twice")
        return out

    def write(self, utype: int, pre: p4r.PacketReplicationEngineEntry) -> None:
        which = pre.WhichOneof("type")
        sw = self.svc.switch
        if which == "multicast_group_entry":
            g = pre.multicast_group_entry
            gid = g.multicast_group_id
            if gid == 0 or gid >= CLONE_MGID_BASE:
                raise RpcError("OUT_OF_RANGE", f"multicast group id {gid} not in [1, 65535]")
            exists = gid in sw.mcast_groups
            if utype == U.INSERT and exists:
                raise RpcError("ALREADY_EXISTS", f"multicast group {gid} exists")
            if utype != U.INSERT and not exists:
                raise RpcError("NOT_FOUND", f"no multicast group {gid}")
            if utype == U.DELETE:
                del sw.mcast_groups[gid]
            else:
                sw.mcast_groups[gid] = self.replicas(g.replicas)
        elif which == "clone_session_entry":
            c = pre.clone_session_entry
            sid = c.session_id
            exists = sid in sw.clone_sessions
            if utype == U.INSERT and exists:
                raise RpcError("ALREADY_EXISTS", f"clone session {sid} exists")
            if utype != U.INSERT and not exists:
                raise RpcError("NOT_FOUND", f"no clone session {sid}")
            if utype == U.DELETE:
                sw.mcast_groups.pop(CLONE_MGID_BASE + sid, None)
                del sw.clone_sessions[sid]
                return
            if not exists and len(sw.clone_sessions) >= MAX_CLONE_SESSIONS:
                raise RpcError("RESOURCE_EXHAUSTED", f"at most {MAX_CLONE_SESSIONS} clone sessions")
            if c.class_of_service > MAX_COS:
                raise RpcError(
                    "OUT_OF_RANGE",
                    f"class_of_service {c.class_of_service} is not in [0, {MAX_COS}]",
                )
            if c.packet_length_bytes < 0:
                raise RpcError("INVALID_ARGUMENT", "packet_length_bytes must not be negative")
            replicas = self.replicas(c.replicas)
            mgid = CLONE_MGID_BASE + sid
            sw.mcast_groups.pop(mgid, None)
            session = CloneSession(truncate=c.packet_length_bytes, cos=c.class_of_service)
            if len(replicas) == 1:
                session.port = replicas[0][0]
            elif replicas:
                sw.mcast_groups[mgid] = replicas
                session.mgid = mgid
            sw.clone_sessions[sid] = session
        else:
            raise RpcError("INVALID_ARGUMENT", "empty packet replication engine entry")

    def read(self, req: p4r.PacketReplicationEngineEntry) -> list[p4r.Entity]:
        out = []
        sw = self.svc.switch
        which = req.WhichOneof("type")
        if which in (None, "multicast_group_entry"):
            want = req.multicast_group_entry.multicast_group_id if which else 0
            for gid, replicas in sorted(sw.mcast_groups.items()):
                if gid >= CLONE_MGID_BASE or (want and gid != want):
                    continue
                pre = p4r.PacketReplicationEngineEntry()
                pre.multicast_group_entry.multicast_group_id = gid
                for port, rid in replicas:
                    pre.multicast_group_entry.replicas.add(egress_port=port, instance=rid)
                out.append(p4r.Entity(packet_replication_engine_entry=pre))
        if which in (None, "clone_session_entry"):
            want = req.clone_session_entry.session_id if which else 0
            for sid, s in sorted(sw.clone_sessions.items()):
                if want and sid != want:
                    continue
                pre = p4r.PacketReplicationEngineEntry()
                c = pre.clone_session_entry
                c.session_id, c.class_of_service, c.packet_length_bytes = sid, s.cos, s.truncate
                if s.port is not None:
                    c.replicas.add(egress_port=s.port, instance=0)
                for port, rid in sw.mcast_groups.get(s.mgid or -1, []):
                    c.replicas.add(egress_port=port, instance=rid)
                out.append(p4r.Entity(packet_replication_engine_entry=pre))
        return out
