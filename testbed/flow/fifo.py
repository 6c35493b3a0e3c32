"""Flows that all start together, through FIFO queues: when each one's last byte arrives.

Max-min rates (testbed/flow/maxmin.py) keep busy, from the first instant, every link that
bounds a flow. A packet network does not, when many flows start at once: each NIC sends its
queue pairs' packets round robin (the twin's NIC, testbed/sim/nic.py: earliest departure
first, ties by queue pair, so a flow's k-th packet leaves in the k-th round), every switch
port is one FIFO, and a spine's port towards a leaf stays idle while the packets it will
carry wait behind others in the leaves' uplinks. On the twin's all-to-all of 256 KiB per
rank (2:1 leaf-spine, no congestion control) that made the all-to-all 1.02, 1.10, 1.30 and
1.62 times max-min's time at 8, 16, 32 and 64 hosts (docs/flow.md, "Through FIFO queues").

The model: each flow's bytes in pieces (packets of `mtu` bytes; a flow of more than
`max_pieces` packets in that many equal pieces, the FIFOs' order at a coarser grain), put
on its first link (its NIC) round robin in flow order, back to back from time 0; every link
a FIFO at its capacity. A packet leaves a link when its last byte is sent (store and
forward) and joins the next link's queue `link_latency` later; a piece of several packets
joins it when its first packet does and leaves it no earlier than its last packet could
(cut-through at the packets' grain). A link serves its pieces in the order they arrive
(ties: the round, then the flow), so its departures are D_i = max(D_(i-1) + s_i / C, r_i)
(r_i: when piece i could leave were the link idle), that is D_i = S_i / C + max over
j <= i of (r_j - S_j / C) with S the running sum of the sizes: a running maximum per
link, vectorized over every link of a stage. A link's stage is the most links a path crosses
before it (`link_levels`), so a piece's arrival at a link is known before the link serves.

No transport (windows, ACKs, resends) and no congestion control: the scheme's efficiency,
fitted on the twin (testbed/flow/calibration.py), carries those, as it did for max-min's
time. Not for flows sprayed over several paths (their coefficients below 1): those take
max-min's rates, which spraying's even load is what they model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from testbed.flow.fabric import NIC_UP, SCALEUP, Fabric
from testbed.flow.routing import Routes

# per flow: beyond it the pieces grow. The NICs' rounds are then coarser than packets and a
# round's edges leave links idle: about 0.75 / MAX_PIECES of the time on a 64-GPU group's
# all-to-all of 4 MiB per pair (1.2 % at 64 pieces, 4.7 % at 16; tests/test_flow_fifo.py)
MAX_PIECES = 64
MAX_TOTAL_PIECES = 1 << 22  # over all flows: fewer per flow where there are more flows


def pieces(nbytes: np.ndarray, mtu: int, max_pieces: int = MAX_PIECES) -> np.ndarray:
    """Per flow, how many pieces its bytes are sent in (0 for an empty flow): a piece a
    packet, at most `max_pieces`, and at most MAX_TOTAL_PIECES over all the flows."""
    if mtu < 1 or max_pieces < 1:
        raise ValueError("mtu and max_pieces must be >= 1")
    per_flow = max(1, min(max_pieces, MAX_TOTAL_PIECES // max(1, len(nbytes))))
    return np.minimum(np.ceil(nbytes / mtu), per_flow).astype(np.int64)


def burst(
    fab: Fabric,
    r: Routes,
    nbytes: np.ndarray,
    mtu: int,
    link_latency: float = 0.0,
    max_pieces: int = MAX_PIECES,
    peak: np.ndarray | None = None,
) -> np.ndarray:
    """Seconds from the common start to each flow's last byte arriving (0 for an empty
    flow). `peak` (one per link), if given, gets each link's largest queue in bytes: what
    had arrived and not yet left, at an arrival (a piece's bytes whole from its first
    packet's arrival)."""
    n = r.n_flows
    if len(nbytes) != n:
        raise ValueError("one size per flow")
    if n and not np.all(r.coeff == 1.0):
        raise ValueError("flows on one path each (sprayed flows take max-min's rates)")
    count = pieces(np.asarray(nbytes, dtype=float), mtu, max_pieces)
    p = int(count.sum())
    if p == 0:
        return np.zeros(n)
    # the pieces: their flow, round (k-th piece of its flow) and size (the last one the rest)
    flow = np.repeat(np.arange(n), count)
    first = np.cumsum(count) - count
    k = np.arange(p) - first[flow]
    size = nbytes[flow] / count[flow]
    # the (piece, hop) entries, each piece's hops in path order (32-bit: a million flows'
    # pieces and hops are tens of millions of entries)
    hops = np.diff(r.indptr).astype(np.int32)
    per_piece = hops[flow]
    e_piece = np.repeat(np.arange(p, dtype=np.int32), per_piece)
    starts = np.cumsum(per_piece, dtype=np.int64) - per_piece
    pos = (np.arange(len(e_piece), dtype=np.int64) - np.repeat(starts, per_piece)).astype(np.int32)
    del starts, per_piece
    link = r.links[r.indptr[flow[e_piece]] + pos].astype(np.int32)
    stage = link_levels(fab, r)[link].astype(np.int32)
    done = np.zeros(len(e_piece))  # when the piece's last byte left that hop's link
    piece_bytes = size[e_piece]
    for s in np.unique(stage):
        sel = np.flatnonzero(stage == s)
        first = pos[sel] == 0
        prev = np.where(first, sel, sel - 1)
        # a piece of several packets joins the next queue once its first packet is across
        # (the rest follows at the previous link's rate): cut-through at the packets' grain
        lead = (piece_bytes[sel] - np.minimum(piece_bytes[sel], mtu)) * 8.0
        arrive = np.where(first, 0.0, done[prev] - lead / fab.link_cap[link[prev]] + link_latency)
        # and it cannot leave before its last packet has come in and crossed this link too
        tail = np.where(first, 0.0, done[prev] + link_latency)
        # FIFO per link: by arrival, ties by round then flow (the NICs' round robin)
        order = np.lexsort((flow[e_piece[sel]], k[e_piece[sel]], arrive, link[sel]))
        idx = sel[order]
        lk = link[idx]
        cap = fab.link_cap[lk]
        serve = piece_bytes[idx] * 8.0 / cap
        ready = np.maximum(
            arrive[order] + serve, tail[order] + np.minimum(piece_bytes[idx], mtu) * 8.0 / cap
        )
        # D_i = max(D_(i-1) + serve_i, ready_i) = S_i + max over j <= i of (ready_j - S_j)
        starts = np.flatnonzero(np.r_[True, lk[1:] != lk[:-1]])
        lens = np.diff(np.r_[starts, len(lk)])  # each link's pieces
        seg = np.repeat(np.arange(len(starts)), lens)
        cum = np.cumsum(serve)
        s_incl = cum - np.repeat(cum[starts] - serve[starts], lens)
        done[idx] = s_incl + _segment_cummax(ready - s_incl, seg)
        if peak is not None and s > 0:  # a NIC's own sending is no switch's queue
            _peaks(peak, lk, starts, lens, seg, arrive[order], done[idx], piece_bytes[idx])
    last = np.flatnonzero(np.r_[e_piece[1:] != e_piece[:-1], True])  # each piece's last hop
    end = np.zeros(n)
    np.maximum.at(end, flow[e_piece[last]], done[last] + link_latency)
    return end


def _peaks(
    peak: np.ndarray,
    lk: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    seg: np.ndarray,
    arrive: np.ndarray,
    leave: np.ndarray,
    size: np.ndarray,
) -> None:
    """Into `peak`: per link (segments of `lk`, each `lens` long from `starts`, in arrival
    order, departures rising), the bytes arrived and not yet left at each arrival, at most."""
    total = np.cumsum(size)
    before = np.repeat(total[starts] - size[starts], lens)  # the segment's bytes before it
    span = float(max(leave.max(), arrive.max()) - min(leave.min(), arrive.min())) + 1.0
    # per arrival, the pieces of its link that left by then (departures rise in a FIFO)
    gone = np.searchsorted(leave + seg * span, arrive + seg * span, side="right")
    left = np.where(gone > starts[seg], total[np.maximum(gone - 1, 0)] - before, 0.0)
    np.maximum.at(peak, lk, total - before - left)


def overflow(
    fab: Fabric, peak: np.ndarray, buffer_per_port: float, alpha: float
) -> dict[str, Any] | None:
    """The switch port whose queue (`peak`, bytes) most exceeds what a shared buffer admits
    (Choudhury and Hahne's dynamic threshold, as the packet engines' switches run it: a
    queue grows while it holds at most `alpha` times the buffer left free), with every
    queue of its switch at its peak at once: its link, its peak, its switch's queues at
    their peaks and the switch's buffer (bytes), and alpha; None if no port passes. The
    switch's buffer is `buffer_per_port` times its ports with a link. A NIC's own link is
    no switch's queue."""
    switch_port = (fab.link_kind != NIC_UP) & (fab.link_kind != SCALEUP)
    node = fab.link_src
    buffer = np.bincount(node[switch_port], minlength=fab.n_nodes) * buffer_per_port
    held = np.bincount(node[switch_port], weights=peak[switch_port], minlength=fab.n_nodes)
    over = np.where(switch_port, peak - alpha * (buffer[node] - held[node]), -np.inf)
    worst = int(np.argmax(over)) if len(over) else -1
    if worst < 0 or over[worst] <= 0:
        return None
    sw = node[worst]
    return {
        "link": fab.link_name(worst),
        "queue_bytes": float(peak[worst]),
        "switch_queues_bytes": float(held[sw]),
        "switch_buffer_bytes": float(buffer[sw]),
        "alpha": alpha,
    }


def link_levels(fab: Fabric, r: Routes) -> np.ndarray:
    """Each link's stage: the most links any path crosses before it (links no path uses:
    -1), so that every link a piece crosses earlier is served at an earlier stage. Refuses
    paths that loop (no such order exists)."""
    level = np.full(fab.n_links, -1, dtype=np.int64)
    level[r.links] = 0
    same = np.diff(r.flow_of_entry()) == 0  # consecutive entries of one flow
    a, b = r.links[:-1][same], r.links[1:][same]
    for _ in range(fab.n_links + 1):
        before = level.copy()
        np.maximum.at(level, b, level[a] + 1)
        if np.array_equal(level, before):
            return level
    raise ValueError("the flows' paths loop: no order to serve the links in")


def _segment_cummax(x: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """The running maximum of x within each segment (seg: non-decreasing segment ids)."""
    if not len(x):
        return x
    span = float(x.max() - x.min()) + 1.0
    shifted = x + seg * span  # later segments lie above every earlier one
    return np.maximum.accumulate(shifted) - seg * span
