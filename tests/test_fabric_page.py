"""The controller's fabric page in a real headless browser (Debian's chromium + chromium-driver):
a controller daemon programs four built-in switches (in this process, on loopback) and talks to
eight host agents (fakes reporting flows), Telemetry Reports reach its collector over UDP; the
browser loads the page, and what the page shows — every link's utilisation and queue, the
colours in the screenshot, the flows with rates and caps, the switches' health — is checked
against the controller's gRPC API and its Prometheus metrics.

XINGMAI_SCREENSHOT=docs/img/fabric-page.png saves the screenshot there too (docs/operations.md)."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.service import flow_label
from tests.controller_rig import BMV2_JSON, P4INFO, REPO, FakeHostAgent, free_port
from tests.grafana_helpers import queries
from tests.telemetry_helpers import report
from tests.webdriver import Browser, available

EXAMPLE = REPO / "controller" / "examples" / "leafspine-2x2.yaml"

pytestmark = [
    pytest.mark.skipif(not P4INFO.exists(), reason="p4src not built (make p4)"),
    pytest.mark.slow,
]


class InProcessSwitch:
    """A built-in switch's P4Runtime and SwitchAdmin services on a loopback port (no ports,
    no packets: the controller programs it as it would a switch of the fabric)."""

    def __init__(self, device_id: int):
        from controller.proto import switch_pb2_grpc
        from testbed.switch.admin import SwitchAdminService
        from testbed.switch.p4runtime import P4RuntimeService, serve
        from testbed.switch.traffic_manager import Clock
        from testbed.switch.v1model import V1Switch

        self.sw = V1Switch(Clock(virtual=True), device_id=device_id, cpu_port=255)
        self.sw.transmit = lambda port, data: None
        service = P4RuntimeService(self.sw, device_id)
        admin = SwitchAdminService(self.sw, None, service)
        self.addr = f"127.0.0.1:{free_port()}"
        self.server = serve(
            service,
            self.addr,
            also=(lambda srv: switch_pb2_grpc.add_SwitchAdminServicer_to_server(admin, srv),),
        )

    def close(self) -> None:
        self.server.stop(0)


# (sender, receiver, sport, transit hops (node, in, out, queue bytes, tx util), sink (node, in,
# out, queue bytes)): h1 and h2 into h5 over both spines, h3 to h6 beside them
FLOWS = [
    (
        "10.0.1.1",
        "10.0.2.1",
        49152,
        [(1, 1, 5, 31_000, 0.62), (3, 1, 2, 4_000, 0.55)],
        (2, 5, 1, 95_000),
    ),
    (
        "10.0.1.2",
        "10.0.2.1",
        49153,
        [(1, 2, 6, 2_000, 0.31), (4, 1, 2, 0, 0.30)],
        (2, 6, 1, 95_000),
    ),
    (
        "10.0.1.3",
        "10.0.2.2",
        49154,
        [(1, 3, 5, 31_000, 0.62), (3, 1, 2, 4_000, 0.55)],
        (2, 5, 2, 12_000),
    ),
]
AGENT_RATES = {"h1": 48e6, "h2": 29e6, "h3": 20e6}


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[dict[str, Any]]:
    why = available()
    if why:
        pytest.skip(why)
    switches = [InProcessSwitch(i + 1) for i in range(4)]
    agents = {f"h{i}": FakeHostAgent(f"h{i}") for i in range(1, 9)}
    for (src, dst, sport, _, _), host in zip(FLOWS, AGENT_RATES, strict=True):
        agents[host].flows = [((src, dst, 17, sport, 4791), int(AGENT_RATES[host]))]
    ports = {k: free_port() for k in ("grpc", "metrics", "web")}
    udp = free_port(socket.SOCK_DGRAM)
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["pipeline"] = {"p4info": str(P4INFO), "bmv2_json": str(BMV2_JSON)}
    doc["controller"].update(
        {
            "grpc_addr": f"127.0.0.1:{ports['grpc']}",
            "metrics_addr": f"127.0.0.1:{ports['metrics']}",
            "web_addr": f"127.0.0.1:{ports['web']}",
            "counter_poll_s": 0.5,
        }
    )
    doc["policy"]["interval_s"] = 0.5
    doc["policy"]["flow_idle_s"] = 600  # the reports are sent once: keep their flows active
    doc["int"]["collector"]["listen"] = f"127.0.0.1:{udp}"
    for sw, ips in zip(doc["switches"], switches, strict=True):
        sw["grpc_addr"] = ips.addr
    for h in doc["hosts"]:
        h["agent"] = agents[h["name"]].addr
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    log = tmp_path / "controller.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.daemon", "--config", str(cfg), "--log-file", str(log)],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield {
            "ports": ports,
            "udp": udp,
            "log": log,
            "proc": proc,
            "switches": dict(zip(("leaf1", "leaf2", "spine1", "spine2"), switches, strict=True)),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for a in agents.values():
            a.close()
        for s in switches:
            s.close()


def _stub(port: int) -> Any:
    from controller.proto import controller_pb2_grpc as pb_grpc

    return pb_grpc.ControllerStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def _wait(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            v = check()
        except grpc.RpcError:
            v = None
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _send_reports(udp: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    seq: dict[int, int] = {}
    for src, dst, sport, transit, (sink, s_in, s_out, s_q) in FLOWS:
        hops = [
            {
                "node_id": n,
                "l1_ingress_port": i,
                "l1_egress_port": o,
                "hop_latency": 2000,
                "queue_id": 0,
                "queue_occupancy": q,
                "egress_ts": 1_000_000,
                "tx_util": round(u * 1e6),
            }
            for n, i, o, q, u in reversed(transit)
        ]
        seq[sink] = seq.get(sink, -1) + 1
        sock.sendto(
            report(
                seq[sink],
                sink,
                hops,
                src=src,
                dst=dst,
                sport=sport,
                sink_in=s_in,
                sink_out=s_out,
                sink_qocc=s_q,
            ),
            ("127.0.0.1", udp),
        )
    sock.close()


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# what the page shows, read from its elements' data attributes (and where each link's core is)
READ_PAGE = """
            const links = [...document.querySelectorAll('[data-link]')].map((g) => {
              const core = g.querySelectorAll('line')[1].getBoundingClientRect();
              return {name: g.dataset.link, util: g.dataset.util, qocc: g.dataset.qocc,
                      colour: g.dataset.colour, dead: g.dataset.dead, x: core.x + core.width / 2,
                      y: core.y + core.height / 2};
            });
            const rows = (id) => [...document.querySelectorAll(`#${id} tbody tr`)]
              .filter((tr) => Object.keys(tr.dataset).length).map((tr) => ({...tr.dataset}));
            const nodes = [...document.querySelectorAll('[data-node]')]
              .map((g) => ({...g.dataset}));
            return {links, flows: rows('flows'), switches: rows('switches'), nodes,
                    suspects: rows('suspects'),
                    status: document.getElementById('status').textContent,
                    dpr: window.devicePixelRatio};
        """


def _loaded(controller: dict[str, Any]) -> Any:
    """Wait for the fabric to be programmed, send the reports, wait for the flows to be capped
    and the port counters polled; the controller's stub."""
    from controller.proto import controller_pb2 as pb

    stub = _stub(controller["ports"]["grpc"])
    _wait(
        "every switch programmed, every agent reached",
        lambda: (
            (st := stub.GetStatus(pb.GetStatusRequest(), timeout=2)).healthy
            and st.agents_reachable == 8
        ),
    )
    _send_reports(controller["udp"])
    _wait(
        "the reports' flows",
        lambda: len(stub.ListFlows(pb.ListFlowsRequest(), timeout=2).flows) == len(FLOWS),
    )
    # the slow loop has capped every flow from the agents' rates, and the counters are polled
    _wait(
        "caps on every flow",
        lambda: all(
            f.cap_bps > 0 and f.rate_bps > 0
            for f in stub.ListFlows(pb.ListFlowsRequest(), timeout=2).flows
        ),
    )
    _wait(
        "port counters",
        lambda: all(
            ls.util_counter >= 0
            for ls in stub.GetTelemetry(pb.GetTelemetryRequest(), timeout=2).links
            if ls.name.startswith("leaf")
        ),
    )
    return stub


