"""The built-in switch runs p4c's bmv2 conformance programs as bmv2 does.

The project's own cases (`tests/p4/NAME.p4` with `NAME.stf`, compiled into `tests/p4/build/`)
pin down where the built-in switch once did otherwise than bmv2; they always run.

Both pipelines run every case: the native one (the default) and the Python reference it is
proven identical to (tests/test_native_pipeline.py), which runs a case the native one cannot.

Every case of ../shared/conformance (146 p4c test programs with STF packet tests that pass on
real bmv2) runs on the built-in switch; `tests/data/conformance_expected.txt` lists which are
expected to pass, and the suite fails when one of them regresses. The corpus is not part of a
user's checkout: point XINGMAI_CONFORMANCE at it, or the tests skip saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.switch.stf import run_stf
from testbed.switch.v1model import PIPELINES
from tests.fuzz.native import CORPUS

REPO = Path(__file__).resolve().parents[1]
EXPECTED_FILE = REPO / "tests" / "data" / "conformance_expected.txt"
OWN_CASES = REPO / "tests" / "p4"


def load_expected() -> dict[str, tuple[str, str]]:
    out = {}
    for line in EXPECTED_FILE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, status, *why = line.split(maxsplit=2)
        out[name] = (status, why[0] if why else "")
    return out


EXPECTED = load_expected()
needs_corpus = pytest.mark.skipif(
    not (CORPUS / "index.json").exists(),
    reason=f"conformance corpus not found at {CORPUS} (set XINGMAI_CONFORMANCE)",
)


def test_expected_list_meets_the_bar() -> None:
    """At least 90 % of the corpus is listed as passing, and every failing case says why."""
    passing = [n for n, (s, _) in EXPECTED.items() if s == "pass"]
    assert len(passing) >= 0.9 * len(EXPECTED), f"{len(passing)}/{len(EXPECTED)} listed as passing"
    for name, (status, why) in EXPECTED.items():
        assert status in ("pass", "fail"), name
        if status == "fail":
            assert why, f"{name} is listed as failing without the feature it needs"


@needs_corpus
def test_every_corpus_case_is_listed() -> None:
    cases = [c["name"] for c in json.loads((CORPUS / "index.json").read_text())["cases"]]
    assert sorted(cases) == sorted(EXPECTED)


@needs_corpus
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", sorted(n for n, (s, _) in EXPECTED.items() if s == "pass"))
def test_case_passes(name: str, pipeline: str) -> None:
    res = run_stf(CORPUS / f"{name}.json", CORPUS / f"{name}.stf", pipeline)
    assert res.passed, "\n".join(res.messages)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", sorted(p.stem for p in OWN_CASES.glob("*.stf")))
def test_own_case_passes(name: str, pipeline: str) -> None:
    res = run_stf(OWN_CASES / "build" / f"{name}.json", OWN_CASES / f"{name}.stf", pipeline)
    assert res.passed, "\n".join(res.messages)
