"""p4runtime-shell (in its own venv: `make p4runtime-shell`) connects to the built-in switch,
pushes a pipeline and inserts a table entry, as it would with simple_switch_grpc."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.common.ports import free_port
from testbed.switch.p4runtime import P4RuntimeService, serve
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch

REPO = Path(__file__).resolve().parents[1]
SHELL_PY = REPO / ".venv-p4runtime-shell" / "bin" / "python"
BUILD = REPO / "tests" / "p4" / "build"

SCRIPT = """
import sys
import p4runtime_sh.shell as sh
addr, p4info, blob = sys.argv[1:4]
sh.setup(device_id=1, grpc_addr=addr, election_id=(0, 1),
         config=sh.FwdPipeConfig(p4info, blob))
te = sh.TableEntry("routes")(action="routed_set_nexthop")
te.match["dst_addr"] = "10.0.2.0/24"
te.action["dmac"] = "02:00:00:00:00:02"
te.action["port"] = "2"
te.insert()
for e in sh.TableEntry("routes").read():
    print("ENTRY", e.match["dst_addr"].lpm.prefix_len, e.action["port"].value.hex())
sh.teardown()
"""


@pytest.fixture
def server() -> Iterator[tuple[str, V1Switch]]:
    sw = V1Switch(Clock(virtual=True), device_id=1)
    addr = f"127.0.0.1:{free_port()}"
    srv = serve(P4RuntimeService(sw, 1), addr)
    yield addr, sw
    srv.stop(0)


@pytest.mark.skipif(
    not SHELL_PY.exists(), reason="p4runtime-shell venv missing: make p4runtime-shell"
)
@pytest.mark.skipif(not (BUILD / "switch_features.json").exists(), reason="test program not built")
def test_p4runtime_shell_pushes_pipeline_and_inserts(server: tuple[str, V1Switch]) -> None:
    addr, sw = server
    res = subprocess.run(
        [
            str(SHELL_PY),
            "-c",
            SCRIPT,
            addr,
            str(BUILD / "switch_features.p4info.txtpb"),
            str(BUILD / "switch_features.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ENTRY 24 02" in res.stdout
    assert sw.ready
    routes = sw.compiled.tables["SwitchIngress.routes"]  # type: ignore[union-attr]
    assert len(routes.entries) == 1
