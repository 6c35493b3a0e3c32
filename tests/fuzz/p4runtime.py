"""P4Runtime Write/Read and SwitchAdmin, in process on the switch's own handlers: entities
built from the P4Info (ids mostly real, values of every width and then some), the same after
byte mutation of their encoding, and SwitchAdmin requests with every kind of number."""

from __future__ import annotations

import queue
from typing import Any

from finsy.proto import p4i, p4r
from hypothesis import strategies as st

from controller.proto import switch_pb2
from testbed.switch.admin import SwitchAdminService
from testbed.switch.p4runtime import P4RuntimeService, RpcError, parse_p4info_text
from testbed.switch.p4runtime.codec import MAX_CLONE_SESSIONS, MAX_REPLICAS, to_bytes
from testbed.switch.p4runtime.stream import MAX_PENDING_DIGESTS, Client
from testbed.switch.tables import UNSIZED_LIMIT, TableError
from testbed.switch.traffic_manager import (
    MAX_DEPTH_BYTES,
    MAX_DEPTH_PACKETS,
    MAX_PORT,
    MAX_RATE_BPS,
    MAX_RATE_PPS,
    Clock,
)
from testbed.switch.v1model import V1Switch
from tests.fuzz.harness import EDITS, Crash, Surface, mutate
from tests.switch_rig import FEATURES_JSON, FEATURES_P4INFO, XINGMAI_JSON, XINGMAI_P4INFO

NEVER = ("INTERNAL", "UNKNOWN")  # what P4Runtime's spec never has a handler answer
ELECTION = 10
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
U32 = st.integers(0, 2**32 - 1)
ANY_INT = st.one_of(st.integers(0, 16), st.integers(0, 2**32 - 1), I64)