def test_fabric_page_in_a_browser_matches_the_api(
    controller: dict[str, Any], tmp_path: Path
) -> None:
    from controller.proto import controller_pb2 as pb

    stub = _loaded(controller)
    url = f"http://127.0.0.1:{controller['ports']['web']}/?refresh=0"
    with Browser(width=1280, height=1000) as b:
        b.get(url)
        b.wait_for("return document.body.dataset.updated || document.body.dataset.error")
        assert not b.run("return document.body.dataset.error || ''")
        page = b.run(READ_PAGE)
        png = b.screenshot(tmp_path / "fabric-page.png")

    topo = stub.GetTopology(pb.GetTopologyRequest(), timeout=5)
    tel = {ls.name: ls for ls in stub.GetTelemetry(pb.GetTelemetryRequest(), timeout=5).links}
    flows = {
        flow_label((f.key.src_ip, f.key.dst_ip, f.key.protocol, f.key.src_port, f.key.dst_port)): f
        for f in stub.ListFlows(pb.ListFlowsRequest(), timeout=5).flows
    }
    health = {s.name: s for s in stub.ListSwitches(pb.ListSwitchesRequest(), timeout=5).switches}
    metrics = _metrics(controller["ports"]["metrics"])

    # every directed link of the topology is drawn, with the API's utilisation and queue
    drawn = {lk["name"]: lk for lk in page["links"]}
    assert set(drawn) == {lk.name for lk in topo.links}
    for name, lk in drawn.items():
        ls = tel[name]
        want_util = ls.util_int if ls.util_int >= 0 else ls.util_counter
        if want_util >= 0:
            assert float(lk["util"]) == pytest.approx(want_util, abs=1e-9), name
            source = "int" if ls.util_int >= 0 else "counter"
            assert metrics[
                ("xingmai_controller_link_utilization", (("link", name), ("source", source)))
            ] == pytest.approx(want_util)
        else:
            assert lk["util"] == "", name
        if ls.qocc_bytes >= 0:
            assert int(lk["qocc"]) == ls.qocc_bytes, name
            assert (
                metrics[("xingmai_controller_link_queue_bytes", (("link", name),))] == ls.qocc_bytes
            )
        else:
            assert lk["qocc"] == "", name
    # what the reports said, as drawn: INT's utilisation on the transit hops, the queues
    assert float(drawn["leaf1:5"]["util"]) == pytest.approx(0.62)
    assert int(drawn["leaf2:1"]["qocc"]) == 95_000 and int(drawn["leaf1:5"]["qocc"]) == 31_000

    # the screenshot shows each link's colour where the page drew it
    import matplotlib.image as mpimg

    img = mpimg.imread(io.BytesIO(png), format="png")[..., :3] * 255
    dpr = float(page["dpr"])
    for name in ("leaf1:5", "leaf1:6", "spine1:2", "h1:eth0"):
        lk = drawn[name]
        px = img[round(lk["y"] * dpr), round(lk["x"] * dpr)]
        assert np.abs(px - _rgb(lk["colour"])).max() <= 12, (name, px, lk["colour"])
    hot, cool = _rgb(drawn["leaf1:5"]["colour"]), _rgb(drawn["leaf1:6"]["colour"])
    assert hot[0] > cool[0] and hot[1] < cool[1] + 40  # 62 % is redder than 31 %

    # the flows: the API's, with its rates, caps and queues; each also a Prometheus series
    assert {f["flow"] for f in page["flows"]} == set(flows)
    for f in page["flows"]:
        api = flows[f["flow"]]
        assert float(f["rate"]) == pytest.approx(api.rate_bps)
        assert float(f["cap"]) == pytest.approx(api.cap_bps)
        assert int(f["qocc"]) == api.max_qocc_bytes
        labels = (("dst_host", api.dst_host), ("flow", f["flow"]), ("src_host", api.src_host))
        assert metrics[("xingmai_controller_flow_rate_bps", labels)] == pytest.approx(api.rate_bps)
        assert metrics[("xingmai_controller_flow_cap_bps", labels)] == pytest.approx(api.cap_bps)
        assert metrics[("xingmai_controller_flow_max_qocc_bytes", labels)] == api.max_qocc_bytes
    assert flows[flow_label(("10.0.1.1", "10.0.2.1", 17, 49152, 4791))].max_qocc_bytes == 95_000

    # the switches' health, as the API and the metrics say
    assert {s["switch"] for s in page["switches"]} == set(health)
    for s in page["switches"]:
        h = health[s["switch"]]
        assert (s["connected"], s["programmed"]) == (
            str(h.connected).lower(),
            str(h.programmed).lower(),
        )
        assert metrics[("xingmai_controller_switch_connected", (("switch", s["switch"]),))] == int(
            h.connected
        )
    assert all(n["up"] == "true" for n in page["nodes"] if n["kind"] == "switch")
    assert "healthy" in page["status"] and "NOT" not in page["status"]
    assert page["suspects"] == []

    # spine2 dies: the controller names it and routes around it; the page shows the suspect
    # and the dead links as GetSuspects has them, and so do the metrics
    controller["switches"]["spine2"].close()
    sus = _wait(
        "spine2 suspected",
        lambda: [
            s
            for s in stub.GetSuspects(pb.GetSuspectsRequest(), timeout=2).suspects
            if s.element == "switch spine2"
        ],
    )
    assert sus[0].kind == "switch-unreachable"
    _wait("the fail-over", lambda: stub.GetSuspects(pb.GetSuspectsRequest(), timeout=2).dead_links)
    with Browser(width=1280, height=1000) as b:
        b.get(url)
        b.wait_for("return document.body.dataset.updated || document.body.dataset.error")
        after = b.run(READ_PAGE)
        png = b.screenshot(tmp_path / "fabric-page-suspect.png")
    if os.environ.get("XINGMAI_SCREENSHOT"):
        Path(os.environ["XINGMAI_SCREENSHOT"]).write_bytes(png)
    api = stub.GetSuspects(pb.GetSuspectsRequest(), timeout=5)
    assert [(s["element"], s["kind"]) for s in after["suspects"]] == [
        (s.element, s.kind) for s in api.suspects
    ]
    assert [float(s["score"]) for s in after["suspects"]] == pytest.approx(
        [s.score for s in api.suspects]
    )
    dead = {lk["name"] for lk in after["links"] if lk["dead"] == "true"}
    assert dead == {
        lk.name
        for lk in topo.links
        if "spine2" in (getattr(lk, "from").split(":")[0], lk.to.split(":")[0])
    }
    assert {n["node"]: n["up"] for n in after["nodes"]}["spine2"] == "false"
    metrics = _metrics(controller["ports"]["metrics"])
    for s in api.suspects:
        assert metrics[
            ("xingmai_controller_suspect_score", (("element", s.element), ("kind", s.kind)))
        ] == pytest.approx(s.score)
    assert metrics[("xingmai_controller_dead_links", ())] == len(api.dead_links)


