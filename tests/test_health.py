"""The localizer (controller/health.py) on hand-made polls of the 2x2 example fabric: each rule
names the right element, a healthy fabric names nothing, dead links are what fail-over needs,
and suspects clear when the fault goes."""

from __future__ import annotations

from tests.health_rig import Fabric


def test_healthy_fabric_names_nothing() -> None:
    f = Fabric()
    assert f.run(10) == [] and f.loc.named == {} and f.loc.dead_links() == set()


def test_a_switch_never_seen_is_not_dead() -> None:
    f = Fabric()
    f.silent.add("spine2")  # not up yet when the controller starts
    assert f.run(2) == [] and f.loc.dead_links() == set()


def test_lossy_link_is_named_within_the_window_and_cleared_after() -> None:
    f = Fabric()
    f.run(3)
    f.loss[("spine1", 1)] = 0.01  # leaf1:5 -> spine1:1 corrupts 1 % of its frames
    named_at = None
    for _ in range(50):
        if f.step():
            named_at = f.t
            break
    assert named_at is not None and named_at - 3 <= 2.5
    s = f.loc.ranked()[0]
    assert (s.element, s.kind) == ("link leaf1:5-spine1:1", "lossy-link")
    assert "spine1:1 received" in s.evidence and f.loc.dead_links() == set()  # not dead
    f.loss.clear()
    assert f.run(8) == []  # the window moves past the loss, the hold runs out
    f.loss[("spine1", 1)] = 0.01  # the same fault again: named again, first named anew
    f.run(3)
    assert f.loc.ranked()[0].first_named > named_at + 8
    # the history keeps when it was first named, and its latest naming
    seen = f.loc.named["link leaf1:5-spine1:1"]
    assert seen.first_named == named_at and seen.last_named == f.t


def test_down_port_and_dead_switch_give_dead_links() -> None:
    f = Fabric()
    f.run(1)
    f.down.add(("leaf2", 6))
    assert f.step() == ["link leaf2:6-spine2:2"]
    assert f.loc.ranked()[0].kind == "link-down"
    assert f.loc.dead_links() == {"leaf2:6-spine2:2"}
    f.down.clear()
    f.run(1)
    assert f.loc.dead_links() == set()  # restored as soon as the port is up
    f.silent.add("spine1")
    f.step()
    assert f.loc.dead_links() == set()  # not before dead_after_s
    f.run(0.5)
    assert f.loc.ranked()[0].element == "switch spine1"
    assert f.loc.dead_links() == {"leaf1:5-spine1:1", "leaf2:5-spine1:2"}


def test_slow_port_is_a_slow_link_and_a_slow_switch_is_named_once() -> None:
    f = Fabric()
    f.run(3)
    f.extra_wait_ns[("leaf1", 5)] = 4_000_000  # 2.4 frame times at 20 Mb/s beyond the queue
    f.run(3)
    s = f.loc.ranked()[0]
    assert (s.element, s.kind) == ("link leaf1:5-spine1:1", "slow-link")
    g = Fabric()
    g.run(3)
    g.extra_wait_ns.update({("spine2", 1): 5_000_000, ("spine2", 2): 5_000_000})
    g.run(3)
    assert [(s.element, s.kind) for s in g.loc.ranked()] == [("switch spine2", "slow-switch")]


def test_a_slow_switch_whose_ports_are_busy_in_turns_is_named_as_the_switch() -> None:
    """A spine carries one direction of a flow on each port: with traffic one way and then
    the other, one port at a time is busy and slow. Two of its ports slow within the hold
    time name the switch (the emulation's WebSearch showed it as two slow links for 6 s)."""
    f = Fabric()
    f.run(3)
    slow = {("spine2", 1): 5_000_000, ("spine2", 2): 5_000_000}
    f.extra_wait_ns.update(slow)
    f.idle.add(("spine2", 2))
    f.run(2.5)
    assert [(s.element, s.kind) for s in f.loc.ranked()] == [("link leaf1:6-spine2:1", "slow-link")]
    f.idle = {("spine2", 1)}  # the traffic turns: now only port 2 is busy
    for _ in range(30):
        if "switch spine2" in f.loc.suspects:
            break
        f.step()
    s = f.loc.ranked()[0]
    assert (s.element, s.kind) == ("switch spine2", "slow-switch")
    assert f.t - 5.5 <= 2.5 and "2 of 2 ports busy in the last 3 s" in s.evidence
    # a slow link alone is never a slow switch, however long it lasts
    g = Fabric()
    g.run(3)
    g.extra_wait_ns[("spine2", 1)] = 5_000_000
    g.run(8)
    assert "switch spine2" not in g.loc.named


