"""The simulated twin (testbed.sim): no root, one process, virtual time.

- determinism: two runs with the same inputs and seed write byte-identical results (apart
  from the date and the machine) and CSVs;
- the mission's verdicts at the model's own speed (--scale 1, the quick suite): TiTa keeps the
  incast's p99 queue below DCQCN's without a drop, and WebSearch's p99 FCT slowdown below
  DCQCN's;
- a YAML topology and a --flows file, end to end through `xingmai-testbed run`;
- the INT source (testbed.sim.nic_programs.insert_int) builds what the transport and the INT decoder
  read.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from controller.wire.int_md import INT_DSCP_DEFAULT
from controller.wire.ipv4 import checksum as ipv4_checksum
from testbed.collective import run as coll_run
from testbed.experiment.report import comparable
from testbed.experiment.suite import SuiteConfig
from testbed.main import build_parser, main
from testbed.model import Scaling, model_with_buffer
from testbed.probes import Capture, record_int_frame
from testbed.sim.engine import EventLoop
from testbed.sim.fabric import SimFabric
from testbed.sim.nic_programs import IntSource, insert_int
from testbed.sim.suite import SimSuite
from testbed.topo import leafspine
from testbed.traffic.transport_core import TransportConfig, TransportCore

DATA = Path(__file__).parent / "data"


def _run(tmp: Path, *argv: str) -> Path:
    assert main(["run", "--engine", "sim", "--run-dir", str(tmp), *argv]) == 0
    return tmp


def _stable(path: Path) -> str:
    doc = json.loads((path / "results.json").read_text())
    return json.dumps(comparable(doc), sort_keys=True)


@pytest.mark.slow
def test_same_inputs_and_seed_give_identical_results(tmp_path: Path) -> None:
    argv = (
        "--topo",
        "leafspine:2,1,2",
        "--quick",
        "--scenarios",
        "incast,websearch",
        "--schemes",
        "dcqcn,tita",
        "--seed",
        "3",
    )
    a = _run(tmp_path / "a", *argv)
    b = _run(tmp_path / "b", *argv)
    assert _stable(a) == _stable(b)
    for name in ("flows.csv", "queues.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    c = _run(tmp_path / "c", *argv[:-1], "4")  # another seed: another WebSearch mix
    assert _stable(a) != _stable(c)
    doc = json.loads((a / "results.json").read_text())
    assert doc["setup"]["engine"] == "sim" and doc["machine"]["wall_s"] > 0
    assert {(r["scenario"], r["scheme"]) for r in doc["runs"]} == {
        ("incast", "dcqcn"),
        ("incast", "tita"),
        ("websearch", "dcqcn"),
        ("websearch", "tita"),
    }
    for plot in ("queue.png", "fct_cdf.png"):
        assert (a / plot).stat().st_size > 0


@pytest.mark.slow
def test_repeat_runs_every_cell_n_times_and_keeps_each(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "--topo",
        "leafspine:2,1,2",
        "--quick",
        "--scenarios",
        "incast",
        "--schemes",
        "dcqcn,tita",
        "--repeat",
        "2",
    )
    doc = json.loads((out / "results.json").read_text())
    assert [(r["scheme"], r["repetition"]) for r in doc["runs"]] == [
        ("dcqcn", 0),
        ("tita", 0),
        ("dcqcn", 1),
        ("tita", 1),
    ]
    assert [(s["scheme"], s["repetition"]) for s in doc["series"]] == [
        (r["scheme"], r["repetition"]) for r in doc["runs"]
    ]
    # the twin is deterministic: its repetitions run under the next seeds
    assert [r["seed"] for r in doc["runs"]] == [1, 1, 2, 2]
    assert doc["setup"]["suite"]["repeat"] == 2
    assert doc["setup"]["suite"]["proactive_start"] is True  # the default
    assert doc["verdict"][0].startswith("incast: TiTa vs DCQCN over 2 runs")
    assert main(["run", "--engine", "sim", "--repeat", "0"]) == 2


@pytest.mark.slow
def test_model_speed_verdicts_on_the_quick_suite() -> None:
    """At 400G and microsecond RTTs (HPCC's eta 0.95 and T = base RTT; DCQCN's parameters
    at the NIC's rate; the static buffer's 500 KB per port, which DCQCN's incast overflows: the
    drops are counted with their reason), on the default fabric; the laws alone, every flow
    from line rate (declared at their share, DCQCN's flows keep it and nothing queues)."""
    spec = leafspine(2, 2, 4)
    static = model_with_buffer("static")
    fab = SimFabric(spec, Scaling(model=static, scale=1, max_hops=spec.longest_path_switches()))
    cfg = SuiteConfig(
        **{
            **SuiteConfig.quick().__dict__,
            "schemes": ("dcqcn", "tita"),
            "scenarios": ("incast", "websearch"),
            "proactive_start": False,
        }
    )
    suite = SimSuite(fab, cfg)
    rec = {(r.scenario, r.scheme): r for r in suite.run()}
    assert suite.base_rtt_s < 2e-6  # the model's microsecond RTT
    ti, di = rec[("incast", "tita")], rec[("incast", "dcqcn")]
    assert ti.flows_completed == ti.flows == 7 and di.flows_completed == 7
    assert ti.queue_p99_bytes < di.queue_p99_bytes, (ti.queue_p99_bytes, di.queue_p99_bytes)
    assert ti.drops == 0
    # every drop of the twin is one its switches counted, with its reason (on the emulation
    # the rest is what the switch processes did not read: drops_uncounted). The switches
    # count more than their ports' received-minus-sent: their own drop reports leave too.
    assert di.drops > 0 and set(di.drops_by_reason) == {"queue_full"}
    assert di.drops_by_reason["queue_full"] >= di.drops and di.drops_uncounted == 0
    assert ti.drops_by_reason == {} and ti.drops_uncounted == 0
    tw, dw = rec[("websearch", "tita")], rec[("websearch", "dcqcn")]
    assert tw.flows_completed == tw.flows > 50 and dw.flows_completed == dw.flows
    assert tw.fct_slowdown_p99 is not None and dw.fct_slowdown_p99 is not None
    assert tw.fct_slowdown_p99 < dw.fct_slowdown_p99, (tw.fct_slowdown_p99, dw.fct_slowdown_p99)


def test_yaml_topology_and_flows_file(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "--topo",
        str(DATA / "twin-fabric.yaml"),
        "--flows",
        str(DATA / "twin-flows.csv"),
        "--schemes",
        "tita",
    )
    doc = json.loads((out / "results.json").read_text())
    (run,) = doc["runs"]
    assert run["scenario"] == "flows" and run["flows"] == run["flows_completed"] == 4
    assert run["bottleneck"] in run["queue_by_link"] and run["int_max_hops"] == 3
    rows = list(csv.DictReader((out / "flows.csv").open()))
    assert [(r["src"], r["dst"], int(r["bytes"])) for r in rows] == [
        ("h3", "h1", 300000),
        ("h4", "h1", 300000),
        ("h1", "h4", 50000),
        ("h2", "h3", 8000),
    ]
    assert all(float(r["fct_s"]) > 0 for r in rows)
    ports = {r["port"] for r in csv.DictReader((out / "queues.csv").open())}
    assert "leaf1:1" in ports  # h1's downlink, where the two senders meet


def test_flows_file_errors_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("src,dst,bytes,start_s\nh1,h9,100,0\n")
    with pytest.raises(ValueError, match="bad.csv:2: unknown host 'h9'"):
        from testbed.sim.run import load_flows
        from testbed.topo import parse_choice

        load_flows(bad, parse_choice("leafspine:2,1,2"))


def test_int_source_builds_what_transport_and_decoder_read() -> None:
    core = TransportCore(TransportConfig(local_ip="10.0.1.1", mtu=1024), seed=1)
    qp = core.create_qp(5, "10.0.2.1", 6)
    qp.post_send(bytes(100), 0.0)
    pkt = qp.peek(0.0)
    assert pkt is not None
    src = IntSource(True, INT_DSCP_DEFAULT, 0xF500, 8, 9014)
    with_int = insert_int(pkt, src)
    assert with_int is not None and len(with_int) == len(pkt) + 16
    assert with_int[1] >> 2 == INT_DSCP_DEFAULT and ipv4_checksum(with_int[:20]) == 0
    assert insert_int(with_int, src) is None  # already marked: left alone, as tc does
    peer = TransportCore(TransportConfig(local_ip="10.0.2.1", mtu=1024), seed=2)
    peer.create_qp(6, "10.0.1.1", 5)
    peer.receive(with_int, 0.0)  # ICRC still valid, INT parsed and echoed
    assert not peer.drops and peer.qps[6].counters.int_seen == 1
    cap = Capture()
    got = record_int_frame(cap, bytes(14) + with_int, 0.0, {})
    assert got is not None and got[1] == [] and cap.max_hops == 0  # no hop yet


def test_event_loop_orders_ties_by_scheduling() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.at(5, seen.append, "b")
    loop.at(3, seen.append, "a")
    loop.at(5, seen.append, "c")
    assert not loop.run(stop=lambda: False)
    assert seen == ["a", "b", "c"] and loop.now_ns == 5 and loop.events == 3


def test_compare_gives_ratios_per_cell_and_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed.experiment.report import write_results
    from testbed.experiment.suite import RunRecord

    def rec(scheme: str, q: float, t: float) -> RunRecord:
        return RunRecord(
            scheme=scheme,
            scenario="incast",
            bottleneck="leaf1:1",
            queue_p50_bytes=0,
            queue_p99_bytes=q,
            queue_max_bytes=q,
            queue_samples=10,
            drops=0,
            utilization=0.5,
            fct_slowdown_p50=2.0,
            fct_slowdown_p99=4.0,
            flows=7,
            flows_completed=7,
            busbw_bps=None,
            completion_s=t,
            int_packets=10,
            int_max_hops=3,
            retransmits=0,
            cnps=0,
            out_of_order=0,
            window=64,
        )

    for name, q, t in (("a", 100_000.0, 2.0), ("b", 150_000.0, 1.0)):
        (tmp_path / name).mkdir()
        write_results(
            tmp_path / name / "results.json",
            [rec("tita", q, t)],
            {"engine": name, "topology": "x", "scale": 20000},
        )
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "p99 queue KB" in ln)
    assert line.split()[-3:] == ["100", "150", "1.50"]
    line = next(ln for ln in out.splitlines() if "time s" in ln)
    assert line.split()[-1] == "0.50"
    with pytest.raises(ValueError, match="at least two"):
        from testbed.experiment.report import compare

        compare([tmp_path / "a"])


