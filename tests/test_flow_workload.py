"""SimAI/AICB workload files on the flow engine (testbed/flow/workload.py): the file read as
SimAI's Workload.cc reads it, every bad line named; the groups laid out TP-fastest (TP in a
server, DP along a rail, EP of consecutive DP ranks); one pass of SimAI's loop (blocking
forward and input-gradient collectives, weight-gradient ones FIFO beside the backward pass);
`flow-workload`'s figures."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from testbed.flow import workload
from testbed.flow.collectives import model_link_latency, ring_allreduce
from testbed.flow.fabric import ClosParams, build_clos
from testbed.main import main

DATA = Path(__file__).parent / "data" / "workloads"
MOE = DATA / "moe-tp8-ep8-128gpus.txt"
HEAD = (
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 8 ep: 1 pp: 1 vpp: 1 ga: 1 "
    "all_gpus: 16 checkpoints: 0 checkpoint_initiates: 0"
)


def _file(tmp_path: Path, *layers: str, head: str = HEAD) -> Path:
    p = tmp_path / "w.txt"
    p.write_text("\n".join([head, str(len(layers)), *layers]) + "\n")
    return p


def test_the_file_as_simai_reads_it() -> None:
    wl = workload.read(MOE)
    assert (wl.tp, wl.dp, wl.pp, wl.ep, wl.all_gpus) == (8, 16, 1, 8, 128)
    assert [layer.name for layer in wl.layers][:3] == [
        "grad_gather",
        "grad_param_comm",
        "embedding_layer",
    ]
    emb = wl.layers[2]
    # times in ns (SimAI's ticks); no suffix: TP forward and input gradient, DP weight gradient
    assert emb.fwd == workload.Phase(500e-6, "allreduce", "TP", 16 << 20)
    assert emb.ig == workload.Phase(1e-9, "", "", 0)
    assert wl.layers[0].wg == workload.Phase(1e-9, "allgather", "DP", 64 << 20)
    assert wl.layers[4].fwd.group == "EP" and wl.layers[4].fwd.collective == "alltoall"
    assert wl.layers[5].wg.group == "DP_EP" and wl.group_size("DP_EP") == 2


def test_the_groups_tp_fastest_then_dp_then_pp() -> None:
    wl = workload.Workload("x", "p", 8, 2, 2, 1, 1, 64, 0, ())  # TP 8, EP 2, PP 2
    assert wl.dp == 4
    tp = workload.groups(wl, "TP")
    assert len(tp) == 8 and list(tp[1]) == list(range(8, 16))  # a server's GPUs
    dp = workload.groups(wl, "DP")
    assert len(dp) == 16 and list(dp[0]) == [0, 8, 16, 24] and list(dp[8]) == [32, 40, 48, 56]
    ep = workload.groups(wl, "EP")  # 2 consecutive DP ranks
    assert list(ep[0]) == [0, 8] and list(ep[1]) == [1, 9]
    dp_ep = workload.groups(wl, "DP_EP")  # the DP ranks of one expert index
    assert list(dp_ep[0]) == [0, 16] and list(dp_ep[1]) == [1, 17]
    for kind in ("TP", "DP", "EP", "DP_EP"):  # every GPU in exactly one group of each kind
        assert sorted(np.concatenate(workload.groups(wl, kind))) == list(range(64))


@pytest.mark.parametrize(
    ("head", "layers", "message"),
    [
        ("DLRM", ["l -1 1 NONE 0 1 NONE 0 1 NONE 0 1"], "policy 'DLRM'"),
        (HEAD.replace("ga: 1 ", ""), ["l -1 1 NONE 0 1 NONE 0 1 NONE 0 1"], "ga must be given"),
        (HEAD.replace("all_gpus: 16", "all_gpus: 12"), [], "not a multiple of TP 8"),
        (HEAD.replace("checkpoints: 0", "checkpoints: 1 3"), [], "checkpoints"),
        (HEAD, ["l -1 1 NONE 0 1 NONE 0"], "w.txt:3: 8 fields"),
        (
            HEAD,
            ["l -1 1 ALLREDUCEALLTOALL 8 1 NONE 0 1 NONE 0 1"],
            "fwd collective 'ALLREDUCEALLTOALL'",
        ),
        (HEAD, ["l -1 x NONE 0 1 NONE 0 1 NONE 0 1"], "fwd compute time 'x'"),
        (HEAD, ["l -1 1 ALLREDUCE -8 1 NONE 0 1 NONE 0 1"], "a negative"),
    ],
)
def test_a_bad_file_is_named_with_its_line(
    tmp_path: Path, head: str, layers: list[str], message: str
) -> None:
    p = _file(tmp_path, *layers, head=head)
    with pytest.raises(workload.WorkloadError, match=message):
        workload.read(p)


def test_a_layer_count_that_does_not_match(tmp_path: Path) -> None:
    p = _file(tmp_path, "l -1 1 NONE 0 1 NONE 0 1 NONE 0 1")
    p.write_text(p.read_text().replace("\n1\n", "\n2\n"))
    with pytest.raises(workload.WorkloadError, match="2 layers announced, 1 given"):
        workload.read(p)


def _fabric(gpus: int = 16):  # type: ignore[no-untyped-def]
    return build_clos(ClosParams(gpus=gpus, radix=8, switch_tbps=3.2))


def test_one_pass_blocking_then_the_weight_gradients_fifo(tmp_path: Path) -> None:
    fab, lat = _fabric(), model_link_latency()
    dp = ring_allreduce(
        fab,
        workload.groups(workload.Workload("x", "p", 8, 1, 1, 1, 1, 16, 0, ()), "DP"),
        64 << 20,
        link_latency=lat,
    )
    # the last layer's weight gradient is issued first in the backward pass and hidden by
    # the 10 ms of input-gradient compute of the layer before it
    hidden = workload.read(
        _file(
            tmp_path,
            "a -1 1000 NONE 0 10000000 NONE 0 1000 NONE 0 1",
            "b -1 1000 NONE 0 1000 NONE 0 1000 ALLREDUCE 67108864 1",
        )
    )
    tl = workload.run(fab, hidden, lat)
    compute = 4000e-9 + 10e-3 + 1000e-9
    assert tl.compute_s == pytest.approx(compute)
    assert tl.wg_comm_s == pytest.approx(dp.time_s) and dp.time_s < 10e-3
    assert tl.wg_exposed_s == 0 and tl.time_s == pytest.approx(compute)
    # the first layer's is issued last: all of it exposed; two in a row queue (FIFO)
    exposed = workload.read(
        _file(
            tmp_path,
            "a -1 1000 NONE 0 1000 NONE 0 1000 ALLREDUCE 67108864 1",
            "b -1 1000 ALLREDUCE 1048576 1000 NONE 0 1000 ALLREDUCE 67108864 1",
        )
    )
    tl = workload.run(fab, exposed, lat)
    tp = tl.collectives[("allreduce", "TP", 1 << 20)]
    assert tl.blocking_comm_s == pytest.approx(tp.time_s)
    assert tl.wg_comm_s == pytest.approx(2 * dp.time_s)
    # b's starts after both forwards, b's collective and b's backward computation (the
    # backward pass goes from the last layer); a's queues behind it
    start_b = 4000e-9 + tp.time_s
    assert tl.time_s == pytest.approx(start_b + 2 * dp.time_s)
    assert tl.time_s == pytest.approx(tl.compute_s + tl.blocking_comm_s + tl.wg_exposed_s)
    assert tl.comm_by_group == pytest.approx({"TP": tp.time_s, "DP": 2 * dp.time_s})


def test_a_scheme_slows_the_network_not_the_servers(tmp_path: Path) -> None:
    fab, lat = _fabric(), model_link_latency()
    wl = workload.read(
        _file(tmp_path, "a -1 1000 ALLREDUCE 1048576 1000 NONE 0 1000 ALLREDUCE 67108864 1")
    )
    ideal = workload.run(fab, wl, lat)
    half = workload.run(fab, wl, lat, lambda coll, r: 0.5)
    assert half.blocking_comm_s == pytest.approx(ideal.blocking_comm_s)  # TP: in the server
    assert half.wg_comm_s == pytest.approx(2 * ideal.wg_comm_s, rel=1e-6)
    with pytest.raises(workload.WorkloadError, match="do not fit the fabric's 16 GPUs"):
        workload.run(fab, wl, lat, jobs=(0, 16))
    with pytest.raises(workload.WorkloadError, match="jobs overlap"):
        workload.run(_fabric(32), wl, lat, jobs=(0, 8))


def test_jobs_in_lockstep_meet_only_where_they_share_links(tmp_path: Path) -> None:
    """Copies of a job on consecutive GPUs, their same collectives at once: on a
    rail-optimized fabric each DP ring stays on its rail's leaf (nothing shared), on a plain
    3-tier Clos with leaves at 2:1 the copies' rings meet on the uplinks and each pass is
    longer than one copy's alone on the same fabric (at 1:1 their rings' paths are apart
    since each tier reads its own digit of the hash, controller.ecmp)."""
    head = HEAD.replace("NPU_group: 8", "NPU_group: 2").replace("all_gpus: 16", "all_gpus: 32")
    layer = "a -1 1000 NONE 0 1000 NONE 0 1000 ALLREDUCE 67108864 1"
    wl = workload.read(_file(tmp_path, layer, head=head))  # TP 2 x DP 16 on 32 GPUs
    lat = model_link_latency()
    jobs = (0, 32, 64, 96)
    rail = build_clos(ClosParams(gpus=128, radix=8, switch_tbps=3.2, tiers=3))
    together = workload.run(rail, wl, lat, jobs=jobs)
    assert together.time_s == pytest.approx(workload.run(rail, wl, lat).time_s)
    plain = build_clos(
        ClosParams(gpus=128, radix=8, switch_tbps=3.2, rail=False, tiers=3, oversub=2.0)
    )
    alone = workload.run(plain, wl, lat)
    together = workload.run(plain, wl, lat, jobs=jobs)
    assert together.time_s > 1.25 * alone.time_s
    assert together.compute_s == alone.compute_s


def test_flow_workload_prints_and_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["flow-workload", str(MOE), "--run-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "TP 8 x DP 16 x PP 1, EP 8 on rail2-128" in text and "one pass" in text
    doc = json.loads((tmp_path / "workload.json").read_text())
    got = doc["workload"]
    assert len(doc["source"]["commit"]) == 40
    assert got["time_s"] == pytest.approx(
        got["compute_s"] + got["blocking_comm_s"] + got["wg_exposed_s"]
    )
    kinds = {(c["collective"], c["group"]) for c in got["collectives"]}
    assert ("alltoall", "EP") in kinds and ("allgather", "DP_EP") in kinds
    assert (tmp_path / "workload.png").stat().st_size > 0
    assert main(["flow-workload", str(MOE), "--gpus", "256", "--json"]) == 2  # not 1 x 128
    assert main(["flow-workload", str(MOE), "--jobs", "2", "--json"]) == 0  # 256 GPUs
    assert '"jobs": 2' in capsys.readouterr().out
    assert main(["flow-workload", str(tmp_path / "missing.txt"), "--json"]) == 1


def test_the_pipeline_bubble_by_simais_formula(tmp_path: Path) -> None:
    # pre-bubble: every layer's but the embedding's computation and waited-for collectives,
    # times (PP - 1) / (GA x vpp)
    head = HEAD.replace(" pp: 1", " pp: 2").replace("ga: 1", "ga: 2") + " pp_comm 1048576"
    wl = workload.read(
        _file(
            tmp_path,
            "embedding_layer -1 5000 NONE 0 5000 NONE 0 5000 NONE 0 1",
            "a -1 1000 NONE 0 2000 NONE 0 3000 NONE 0 1",
            head=head.replace("all_gpus: 16", "all_gpus: 32"),
        )
    )
    assert (wl.pp, wl.ga, wl.pp_comm, wl.dp) == (2, 2, 1 << 20, 2)
    tl = workload.run(_fabric(32), wl, model_link_latency())
    assert tl.bubble_s == pytest.approx(6000e-9 * 1 / 2)
    assert tl.time_s == pytest.approx(21000e-9)  # the bubble is reported, not added


def test_a_reader_that_goes_away_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import testbed.flow.cli as flow_cli

    def closed(*_: object) -> str:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(flow_cli, "describe", closed)
    assert main(["fabric", "--gpus", "64", "--radix", "8", "--switch-tbps", "3.2"]) == 141
    assert "Traceback" not in capsys.readouterr().err


def test_a_group_with_several_gpus_per_server_runs_a_channel_per_member() -> None:
    # DP of TP 2: GPUs 0, 2, 4, 6 of each server; NCCL's rings: 4 channels, each leaving a
    # server by another member, so every member's NIC carries one channel between servers
    g = np.array([0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22])
    rings = workload.channel_rings([g], 8)
    assert len(rings) == 4 and all(sorted(r) == sorted(g) for r in rings)
    leaving = sorted(int(r[3]) % 8 for r in rings)  # the last member of server 0 in each
    assert leaving == [0, 2, 4, 6]
    # one GPU per server, or a group inside one server: one ring as it is
    assert [list(r) for r in workload.channel_rings([np.array([0, 8, 16])], 8)] == [[0, 8, 16]]
    assert [list(r) for r in workload.channel_rings([np.arange(4)], 8)] == [[0, 1, 2, 3]]
    # on the fabric: the DP all-reduce of TP 2 x DP 16 (4 members a server) beside TP 8 x
    # DP 4 (one a server), the same bytes over 4 times the NICs
    fab, lat = build_clos(ClosParams(gpus=32, radix=8, switch_tbps=3.2)), model_link_latency()
    wide = workload.Workload("x", "p", 2, 1, 1, 1, 1, 32, 0, ())
    narrow = workload.Workload("x", "p", 8, 1, 1, 1, 1, 32, 0, ())
    layer = workload.Layer(
        "a",
        workload.Phase(0, "", "", 0),
        workload.Phase(0, "", "", 0),
        workload.Phase(0, "allreduce", "DP", 64 << 20),
    )
    t_wide = workload.run(fab, replace(wide, layers=(layer,)), lat).time_s
    t_narrow = workload.run(fab, replace(narrow, layers=(layer,)), lat).time_s
    assert t_wide < 0.5 * t_narrow
