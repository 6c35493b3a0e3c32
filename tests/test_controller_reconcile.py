"""The reconciler's diff on raw P4Runtime entities: equal state writes nothing (whatever the
byte padding), changes become modifies, stale entities deletes in dependency order, defaults
are only modified, and IDs are kept by content."""

from __future__ import annotations

from finsy.proto import p4r

from controller.reconcile import IdAllocator, SwitchState, diff

ROUTES, NEXT, PROFILE, SET_NEXT, ROUTE = 1, 2, 3, 10, 11


def lpm_entry(prefix: bytes, plen: int, next_id: int, pad: int = 0) -> p4r.Entity:
    te = p4r.TableEntry(table_id=ROUTES)
    fm = te.match.add(field_id=1)
    fm.lpm.value = b"\x00" * pad + prefix
    fm.lpm.prefix_len = plen
    te.action.action.action_id = SET_NEXT
    te.action.action.params.add(param_id=1, value=next_id.to_bytes(2, "big"))
    return p4r.Entity(table_entry=te)


def next_entry(next_id: int, group: int | None = None, member: int | None = None) -> p4r.Entity:
    te = p4r.TableEntry(table_id=NEXT)
    te.match.add(field_id=1).exact.value = next_id.to_bytes(2, "big").lstrip(b"\0") or b"\0"
    if group is not None:
        te.action.action_profile_group_id = group
    else:
        assert member is not None
        te.action.action_profile_member_id = member
    return p4r.Entity(table_entry=te)


def member(mid: int, port: int) -> p4r.Entity:
    m = p4r.ActionProfileMember(action_profile_id=PROFILE, member_id=mid)
    m.action.action_id = ROUTE
    m.action.params.add(param_id=1, value=bytes([port]))
    return p4r.Entity(action_profile_member=m)


def group(gid: int, members: list[int]) -> p4r.Entity:
    g = p4r.ActionProfileGroup(action_profile_id=PROFILE, group_id=gid)
    for m in members:
        g.members.add(member_id=m, weight=1)
    return p4r.Entity(action_profile_group=g)


def clone(session: int, port: int) -> p4r.Entity:
    c = p4r.CloneSessionEntry(session_id=session)
    c.replicas.add(egress_port=port, instance=0)
    return p4r.Entity(
        packet_replication_engine_entry=p4r.PacketReplicationEngineEntry(clone_session_entry=c)
    )


def default(table: int, action: int) -> p4r.Entity:
    te = p4r.TableEntry(table_id=table, is_default_action=True)
    te.action.action.action_id = action
    return p4r.Entity(table_entry=te)


def state() -> list[p4r.Entity]:
    return [
        member(1, 5),
        member(2, 6),
        group(1, [1, 2]),
        next_entry(1, group=1),
        lpm_entry(b"\x0a\x00\x02\x01", 32, 1),
        clone(500, 7),
        default(NEXT, 99),
    ]


def test_same_state_writes_nothing_even_with_padded_bytes() -> None:
    current = state()
    desired = state()
    desired[4] = lpm_entry(b"\x0a\x00\x02\x01", 32, 1, pad=0)
    current[4] = lpm_entry(b"\x0a\x00\x02\x01", 32, 1, pad=2)  # non-canonical on the switch
    plan = diff(desired, current)
    assert plan.empty and plan.unchanged == len(desired)


def test_changes_modify_and_stale_entities_delete_in_dependency_order() -> None:
    current = state()
    # the group loses port 6 (member 2), a route changes next id, the clone port changes
    desired = [
        member(1, 5),
        group(1, [1]),
        next_entry(1, group=1),
        lpm_entry(b"\x0a\x00\x02\x01", 32, 2),
        next_entry(2, member=1),
        clone(500, 8),
    ]
    plan = diff(desired, current)
    assert [e.WhichOneof("entity") for e in plan.inserts] == ["table_entry"]  # next id 2
    kinds = [e.WhichOneof("entity") for e in plan.modifies]
    assert kinds == ["action_profile_group", "table_entry", "packet_replication_engine_entry"]
    # member 2 is deleted after the group stopped using it; the default is left alone
    assert [e.WhichOneof("entity") for e in plan.deletes] == ["action_profile_member"]
    assert plan.summary() == {"insert": 1, "modify": 3, "delete": 1, "unchanged": 2}


def test_defaults_are_modified_not_inserted_and_keep_protects() -> None:
    plan = diff([default(NEXT, 98)], [])
    assert plan.modifies and not plan.inserts
    current = [lpm_entry(b"\x0a\x00\x00\x00", 8, 3)]
    assert len(diff([], current).deletes) == 1
    assert diff([], current, keep=current).empty


def test_duplicate_desired_entities_are_refused() -> None:
    try:
        diff([member(1, 5), member(1, 6)], [])
    except ValueError as exc:
        assert "twice" in str(exc)
    else:
        raise AssertionError("duplicate accepted")


def test_ids_are_kept_by_content() -> None:
    st = SwitchState([member(4, 5), member(9, 6), group(3, [4, 9])])
    members = IdAllocator(st.members())
    port5 = next(k for k, v in st.members().items() if v == 4)
    port6 = next(k for k, v in st.members().items() if v == 9)
    assert members.get(port6) == 9 and members.get(port5) == 4
    assert members.get((PROFILE, ("new",))) == 1  # lowest ID not in use
    assert members.get((PROFILE, ("other",))) == 2
    assert members.get((PROFILE, ("new",))) == 1  # stable
    groups = IdAllocator(st.groups())
    assert groups.get((PROFILE, ((4, 1), (9, 1)))) == 3
    assert groups.get((PROFILE, ((4, 1),))) == 1
