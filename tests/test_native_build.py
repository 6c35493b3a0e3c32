"""The native pipeline's cache: bounded, the objects used last kept; and the prebuild that
`make install` runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.switch import prebuild
from testbed.switch.native import build


def test_prune_keeps_the_objects_used_last_with_their_c(tmp_path: Path) -> None:
    for i in range(6):
        for ext in (".so", ".c"):
            f = tmp_path / f"pipeline-{i:032x}{ext}"
            f.write_text("x")
            os.utime(f, (1000 + i, 1000 + i))
    os.utime(tmp_path / f"pipeline-{0:032x}.so", (5000, 5000))  # a hit: used last
    build.prune(tmp_path, keep=3)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(f"pipeline-{i:032x}{ext}" for i in (0, 4, 5) for ext in (".so", ".c"))


def test_a_cache_hit_refreshes_the_objects_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    digest = "ab" * 32
    so = build.cache_dir() / f"pipeline-{digest[:32]}.so"
    so.parent.mkdir(parents=True)
    so.write_text("x")
    os.utime(so, (1000, 1000))
    assert build.build("unused: a hit compiles nothing", digest) == so
    assert so.stat().st_mtime > 1000


def test_prebuild_names_the_pipeline_that_runs_the_project_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if not prebuild.BMV2_JSON.exists():
        pytest.skip("p4src/build is missing (make p4)")
    assert prebuild.main([]) == 0
    out = capsys.readouterr().out
    assert "native pipeline and native traffic manager ready" in out, out
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert prebuild.main([str(bad)]) == 2
    assert "cannot load" in capsys.readouterr().err


def test_sanitizers_build_apart_and_are_named_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """XINGMAI_NATIVE_SANITIZE adds the sanitizers' flags (make fuzz); anything but a plain
    list of names is refused before it reaches a compiler's command line."""
    monkeypatch.delenv(build.SANITIZE_ENV, raising=False)
    assert build.cflags() == build.CFLAGS
    monkeypatch.setenv(build.SANITIZE_ENV, "address,undefined")
    assert "-fsanitize=address,undefined" in build.cflags()
    monkeypatch.setenv(build.SANITIZE_ENV, "address -o /etc/passwd")
    with pytest.raises(build.BuildError, match="comma-separated"):
        build.cflags()
