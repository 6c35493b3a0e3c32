"""Action profile members and groups (action selectors)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from finsy.proto import p4r

from testbed.switch.p4info import TableInfo
from testbed.switch.p4runtime.codec import RpcError
from testbed.switch.p4runtime.table_entries import TableEntries
from testbed.switch.tables import ActionProfile

if TYPE_CHECKING:
    from testbed.switch.p4runtime.service import P4RuntimeService

U = p4r.Update


class _Profiles:
    def __init__(self, svc: P4RuntimeService, tables: TableEntries):
        self.svc = svc
        self.tables = tables

    def profile(self, pid: int) -> ActionProfile:
        prof = self.svc.idx.profiles.get(pid)
        if prof is None:
            raise RpcError("NOT_FOUND", f"no action profile with id {pid}")
        return prof

    def profile_table(self, pid: int) -> TableInfo | None:
        return next((t for t in self.svc.idx.tables.values() if t.profile_id == pid), None)

    def ids(self, pid: int) -> list[int]:
        return [pid] if pid else list(self.svc.idx.profiles)


class ActionProfileMembers(_Profiles):
    def write(self, utype: int, m: p4r.ActionProfileMember) -> None:
        prof = self.profile(m.action_profile_id)
        if utype == U.DELETE:
            prof.delete_member(m.member_id)
            return
        call = self.tables.action_call(self.profile_table(m.action_profile_id), m.action)
        (prof.add_member if utype == U.INSERT else prof.modify_member)(m.member_id, call)

    def read(self, req: p4r.ActionProfileMember) -> list[p4r.Entity]:
        out = []
        for pid in self.ids(req.action_profile_id):
            for mid, call in sorted(self.profile(pid).members.items()):
                if req.member_id and mid != req.member_id:
                    continue
                m = p4r.ActionProfileMember(action_profile_id=pid, member_id=mid)
                self.tables.encode_action(m.action, call)
                out.append(p4r.Entity(action_profile_member=m))
        return out


class ActionProfileGroups(_Profiles):
    def write(self, utype: int, g: p4r.ActionProfileGroup) -> None:
        prof = self.profile(g.action_profile_id)
        if utype == U.DELETE:
            ti = self.profile_table(g.action_profile_id)
            if ti is not None and any(e.group == g.group_id for e in ti.table.entries.values()):
                raise RpcError("FAILED_PRECONDITION", f"group {g.group_id} is used by entries")
            prof.delete_group(g.group_id)
            return
        if g.max_size < 0:
            raise RpcError("INVALID_ARGUMENT", "max_size must not be negative")
        members = [(mm.member_id, mm.weight or 1) for mm in g.members]
        prof.set_group(g.group_id, members, g.max_size, create=utype == U.INSERT)

    def read(self, req: p4r.ActionProfileGroup) -> list[p4r.Entity]:
        out = []
        for pid in self.ids(req.action_profile_id):
            for gid, grp in sorted(self.profile(pid).groups.items()):
                if req.group_id and gid != req.group_id:
                    continue
                g = p4r.ActionProfileGroup(
                    action_profile_id=pid, group_id=gid, max_size=grp.max_size
                )
                for mid, w in grp.weights.items():
                    g.members.add(member_id=mid, weight=w)
                out.append(p4r.Entity(action_profile_group=g))
        return out
