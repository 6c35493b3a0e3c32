"""Named CC profiles (controller/nic/ratelaw/profiles.py): every file loads and validates,
each source unit converts as hand-checked, bad names and values fail with a clear message,
and the paper profiles reproduce the old defaults (CcParams.defaults) exactly."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.nic.ratelaw import UNIT, CcParams, Law
from controller.nic.ratelaw.base import to_fixed
from controller.nic.ratelaw.profiles import (
    DEFAULT_PROFILES,
    PROFILE_DIR,
    ProfileError,
    known_profiles,
    load_profile,
    parse_profile,
    policy_params,
)
from testbed.model import Scaling

EMU_NIC = int(Scaling().nic_bps)  # the emulation's NIC at the default scale
G400_NIC = int(Scaling(scale=1).nic_bps)  # the twin at 400G
RATES = (EMU_NIC, G400_NIC, 19_531_250, 10**9, 40 * 10**9, 100 * 10**9, 123_456_789)


def doc(name: str) -> dict[str, Any]:
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())


def test_every_profile_file_loads_and_builds_valid_params() -> None:
    names = known_profiles()
    assert {
        "dcqcn-nvidia",
        "dcqcn-hpcc-sim",
        "dcqcn-paper",
        "hpcc-paper",
        "timely-paper",
        "swift-paper",
        "tita",
        "none",
    } <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name and p.source["url"] and p.source["title"]
        # a NIC at the model's speed (400G), or the emulation's dilated 20,000 times
        for rate, dilation in ((G400_NIC, 1.0), (EMU_NIC, Scaling().scale), (10**9, 1.0)):
            cc = p.cc_params(rate, 100_000, dilation)  # validates
            assert cc.law is p.law
        # every field says where its value comes from: the source's words or our reason
        assert all(prm.origin for prm in p.params.values())


def test_a_default_profile_per_law() -> None:
    assert set(DEFAULT_PROFILES) == set(Law)
    for law, name in DEFAULT_PROFILES.items():
        assert load_profile(name).law is law
    assert DEFAULT_PROFILES[Law.DCQCN] == "dcqcn-nvidia"


@pytest.mark.parametrize(
    ("name", "law"),
    [
        ("dcqcn-paper", Law.DCQCN),
        ("tita", Law.TITA),
        ("hpcc-paper", Law.HPCC),
        ("timely-paper", Law.TIMELY),
        ("swift-paper", Law.SWIFT),
        ("none", Law.NONE),
    ],
)
def test_paper_profiles_are_the_old_defaults(name: str, law: Law) -> None:
    """Old results reproduce: whatever the dilation, these scale by line rate as before."""
    p = load_profile(name)
    for rate in RATES:
        for t in (8_000, 100_000, 12_345_678):
            want = CcParams.defaults(law, rate, t)
            assert p.cc_params(rate, t) == want
            assert p.cc_params(rate, t, 20_000.0) == want


def test_nvidia_units_hand_checked() -> None:
    """ConnectX defaults at 400 Gb/s, then dilated by 20,000 (the emulation's scale)."""
    p = load_profile("dcqcn-nvidia")
    d = p.cc_params(400 * 10**9, 10_000).dcqcn
    assert d.rai_bps == 5_000_000  # rpg_ai_rate 5 Mb/s
    assert d.rhai_bps == 50_000_000  # rpg_hai_rate 50 Mb/s
    assert d.byte_counter == 32_767  # rpg_byte_reset, bytes
    assert d.g == 5 * UNIT // 1024  # dce_tcp_g 1019: g = (1024 - 1019) / 1024
    assert d.alpha_timer_ns == 1_000  # dce_tcp_rtt 1 us
    assert d.rate_timer_ns == 300_000  # rpg_time_reset 300 us
    assert d.cut_interval_ns == 4_000  # rate_reduce_monitor_period 4 us
    assert d.fast_recovery_steps == 1  # rpg_threshold
    assert p.cc_params(400 * 10**9, 10_000).min_rate_bps == 1_000_000  # rpg_min_rate 1 Mb/s
    slow = p.cc_params(20_000_000, 10_000, 20_000.0)
    assert slow.dcqcn.rai_bps == 250  # 5 Mb/s / 20,000
    assert slow.min_rate_bps == 50
    assert slow.dcqcn.alpha_timer_ns == 20_000_000  # 1 us x 20,000
    assert slow.dcqcn.byte_counter == 32_767  # bytes do not dilate
    # 300 us x 20,000 = 6 s does not fit the NIC's 32-bit ns: clamped, and said
    assert slow.dcqcn.rate_timer_ns == 2**32 - 1
    assert p.clamped(20_000_000, 10_000, 20_000.0) == {"rate_timer_ns": 6_000_000_000}
    assert p.clamped(400 * 10**9, 10_000) == {}


def test_hpcc_simulator_units_hand_checked() -> None:
    """run.py: RATE_AI 5 Mb/s and RATE_HAI 50 Mb/s per 25 Gb/s, MIN_RATE 1000 Mb/s flat."""
    p = load_profile("dcqcn-hpcc-sim")
    cc = p.cc_params(100 * 10**9, 10_000)
    assert (cc.dcqcn.rai_bps, cc.dcqcn.rhai_bps) == (20_000_000, 200_000_000)
    assert cc.min_rate_bps == 1_000_000_000
    assert cc.dcqcn.g == UNIT // 256 and cc.dcqcn.byte_counter == 0
    assert (cc.dcqcn.alpha_timer_ns, cc.dcqcn.rate_timer_ns, cc.dcqcn.cut_interval_ns) == (
        1_000,
        300_000,
        4_000,
    )
    # rates already follow the line rate: dilation changes only the absolute ones
    slow = p.cc_params(5 * 10**6, 10_000, 20_000.0)
    assert slow.dcqcn.rai_bps == 1_000 and slow.min_rate_bps == 50_000
    assert slow.dcqcn.cut_interval_ns == 80_000_000


def test_relative_units_hand_checked() -> None:
    swift = load_profile("swift-paper").cc_params(10**9, 100_001).swift
    assert swift.ai_bytes == 4154 and swift.per_hop_ns == 25_000  # 1 packet, T / 4 floored
    hpcc = load_profile("hpcc-paper").cc_params(10**9, 50_000).hpcc
    assert hpcc.wai_bps == 500_000 and hpcc.base_rtt_ns == 50_000  # 0.0005 x line, 1 T
    paper = load_profile("dcqcn-paper").cc_params(40 * 10**9, 1).dcqcn
    assert (paper.rai_bps, paper.rhai_bps, paper.alpha_timer_ns) == (
        40_000_000,
        400_000_000,
        55_000,
    )
    assert paper.byte_counter == 10 << 20


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(
        ProfileError,
        match=r"unknown cc profile 'dcqcn-acme' \(known: .*"
        r"dcqcn-nvidia.*tita",
    ):
        load_profile("dcqcn-acme")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["parameters"]["g"].update(value=1024), r"g: DCE_TCP_G 1024 must be"),
        (
            lambda d: d["parameters"]["rai_bps"].update(unit="furlongs"),
            r"rai_bps: unit 'furlongs' is not a rate unit",
        ),
        (lambda d: d["parameters"]["rai_bps"].update(value=-5), r"rai_bps: value -5 must be"),
        (
            lambda d: d["parameters"]["fast_recovery_steps"].update(value=1.5),
            r"fast_recovery_steps: 1.5 must be an integer count",
        ),
        (lambda d: d["parameters"].pop("rate_timer_ns"), r"missing \['rate_timer_ns'\]"),
        (
            lambda d: d["parameters"].update(eta={"value": 0.9, "unit": "fraction", "from": "x"}),
            r"not its own \['eta'\]",
        ),
        (lambda d: d["parameters"]["rai_bps"].pop("from"), r"rai_bps: say either from"),
        (
            lambda d: d["parameters"]["byte_counter"].update(per="40 Gb/s"),
            r"byte_counter: per applies to rates and times",
        ),
        (lambda d: d.update(law="reno"), r"law 'reno' is none of"),
        (lambda d: d["source"].pop("url"), r"source needs title, by, year, section, url"),
    ],
)
def test_bad_values_fail_with_a_clear_message(edit: Any, message: str) -> None:
    d = copy.deepcopy(doc("dcqcn-nvidia"))
    edit(d)
    with pytest.raises(ProfileError, match=r"cc profile 'dcqcn-nvidia': .*" + message):
        parse_profile(d, "dcqcn-nvidia")


