"""The localizer's 007 vote (controller/health.py) over the receiving NICs' loss reports: it
names a lossy link that no counter sees (a host's downlink, whose receiving end no switch
polls), splits the blame where paths cannot tell two links apart, and does not blame
congestion (tail drops of a full queue), a single flow, or a loss rate a healthy link has."""

from __future__ import annotations

from controller.health import PathLoss
from tests.health_rig import Fabric

# directed links (the collector's names) of paths into h5 (leaf2 port 1) in the 2x2 example
TO_H5 = {
    "h1": ("h1:eth0", "leaf1:5", "spine1:2", "leaf2:1"),
    "h2": ("h2:eth0", "leaf1:6", "spine2:2", "leaf2:1"),
    "h6": ("h6:eth0", "leaf2:1"),
}
H5_DOWNLINK = "link h5:eth0-leaf2:1"


def flow(src: str, sport: int = 49152) -> tuple[str, str, int, int, int]:
    ips = {"h1": "10.0.1.1", "h2": "10.0.1.2", "h6": "10.0.2.2", "h5": "10.0.2.1"}
    return (ips[src], ips["h5"], 17, sport, 4791)


def run_with_losses(f: Fabric, losses: list[tuple[str, int]], seconds: float = 3.0) -> list[str]:
    """Step the fabric; at each step, the NIC losses due then (src host, queue on the path)."""
    out: list[str] = []
    steps = round(seconds / 0.1)
    for i in range(steps):
        for src, qocc in losses[i::steps]:
            f.loc.path_loss(PathLoss(f.t, flow(src), TO_H5[src], qocc))
        out = f.step()
    return out


def test_a_lossy_host_downlink_that_counters_miss_is_named_by_vote() -> None:
    f = Fabric()
    assert f.run(2) == []
    # 2 % of h5's downlink lost, as the NICs see it: the senders' flows have PSN gaps;
    # no switch counts an error (the link's receiving end is h5's NIC)
    losses = [("h1", 0), ("h2", 0), ("h6", 0)] * 10
    named = run_with_losses(f, losses)
    assert named[:1] == [H5_DOWNLINK]
    s = f.loc.suspects[H5_DOWNLINK]
    assert s.kind == "lossy-link" and "007: 30 of 30 path losses (3 flows)" in s.evidence
    assert "spine" not in " ".join(named)  # the senders' other links are not blamed
    # the loss stops: the suspect clears
    f.run(8)
    assert f.loc.suspects == {}


def test_links_no_path_tells_apart_share_the_blame_and_counters_break_the_tie() -> None:
    f = Fabric()
    f.run(2)
    # h1 -> h5 and h2 -> h6 both over spine1: leaf1:5 -> spine1 and spine1:2 -> leaf2 are on
    # every such path, so the vote alone cannot tell them apart
    paths = [
        ("h1:eth0", "leaf1:5", "spine1:2", "leaf2:1"),
        ("h2:eth0", "leaf1:5", "spine1:2", "leaf2:2"),
    ]
    for i in range(30):
        p = paths[i % 2]
        f.loc.path_loss(PathLoss(f.t, (f"10.0.1.{1 + i % 2}", "x", 17, i % 3, 4791), p, 0))
        f.step()
    up, down = "link leaf1:5-spine1:1", "link leaf2:5-spine1:2"
    assert {up, down} <= set(f.loc.suspects)
    assert "tied with 1 other link" in f.loc.suspects[up].evidence
    assert f.loc.suspects[up].score == f.loc.suspects[down].score
    # the uplink's receiving end also counts corrupted frames: counters and votes agree there
    f.loss[("spine1", 1)] = 0.01
    for i in range(20):
        f.loc.path_loss(PathLoss(f.t, ("10.0.1.1", "x", 17, i % 3, 4791), paths[i % 2], 0))
        f.step()
    ranked = [s.element for s in f.loc.ranked()]
    assert ranked[0] == up and f.loc.suspects[up].score > f.loc.suspects[down].score
    assert "corrupted frames" in f.loc.suspects[up].evidence


def test_congestion_one_flow_and_rare_losses_are_not_blamed() -> None:
    cases = {
        # tail drops of a full queue on h5's downlink (an incast): congestion, not a fault
        "congestion": [("h1", 1.0), ("h2", 1.0), ("h6", 1.0)] * 10,
        "two flows": [("h1", 0.0), ("h6", 0.0)] * 15,  # too few to vote across
        "few": [("h1", 0.0), ("h2", 0.0), ("h6", 0.0), ("h1", 0.0)],  # under min_vote_losses
        # 6 losses of 3 flows, 0.3 % of the 2,000 frames the link carried: the rate
        # that links beside a silently lossy one showed on the emulation (go-back-N's bursts
        # of resends meeting full queues)
        "low rate": [("h1", 0.0), ("h2", 0.0), ("h6", 0.0)] * 2,
    }
    for what, share in cases.items():
        f = Fabric()
        f.run(4)  # the counters' window full: a link's frames are 4 s of them
        depth = f.topo.cfg.model.queue_depth_bytes
        losses = [(src, round(q * depth)) for src, q in share]
        assert run_with_losses(f, losses, seconds=4.0) == [], what
        assert f.loc.named == {}, what
        assert f.loc.losses_seen == len(losses)
        if what == "congestion":
            assert f.loc.losses_congested == len(losses)


def test_a_link_the_counters_name_ranks_above_a_link_named_by_vote_alone() -> None:
    """On the emulation a receiving host that cannot read its socket in time loses frames
    that vote against its own downlink, sometimes more than a faulty link's losses do (CI:
    h4's downlink ranked above the 1 % lossy link leaf1:3 that leaf1's counters named). A
    counted error is measured where it happened and ranks first."""
    f = Fabric()
    f.run(2)
    f.loss[("spine1", 1)] = 0.01  # leaf1:5 -> spine1:1 corrupts 1 % of its frames
    losses = [("h1", 0), ("h2", 0), ("h6", 0)] * 20  # and h5's downlink loses more
    run_with_losses(f, losses)
    counted, voted = "link leaf1:5-spine1:1", H5_DOWNLINK
    assert {counted, voted} <= set(f.loc.suspects)
    assert "corrupted frames" in f.loc.suspects[counted].evidence
    assert "007: " in f.loc.suspects[voted].evidence
    assert [s.element for s in f.loc.ranked()][:2] == [counted, voted]
