"""The localizer's probe rule (controller/health.py `_probed_links`) on the 2x2 example fabric:
probe flows between hosts under both leaves over both spines, their receivers' tallies fed
every 0.1 s. It names the direction that loses (a NIC's own uplink, not its peers'
downlinks), lets links no path tells apart share the blame, does not count tail drops of
congestion, needs enough losses, and clears when the losses stop."""

from __future__ import annotations

from pathlib import Path

from controller.config import load
from controller.health import Localizer, ProbeTally
from controller.topology import Topology

EXAMPLE = Path(__file__).resolve().parents[1] / "controller" / "examples" / "leafspine-2x2.yaml"
# directed links (the collector's names: the transmitting end) of each host to its leaf,
# its leaf to it, and between the leaves over each spine
UP = {"h1": "h1:eth0", "h2": "h2:eth0", "h5": "h5:eth0", "h6": "h6:eth0"}
DOWN = {"h1": "leaf1:1", "h2": "leaf1:2", "h5": "leaf2:1", "h6": "leaf2:2"}
LEAF = {"h1": "leaf1", "h2": "leaf1", "h5": "leaf2", "h6": "leaf2"}
ACROSS = {
    ("leaf1", "spine1"): ("leaf1:5", "spine1:2"),
    ("leaf1", "spine2"): ("leaf1:6", "spine2:2"),
    ("leaf2", "spine1"): ("leaf2:5", "spine1:1"),
    ("leaf2", "spine2"): ("leaf2:6", "spine2:1"),
}


def path(src: str, dst: str, spine: str) -> tuple[str, ...]:
    if LEAF[src] == LEAF[dst]:
        return (UP[src], DOWN[dst])
    return (UP[src], *ACROSS[(LEAF[src], spine)], DOWN[dst])


class Probes:
    """Probe flows (every ordered pair of h1, h2, h5, h6, two source ports each: one over
    each spine), each sending `per_step` probes a step; a lossy directed link loses its
    share of the probes crossing it (deterministically, by owed fractions)."""

    def __init__(self, per_step: int = 20) -> None:
        self.loc = Localizer(Topology(load(EXAMPLE)), mtu_bytes=4154)
        self.t = 0.0
        self.per_step = per_step
        self.loss: dict[str, float] = {}  # directed link -> share of probes it loses
        self.congested: set[str] = set()  # directed links whose losses are tail drops
        hosts = list(UP)
        self.flows = {
            (s, d, 49152 + i): path(s, d, spine)
            for s in hosts
            for d in hosts
            if s != d
            for i, spine in enumerate(("spine1", "spine2"))
        }
        self.counts = {k: [0, 0, 0] for k in self.flows}  # received, lost, lost congested
        self.owed = dict.fromkeys(self.flows, 0.0)

    def step(self) -> list[str]:
        self.t += 0.1
        tallies = []
        for key, links in self.flows.items():
            c = self.counts[key]
            p = 1.0
            for n in links:
                p *= 1 - self.loss.get(n, 0.0)
            self.owed[key] += self.per_step * (1 - p)
            lost = int(self.owed[key])
            self.owed[key] -= lost
            c[0] += self.per_step - lost
            c[1] += lost
            if any(n in self.congested for n in links):
                c[2] += lost
            tallies.append(ProbeTally(self.t, key, links, c[0], c[1], c[2]))
        self.loc.probes(tallies)
        return [s.element for s in self.loc.evaluate(self.t)]

    def run(self, seconds: float) -> list[str]:
        out: list[str] = []
        for _ in range(round(seconds / 0.1)):
            out = self.step()
        return out


def test_a_nic_losing_what_it_sends_is_named_not_its_peers() -> None:
    f = Probes()
    assert f.run(1) == []
    f.loss["h1:eth0"] = 0.01  # h1's NIC loses 1 % of what it sends, silently
    named = f.run(3)
    assert named == ["link h1:eth0-leaf1:1"]
    s = f.loc.suspects["link h1:eth0-leaf1:1"]
    assert s.kind == "lossy-link" and 0.4 <= s.score < 0.5
    assert round(s.first_named, 6) == 1.5  # 1.2 losses a step: the fifth 0.5 s after the fault
    # 6 flows from h1 (to h2, h5, h6 over two ports), 20 probes a step: 36 lost in the 3 s
    # of the fault, of 4,680 sent in the 3.9 s between the window's first tally and its last
    assert "probes: 36 of 4680 lost (0.77 %) on the 6 probe flows over h1:eth0->leaf1:1" in (
        s.evidence
    )
    f.loss.clear()  # the losses stop: after the vote window and the hold, it clears
    f.run(8)
    assert f.loc.suspects == {}


def test_both_halves_of_the_path_over_a_spine_share_the_blame() -> None:
    # leaf1:5 -> spine1 loses: every probe flow over it also crosses spine1:2 -> leaf2, and
    # no other flow crosses either, so no path tells them apart
    f = Probes()
    f.loss["leaf1:5"] = 0.02
    named = f.run(3)
    assert sorted(named) == ["link leaf1:5-spine1:1", "link leaf2:5-spine1:2"]
    assert all("tied with 1 other link(s)" in f.loc.suspects[e].evidence for e in named)


def test_tail_drops_and_rare_losses_are_not_blamed() -> None:
    f = Probes()
    f.loss["leaf1:1"] = 0.05
    f.congested.add("leaf1:1")  # a queue near full towards h1: congestion, not a fault
    assert f.run(3) == []
    g = Probes(per_step=2)
    g.loss["leaf2:1"] = 0.01  # 1 % of 2 probes a step on each of the 6 flows into h5:
    assert g.run(4.5) == []  # not one loss of a flow yet
    assert g.run(1) == ["link h5:eth0-leaf2:1"]  # a loss of each flow at 5 s: 6 losses
