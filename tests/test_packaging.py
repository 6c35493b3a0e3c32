"""The package as a user installs it: a wheel built from the sources carries the gRPC stubs
(generated at build time, never committed), the switch program and the workloads' data, and
the twin runs from it alone — no repository beside it, no root, and none of the optional
extras (Mininet, pyroute2, scapy, matplotlib, Dask) installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

# run in a fresh interpreter: the optional extras made unimportable, then the command line
BLOCKED_RUN = """
import importlib.abc, sys
BLOCK = {"mininet", "pyroute2", "scapy", "matplotlib", "dask", "distributed", "bcc"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
import testbed
assert "site-packages" not in testbed.__file__ and "%(repo)s" not in testbed.__file__
from testbed.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # from a copy of the tracked files, as a clean clone has them (setuptools writes build/
    # beside the sources)
    src = tmp_path_factory.mktemp("src")
    tracked = (
        subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    # no build isolation: the build requirements (setuptools, grpcio-tools) are the dev
    # extra's, so this needs no network
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        cwd=out,
    )
    [whl] = out.glob("xingmai-*.whl")
    return whl


def test_the_wheel_carries_stubs_program_and_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for proto in ("agent", "controller", "switch"):
        assert f"controller/proto/{proto}_pb2.py" in names
        assert f"controller/proto/{proto}_pb2_grpc.py" in names
    assert {"testbed/_program/xingmai.json", "testbed/_program/xingmai.p4info.txtpb"} <= names
    assert "testbed/data/workloads/WebSearch_distribution.txt" in names
    # the NIC's C, which the twin compiles (testbed/sim/nic_native.py)
    ebpf = {n for n in names if n.startswith("controller/nic/_ebpf/")}
    assert {
        "controller/nic/_ebpf/xingmai.h",
        "controller/nic/_ebpf/tc_egress.c",
        "controller/nic/_ebpf/xdp_ingress.c",
        "controller/nic/_ebpf/lib/tita.h",
    } <= ebpf
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "ebpf"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert {n.removeprefix("controller/nic/_ebpf/") for n in ebpf} == {
        t.removeprefix("ebpf/") for t in tracked if t.endswith((".c", ".h"))
    }
    meta = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        .decode()
    )
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    # the twin's dependencies only: the emulation's and the plots' are extras
    assert not any(p in r for r in core for p in ("mininet", "pyroute2", "matplotlib", "scapy"))
    assert any("mininet" in r and 'extra == "emu"' in r for r in requires)
    assert "Requires-Python: >=3.11" in meta


def test_the_twin_runs_from_the_wheel_without_the_extras(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    script = BLOCKED_RUN % {"repo": str(REPO)}
    argv = [
        "run",
        "--engine",
        "sim",
        "--quick",
        "--topo",
        "leafspine:2,1,2",
        "--schemes",
        "tita",
        "--scenarios",
        "incast",
        "--run-dir",
        str(work / "run"),
    ]
    res = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=work,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (work / "run" / "results.json").exists()
    assert "matplotlib is not installed: pip install 'xingmai[plots]'" in res.stderr
    # the wheel carries the NIC's C: the twin's NICs run it compiled, as from a clone
    assert "native NIC unavailable" not in res.stderr
    setup = json.loads((work / "run" / "results.json").read_text())["setup"]
    assert setup["nic_pipeline"] == "native"
    assert setup["loop_pipeline"] == "native"  # the event loop's C comes with the pipeline's
    # the transport core's and the hosts' C come with the package
    assert setup["transport_pipeline"] == "native"
    assert setup["host_pipeline"] == "native", setup["host_native_reasons"]
    assert "incast     tita" in res.stdout


def test_the_emulation_without_its_extra_names_it(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    res = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN % {"repo": str(REPO)}, "run", "--engine", "emu"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stderr[-3000:]
    assert res.stderr.strip() == (
        "xingmai-testbed: the emulation needs mininet, which is not installed: "
        "pip install 'xingmai[emu]'"
    )
