"""The collective library (testbed.collective) on the simulated twin: every collective and
algorithm gives the right sums on every rank at small sizes, over both rails of a
rail topology; the check catches a wrong plan; concurrent jobs; the metrics; the scenario
file's errors; a degraded rail with static and adaptive channels."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.collective.metrics import parse_sizes, summarize
from testbed.collective.run import (
    CollFabric,
    collective,
    concurrent,
    degraded_rail,
    load_jobs,
    parse_job,
)
from testbed.experiment.suite import SuiteConfig
from testbed.model import Scaling
from testbed.sim.fabric import SimFabric
from testbed.sim.suite import SimSuite
from testbed.topo import rail
from testbed.traffic import collective_jobs
from testbed.traffic import collective_plans as plan

CASES = [(c, a) for c, algs in plan.SUPPORTED.items() for a in algs]


def _fabric(nics: int, hosts: int) -> CollFabric:
    """The twin at the model's speed, TiTa on every NIC."""
    spec = rail(nics, hosts, 1)
    fab = SimFabric(spec, Scaling(scale=1.0, max_hops=spec.longest_path_switches()))
    suite = SimSuite(fab, SuiteConfig())
    suite.prepare()
    suite.use_scheme("tita")
    return suite.collective_fabric("tita")


@pytest.fixture(scope="module")
def rail3() -> CollFabric:
    """Three hosts (not a power of two) with two NICs each."""
    return _fabric(2, 3)


@pytest.mark.parametrize(("coll", "alg"), CASES)
@pytest.mark.parametrize("schedule", ["static", "adaptive"])
def test_every_algorithm_sums_right_on_every_rank(
    rail3: CollFabric, coll: str, alg: str, schedule: str
) -> None:
    # an odd element count, several messages per channel, two iterations
    r = collective(
        rail3, collective=coll, algorithm=alg, size=4 * 3001, chunk=2048, schedule=schedule, iters=2
    )
    assert r["correct"] and r["wrong_ranks"] == 0
    assert all(b > 0 for b in r["channel_bytes"]), "both rails carry the collective"
    assert r["iterations"] == 2 and r["busbw_Bps"] > 0


def test_a_run_depends_only_on_its_inputs(rail3: CollFabric) -> None:
    """Issue 27's run independence for the collective library on the twin: a run on the
    module's fabric, after every test before it and after a run of another size, gives the
    record it gives on a fabric just built (each run gets a fresh one)."""
    params = {"collective": "allreduce", "algorithm": "tree", "size": 4 * 3001, "chunk": 2048}
    collective(rail3, **{**params, "size": 4 * 9001})
    after = collective(rail3, **params)
    alone = collective(_fabric(2, 3), **params)
    assert after == alone


@pytest.mark.parametrize("payload", ["data", "size"])
def test_a_wrong_plan_is_caught(
    rail3: CollFabric, monkeypatch: pytest.MonkeyPatch, payload: str
) -> None:
    real = plan.build

    def wrong(spec: plan.PlanSpec) -> list[plan.Transfer]:
        out = real(spec)
        # the first reduce step overwrites instead of adding: some sums miss a rank
        out[0] = replace(out[0], op=plan.Op.COPY)
        return out

    # the plans are built once per process: this one is built (and then dropped) wrong
    cache_clear = collective_jobs.layout.cache_clear
    cache_clear()
    monkeypatch.setattr("testbed.traffic.collective_jobs.build", wrong)
    try:
        r = collective(
            rail3, collective="allreduce", algorithm="ring", size=4096, chunk=1024, payload=payload
        )
    finally:
        cache_clear()
    assert not r["correct"] and r["wrong_ranks"] >= 1


@pytest.mark.parametrize(("coll", "alg"), CASES)
def test_sizes_only_run_as_the_data_does(coll: str, alg: str) -> None:
    """`payload: size`: the same bytes on the wire, so the same times, and every rank's
    fingerprints check out, with a buffer of a few values, not of the data (each on a
    fabric of its own, as built)."""
    runs = {
        p: collective(
            _fabric(2, 3),
            collective=coll,
            algorithm=alg,
            size=4 * 3001,
            chunk=2048,
            iters=2,
            payload=p,
        )
        for p in ("data", "size")
    }
    data, size = runs["data"], runs["size"]
    assert data["correct"] and size["correct"] and size["wrong_ranks"] == 0
    for k in ("time_s", "time_spread_s", "busbw_Bps", "channel_bytes", "moved", "transfers"):
        assert size[k] == data[k], k
    spec = plan.PlanSpec(coll, alg, 3, 3001, 2, 2048, gpus=2)
    lay = collective_jobs.layout(spec, "size")
    assert lay.units < len(plan.build(spec)) < 3001