def test_sweep_on_a_local_dask_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "sweep",
                "--topo",
                "leafspine:2,1,2",
                "--quick",
                "--scenarios",
                "incast",
                "--schemes",
                "tita",
                "--param",
                "incast_bytes=50000,100000",
                "--seeds",
                "1,2",
                "--workers",
                "1",
                "--run-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["param"] == "incast_bytes" and len(doc["points"]) == 4
    from testbed.sweep import aggregate

    cells = aggregate(doc["points"])
    small, big = cells[(50000, "incast", "tita")], cells[(100000, "incast", "tita")]
    assert small["seeds"] == big["seeds"] == 2
    assert small["time ms"][0] < big["time ms"][0]  # twice the bytes take longer
    assert "50000" in capsys.readouterr().out


def test_link_serializes_delays_and_drops_over_mtu() -> None:
    from testbed.sim.fabric import Wire

    loop = EventLoop()
    got: list[tuple[int, int]] = []
    wire = Wire(loop, 8e9, 100, 1000, lambda f: got.append((loop.now_ns, len(f))))
    assert wire.send(bytes(1014), 0)  # 1014 B at 8 Gb/s: 1014 ns, then 100 ns
    assert not wire.send(bytes(1015), 0) and wire.too_big == 1
    loop.run()
    assert got == [(1114, 1014)]