def test_a_busy_slow_switch_whose_queues_explain_most_of_the_wait_is_named() -> None:
    """A switch holding every frame for d adds about d * (1 - load) beyond each frame's
    queue: on busy ports the queue explains most of the wait, under the link rule's ratio
    (1.5), yet every port shows it. 0.45 ms beyond the 2.1 ms that the rig's healthy ports
    wait on a 2 ms queue (1.35 frame times at the rig's 100 Mb/s beyond the fabric's own
    wait, ratio 1.21) on both ports of spine2 names the switch and no link; on one port
    alone, nothing; at a ratio of 1.07 on both (what PFC's waits looked like), nothing."""
    f = Fabric()
    f.run(3)
    f.extra_wait_ns.update({("spine2", 1): 450_000, ("spine2", 2): 450_000})
    f.run(2)  # the 2 s window averages it in
    assert [(s.element, s.kind) for s in f.loc.ranked()] == [("switch spine2", "slow-switch")]
    g = Fabric()
    g.run(3)
    g.extra_wait_ns[("spine2", 1)] = 450_000
    assert g.run(6) == [] and g.loc.named == {}
    h = Fabric()
    h.run(3)
    h.extra_wait_ns.update({("spine2", 1): 150_000, ("spine2", 2): 150_000})
    assert h.run(6) == [] and h.loc.named == {}


def test_a_wait_every_port_shares_is_the_fabrics_not_a_fault() -> None:
    """Software switches on a shared CPU make every busy port wait beyond its queue alike
    (the emulation's default suite: 0.18 frame times in half its windows, up to 0.66, and
    healthy leaves and links named slow). A port is judged beyond the fabric's median wait:
    every port 0.6 ms beyond (1.8 frame times, ratio 1.3) names nothing; one port 4 ms
    beyond that is still a slow link, with the fabric's wait in its evidence."""
    f = Fabric()
    f.run(3)
    for k in f.tx:
        f.extra_wait_ns[k] = 600_000
    assert f.run(6) == [] and f.loc.named == {}
    f.extra_wait_ns[("leaf1", 5)] = 4_600_000
    f.run(3)
    s = f.loc.ranked()[0]
    assert (s.element, s.kind) == ("link leaf1:5-spine1:1", "slow-link")
    assert "the fabric's ports wait 0.70 ms beyond theirs" in s.evidence


def test_suspects_over_grpc_and_the_command(capsys) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import threading
    import types

    import grpc

    from controller.proto import controller_pb2_grpc
    from controller.service import ControllerService
    from controller.suspects import main as suspects_main

    f = Fabric()
    f.run(1)
    f.down.add(("leaf2", 6))
    f.step()
    ops = types.SimpleNamespace(
        loc=f.loc,
        dead=frozenset(f.loc.dead_links()),
        failovers=1,
        events=[{"event": "failover", "t": 1.0}],
        unix=lambda t: 1e9 + t,
    )
    ready, stop = threading.Event(), threading.Event()
    port: list[int] = []

    async def serve() -> None:
        server = grpc.aio.server()
        controller_pb2_grpc.add_ControllerServicer_to_server(
            ControllerService(types.SimpleNamespace(operations=ops)), server
        )  # type: ignore[arg-type]
        port.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)

    t = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    t.start()
    assert ready.wait(10)
    try:
        assert suspects_main(["--addr", f"127.0.0.1:{port[0]}", "--all"]) == 0
    finally:
        stop.set()
        t.join(10)
    out = capsys.readouterr().out
    assert "link leaf2:6-spine2:2" in out and "link-down" in out
    assert "routed around (fail-over 1x): leaf2:6-spine2:2" in out
    assert suspects_main(["--addr", "127.0.0.1:1"]) == 1  # nothing listens: said, not raised