def test_web_server_refuses_what_it_does_not_serve(controller: dict[str, Any]) -> None:
    from controller.proto import controller_pb2 as pb

    stub = _stub(controller["ports"]["grpc"])
    _wait("the controller", lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=2))
    port = controller["ports"]["web"]

    def raw(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out

    assert raw(b"GET /nowhere HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    assert raw(b"POST / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert raw(b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431")
    head = raw(b"HEAD /api/fabric HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
    # and still serving
    assert raw(b"GET /api/fabric HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")
    assert controller["proc"].poll() is None


def test_prometheus_server_scrapes_what_the_page_shows(
    controller: dict[str, Any], tmp_path: Path
) -> None:
    """The testbed's Prometheus server (Debian's prometheus) on the same controller: every
    series the page draws is there with the API's value."""
    from controller.proto import controller_pb2 as pb
    from testbed.emu.prometheus import Prometheus, Target, binary

    if binary() is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    stub = _loaded(controller)
    prom = Prometheus(
        tmp_path,
        [
            Target(
                "controller", f"127.0.0.1:{controller['ports']['metrics']}", {"node": "controller"}
            )
        ],
        f"127.0.0.1:{free_port()}",
    )
    prom.start()
    try:
        prom.wait_ready(60)
        _wait("the controller scraped", prom.all_up, 30)
        tel = {ls.name: ls for ls in stub.GetTelemetry(pb.GetTelemetryRequest(), timeout=5).links}
        _wait(
            "a scrape after the reports",
            lambda: prom.query('xingmai_controller_link_queue_bytes{link="leaf2:1"}'),
            30,
        )
        queues = {m["link"]: v for m, v in prom.query("xingmai_controller_link_queue_bytes")}
        assert queues == {n: ls.qocc_bytes for n, ls in tel.items() if ls.qocc_bytes >= 0}
        util = {
            m["link"]: v for m, v in prom.query('xingmai_controller_link_utilization{source="int"}')
        }
        assert util == pytest.approx({n: ls.util_int for n, ls in tel.items() if ls.util_int >= 0})
        flows = stub.ListFlows(pb.ListFlowsRequest(), timeout=5).flows
        rates = {m["flow"]: v for m, v in prom.query("xingmai_controller_flow_rate_bps")}
        assert rates == {
            flow_label(
                (f.key.src_ip, f.key.dst_ip, f.key.protocol, f.key.src_port, f.key.dst_port)
            ): f.rate_bps
            for f in flows
        }
        assert [t["job"] for t in prom.targets()] == ["controller"]
        # and every controller query of the shipped Grafana dashboard finds its series
        for expr in queries("xingmai_controller_"):
            if "suspect" in expr:  # a healthy fabric: no suspect, a valid query
                assert prom.query(expr) == []
                continue
            _wait(f"data for {expr}", lambda e=expr: prom.query(e), 20)
        assert (tmp_path / "prometheus" / "prometheus.yml").is_file()
    finally:
        prom.stop()
    assert prom.component is not None and not prom.component.alive()