def test_a_run_that_cannot_finish_is_recorded_and_the_suite_goes_on() -> None:
    """A workload that stalls (here h1 cut off: its only link down, so the ring all-reduce
    never completes) is that run's result: recorded as failed with why, in the table and with
    no completion-time verdict, and the next run goes on (the emulation's TIMELY all-reduce
    once stalled and ended the whole suite with a traceback)."""
    from testbed.experiment.report import table, verdict
    from testbed.faults import Fault

    spec = leafspine(2, 1, 2)
    fab = SimFabric(spec, Scaling(max_hops=spec.longest_path_switches()))
    cfg = SuiteConfig(
        **{
            **SuiteConfig.quick().__dict__,
            "schemes": ("dcqcn", "tita"),
            "scenarios": ("allreduce", "incast"),
        }
    )
    suite = SimSuite(fab, cfg)
    suite.faults = [Fault("leaf1:1", "down", None, 0.0)]
    records = suite.run()
    assert [(r.scheme, r.scenario) for r in records] == [
        ("dcqcn", "allreduce"),
        ("dcqcn", "incast"),
        ("tita", "allreduce"),
        ("tita", "incast"),
    ]
    stuck = [r for r in records if r.scenario == "allreduce"]
    assert all("stuck" in r.error and r.flows_completed == 0 for r in stuck), stuck[0].error
    assert all(not r.error for r in records if r.scenario == "incast")
    assert "FAILED 1 of 1" in table(records)
    lines = verdict(records)
    assert any(
        v.startswith("allreduce") and "no verdict (a run did not finish)" in v for v in lines
    ), lines