def test_a_value_out_of_range_at_a_line_rate_names_the_profile() -> None:
    d = copy.deepcopy(doc("dcqcn-nvidia"))
    d["parameters"]["rhai_bps"].update(value=2, unit="Gb/s")  # above a 1 Gb/s line
    p = parse_profile(d, "dcqcn-nvidia")
    with pytest.raises(ProfileError, match=r"'dcqcn-nvidia' at 1000000000 b/s: rhai_bps must"):
        p.cc_params(10**9, 10_000)


def test_policy_params_carry_every_parameter_of_the_law() -> None:
    from controller.config import RATE_LAW_PARAMS

    for name in known_profiles():
        p = load_profile(name)
        pp = policy_params(p.cc_params(10**9, 100_000))
        allowed = RATE_LAW_PARAMS[p.law.name.lower()]
        # Swift's T only defaults its target, which the profile gives
        assert set(pp) <= allowed and allowed - set(pp) <= {"base_rtt_ns"}, name


@pytest.mark.parametrize("name", known_profiles())
def test_a_profile_reaches_the_emulations_agents_whole(name: str) -> None:
    """The emulation's path: the controller's policy (its params map) -> the agent's
    RateLawConfig -> the agent's effective parameters are the profile's, field for field."""
    from types import SimpleNamespace

    from controller.config import LawPolicy
    from controller.hostagents import rate_law_config
    from controller.nic.agent.agent import Agent
    from controller.nic.agent.service import overrides_from_pb

    p = load_profile(name)
    want = p.cc_params(EMU_NIC, 12_345_678, Scaling().scale)
    cfg = rate_law_config(LawPolicy(p.law.name.lower(), policy_params(want)))
    agent = SimpleNamespace(opts=SimpleNamespace(line_rate_bps=EMU_NIC))
    base = CcParams.defaults(Law.TITA, EMU_NIC, 100_000)  # what the agent had before
    got = Agent.effective_params(agent, base, p.law, overrides_from_pb(cfg))  # type: ignore[arg-type]
    law_struct = {
        Law.TITA: "tita",
        Law.HPCC: "hpcc",
        Law.DCQCN: "dcqcn",
        Law.TIMELY: "timely",
        Law.SWIFT: "swift",
    }.get(p.law)
    assert got.min_rate_bps == want.min_rate_bps
    if law_struct:
        assert getattr(got, law_struct) == getattr(want, law_struct)


