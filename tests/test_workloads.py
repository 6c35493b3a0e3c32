"""Workload generators checked statistically (no namespaces needed)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from testbed.traffic import generators as gen
from testbed.traffic.jobs import payload, qpn


def test_incast_has_the_configured_senders_and_sizes() -> None:
    flows = gen.incast(8, 250_000, receiver=3)
    assert sorted(f.src for f in flows) == [0, 1, 2, 4, 5, 6, 7]
    assert {f.dst for f in flows} == {3} and {f.size for f in flows} == {250_000}
    assert {f.start for f in flows} == {0.0} and len({f.id for f in flows}) == 7
    with pytest.raises(ValueError):
        gen.incast(4, 10, receiver=1, senders=[1, 2])


def test_all_to_all_sends_size_over_n_to_every_peer() -> None:
    flows = gen.all_to_all(4, 4_000_000)
    assert len(flows) == 12 and {f.size for f in flows} == {1_000_000}
    assert {(f.src, f.dst) for f in flows} == {(s, d) for s in range(4) for d in range(4) if s != d}


@pytest.mark.parametrize("name", ["websearch", "fbhadoop"])
def test_cdf_sampling_follows_the_published_cdf(name: str) -> None:
    cdf = gen.SizeCdf.load(name)
    rng = random.Random(7)
    samples = sorted(cdf.sample(rng) for _ in range(40_000))
    # Kolmogorov-Smirnov distance against the tabulated CDF (critical value at 1e-3: ~0.0098)
    ks = max(abs((i + 1) / len(samples) - cdf.cdf(s)) for i, s in enumerate(samples))
    assert ks < 0.012, ks
    mean = sum(samples) / len(samples)
    assert mean == pytest.approx(cdf.mean(), rel=0.05)


def test_poisson_generator_hits_the_target_load_and_arrival_process() -> None:
    cdf = gen.SizeCdf.load("websearch")
    rate, duration, n = 1e9, 20.0, 4
    flows = gen.poisson(n, cdf, 0.4, rate, duration, seed=3)
    assert gen.offered_load(flows, n, rate, duration) == pytest.approx(0.4, rel=0.1)
    assert all(0 <= f.start < duration and f.src != f.dst for f in flows)
    # exponential inter-arrivals per host: coefficient of variation ~1
    starts = sorted(f.start for f in flows if f.src == 0)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert 0.85 < cv < 1.15, cv
    assert mean == pytest.approx(cdf.mean() * 8 / (0.4 * rate), rel=0.12)
    # destinations uniform over the other hosts
    dsts = [f.dst for f in flows if f.src == 0]
    for d in (1, 2, 3):
        assert dsts.count(d) / len(dsts) == pytest.approx(1 / 3, abs=0.06)
    assert flows == gen.poisson(n, cdf, 0.4, rate, duration, seed=3)  # replayable


def test_bad_cdf_and_load_are_rejected(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.txt"
    bad.write_text("0 0\n100 50\n")
    with pytest.raises(ValueError, match="end at 1.0"):
        gen.SizeCdf.load(str(bad))
    with pytest.raises(ValueError):
        gen.poisson(4, gen.SizeCdf.load("websearch"), 1.5, 1e9, 1.0)


def test_payload_is_deterministic_and_position_dependent() -> None:
    a = payload(5, 10_000)
    assert a == payload(5, 10_000) and a != payload(6, 10_000)
    assert a[:1024] != a[1024:2048]  # a packet at the wrong offset would not match
    assert qpn(2, 3) != qpn(3, 2) and qpn(0, 0) > 0


def test_flows_command_writes_a_flow_list_run_reads(tmp_path: Path) -> None:
    """`xingmai-testbed flows`: the suite's Poisson generator at a load of the hosts' own
    link speed, written as a --flows file; the twin's reader gives back the same flows."""
    from testbed.main import main
    from testbed.sim.run import load_flows
    from testbed.topo import parse_choice

    out = tmp_path / "ws.csv"
    argv = ["flows", "websearch", "--load", "0.3", "--seconds", "0.0005", "--topo", "fattree"]
    assert main([*argv, "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# websearch at 0.3 of 100 Gb/s per host, 0.5 ms")
    spec = parse_choice("fattree")
    want = gen.poisson(320, gen.SizeCdf.load("websearch"), 0.3, 100e9, 0.0005, seed=1)
    got = load_flows(out, spec)
    assert [(f.src, f.dst, f.size, f.start) for f in got] == [
        (f.src, f.dst, f.size, f.start) for f in want
    ]


def test_an_unknown_cdf_is_named() -> None:
    with pytest.raises(ValueError, match="'nosuch': neither a bundled CDF .*websearch"):
        gen.SizeCdf.load("nosuch")
