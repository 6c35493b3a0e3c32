"""Parser value sets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from finsy.proto import p4r

from testbed.switch.p4runtime.codec import RpcError, to_bytes, to_int
from testbed.switch.tables import UNSIZED_LIMIT

if TYPE_CHECKING:
    from testbed.switch.p4runtime.service import P4RuntimeService


class ValueSets:
    def __init__(self, svc: P4RuntimeService):
        self.svc = svc

    def write(self, utype: int, vse: p4r.ValueSetEntry) -> None:
        if utype != p4r.Update.MODIFY:
            raise RpcError("INVALID_ARGUMENT", "value sets can only be modified")
        idx = self.svc.idx
        vs = idx.value_sets.get(vse.value_set_id)
        info = idx.value_set_info.get(vse.value_set_id)
        if vs is None or info is None:
            raise RpcError("NOT_FOUND", f"no value set with id {vse.value_set_id}")
        limit = info.size or UNSIZED_LIMIT
        if len(vse.members) > limit:
            raise RpcError("RESOURCE_EXHAUSTED", f"{vs.name}: at most {limit} members")
        values = set()
        for member in vse.members:
            fields = {fm.field_id: fm for fm in member.match}
            value = 0
            for mf in info.match:
                fm = fields.get(mf.id)
                if fm is None or fm.WhichOneof("field_match_type") != "exact":
                    raise RpcError("INVALID_ARGUMENT", f"{vs.name}: needs an exact {mf.name}")
                value = (value << mf.bitwidth) | to_int(fm.exact.value, mf.bitwidth, mf.name)
            values.add(vs.padded(value))
        vs.values = values

    def read(self, req: p4r.ValueSetEntry) -> list[p4r.Entity]:
        idx = self.svc.idx
        out = []
        ids = [req.value_set_id] if req.value_set_id else list(idx.value_sets)
        for vid in ids:
            vs = idx.value_sets.get(vid)
            info = idx.value_set_info.get(vid)
            if vs is None or info is None:
                raise RpcError("NOT_FOUND", f"no value set with id {vid}")
            vse = p4r.ValueSetEntry(value_set_id=vid)
            widths = [mf.bitwidth for mf in info.match]
            for padded in sorted(vs.values):
                member = vse.members.add()
                shift = sum(8 * ((w + 7) // 8) for w in widths)
                for mf, w in zip(info.match, widths, strict=True):
                    shift -= 8 * ((w + 7) // 8)
                    member.match.add(field_id=mf.id).exact.value = to_bytes(
                        (padded >> shift) & ((1 << w) - 1)
                    )
            out.append(p4r.Entity(value_set_entry=vse))
        return out