@pytest.mark.parametrize(("coll", "alg"), CASES)
def test_every_transfer_covers_whole_pieces_at_both_ends(coll: str, alg: str) -> None:
    """The pieces of the size mode: a transfer's source and destination ranges start and
    end on piece boundaries and hold as many pieces (all-to-all moves blocks elsewhere)."""
    for n, count in ((2, 1000), (3, 4 * 1000 + 3), (5, 997)):
        spec = plan.PlanSpec(coll, alg, n, count, 2, 512, gpus=2)
        lay = collective_jobs.layout(spec, "size")
        for x in plan.build(spec):
            a, b = lay.span(x.lo, x.hi)
            c, d = lay.span(x.dst_lo, x.dst_lo + x.hi - x.lo)
            assert b - a == d - c >= (1 if x.hi > x.lo else 0)
            for i in range(a, b):  # the same sizes in the same order
                assert (
                    lay.cuts[i + 1] - lay.cuts[i] == lay.cuts[c + i - a + 1] - lay.cuts[c + i - a]
                )
    with pytest.raises(ValueError, match="payload"):
        collective_jobs.layout(spec, "bytes")


def test_plans_respect_causality() -> None:
    """Every dependency of a transfer arrives at its sender, and earlier in the plan."""
    for coll, alg in CASES:
        for n in (2, 3, 5):
            ps = plan.PlanSpec(coll, alg, n, 4 * 1000 + 3, 2, 512, gpus=2)
            ts = plan.build(ps)
            for t in ts:
                assert 0 <= t.src < n and 0 <= t.dst < n and t.src != t.dst
                for d in t.deps:
                    assert d < t.id and ts[d].dst == t.src
            assert {t.channel for t in ts} == {0, 1}


def test_double_binary_tree_leaves_are_inner_nodes_of_the_other() -> None:
    # NCCL's trees: two children at most per rank over both trees (an inner node of one is a
    # leaf of the other, or, n odd, rank 0 a one-child node of each), so at most twice its
    # share of the buffer moved
    for n in range(2, 40):
        a, b = plan.double_binary_trees(n)
        for t in (a, b):
            assert len(t) == n - 1 and sum(1 for r in range(n) if r not in t) == 1  # one root
        kids = list(a.values()) + list(b.values())
        assert max(kids.count(r) for r in range(n)) <= 2, n
    assert plan.double_binary_trees(8)[0] == {1: 2, 2: 4, 3: 2, 4: 0, 5: 6, 6: 4, 7: 6}
    sent: dict[int, int] = {}
    for x in plan.build(plan.PlanSpec("allreduce", "tree", 8, 1 << 16, 1, 1 << 12)):
        sent[x.src] = sent.get(x.src, 0) + x.nbytes
    assert max(sent.values()) <= 2 * (1 << 16) * 4  # twice the buffer (float32 elements)


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="no 'tree'"):
        plan.PlanSpec("alltoall", "tree", 4, 1024, 2, 4096)
    with pytest.raises(ValueError, match="fewer than one"):
        plan.PlanSpec("allreduce", "ring", 4, 3, 1, 4096)
    with pytest.raises(ValueError, match="own GPU"):
        plan.PlanSpec("allreduce", "hier", 4, 1024, 2, 4096, gpus=1)