def test_the_twin_sets_each_profiles_params_on_its_hosts() -> None:
    from testbed.sim.fabric import SimFabric
    from testbed.topo import leafspine

    spec = leafspine(2, 1, 2)
    scaling = Scaling(max_hops=spec.longest_path_switches())
    fab = SimFabric(spec, scaling)
    got = {}
    for name in ("dcqcn-nvidia", "dcqcn-paper"):
        assert fab.set_law(Law.DCQCN, 1_000_000, name) == len(fab.hosts)
        params = {h: host.nic.params for h, host in fab.hosts.items()}
        assert len(set(params.values())) == 1  # every host the same
        got[name] = next(iter(params.values()))
    nv, paper = got["dcqcn-nvidia"], got["dcqcn-paper"]
    assert nv.law is paper.law is Law.DCQCN and nv.dcqcn != paper.dcqcn
    line = int(scaling.nic_bps)
    assert nv == load_profile("dcqcn-nvidia").cc_params(line, 1_000_000, scaling.scale)
    assert paper == CcParams.defaults(Law.DCQCN, line, 1_000_000)  # the old behaviour
    with pytest.raises(ValueError, match="cc profile 'tita' is not for dcqcn"):
        fab.set_law(Law.DCQCN, 1_000_000, "tita")


def test_cc_profile_option_parses_laws_and_names() -> None:
    from testbed.experiment.schemes import default_cc_profiles, parse_cc_profiles

    assert parse_cc_profiles("") == default_cc_profiles()
    got = parse_cc_profiles("dcqcn-paper, hpcc=hpcc-paper")
    assert got["dcqcn"] == "dcqcn-paper" and got["tita"] == "tita"
    with pytest.raises(ValueError, match="is for dcqcn, not 'swift'"):
        parse_cc_profiles("swift=dcqcn-hpcc-sim")
    with pytest.raises(ValueError, match="unknown cc profile 'acme'"):
        parse_cc_profiles("acme")