def _bytes_for(width: int) -> st.SearchStrategy[bytes]:
    n = max(1, (width + 7) // 8)
    return st.one_of(
        st.integers(0, (1 << width) - 1).map(to_bytes), st.binary(min_size=0, max_size=n + 2)
    )


class _Program:
    """A switch running one program, with a primary controller, and the strategies of the
    entities its P4Info describes."""

    def __init__(self, p4info: Any, json: Any):
        self.sw = V1Switch(Clock(virtual=True), device_id=1, cpu_port=255)
        self.sw.transmit = lambda port, data: None
        self.svc = P4RuntimeService(self.sw, 1)
        self.info: p4i.P4Info = parse_p4info_text(p4info.read_text())
        self.svc.install(self.info, json.read_bytes(), 0)
        self.svc.streams.clients[1] = Client(1, queue.Queue(), election_id=ELECTION)
        self._action: st.SearchStrategy[p4r.Action] | None = None
        self._table_entry: st.SearchStrategy[p4r.TableEntry] | None = None

    def _id(self, objs: Any) -> st.SearchStrategy[int]:
        ids = [o.preamble.id for o in objs]
        return (
            st.one_of(st.sampled_from(ids), st.integers(0, 2**32 - 1))
            if ids
            else st.integers(0, 2**32 - 1)
        )

    def action(self) -> st.SearchStrategy[p4r.Action]:
        if self._action is None:
            self._action = self._make_action()
        return self._action

    def table_entry(self) -> st.SearchStrategy[p4r.TableEntry]:
        if self._table_entry is None:
            self._table_entry = self._make_table_entry()
        return self._table_entry

    def _make_action(self) -> st.SearchStrategy[p4r.Action]:
        acts = list(self.info.actions)

        @st.composite
        def build(draw: st.DrawFn) -> p4r.Action:
            a = draw(st.sampled_from(acts))
            msg = p4r.Action(
                action_id=draw(
                    st.one_of(st.just(a.preamble.id), ANY_INT.filter(lambda v: 0 <= v < 2**32))
                )
            )
            for prm in a.params:
                if draw(st.integers(0, 9)):
                    msg.params.add(param_id=prm.id, value=draw(_bytes_for(prm.bitwidth)))
            if not draw(st.integers(0, 9)):
                msg.params.add(param_id=draw(st.integers(0, 2**32 - 1)), value=b"\x01")
            return msg

        return build()

    def _make_table_entry(self) -> st.SearchStrategy[p4r.TableEntry]:
        tables = list(self.info.tables)

        @st.composite
        def build(draw: st.DrawFn) -> p4r.TableEntry:
            t = draw(st.sampled_from(tables))
            te = p4r.TableEntry(
                table_id=draw(st.one_of(st.just(t.preamble.id), st.integers(0, 2**32 - 1))),
                priority=draw(st.one_of(st.integers(0, 10), I32)),
            )
            for mf in t.match_fields:
                if not draw(st.integers(0, 5)):
                    continue
                fm = te.match.add(field_id=draw(st.one_of(st.just(mf.id), st.integers(0, 9))))
                kind = draw(st.one_of(st.just(mf.match_type), st.integers(1, 5)))
                v = draw(_bytes_for(mf.bitwidth))
                if kind == p4i.MatchField.EXACT:
                    fm.exact.value = v
                elif kind == p4i.MatchField.LPM:
                    fm.lpm.value = v
                    fm.lpm.prefix_len = draw(st.one_of(st.integers(0, mf.bitwidth + 2), I32))
                elif kind == p4i.MatchField.TERNARY:
                    fm.ternary.value, fm.ternary.mask = v, draw(_bytes_for(mf.bitwidth))
                elif kind == p4i.MatchField.RANGE:
                    fm.range.low, fm.range.high = v, draw(_bytes_for(mf.bitwidth))
                else:
                    fm.optional.value = v
            which = draw(st.integers(0, 3))
            if which == 0:
                te.action.action.CopyFrom(draw(self.action()))
            elif which == 1:
                te.action.action_profile_member_id = draw(st.integers(0, 2**32 - 1))
            elif which == 2:
                te.action.action_profile_group_id = draw(st.integers(0, 2**32 - 1))
            te.is_default_action = not draw(st.integers(0, 7))
            if not draw(st.integers(0, 5)):
                te.meter_config.cir, te.meter_config.pir = draw(I64), draw(I64)
                te.meter_config.cburst, te.meter_config.pburst = draw(I64), draw(I64)
            if not draw(st.integers(0, 5)):
                te.counter_data.packet_count = draw(I64)
                te.counter_data.byte_count = draw(I64)
            te.idle_timeout_ns = draw(st.one_of(st.just(0), I64))
            return te

        return build()

    def entity(self) -> st.SearchStrategy[p4r.Entity]:
        info = self.info
        prof = self._id(info.action_profiles)

        @st.composite
        def member(draw: st.DrawFn) -> p4r.Entity:
            m = p4r.ActionProfileMember(
                action_profile_id=draw(prof), member_id=draw(st.integers(0, 40))
            )
            m.action.CopyFrom(draw(self.action()))
            return p4r.Entity(action_profile_member=m)

        @st.composite
        def group(draw: st.DrawFn) -> p4r.Entity:
            g = p4r.ActionProfileGroup(
                action_profile_id=draw(prof),
                group_id=draw(st.integers(0, 40)),
                max_size=draw(st.one_of(st.integers(0, 8), I32)),
            )
            for _ in range(draw(st.integers(0, 5))):
                g.members.add(
                    member_id=draw(st.integers(0, 40)),
                    weight=draw(st.one_of(st.integers(0, 5), I32)),
                )
            return p4r.Entity(action_profile_group=g)

        def indexed(field: str, objs: Any, id_field: str) -> st.SearchStrategy[p4r.Entity]:
            @st.composite
            def build(draw: st.DrawFn) -> p4r.Entity:
                ent = p4r.Entity()
                msg = getattr(ent, field)
                setattr(msg, id_field, draw(self._id(objs)))
                if draw(st.integers(0, 4)):
                    msg.index.index = draw(st.one_of(st.integers(-2, 600), I64))
                if field == "counter_entry":
                    msg.data.packet_count, msg.data.byte_count = draw(I64), draw(I64)
                elif field == "meter_entry" and draw(st.booleans()):
                    msg.config.cir, msg.config.pir = draw(I64), draw(I64)
                    msg.config.cburst, msg.config.pburst = draw(I64), draw(I64)
                elif field == "register_entry":
                    msg.data.bitstring = draw(st.binary(max_size=10))
                return ent

            return build()

        @st.composite
        def pre(draw: st.DrawFn) -> p4r.Entity:
            e = p4r.PacketReplicationEngineEntry()
            if draw(st.booleans()):
                g = e.multicast_group_entry
                g.multicast_group_id = draw(st.one_of(st.integers(0, 10), U32))
                reps = g.replicas
            else:
                c = e.clone_session_entry
                c.session_id = draw(st.one_of(st.integers(0, 10), st.integers(0, 2**32 - 1)))
                c.class_of_service = draw(st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1)))
                c.packet_length_bytes = draw(st.one_of(st.integers(0, 100), I32))
                reps = c.replicas
            for _ in range(draw(st.integers(0, 4))):
                r = reps.add(instance=draw(st.one_of(st.integers(0, 3), st.integers(0, 2**32 - 1))))
                if draw(st.booleans()):
                    r.egress_port = draw(st.one_of(st.integers(0, 600), st.integers(0, 2**32 - 1)))
                else:
                    r.port = draw(st.binary(max_size=9))
            return p4r.Entity(packet_replication_engine_entry=e)

        @st.composite
        def value_set(draw: st.DrawFn) -> p4r.Entity:
            v = p4r.ValueSetEntry(value_set_id=draw(self._id(info.value_sets)))
            for _ in range(draw(st.integers(0, 6))):
                m = v.members.add()
                m.match.add(field_id=draw(st.integers(0, 3))).exact.value = draw(
                    st.binary(max_size=4)
                )
            return p4r.Entity(value_set_entry=v)

        @st.composite
        def digest(draw: st.DrawFn) -> p4r.Entity:
            d = p4r.DigestEntry(digest_id=draw(self._id(info.digests)))
            d.config.max_timeout_ns, d.config.max_list_size = draw(I64), draw(I32)
            d.config.ack_timeout_ns = draw(I64)
            return p4r.Entity(digest_entry=d)

        @st.composite
        def direct(draw: st.DrawFn) -> p4r.Entity:
            te = draw(self.table_entry())
            if draw(st.booleans()):
                dce = p4r.DirectCounterEntry()
                dce.table_entry.CopyFrom(te)
                dce.data.packet_count = draw(I64)
                return p4r.Entity(direct_counter_entry=dce)
            dme = p4r.DirectMeterEntry()
            dme.table_entry.CopyFrom(te)
            dme.config.cir, dme.config.pir = draw(I64), draw(I64)
            return p4r.Entity(direct_meter_entry=dme)

        return st.one_of(
            self.table_entry().map(lambda te: p4r.Entity(table_entry=te)),
            member(),
            group(),
            pre(),
            value_set(),
            digest(),
            direct(),
            indexed("counter_entry", info.counters, "counter_id"),
            indexed("meter_entry", info.meters, "meter_id"),
            indexed("register_entry", info.registers, "register_id"),
            st.just(p4r.Entity()),
        )