def test_metrics_follow_nccl_tests() -> None:
    rank = {
        "size": 8 << 20,
        "bus_factor": plan.bus_factor("allreduce", 8),
        "channels": 2,
        "collective": "allreduce",
        "algorithm": "ring",
        "schedule": "static",
        "payload": "data",
        "chunk": 1 << 20,
        "ranks": 8,
        "ok": True,
        "channel_bytes": [1, 1],
        "moved": 0,
        "transfers_out": 1,
    }
    results: list[dict[str, Any]] = [
        dict(rank, coll=[(0.0, 0.9), (1.0, 2.0)]),
        dict(rank, coll=[(0.1, 1.0), (1.0, 1.5)]),
    ]
    r = summarize(results, nic_payload_bps=100e9, nics=2)
    # each rank's own time, averaged over the ranks (0.9, 0.9; 1.0, 0.5), then over the
    # iterations (0.9, 0.75): nccl-tests', not the first start to the last end (1.0, 1.0)
    assert r["time_s"] == pytest.approx(0.825)
    assert r["time_spread_s"] == pytest.approx(0.15)
    # the scenario table's: first start to last end (1.0, 1.0), and its busbw
    assert r["makespan_s"] == pytest.approx(1.0)
    assert r["makespan_busbw_Bps"] == pytest.approx((8 << 20) * 2 * 7 / 8)
    w = summarize(results, nic_payload_bps=100e9, nics=2, warmup=1)
    assert w["time_s"] == pytest.approx(0.75) and w["iterations"] == 1
    r = summarize(
        [dict(rank, coll=[(0.0, 0.8), (0.8, 2.0)]), dict(rank, coll=[(0.0, 1.0), (1.0, 2.0)])],
        nic_payload_bps=100e9,
        nics=2,
    )
    assert r["time_s"] == pytest.approx(1.0)  # two iterations in 2.0: 1.0 each
    assert r["algbw_Bps"] == pytest.approx(8 << 20)
    assert r["busbw_Bps"] == pytest.approx((8 << 20) * 2 * 7 / 8)
    assert r["efficiency"] == pytest.approx(r["busbw_Bps"] * 8 / 200e9)
    assert parse_sizes("64K:1M:4") == [64 << 10, 256 << 10, 1 << 20]
    assert parse_sizes("1M,3K") == [1 << 20, 3 << 10]


def test_scenario_file_errors_name_the_job(tmp_path: Path) -> None:
    f = tmp_path / "jobs.yaml"
    f.write_text("jobs:\n  - {name: a, hosts: 0-9, collective: allreduce, size: 1M}\n")
    with pytest.raises(ValueError, match="job 0: hosts"):
        load_jobs(f, 4)
    with pytest.raises(ValueError, match="kind 'x'"):
        parse_job({"name": "b", "hosts": [0, 1], "kind": "x"}, 4, "here")
    f.write_text("nothing: here\n")
    with pytest.raises(ValueError, match="list 'jobs'"):
        load_jobs(f, 4)


def test_concurrent_jobs_each_correct_with_slowdown() -> None:
    fab = _fabric(2, 4)
    decls = [
        parse_job(
            {
                "name": "dp",
                "hosts": "0-1",
                "collective": "allreduce",
                "size": "64K",
                "iters": 2,
                "compute": 5e-6,
            },
            4,
            "dp",
        ),
        parse_job(
            {"name": "moe", "hosts": [2, 3], "collective": "alltoall", "size": "64K", "iters": 2},
            4,
            "moe",
        ),
        parse_job(
            {"name": "bg", "kind": "websearch", "hosts": "0-3", "load": 0.2, "seconds": 20e-6},
            4,
            "bg",
        ),
    ]
    res = concurrent(fab, decls)
    rows = {r["name"]: r for r in res["jobs"]}
    assert all(r["correct"] for r in rows.values())
    dp = rows["dp"]
    assert dp["iter_s"] > dp["compute_s"] > 0 and 0 < dp["comm_share"] < 1
    assert dp["slowdown"] > 0.5 and rows["moe"]["slowdown"] > 0.5
    assert rows["bg"]["flows"] > 0


def test_adaptive_channels_ride_out_a_degraded_rail() -> None:
    """One rail's port into host 1 at a quarter rate: the static split runs at the slow
    rail's pace, the adaptive schedule moves chunks to the healthy rail."""
    fab = _fabric(2, 4)
    d = degraded_rail(
        fab,
        "rail2",
        2,
        0.25,
        collective="allreduce",
        algorithm="ring",
        size=512 << 10,
        chunk=32 << 10,
        iters=2,
        warmup=1,
    )
    assert d["healthy"]["correct"] and d["static"]["correct"] and d["adaptive"]["correct"]
    # at least the healthy rails' share; the ideal uses the slow one too
    assert d["adaptive_ratio"] >= 1 / 2 and d["ideal"] == (2 - 1 + 0.25) / 2
    assert d["goal"] == pytest.approx(0.95 * d["ideal"])
    assert d["adaptive_ratio"] > d["static_ratio"] + 0.05
    assert d["adaptive"]["moved"] > 0


