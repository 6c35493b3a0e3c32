"""The switch's Prometheus view (testbed/switch/admin.py): each port's latency monitor, the
numbers the controller's slow-link rule reads over SwitchAdmin, as counters per port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from testbed.switch.admin import SwitchCollector
from testbed.switch.traffic_manager import Clock
from testbed.switch.v1model import V1Switch


def _samples(sw: V1Switch) -> dict[str, float]:
    reg = CollectorRegistry()
    reg.register(SwitchCollector(sw, None, "leaf1"))
    out = {}
    for line in generate_latest(reg).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_each_ports_waits_and_what_its_queue_explains_are_counters() -> None:
    sw = V1Switch(Clock(virtual=True), device_id=1)
    pq = sw.tm.port(3)
    pq.departures, pq.wait_ns, pq.expected_wait_ns = 40, 6_000_000, 2_500_000
    sw.tm.port(4)
    m = _samples(sw)
    lv = '{port="3",switch="leaf1"}'
    assert m[f"xingmai_switch_port_departures_total{lv}"] == 40
    assert m[f"xingmai_switch_port_wait_seconds_total{lv}"] == 0.006
    assert m[f"xingmai_switch_port_expected_wait_seconds_total{lv}"] == 0.0025
    assert m['xingmai_switch_port_departures_total{port="4",switch="leaf1"}'] == 0


def test_the_delay_lines_lateness_and_drops_per_wired_port() -> None:
    from types import SimpleNamespace

    from testbed.switch.dataplane import PortStats, Wire

    sw = V1Switch(Clock(virtual=True), device_id=1)
    wired = SimpleNamespace(wire=Wire(2e7, 1_600_000), stats=PortStats(line_late_ns=2_500_000))
    wired.stats.line_drops = 3
    plain = SimpleNamespace(wire=None, stats=PortStats())
    stamped = SimpleNamespace(wire=Wire(2e7, 1_600_000, stamped=True), stats=PortStats())
    stamped.stats.line_unstamped = 7
    dp = SimpleNamespace(running=True, loop_errors=0, ports={1: wired, 2: plain, 3: stamped})
    reg = CollectorRegistry()
    reg.register(SwitchCollector(sw, dp, "leaf1"))  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    lv = '{port="1",switch="leaf1"}'
    assert f"xingmai_switch_line_late_seconds_total{lv} 0.0025" in text
    assert f"xingmai_switch_line_drops_total{lv} 3.0" in text
    assert 'xingmai_switch_line_late_seconds_total{port="2"' not in text
    # a stamped wire's frames that came without their due: on its port alone
    assert 'xingmai_switch_line_unstamped_total{port="3",switch="leaf1"} 7.0' in text
    assert "xingmai_switch_line_unstamped_total" + lv not in text
