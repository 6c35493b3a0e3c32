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