def test_parameters_set_over_a_profile_in_their_units() -> None:
    """Profile.with_values: a unit as written or the profile's (and its `per`); the name
    says what was set; a bad field, number, unit or range is named."""
    line, t = 400_000_000_000, 10_000
    nv = load_profile("dcqcn-nvidia").with_values({"g": "0.0625 fraction", "rai_bps": "50 Mb/s"})
    assert nv.name == "dcqcn-nvidia[g=0.0625 fraction,rai_bps=50 Mb/s]"
    d = nv.cc_params(line, t).dcqcn
    assert d.g == to_fixed(0.0625) and d.rai_bps == 50_000_000
    assert d.rate_timer_ns == 300_000  # the rest as the profile ships it
    assert nv.params["g"].chosen and "1019 dce_tcp_g" in nv.params["g"].origin
    # no unit: the profile's, with its per (the paper's 40 Mb/s at 40 Gb/s: 80 -> 800 Mb/s)
    paper = load_profile("dcqcn-paper").with_values({"rai_bps": "80"})
    assert paper.cc_params(line, t).dcqcn.rai_bps == 800_000_000
    assert load_profile("tita").with_values({"eta": "0.9"}).cc_params(line, t).tita.eta == (
        to_fixed(0.9)
    )
    assert load_profile("tita").with_values({}) is load_profile("tita")
    for settings, message in [
        ({"gain": "1"}, "no parameter 'gain'"),
        ({"eta": "lots"}, "'lots' is not a number"),
        ({"eta": "0.9 Mb/s"}, "unit 'Mb/s' is not a fraction unit"),
        ({"eta": "1.5"}, "outside the fraction's range"),
        ({"eta": "0.9 fraction extra"}, "not 'VALUE [UNIT]'"),
    ]:
        with pytest.raises(ProfileError, match=re.escape(message)):
            load_profile("tita").with_values(settings)


