"""The report decoder and the collector: valid Telemetry Reports with drawn sequence numbers,
node ids and INT stacks, the same mutated, and random datagrams; with the example fabric's
topology and without one."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from controller.collector import Collector
from controller.config import load
from controller.topology import Topology
from controller.wire.telemetry_report import ReportError, decode
from tests.fuzz.harness import EDITS, Crash, Surface, mutate
from tests.telemetry_helpers import EXAMPLE, hop, report


class CollectorSurface(Surface):
    name = "report_decoder_and_collector"

    def __init__(self) -> None:
        self.cols = [
            Collector(Topology(load(EXAMPLE))),
            Collector(None, max_nodes=64, max_links=256, max_flows=512),
        ]
        # valid reports from the example fabric's switches (scapy builds them once: slow)
        self.templates = [
            bytearray(report(1, node, [hop(h, 1, 2, qocc=q), hop(3, 4, 5)], sport=1000 + node))
            for node in (1, 2, 3, 4)
            for h in (1, 3, 99)
            for q in (0, 5000)
        ]

    def strategy(self) -> st.SearchStrategy[Any]:
        valid = st.tuples(
            st.integers(0, len(self.templates) - 1),
            st.one_of(st.integers(0, 50), st.integers(0, 2**22 - 1)),
            st.one_of(st.integers(1, 4), st.integers(0, 2**32 - 1)),
        )
        return st.tuples(
            st.integers(0, 1),
            st.one_of(
                st.tuples(st.just("valid"), valid),
                st.tuples(st.just("mutated"), valid, EDITS),
                st.tuples(st.just("random"), st.binary(max_size=300)),
            ),
        )

    def _datagram(self, case: Any) -> bytes:
        kind = case[0]
        if kind == "random":
            return bytes(case[1])
        i, seq, node = case[1]
        b = bytearray(self.templates[i])
        # the group header: ver(4) hw_id(6) seq(22), then the node id
        word = (b[0] << 24 | b[1] << 16 | b[2] << 8 | b[3]) & ~((1 << 22) - 1) | seq
        b[0:4] = word.to_bytes(4, "big")
        b[4:8] = node.to_bytes(4, "big")
        return mutate(bytes(b), case[2]) if kind == "mutated" else bytes(b)

    def check(self, case: Any) -> str:
        col = self.cols[case[0]]
        data = self._datagram(case[1])
        try:
            decode(data)
            outcome = "decoded"
        except ReportError as exc:
            outcome = exc.reason
        before = col.errors["decoder_exception"]
        col.ingest(data)
        if col.errors["decoder_exception"] != before:
            raise Crash("the decoder raised something other than ReportError")
        return outcome

    def bounds(self) -> list[str]:
        out = []
        for col in self.cols:
            if col.topo is not None:
                if not set(col.nodes) <= set(col.topo.by_node_id):
                    out.append("a node outside the topology is kept")
                if not set(col.links) <= set(col.topo.links):
                    out.append("a link outside the topology is kept")
            if len(col.nodes) > col.max_nodes or len(col.links) > col.max_links:
                out.append(f"{len(col.nodes)} nodes, {len(col.links)} links")
            if len(col.flows) > col.max_flows:
                out.append(f"{len(col.flows)} flows")
            for n in col.nodes.values():
                for t in n.seq.values():
                    if len(t._missing) > t.window:
                        out.append("a sequence tracker remembers more than its window")
            for lt in col.links.values():
                if len(lt.int_series) > col.series_points:
                    out.append(f"link {lt.name}: series over its bound")
        return out