def test_int_names_a_link_that_drains_below_its_rate_where_no_counter_shows_it() -> None:
    """A silent rate fault: the switch's own latency monitor sees nothing (it expects the
    degraded rate), but the packets' INT hop latency is longer than the queue INT saw
    explains at the link's nominal rate. 70 % of the rate waits 1.43 times: named; a port
    whose packets wait 1.1 times (90 %) is not, nor a healthy fabric."""
    f = Fabric()
    f.run(3)
    assert f.loc.ranked() == []
    f.silent_rate[("spine1", 1)] = 0.7
    f.run(3)
    [s] = f.loc.ranked()
    assert (s.element, s.kind) == ("link leaf1:5-spine1:1", "slow-link")
    assert s.evidence.startswith("INT: ") and "at spine1:1" in s.evidence
    g = Fabric()
    g.silent_rate[("spine1", 1)] = 0.9
    g.run(6)
    assert g.loc.ranked() == []


def test_int_does_not_call_a_port_slow_that_drains_a_deep_queue_at_its_rate() -> None:
    """INT carries the queue at dequeue: while a deep queue drains (a DCQCN incast cut its
    senders), each packet waited for the bytes ahead of it but leaves few behind, so the
    waits are several times what the dequeue depth explains (the twin's incast at 1/20000:
    450 ms against 97 ms on h1's link). The port sent at its rate all along (INT's tx
    utilisation while it had a queue): not slow. The same waits at 70 % of the rate are."""
    f = Fabric()
    f.draining[("spine1", 1)] = 4.6
    f.run(6)
    assert f.loc.ranked() == []
    f.silent_rate[("spine1", 1)] = 0.7
    f.run(3)
    [s] = f.loc.ranked()
    assert (s.element, s.kind) == ("link leaf1:5-spine1:1", "slow-link")
    assert "it sent at 70% of its rate while it had a queue" in s.evidence, s.evidence


def test_a_port_that_pfc_pauses_is_not_called_slow() -> None:
    """Frames held by PFC pauses wait longer than their queue explains, by INT and by the
    port's latency monitor alike: the twin's incast under DCQCN+PFC had a spine's port named
    slow by INT (99 packets waited 14.4 ms against 4.4 ms explained). The pauses are PFC's
    (counted: GetQueues' paused time), and the port downstream that sent them is where to
    look: a paused port is judged by neither rule while its pauses last."""
    f = Fabric()
    f.run(3)
    f.silent_rate[("spine1", 1)] = 0.5
    f.extra_wait_ns[("spine1", 1)] = 10_000_000
    f.paused[("spine1", 1)] = 0.3
    f.run(3)
    assert f.loc.ranked() == []
    f.paused[("spine1", 1)] = 0.0  # the pauses end, the waits stay: now it is slow
    f.run(3)
    assert [(s.element, s.kind) for s in f.loc.ranked()][:1] == [
        ("link leaf1:5-spine1:1", "slow-link")
    ]


def test_a_slow_switch_explains_its_links_int_too() -> None:
    f = Fabric()
    f.run(3)
    f.extra_wait_ns.update({("spine2", 1): 5_000_000, ("spine2", 2): 5_000_000})
    f.silent_rate.update({("spine2", 1): 0.5, ("spine2", 2): 0.5})
    f.run(3)
    assert [(s.element, s.kind) for s in f.loc.ranked()] == [("switch spine2", "slow-switch")]


def test_a_nic_that_sends_less_than_its_waiting_flows_are_paced_at_is_named_slow() -> None:
    """A NIC at 60 % of its rate holds its flows' packets at home: no switch counter or INT
    record sees it, its agent does (what it sent against what waited in it)."""
    f = Fabric()
    f.run(3)
    f.nic_sends["h3"] = 0.6
    f.run(2.5)
    [top] = f.loc.ranked()
    assert (top.element, top.kind) == ("nic h3", "slow-nic")
    assert "sent 360 Mb/s (36 % of its 1000 Mb/s)" in top.evidence, top.evidence
    assert "paced at 600 Mb/s" in top.evidence
    f.nic_sends["h3"] = 1.0  # healed: cleared once its window and the hold time pass
    f.run(6)
    assert f.loc.ranked() == []


def test_a_nic_held_by_pauses_or_a_little_short_is_not_called_slow() -> None:
    f = Fabric()
    f.nic_sends["h3"] = 0.6
    f.nic_paused["h3"] = 0.3  # the switch paused it: where the pauses come from is the fault
    # 0.75 of what waited, but a twentieth of its line rate short: a loaded emulation host's
    # healthy NIC at low load
    f.nic_waiting["h5"], f.nic_sends["h5"] = 0.2, 0.75
    f.run(5)
    assert f.loc.ranked() == []
