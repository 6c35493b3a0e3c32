"""ECMP over more than two tiers: which digit of the one hash each switch reads.

Every switch running the P4 program hashes the same five fields with the same CRC-16 and
takes member `hash % total weight` of a group (p4src/control/routing.p4; v1model's action
selector has no per-switch seed). On a fabric of three tiers that polarizes: the flows a leaf
sends to aggregation switch k all have `hash % n0 == k`, and an aggregation switch with as
many uplinks as the leaf then sends all of them up the same one (on HPCC's 320-host fat-tree,
20 of the 80 aggregation-to-core links would carry traffic, docs/fidelity.md). Shipping
switches avoid it with a hash seed or algorithm per switch; this controller gives each tier
its own digit of the hash instead: a switch `t` tiers above the leaves weights every member
of its groups by `W = n_0 x ... x n_(t-1)` (`n_i`: the most uplinks a switch of tier `i`
has), so it picks member `(hash // W) % members`, independent of the choices below it. That is
for a choice among switches; a choice among parallel links to one switch reads the lowest
digit, as before (a spine's bundle to a leaf picks the link whose index the leaf's choice of
uplink gave: on a two-tier leaf-spine nothing changes).

The tiers are the switches' hop distances from the switches hosts hang off, over every link
of the topology (a link down changes the groups' members, never their weights), so the
packet engines' controller and the flow engine (testbed/flow/routing.py) compute the same.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

N = TypeVar("N", bound=Hashable)


def digit_bases(adj: Mapping[N, Sequence[N]], edge: Iterable[N]) -> dict[N, int]:
    """Each switch's `W`: `adj` maps every switch to its neighbouring switches, one entry per
    link (parallel links repeat); `edge` are the switches hosts hang off (tier 0). A switch
    no edge switch reaches gets 1."""
    tier: dict[N, int] = {}
    todo: deque[N] = deque()
    for s in edge:
        if s in adj and s not in tier:
            tier[s] = 0
            todo.append(s)
    while todo:
        u = todo.popleft()
        for v in adj[u]:
            if v not in tier:
                tier[v] = tier[u] + 1
                todo.append(v)
    ups: dict[int, int] = {}  # tier -> the most links a switch of it has to the tier above
    for u, t in tier.items():
        n = sum(1 for v in adj[u] if tier.get(v) == t + 1)
        ups[t] = max(ups.get(t, 0), n)
    base: dict[N, int] = {}
    for u in adj:
        w = 1
        for t in range(tier.get(u, 0)):
            w *= max(1, ups.get(t, 1))
        base[u] = w
    return base