class P4RuntimeSurface(Surface):
    name = "p4runtime"

    def __init__(self) -> None:
        self.programs = [
            _Program(XINGMAI_P4INFO, XINGMAI_JSON),
            _Program(FEATURES_P4INFO, FEATURES_JSON),
        ]
        self.checked = 0

    def strategy(self) -> st.SearchStrategy[Any]:
        def for_program(i: int) -> st.SearchStrategy[Any]:
            ent = self.programs[i].entity()
            upd = st.builds(lambda t, e: p4r.Update(type=t, entity=e), st.integers(0, 4), ent)
            return st.one_of(
                st.tuples(st.just(i), st.just("write"), st.lists(upd, min_size=1, max_size=4)),
                st.tuples(st.just(i), st.just("read"), ent),
                st.tuples(st.just(i), st.just("mutated"), upd, EDITS),
            )

        return st.one_of(for_program(0), for_program(1))

    def check(self, case: Any) -> str:
        i, kind, body = case[0], case[1], case[2]
        prog = self.programs[i]
        svc = prog.svc
        if kind == "mutated":
            raw = mutate(body.SerializeToString(), case[3])
            upd = p4r.Update()
            try:
                upd.ParseFromString(raw)
            except Exception:
                return "unparseable"  # gRPC refuses it before any handler
            body, kind = [upd], "write"
        if kind == "write":
            errors = svc.write_updates(body)
            codes = ["OK" if e is None else e.code for e in errors]
            bad = [e for e in errors if e is not None and e.code in NEVER]
            if bad:
                raise Crash(f"Write answered {bad[0].code}: {bad[0].message}")
            outcome = codes[0]
        else:
            try:
                with prog.sw.lock, svc.lock:
                    svc.read_entity(body)
                outcome = "OK"
            except RpcError as exc:
                if exc.code in NEVER:
                    raise Crash(f"Read answered {exc.code}: {exc.message}") from exc
                outcome = exc.code
            except TableError as exc:
                outcome = exc.code
        self.checked += 1
        if self.checked % 250 == 0:
            self.health()
        return outcome

    def health(self) -> None:
        """Everything written can still be read back, and packets still run."""
        for prog in self.programs:
            for field in (
                "table_entry",
                "action_profile_member",
                "action_profile_group",
                "counter_entry",
                "meter_entry",
                "register_entry",
                "packet_replication_engine_entry",
                "value_set_entry",
                "digest_entry",
                "direct_counter_entry",
            ):
                ent = p4r.Entity()
                getattr(ent, field).SetInParent()
                with prog.sw.lock, prog.svc.lock:
                    prog.svc.read_entity(ent)
            prog.sw.receive(1, bytes(64))
            prog.sw.service()

    def bounds(self) -> list[str]:
        self.health()
        out = []
        for prog in self.programs:
            sw = prog.sw
            assert sw.compiled is not None
            for name, t in sw.compiled.tables.items():
                if len(t.entries) > (t.max_size or UNSIZED_LIMIT):
                    out.append(f"table {name}: {len(t.entries)} entries")
            for name, p in sw.compiled.profiles.items():
                if len(p.members) > (p.max_size or UNSIZED_LIMIT):
                    out.append(f"profile {name}: {len(p.members)} members")
            if any(len(r) > MAX_REPLICAS for r in sw.mcast_groups.values()):
                out.append("a multicast group over its replica bound")
            if len(sw.clone_sessions) > MAX_CLONE_SESSIONS:
                out.append(f"{len(sw.clone_sessions)} clone sessions")
            if any(len(d.pending) > MAX_PENDING_DIGESTS for d in prog.svc.streams.digests.values()):
                out.append("pending digests over their bound")
            if len(sw.tm.ports) > MAX_PORT + 1:
                out.append(f"{len(sw.tm.ports)} traffic manager ports")
        return out


