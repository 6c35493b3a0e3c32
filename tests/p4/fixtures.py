"""The `fabric` fixture: every P4 test runs once per target (the built-in switch on its
reference pipeline, the built-in switch on its native pipeline (testbed/switch/native/), bmv2).

Test modules import it (`from tests.p4.fixtures import fabric  # noqa: F401`) and call
`fabric(topology)` to get a programmed-from-scratch set of switches; everything is closed
after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.p4 import bmv2
from tests.p4.harness import BMV2_JSON, P4INFO, BuiltinFabric, Fabric, Topology

# the built-in switch on its reference pipeline and on its native one, and bmv2
TARGETS = ("builtin", "native", "bmv2")

FabricFactory = Callable[[Topology], Fabric]


@pytest.fixture(params=TARGETS)
def fabric(request: pytest.FixtureRequest) -> Iterator[FabricFactory]:
    if not (BMV2_JSON.is_file() and P4INFO.is_file()):
        pytest.fail("p4src/build has no compiled program: run `make p4` where p4c exists")
    target = request.param
    if target == "bmv2":
        why = bmv2.unavailable()
        if why:
            pytest.skip(f"bmv2 run skipped: {why} (the built-in switch run is not)")
    made: list[Fabric] = []

    def make(topo: Topology) -> Fabric:
        fab: Fabric
        if target == "bmv2":
            fab = bmv2.Bmv2Fabric(topo)
        else:
            fab = BuiltinFabric(topo, "native" if target == "native" else "reference")
        made.append(fab)
        if isinstance(fab, BuiltinFabric):
            for sw in fab.switches:  # the run must be on the pipeline it is named after
                assert sw.pipeline_in_use == sw.pipeline, sw.native_reason
        return fab

    try:
        yield make
    finally:
        for fab in made:
            fab.close()