def test_a_rail_that_degrades_mid_collective_is_reckoned_with_within_10_rtts() -> None:
    """The port into host 2's second NIC drops to a quarter 5 us into the all-reduce (a
    fault, timed from the job's start): its sender's schedule reckons the channel halfway
    down within the issue's 10 base RTTs (here from its messages' completions: TiTa does
    not cut a flow that its window already holds to the port's pace); the fault is applied
    once per degraded run."""
    fab = _fabric(2, 4)
    d = degraded_rail(
        fab,
        "rail2",
        2,
        0.25,
        at=5e-6,
        collective="allreduce",
        algorithm="ring",
        size=1 << 20,
        chunk=32 << 10,
        iters=3,
        warmup=1,
    )
    assert d["static"]["correct"] and d["adaptive"]["correct"]
    for run in ("static", "adaptive"):
        (f,) = d[run]["faults"]
        assert (f["target"], f["kind"], f["value"]) == ("rail2:2", "rate", 0.25)
    r = d["reaction"]
    assert r["towards"] == "h2 nic 1" and list(r["senders"]) == ["h1"]
    h1 = r["senders"]["h1"]
    assert h1 is not None and 0 < h1["rtts"] <= r["goal_rtts"] == 10
    assert "rate_trace" not in d["adaptive"]
    assert d["adaptive_ratio"] > d["static_ratio"] + 0.05


def test_tuner_picks_the_fastest_measured_and_auto_uses_it(
    rail3: CollFabric, tmp_path: Path
) -> None:
    from testbed.collective import tune

    cache = tmp_path / "tune.json"
    res = tune.tune(rail3, "allreduce", [16 << 10], cache, collective, say=lambda _: None)
    for row in res["rows"]:
        same = [m["busbw_Bps"] for m in res["measured"] if m["size"] == row["size"]]
        assert row["busbw_Bps"] * tune.MIN_GAIN >= max(same) >= row["busbw_Bps"]
        assert row["busbw_Bps"] >= row["default_Bps"]
        got = tune.choose(
            cache, rail3.topology, len(rail3.hosts), rail3.nics, "allreduce", row["size"], "tita"
        )
        assert got == {k: row[k] for k in ("algorithm", "channels", "chunk", "cc")}
        # the CC knobs of TiTa were tried at the chosen algorithm, chunk and channels
        tried = {
            json.dumps(m["cc"], sort_keys=True)
            for m in res["measured"]
            if m["size"] == row["size"] and m["chunk"] == row["chunk"]
        }
        assert len(tried) == 1 + sum(len(v) for v in tune.CC_KNOBS["tita"].values())
        assert row["busbw_Bps"] >= row["profile_Bps"]
    # another scheme was not tuned: the default
    assert (
        tune.choose(
            cache, rail3.topology, len(rail3.hosts), rail3.nics, "allreduce", 16 << 10, "dcqcn"
        )
        == tune.DEFAULT
    )
    r = collective(rail3, collective="allreduce", algorithm="auto", size=16 << 10, tune_cache=cache)
    assert r["correct"] and r["algorithm"] == res["rows"][0]["algorithm"]


def test_the_tuner_keeps_the_default_unless_another_is_a_percent_faster() -> None:
    from testbed.collective.tune import _best

    bw = {"default": 100.0, "near": 100.9, "better": 101.2, "best": 102.3}.__getitem__
    assert _best(["default", "near"], bw) == "default"
    assert _best(["default", "near", "better"], bw) == "better"
    assert _best(["default", "better", "best"], bw) == "best"
    assert _best(["default", "best", "better"], bw) == "best"


def test_tuned_cc_parameters_reach_the_nics_for_that_run_only(tmp_path: Path) -> None:
    """A tuned choice with CC parameters: the run given `algorithm: auto` runs its law with
    them, the next run with the profile as configured."""
    from testbed.collective import tune

    spec = rail(2, 3, 1)
    suite = SimSuite(
        SimFabric(spec, Scaling(scale=1.0, max_hops=spec.longest_path_switches())), SuiteConfig()
    )
    suite.prepare()
    suite.use_scheme("dcqcn")
    fab = suite.collective_fabric("dcqcn")
    cache = tmp_path / "tune.json"
    size = 16 << 10
    cc = {"g": "0.0625 fraction", "rai_bps": "0.001 line"}
    entry = {"algorithm": "tree", "channels": 1, "chunk": 4096, "cc": cc, "busbw_Bps": 1.0}
    k = tune.key(fab.topology, len(fab.hosts), fab.nics, "allreduce", size, "dcqcn")
    cache.write_text(json.dumps({k: entry}))
    r = collective(fab, collective="allreduce", algorithm="auto", size=size, tune_cache=cache)
    assert r["correct"] and r["algorithm"] == "tree"
    record = suite.cc_records["dcqcn"]
    assert record["profile"] == "dcqcn-nvidia[g=0.0625 fraction,rai_bps=0.001 line]"
    params = {h.nic.params.dcqcn for h in suite.fab.hosts.values()}
    assert len(params) == 1
    (got,) = params
    assert got.rai_bps == int(suite.scaling.nic_bps) // 1000 and record["values"]["g"] == 0.0625
    collective(fab, collective="allreduce", algorithm="ring", size=size)
    assert suite.cc_records["dcqcn"]["profile"] == "dcqcn-nvidia"
    (plain,) = {h.nic.params.dcqcn for h in suite.fab.hosts.values()}
    assert plain.rai_bps == 5_000_000 and plain != got
    # a suite's run starts from the configured CC, whatever a collective set before it
    fab.set_cc(cc)
    assert suite.cc_records["dcqcn"]["profile"].startswith("dcqcn-nvidia[")
    suite.run_one("dcqcn", "incast")
    assert suite.cc_records["dcqcn"]["profile"] == "dcqcn-nvidia"
    assert {h.nic.params.dcqcn for h in suite.fab.hosts.values()} == {plain}