class _Aborted(Exception):
    def __init__(self, code: Any, details: str):
        super().__init__(details)
        self.code = code


class FakeContext:
    """What a servicer sees of a gRPC call, in process."""

    def abort(self, code: Any, details: str) -> None:
        raise _Aborted(code, details)

    def peer(self) -> str:
        return "fuzz"

    def is_active(self) -> bool:
        return True

    def set_trailing_metadata(self, md: Any) -> None:
        pass


FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0, 1e6),
    st.sampled_from([0.0, 1e-300, 5e-324, 1e-7, 999.0, 1000.0, 1e13, 1e308]),
)


class SwitchAdminSurface(Surface):
    name = "switch_admin"

    def __init__(self) -> None:
        self.prog = _Program(XINGMAI_P4INFO, XINGMAI_JSON)
        self.admin = SwitchAdminService(self.prog.sw, None, self.prog.svc)
        self.ctx = FakeContext()

    def strategy(self) -> st.SearchStrategy[Any]:
        @st.composite
        def request(draw: st.DrawFn) -> switch_pb2.SetQueueRequest:
            r = switch_pb2.SetQueueRequest(
                port=draw(st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1))),
                all_ports=draw(st.booleans()),
                device_id=draw(st.one_of(st.just(1), U64)),
            )
            eid = draw(st.one_of(st.just(ELECTION), st.integers(0, 2**128 - 1)))
            r.election_id.high, r.election_id.low = eid >> 64, eid & (2**64 - 1)
            for f in ("depth_packets", "depth_bytes"):
                if draw(st.booleans()):
                    setattr(r, f, draw(st.one_of(st.integers(0, 200_000), U64)))
            for f in ("rate_pps", "rate_bps"):
                if draw(st.booleans()):
                    setattr(r, f, draw(FLOATS))
            return r

        return st.one_of(request(), st.tuples(request(), EDITS))

    def check(self, case: Any) -> str:
        if isinstance(case, tuple):
            req = switch_pb2.SetQueueRequest()
            try:
                req.ParseFromString(mutate(case[0].SerializeToString(), case[1]))
            except Exception:
                return "unparseable"
        else:
            req = case
        try:
            self.admin.SetQueue(req, self.ctx)
            outcome = "OK"
        except _Aborted as exc:
            if exc.code.name in NEVER:
                raise Crash(f"SetQueue answered {exc.code.name}") from exc
            outcome = exc.code.name
        self.admin.GetQueues(switch_pb2.GetQueuesRequest(), self.ctx)
        self.admin.GetStatus(switch_pb2.GetStatusRequest(), self.ctx)
        # the packet path still runs: a frame in, the queues served
        sw = self.prog.sw
        sw.receive(1, bytes(64))
        sw.clock.advance(10**9)
        sw.service()
        return outcome

    def bounds(self) -> list[str]:
        out = []
        tm = self.prog.sw.tm
        for port, q in tm.ports.items():
            if not (
                0 <= q.rate_bps <= MAX_RATE_BPS
                and 0 <= q.rate_pps <= MAX_RATE_PPS
                and 0 <= q.depth_pkts <= MAX_DEPTH_PACKETS
                and 0 <= q.depth_bytes <= MAX_DEPTH_BYTES
            ):
                out.append(f"port {port}: a setting out of its bounds")
        if len(tm.ports) > MAX_PORT + 1:
            out.append(f"{len(tm.ports)} traffic manager ports")
        return out
