"""What every test shares: the `root` and `slow` markers, and the rigs that need root.

`@pytest.mark.root` (or `pytestmark = pytest.mark.root`): the test needs root (network
namespaces, veths, eBPF, raw sockets); when not root it is skipped, saying so, instead of each
file repeating the check. On a shared machine run root tests under `flock /tmp/xm-root.lock`.
`@pytest.mark.slow`: more than a few seconds; `make test-fast` leaves out root and slow tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from testbed.emu.nicrig import AgentProcess, NetnsPair
from testbed.traffic.netns import NetnsLan

IS_ROOT = os.geteuid() == 0
NOT_ROOT = (
    "needs root (network namespaces, veths, eBPF, raw sockets): run the suite as root "
    "(`make test`); `make test-fast` runs what needs none"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason=NOT_ROOT)
    for item in items:
        if item.get_closest_marker("root") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def lan() -> Iterator[NetnsLan]:
    """Two fresh network namespaces joined by a veth (10.201.0.1 and .2), one per module."""
    with NetnsLan(2) as lan:
        yield lan


@pytest.fixture
def nic_pair() -> Iterator[NetnsPair]:
    """The NIC rig's two namespaces: `a` (sender, where an agent runs) and `b`."""
    with NetnsPair.create() as pair:
        yield pair


@pytest.fixture(scope="module")
def paced_pair() -> Iterator[tuple[NetnsPair, AgentProcess]]:
    """The NIC rig with an agent on `a` at 1 Gb/s, one per module; INT off: the test flows are
    not the transport, so frames are what the receiver counts."""
    with NetnsPair.create() as pair:
        with AgentProcess(pair.a, pair.dev_a, 1_000_000_000, extra=("--no-int",)) as agent:
            yield pair, agent