def test_cc_set_option_parses_per_law() -> None:
    from testbed.experiment.schemes import parse_cc_set

    assert parse_cc_set("") == {}
    got = parse_cc_set("tita.eta=0.9, dcqcn.g=0.0625  fraction,tita.wai_bps=0.01 line")
    assert got == {
        "tita": {"eta": "0.9", "wai_bps": "0.01 line"},
        "dcqcn": {"g": "0.0625 fraction"},
    }
    for text, message in [
        ("acme.eta=1", "unknown rate law 'acme'"),
        ("tita.eta", "is not LAW.FIELD=VALUE"),
        ("eta=0.9", "is not LAW.FIELD=VALUE"),
        ("tita.g=0.5", "no parameter 'g'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_cc_set(text)


def test_results_json_records_each_schemes_profile(tmp_path: Path) -> None:
    """End to end on the twin: `--cc-profile` reaches the NICs and results.json says which
    profile each scheme ran, its source and every value."""
    import json

    from testbed.main import main

    data = Path(__file__).parent / "data"
    argv = [
        "run",
        "--engine",
        "sim",
        "--run-dir",
        str(tmp_path),
        "--schemes",
        "dcqcn,tita",
        "--topo",
        str(data / "twin-fabric.yaml"),
        "--flows",
        str(data / "twin-flows.csv"),
        "--cc-profile",
        "dcqcn-hpcc-sim",
        "--cc-set",
        "tita.eta=0.9",
    ]
    assert main(argv) == 0
    setup = json.loads((tmp_path / "results.json").read_text())["setup"]
    assert setup["suite"]["cc_profiles"]["dcqcn"] == "dcqcn-hpcc-sim"
    dcqcn, tita = setup["cc_profiles"]["dcqcn"], setup["cc_profiles"]["tita"]
    assert dcqcn["profile"] == "dcqcn-hpcc-sim" and dcqcn["law"] == "dcqcn"
    assert "alibaba-edu/High-Precision-Congestion-Control" in dcqcn["source"]["url"]
    assert dcqcn["values"]["byte_counter"] == 0 and dcqcn["values"]["g"] == 1 / 256
    assert set(dcqcn["values"]) == {f for f in load_profile("dcqcn-hpcc-sim").params}
    assert dcqcn["clamped_from"] == {"rate_timer_ns": 6_000_000_000}  # 300 us x 20,000
    assert tita["profile"] == "tita[eta=0.9]" and tita["values"]["eta"] == pytest.approx(0.9)
    assert setup["suite"]["cc_set"] == {"tita": {"eta": "0.9"}}


def test_the_notification_points_cnp_spacing_comes_from_the_dcqcn_profile() -> None:
    """The receivers' least time between two CNPs of a flow is the DCQCN profile's
    notification point: HPCC's simulator sends one with every ACK of a marked packet (0),
    the paper's 50 us at 40 Gb/s is dilated to the NIC's rate, and a scheme of another law
    gets the configured DCQCN profile's (a NIC's notification point runs whatever law its
    peers run). The law's struct never carries it."""
    import dataclasses

    from testbed.experiment.suite import SuiteConfig, transport_settings
    from testbed.model import Scaling
    from testbed.sim.fabric import SimFabric
    from testbed.sim.suite import SimSuite
    from testbed.topo import parse_choice

    spec = parse_choice("leafspine:1,1,3")
    s = Scaling(scale=1, max_hops=spec.longest_path_switches())
    paper = 50e-6 * 40e9 / s.nic_bps  # the transport's spacing before profiles carried it
    cfg = dataclasses.replace(SuiteConfig.quick(), schemes=("dcqcn",))
    suite = SimSuite(SimFabric(spec, s), cfg)
    suite.prepare()
    assert suite.cnp_interval_s("dcqcn") == pytest.approx(paper, abs=1e-9)
    assert suite.cnp_interval_s("tita") == suite.cnp_interval_s("dcqcn")
    assert transport_settings(s)["cnp_interval"] == pytest.approx(paper, abs=1e-9)
    sim = dataclasses.replace(cfg, cc_profiles={**cfg.cc_profiles, "dcqcn": "dcqcn-hpcc-sim"})
    suite = SimSuite(SimFabric(spec, s), sim)
    suite.prepare()
    assert suite.cnp_interval_s("dcqcn") == 0.0
    assert suite.cnp_interval_s("hpcc") == 0.0  # the NICs' notification point is the simulator's
    suite.use_scheme("dcqcn")
    assert suite.cc_records["dcqcn"]["values"]["cnp_interval_ns"] == 0
    set_cfg = dataclasses.replace(cfg, cc_set={"dcqcn": {"cnp_interval_ns": "2 us"}})
    suite = SimSuite(SimFabric(spec, s), set_cfg)
    suite.prepare()
    assert suite.cnp_interval_s("dcqcn") == pytest.approx(2e-6)
    for name in ("dcqcn-nvidia", "dcqcn-paper", "dcqcn-hpcc-sim"):
        prof = load_profile(name)
        cc = prof.cc_params(400_000_000_000, 2000)
        assert not hasattr(cc.dcqcn, "cnp_interval_ns")
        assert set(prof.np_values(400_000_000_000, 2000)) == {"cnp_interval_ns"}
    assert load_profile("timely-paper").np_values(400_000_000_000, 2000) == {}