def test_the_proactive_start_paces_the_incast_at_its_fair_share_from_the_first_packet() -> None:
    """The proactive start (on by default): the incast's senders declare their share of the
    receiver's link to their NICs; each flow is paced at it from its first packet and its
    law starts there, so the startup burst that fills the queue does not happen. Its
    ablation, `tita-reactive`, is TiTa as it runs with the start off: the same records."""
    spec = leafspine(2, 2, 4)
    quick = SuiteConfig.quick().__dict__
    fab = SimFabric(spec, Scaling(max_hops=spec.longest_path_switches()))
    cfg = SuiteConfig(
        **{**quick, "schemes": ("none", "tita", "tita-reactive"), "scenarios": ("incast",)}
    )
    assert cfg.proactive_start
    on = {r.scheme: r for r in SimSuite(fab, cfg).run()}
    off_cfg = SuiteConfig(
        **{**quick, "schemes": ("tita",), "scenarios": ("incast",), "proactive_start": False}
    )
    off = SimSuite(fab.fresh(), off_cfg).run()[0]
    plain, hinted = on["tita-reactive"], on["tita"]
    assert plain.start_hints == 0 and hinted.start_hints == 7  # one flow per sender
    assert on["none"].start_hints == 0  # no law, no hint: no CC stays no CC
    assert {**plain.summary(), "scheme": "tita"} == off.summary()
    assert hinted.drops == 0 and hinted.flows_completed == hinted.flows == 7
    assert hinted.queue_p99_bytes < 0.6 * plain.queue_p99_bytes, (
        hinted.queue_p99_bytes,
        plain.queue_p99_bytes,
    )
    assert hinted.completion_s <= 1.05 * plain.completion_s
    # the law's first rate of every flow is near the share (1/7 of the line), not the line
    # rate it starts from without the hint
    line = fab.scaling.nic_bps
    firsts = [s["v"][0] for s in hinted.rate_series.values() if s["v"]]
    assert len(firsts) == 7 and all(v < 0.25 * line for v in firsts), (firsts, line)
    plain_firsts = [s["v"][0] for s in plain.rate_series.values() if s["v"]]
    assert all(v > 0.5 * line for v in plain_firsts), plain_firsts


def test_the_proactive_start_is_on_unless_the_command_turns_it_off() -> None:
    parser = build_parser()
    for argv in (["run"], ["collective"], ["tune"]):
        assert parser.parse_args(argv).proactive_start is True, argv
        assert parser.parse_args([*argv, "--no-proactive-start"]).proactive_start is False


def test_the_collectives_declare_their_start_under_every_law_but_the_ablation() -> None:
    """What a collective job declares to the NICs (CollFabric.start, into every job's spec):
    its fair share under every scheme with a rate law (the fairness rule: the baselines get
    what TiTa gets), nothing under no CC, under `tita-reactive` or with the start off."""
    spec = leafspine(2, 2, 4)
    fab = SimFabric(spec, Scaling(max_hops=spec.longest_path_switches()))
    line = fab.scaling.nic_bps
    on = SimSuite(fab, SuiteConfig())
    for name in ("tita", "dcqcn", "dcqcn+pfc", "hpcc", "timely", "swift"):
        assert on.collective_fabric(name).start == {"start_share_bps": line}, name
    for name in ("none", "tita-reactive"):
        assert on.collective_fabric(name).start == {}, name
    off = SimSuite(fab, SuiteConfig(proactive_start=False))
    assert off.collective_fabric("tita").start == {}
    job = coll_run.job_spec(on.collective_fabric("dcqcn"), collective="alltoall", size=1 << 20)
    assert job["start_share_bps"] == line