class _FakeQp:
    """A queue pair that hands over what the test delivers and completes every send, telling
    its watcher as a core does (QueuePair.watch)."""

    watch: set[Any] | None = None

    def __init__(self, qpn: int) -> None:
        self.qpn = qpn
        self.inbox: list[bytes] = []

    def deliver(self, data: bytes) -> None:
        self.inbox.append(data)
        if self.watch is not None:
            self.watch.add(self)

    def poll_recv(self) -> Any:
        if not self.inbox:
            return None
        data = self.inbox.pop(0)
        return type("Msg", (), {"data": data, "size": len(data)})()

    def post_send(self, data: bytes, now: float, tag: object = None, size: int = 0) -> Any:
        if self.watch is not None:
            self.watch.add(self)
        return type("Op", (), {"done": True, "t_done": now})()


class _FakeHost:
    def __init__(self) -> None:
        self.qps: dict[int, Any] = {}

    def create_qp(
        self, qpn: int, peer_ip: str, remote_qpn: int, *, local_ip: str | None = None
    ) -> Any:
        self.qps[qpn] = _FakeQp(qpn)
        return self.qps[qpn]


def test_next_iterations_messages_during_compute_are_kept() -> None:
    """A peer a step ahead sends iteration i+1's data while this rank still computes: it is
    kept for i+1, not taken for a duplicate of iteration i's."""
    from testbed.traffic.collective_jobs import HEADER, CollectiveJob

    host = _FakeHost()
    spec = {
        "hosts": [{"ip": "10.0.1.1"}, {"ip": "10.0.1.2"}],
        "size": 64,
        "chunk": 64,
        "collective": "sendrecv",
        "iters": 2,
        "compute": 1.0,
    }
    job = CollectiveJob(host, spec, 1)
    qp = next(iter(host.qps.values()))
    (x,) = job.incoming.values()

    def msg(it: int) -> bytes:
        return HEADER.pack(it, x.id) + job._inputs(it, 0).tobytes()

    job.start(0.0)
    qp.deliver(msg(0))
    assert not job.poll(1.0)  # iteration 0's collective: data in, own send posted
    assert not job.poll(1.0)  # the send completed: iteration 1 computes
    assert job.it == 1 and job.phase == "compute"
    qp.deliver(msg(1))  # the peer is in iteration 1 already
    assert not job.poll(1.5)
    assert not job.poll(2.0)  # iteration 1: the kept data in, own send posted
    assert job.poll(2.0) and job.ok and job.unexpected == 0


def test_the_collective_command_records_its_provenance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """collective.json names its date, machine, code and command (less --run-dir), as run's
    results.json does: the docs' tables cite them, and `report --markdown` prints the table
    with its run named."""
    from testbed.main import main

    argv = ["collective", "--sizes", "64K", "--algorithms", "ring", "--iters", "1"]
    assert main([*argv, "--warmup", "0", "--run-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "collective.json").read_text())
    assert doc["command"] == "xingmai-testbed " + " ".join([*argv, "--warmup", "0"])
    assert doc["date"][:2] == "20" and doc["machine"]["cores"] and "rows" in doc
    assert "commit" in doc["source"] or "version" in doc["source"]
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Run `{tmp_path}`") and doc["date"] in out and doc["command"] in out
    assert "busbw(GB/s)" in out and "65536" in out and out.count("```") == 2
