"""Every data file a module reads beside itself ships with the package: a pip install that is
not editable has only what pyproject.toml's package-data names (without the flow engine's
calibration.yaml every scheme was uncalibrated there; without the fabric page the
controller's web server had no page)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BESIDE = re.compile(r'Path\(__file__\)\.with_name\("([^"]+)"\)')


def _shipped(rel: Path, package_data: dict[str, list[str]]) -> bool:
    for pkg, globs in package_data.items():
        base = Path(*pkg.split("."))
        if not rel.is_relative_to(base):
            continue
        if any(fnmatch.fnmatch(str(rel.relative_to(base)), g) for g in globs):
            return True
    return False


def test_files_read_beside_a_module_are_package_data() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    read = [
        py.with_name(name).relative_to(ROOT)
        for top in ("controller", "testbed")
        for py in (ROOT / top).rglob("*.py")
        for name in BESIDE.findall(py.read_text())
        if not name.endswith(".py")
    ]
    assert len(read) >= 5  # the C sources, the fabric page, the calibration: found
    missing = [str(r) for r in read if not _shipped(r, setuptools["package-data"])]
    assert not missing, f"read beside their module but not package data: {missing}"
