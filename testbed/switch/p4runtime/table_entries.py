"""Table entries (with their direct counters and meters), and the entries' own direct counter
and direct meter entities."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from finsy.proto import p4i, p4r

from testbed.switch.p4info import TableInfo
from testbed.switch.p4runtime.codec import RpcError, encode_meter, meter_rates, to_bytes, to_int
from testbed.switch.tables import ActionCall, Entry

if TYPE_CHECKING:
    from testbed.switch.p4runtime.service import P4RuntimeService

U = p4r.Update
M = p4i.MatchField
_KINDS: dict[int, str] = {
    M.EXACT: "exact",
    M.LPM: "lpm",
    M.TERNARY: "ternary",
    M.RANGE: "range",
    M.OPTIONAL: "optional",
}


class TableEntries:
    def __init__(self, svc: P4RuntimeService):
        self.svc = svc

    # ---- shared with the direct resources and the action profiles ----

    def table(self, table_id: int) -> TableInfo:
        ti = self.svc.idx.tables.get(table_id)
        if ti is None:
            raise RpcError("NOT_FOUND", f"no table with id {table_id}")
        return ti

    def spec(self, ti: TableInfo, matches: Any) -> tuple[Any, ...]:
        spec: list[Any] = [None] * len(ti.fields)
        for fm in matches:
            mf = ti.fields_by_id.get(fm.field_id)
            if mf is None:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name}: no match field {fm.field_id}")
            if spec[mf.position] is not None:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name}: field {mf.name} given twice")
            which = fm.WhichOneof("field_match_type")
            expected = _KINDS.get(mf.match_type)
            if which != expected:
                raise RpcError(
                    "INVALID_ARGUMENT", f"{ti.name}: field {mf.name} is {expected}, got {which}"
                )
            w = mf.bitwidth
            if which == "exact":
                spec[mf.position] = to_int(fm.exact.value, w, mf.name)
            elif which == "lpm":
                if fm.lpm.prefix_len <= 0:
                    raise RpcError("INVALID_ARGUMENT", f"{mf.name}: omit a /0 prefix")
                spec[mf.position] = (to_int(fm.lpm.value, w, mf.name), fm.lpm.prefix_len)
            elif which == "ternary":
                mask = to_int(fm.ternary.mask, w, mf.name)
                if mask == 0:
                    raise RpcError("INVALID_ARGUMENT", f"{mf.name}: omit a zero ternary mask")
                spec[mf.position] = (to_int(fm.ternary.value, w, mf.name), mask)
            elif which == "range":
                lo, hi = to_int(fm.range.low, w, mf.name), to_int(fm.range.high, w, mf.name)
                if lo > hi:
                    raise RpcError("INVALID_ARGUMENT", f"{mf.name}: low > high")
                spec[mf.position] = (lo, hi)
            else:
                spec[mf.position] = (to_int(fm.optional.value, w, mf.name), (1 << w) - 1)
        for mf in ti.fields:
            if spec[mf.position] is None:
                if mf.match_type == M.EXACT:
                    raise RpcError("INVALID_ARGUMENT", f"{ti.name}: exact field {mf.name} missing")
                spec[mf.position] = (
                    (0, (1 << mf.bitwidth) - 1) if mf.match_type == M.RANGE else (0, 0)
                )
        return tuple(spec)

    def find(self, te: p4r.TableEntry) -> tuple[TableInfo, Entry | None]:
        ti = self.table(te.table_id)
        return ti, ti.table.find(self.spec(ti, te.match), te.priority)

    def read_direct(self, te: p4r.TableEntry, attached: str) -> list[tuple[TableInfo, Entry]]:
        """The entries a direct counter or meter read names: one table's (or every table's
        with that direct resource, `attached` being the TableInfo field naming it), one entry
        when the read gives a match, else all of them."""
        if te.table_id:
            tables = [self.table(te.table_id)]
        else:
            tables = [t for t in self.svc.idx.tables.values() if getattr(t, attached)]
        out = []
        for ti in tables:
            if len(te.match):
                e = ti.table.find(self.spec(ti, te.match), te.priority)
                out.extend([(ti, e)] if e else [])
            else:
                out.extend((ti, e) for e in ti.table.entries.values())
        return out

    def action_call(
        self, ti: TableInfo | None, action: p4r.Action, default: bool = False
    ) -> ActionCall:
        svc = self.svc
        compiled = svc.switch.compiled
        assert compiled is not None
        ai = svc.idx.actions.get(action.action_id)
        if ai is None:
            raise RpcError("NOT_FOUND", f"no action with id {action.action_id}")
        json_id = ai.json_id
        if ti is not None:
            if ai.id not in ti.action_ids:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name} has no action {ai.name}")
            if default and ai.id in ti.table_only:
                raise RpcError("INVALID_ARGUMENT", f"{ai.name} cannot be a default action")
            if not default and ai.id in ti.default_only:
                raise RpcError("INVALID_ARGUMENT", f"{ai.name} is a default-only action")
            json_id = ti.json_actions.get(ai.id, json_id)  # the table's own copy, if any
        given = {p.param_id: p.value for p in action.params}
        if len(given) != len(action.params):
            raise RpcError("INVALID_ARGUMENT", f"{ai.name}: a parameter is given twice")
        params = []
        for pi in ai.params:
            if pi.id not in given:
                raise RpcError("INVALID_ARGUMENT", f"{ai.name}: parameter {pi.name} missing")
            params.append(to_int(given.pop(pi.id), pi.bitwidth, f"{ai.name}.{pi.name}"))
        if given:
            raise RpcError("INVALID_ARGUMENT", f"{ai.name}: unknown parameter ids {list(given)}")
        return ActionCall(json_id, compiled.actions[json_id], tuple(params))

    def encode_action(self, out: p4r.Action, call: ActionCall) -> None:
        ai = self.svc.idx.action_of_json.get(call.action_id)
        if ai is None:  # an action the P4Info does not describe: the program's own default
            raise RpcError("INTERNAL", f"JSON action {call.action_id} is not in the P4Info")
        out.action_id = ai.id
        for pi, v in zip(ai.params, call.params, strict=True):
            out.params.add(param_id=pi.id, value=to_bytes(v))

    def encode(
        self, ti: TableInfo, e: Entry, with_counters: bool, with_meter: bool
    ) -> p4r.TableEntry:
        te = p4r.TableEntry(table_id=ti.id, priority=e.priority if ti.table.needs_priority else 0)
        for mf in ti.fields:
            s = e.spec[mf.position]
            if mf.match_type == M.EXACT:
                te.match.add(field_id=mf.id).exact.value = to_bytes(s)
            elif mf.match_type == M.LPM:
                if s[1]:
                    fm = te.match.add(field_id=mf.id)
                    fm.lpm.value, fm.lpm.prefix_len = to_bytes(s[0]), s[1]
            elif mf.match_type == M.TERNARY:
                if s[1]:
                    fm = te.match.add(field_id=mf.id)
                    fm.ternary.value, fm.ternary.mask = to_bytes(s[0]), to_bytes(s[1])
            elif mf.match_type == M.RANGE:
                if s != (0, (1 << mf.bitwidth) - 1):
                    fm = te.match.add(field_id=mf.id)
                    fm.range.low, fm.range.high = to_bytes(s[0]), to_bytes(s[1])
            elif mf.match_type == M.OPTIONAL:
                if s[1]:
                    te.match.add(field_id=mf.id).optional.value = to_bytes(s[0])
        if e.member is not None:
            te.action.action_profile_member_id = e.member
        elif e.group is not None:
            te.action.action_profile_group_id = e.group
        elif e.call is not None:
            self.encode_action(te.action.action, e.call)
        if with_counters and ti.direct_counter_id:
            te.counter_data.packet_count, te.counter_data.byte_count = e.packet_count, e.byte_count
        if with_meter and e.meter is not None and e.meter.configured:
            encode_meter(te.meter_config, e.meter.get_rates())
        te.idle_timeout_ns = e.idle_timeout_ns
        te.metadata = e.metadata
        te.is_const = ti.is_const
        return te

    # ---- the entity ----

    def _entry(self, ti: TableInfo, te: p4r.TableEntry) -> Entry:
        entry = Entry(self.spec(ti, te.match), te.priority)
        which = te.action.WhichOneof("type")
        if ti.profile_id:
            if which == "action_profile_member_id":
                entry.member = te.action.action_profile_member_id
            elif which == "action_profile_group_id":
                entry.group = te.action.action_profile_group_id
            else:
                raise RpcError(
                    "INVALID_ARGUMENT", f"{ti.name} is indirect: give a member or a group"
                )
        else:
            if which != "action":
                raise RpcError("INVALID_ARGUMENT", f"{ti.name} needs a direct action")
            entry.call = self.action_call(ti, te.action.action)
        if te.idle_timeout_ns < 0:
            raise RpcError("INVALID_ARGUMENT", "idle_timeout_ns must not be negative")
        entry.idle_timeout_ns = te.idle_timeout_ns
        entry.metadata = te.metadata
        return entry

    def write(self, utype: int, te: p4r.TableEntry) -> None:
        ti = self.table(te.table_id)
        table = ti.table
        if ti.is_const and not te.is_default_action:
            raise RpcError("PERMISSION_DENIED", f"{ti.name} is a const table")
        if te.is_default_action:
            if utype != U.MODIFY:
                raise RpcError("INVALID_ARGUMENT", "the default entry can only be modified")
            if len(te.match):
                raise RpcError("INVALID_ARGUMENT", "the default entry has no match")
            if te.HasField("action"):
                if te.action.WhichOneof("type") != "action":
                    raise RpcError("UNIMPLEMENTED", "indirect default actions")
                table.set_default(self.action_call(ti, te.action.action, default=True))
            else:  # reset to the program's default
                table.set_default(self.svc.initial_defaults.get(ti.name))
            return
        if table.needs_priority:
            if te.priority <= 0:
                raise RpcError("INVALID_ARGUMENT", f"{ti.name} needs a priority > 0")
        elif te.priority != 0:
            raise RpcError("INVALID_ARGUMENT", f"{ti.name} takes no priority")
        if utype == U.DELETE:
            table.delete(self.spec(ti, te.match), te.priority)
            return
        entry = self._entry(ti, te)
        rates = meter_rates(te.meter_config) if te.HasField("meter_config") else None
        if te.HasField("counter_data") and (
            te.counter_data.packet_count < 0 or te.counter_data.byte_count < 0
        ):
            raise RpcError("INVALID_ARGUMENT", "counter data must not be negative")
        if utype == U.INSERT:
            e = table.add(entry, strict=True)
        else:
            e = table.modify(entry.spec, entry.priority, entry)
        if te.HasField("counter_data"):
            e.packet_count, e.byte_count = te.counter_data.packet_count, te.counter_data.byte_count
        if rates is not None and e.meter is not None:
            e.meter.set_rates(rates)

    def read(self, req: p4r.TableEntry) -> list[p4r.Entity]:
        tables = [self.table(req.table_id)] if req.table_id else list(self.svc.idx.tables.values())
        with_counters = req.HasField("counter_data")
        with_meter = req.HasField("meter_config")
        out = []
        for ti in tables:
            if req.is_default_action:
                te = p4r.TableEntry(table_id=ti.id, is_default_action=True)
                if ti.table.default is not None:
                    self.encode_action(te.action.action, ti.table.default)
                out.append(p4r.Entity(table_entry=te))
                continue
            if len(req.match):
                e = ti.table.find(self.spec(ti, req.match), req.priority)
                entries = [e] if e is not None else []
            else:
                entries = list(ti.table.entries.values())
            for e in entries:
                out.append(p4r.Entity(table_entry=self.encode(ti, e, with_counters, with_meter)))
        return out


class DirectCounters:
    def __init__(self, svc: P4RuntimeService, tables: TableEntries):
        self.svc = svc
        self.tables = tables

    def write(self, utype: int, dce: p4r.DirectCounterEntry) -> None:
        if utype != U.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "direct counters can only be modified")
        if dce.data.packet_count < 0 or dce.data.byte_count < 0:
            raise RpcError("INVALID_ARGUMENT", "counter data must not be negative")
        ti, e = self.tables.find(dce.table_entry)
        if e is None:
            raise RpcError("NOT_FOUND", f"{ti.name}: no such entry")
        e.packet_count, e.byte_count = dce.data.packet_count, dce.data.byte_count

    def read(self, req: p4r.DirectCounterEntry) -> list[p4r.Entity]:
        out = []
        for ti, e in self.tables.read_direct(req.table_entry, "direct_counter_id"):
            dce = p4r.DirectCounterEntry()
            dce.table_entry.CopyFrom(self.tables.encode(ti, e, False, False))
            dce.data.packet_count, dce.data.byte_count = e.packet_count, e.byte_count
            out.append(p4r.Entity(direct_counter_entry=dce))
        return out


class DirectMeters:
    def __init__(self, svc: P4RuntimeService, tables: TableEntries):
        self.svc = svc
        self.tables = tables

    def write(self, utype: int, dme: p4r.DirectMeterEntry) -> None:
        if utype != U.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "direct meters can only be modified")
        ti, e = self.tables.find(dme.table_entry)
        if e is None or e.meter is None:
            raise RpcError("NOT_FOUND", f"{ti.name}: no such metered entry")
        if dme.HasField("config"):
            e.meter.set_rates(meter_rates(dme.config))
        else:
            e.meter.reset()

    def read(self, req: p4r.DirectMeterEntry) -> list[p4r.Entity]:
        out = []
        for ti, e in self.tables.read_direct(req.table_entry, "direct_meter_id"):
            dme = p4r.DirectMeterEntry()
            dme.table_entry.CopyFrom(self.tables.encode(ti, e, False, False))
            if e.meter is not None and e.meter.configured:
                encode_meter(dme.config, e.meter.get_rates())
            out.append(p4r.Entity(direct_meter_entry=dme))
        return out
