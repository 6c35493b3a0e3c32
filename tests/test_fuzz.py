"""The short fuzz pass of `make test` (issue 18): every surface of tests/fuzz for a few
seconds — no crash, no hang, no unbounded growth. `make fuzz` runs the same surfaces with
10,000 cases each and writes results/fuzz.json."""

from __future__ import annotations

import pytest

from tests.fuzz.harness import run
from tests.fuzz.surfaces import SURFACES

SHORT_CASES = 200
IN_PROCESS = [name for name in SURFACES if name != "agent_api"]


@pytest.mark.parametrize("name", IN_PROCESS)
def test_short_fuzz_pass(name: str) -> None:
    res = run(SURFACES[name](), SHORT_CASES)
    assert res.cases >= SHORT_CASES // 2
    assert res.clean, res.as_dict()


@pytest.mark.slow
@pytest.mark.root
def test_short_fuzz_pass_of_the_agent_api() -> None:
    res = run(SURFACES["agent_api"](), SHORT_CASES)
    assert res.clean, res.as_dict()