def test_ack_every_is_each_schemes_own_unless_the_run_sets_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--ack-every N` (SuiteConfig.ack_every): the receivers ACK every N packets under every
    scheme, in the suite's workloads and in its collectives; unset, each scheme's own (TIMELY
    and Swift time single packets)."""
    spec = leafspine(2, 2, 4)
    fab = SimFabric(spec, Scaling(max_hops=spec.longest_path_switches()))
    own = SimSuite(fab, SuiteConfig())
    assert (own.ack_every("tita"), own.ack_every("timely"), own.ack_every("swift")) == (2, 1, 1)
    assert own.collective_fabric("timely").transport["ack_every"] == 1
    assert own.collective_fabric("tita").transport["ack_every"] == 2
    quick = SuiteConfig.quick().__dict__
    cfg = SuiteConfig(**{**quick, "schemes": ("tita",), "scenarios": ("incast",), "ack_every": 1})
    forced = SimSuite(fab, cfg)
    assert forced.ack_every("tita") == 1
    assert forced.collective_fabric("dcqcn").transport["ack_every"] == 1
    seen = []
    workload = SimSuite._workload

    def spy(self: SimSuite, scenario: str, window: int, ack_every: int) -> dict:
        seen.append(ack_every)
        return workload(self, scenario, window, ack_every)

    monkeypatch.setattr(SimSuite, "_workload", spy)
    (rec,) = forced.run()
    assert seen == [1] and rec.flows_completed == rec.flows
    assert main(["run", "--engine", "sim", "--ack-every", "0", "--run-dir", str(tmp_path)]) == 2


@pytest.mark.parametrize("pipeline", ["native", "reference"])
def test_the_switches_share_one_parsed_program_and_never_write_it(pipeline: str) -> None:
    """The fabric's switches load the program from one parse (its bytes and JSON held once
    per process, not per switch: 80 switches at 1,024 hosts), which is only safe while
    nothing that loads or runs a program writes into its JSON: after an incast through every
    switch, the shared JSON is still what the bytes say."""
    from testbed.switch.v1model import parsed_config

    spec = leafspine(2, 2, 2)
    fab = SimFabric(spec, Scaling(max_hops=spec.longest_path_switches()), pipeline=pipeline)
    raws = {name: s.sw.json_bytes for name, s in fab.switches.items()}
    first = next(iter(raws.values()))
    assert all(r is first for r in raws.values())
    cfg = SuiteConfig(**{**SuiteConfig.quick().__dict__, "schemes": ("tita",)})
    cfg = SuiteConfig(**{**cfg.__dict__, "scenarios": ("incast",)})
    (rec,) = SimSuite(fab, cfg).run()
    assert rec.flows_completed == rec.flows > 0
    raw, doc = parsed_config(first)
    assert raw is first and doc == json.loads(raw)


def test_long_lived_flows_keep_two_messages_posted_and_end_idle() -> None:
    """The long-lived job on the twin: every flow keeps two messages posted for the duration
    (the next posted as one completes), then lets them finish: each flow acknowledged several
    messages by the end, and every message arrived intact."""
    from controller.nic.ratelaw import Law
    from testbed.experiment.suite import tita_window, transport_settings
    from testbed.traffic import generators as gen

    spec = leafspine(2, 2, 2)
    s = Scaling(scale=1, max_hops=spec.longest_path_switches())
    fab = SimFabric(spec, s)
    fab.set_law(Law.TITA, round(s.base_rtt_s * 1e9))
    message = 64 << 10
    flows = gen.pairs_flows([(0, 2), (1, 3)], message, 1)
    job = {
        "kind": "longlived",
        "flows": [f.as_dict() for f in flows],
        "duration": 40e-6,
        "message": message,
        "transport": transport_settings(s, tita_window(s, s.base_rtt_s)),
        "timeout": 1.0,
    }
    out = fab.run_job(fab.traffic_hosts(), job)
    per_flow = [f for r in out.results for f in r["flows"]]
    assert len(per_flow) == 2
    # 400G for 40 us is 2 MB: each of the two flows got well past a few 64 KiB messages
    assert all(f["acked_bytes"] >= 4 * message for f in per_flow), per_flow
    assert sum(r["bad_messages"] for r in out.results) == 0
    received = sum(r["received_messages"] for r in out.results)
    assert received * message >= sum(f["acked_bytes"] for f in per_flow)
