"""`make bench`'s command line: a benchmark it does not have is refused with the list of those
it has, and the opt-in ones (tens of minutes) run only when named."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import bench


def test_an_unknown_benchmark_is_refused_with_the_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--only", "twin-scale", "--out", str(tmp_path / "b.json")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "twin-scale" in err and "twin_scale" in err and "switch" in err
    assert not (tmp_path / "b.json").exists()


def test_opt_in_benchmarks_are_not_in_the_default_run() -> None:
    assert set(bench.OPT_IN).isdisjoint(bench.BENCHMARKS)
    assert "twin_scale" in bench.OPT_IN


def test_the_flow_engines_cost_bench_runs_and_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testbed.benchmarks import flow_scale

    monkeypatch.setattr(flow_scale, "PLOT", tmp_path / "flow-scale.png")
    out = flow_scale.run(quick=True)
    fabrics = [(p["fabric"], p["gpus"]) for p in out["points"]]
    assert fabrics == [
        ("rail", 1024),
        ("plain", 1024),
        ("rail", 8192),
        ("plain", 8192),
        ("rail --full", 1024),
    ]
    full = out["points"][-1]
    assert full["allreduce_s"] == pytest.approx(out["points"][0]["allreduce_s"], rel=1e-12)
    assert out["growth"]["rail"]["gpus"] == 8
    assert (tmp_path / "flow-scale.png").stat().st_size > 10_000
