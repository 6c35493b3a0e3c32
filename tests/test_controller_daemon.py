"""The daemon as a process, without a fabric: --help, --check, bad configs refused with the
bad key named, a switch that refuses or never answers and a flood of malformed reports leave it
serving, SIGHUP with a broken file keeps the running config, SIGTERM ends it cleanly; and the
systemd unit is valid."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.controller_rig import BMV2_JSON, P4INFO, REPO, FakeHostAgent, free_port

EXAMPLE = REPO / "controller" / "examples" / "leafspine-2x2.yaml"
UNIT = REPO / "controller" / "systemd" / "xingmai-controller.service"
needs_p4 = pytest.mark.skipif(not P4INFO.exists(), reason=f"{P4INFO} not built (make p4)")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.daemon", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_describes_the_daemon() -> None:
    res = run_cli("--help")
    assert res.returncode == 0
    assert "xingmai-controller" in res.stdout and "--config" in res.stdout


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["switches"][2]["ports"][0] = {"port": 1, "speed_gbps": "fast"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    res = run_cli("--config", str(bad), "--check")
    assert res.returncode == 2
    assert "switches[2].ports[0].speed_gbps: expected a number, got 'fast'" in res.stderr
    res = run_cli("--config", str(tmp_path / "missing.yaml"))
    assert res.returncode == 2 and "cannot read" in res.stderr


def test_missing_pipeline_is_an_error(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["pipeline"] = {"p4info": "nowhere.txtpb", "bmv2_json": "nowhere.json"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    res = run_cli("--config", str(cfg), "--check")
    assert res.returncode == 2 and "nowhere.txtpb does not exist" in res.stderr


@needs_p4
def test_check_accepts_the_example() -> None:
    res = run_cli("--config", str(EXAMPLE), "--check")
    assert res.returncode == 0, res.stderr
    assert "valid (4 switches, 8 hosts, 13 links)" in res.stdout


def test_systemd_unit_is_valid(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    exe = REPO / ".venv" / "bin" / "xingmai-controller"
    if not exe.exists():
        pytest.skip("the console script is not installed (make install)")
    unit = tmp_path / "xingmai-controller.service"
    unit.write_text(UNIT.read_text().replace("/opt/xingmai/.venv/bin/xingmai-controller", str(exe)))
    res = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = UNIT.read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text and "KillSignal=SIGTERM" in text


class Silent:
    """A TCP server that accepts connections and never says a word (a hung switch)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[dict[str, Any]]:
    if not P4INFO.exists():
        pytest.skip(f"{P4INFO} not built (make p4)")
    silent = Silent()
    refused = free_port()  # nobody listens there
    ctl = free_port()
    metrics = free_port()
    udp = free_port(socket.SOCK_DGRAM)
    hanging = FakeHostAgent("h1")
    hanging.hang.set()
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["pipeline"] = {"p4info": str(P4INFO), "bmv2_json": str(BMV2_JSON)}
    doc["controller"] = {
        "grpc_addr": f"127.0.0.1:{ctl}",
        "rpc_timeout_s": 0.5,
        "reconnect_max_s": 1.0,
        "metrics_addr": f"127.0.0.1:{metrics}",
    }
    doc["policy"] = {"interval_s": 0.5}
    doc["int"]["collector"]["listen"] = f"127.0.0.1:{udp}"
    for i, sw in enumerate(doc["switches"]):
        sw["grpc_addr"] = f"127.0.0.1:{silent.port if i % 2 else refused}"
    for h in doc["hosts"]:
        h.pop("agent", None)
    doc["hosts"][0]["agent"] = hanging.addr  # an agent that never answers
    doc["hosts"][1]["agent"] = f"127.0.0.1:{refused}"  # and one that is not there
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    log = tmp_path / "ctl.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.daemon", "--config", str(cfg), "--log-file", str(log)],
        cwd=REPO,
        stderr=subprocess.PIPE,
    )
    try:
        yield {"proc": proc, "ctl": ctl, "udp": udp, "cfg": cfg, "log": log, "metrics": metrics}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        silent.close()
        hanging.close()


def _status(ctl: int, timeout: float = 20.0) -> Any:
    from controller.proto import controller_pb2 as pb
    from controller.proto import controller_pb2_grpc as pb_grpc

    stub = pb_grpc.ControllerStub(grpc.insecure_channel(f"127.0.0.1:{ctl}"))
    deadline = time.monotonic() + timeout
    while True:
        try:
            return stub, stub.GetStatus(pb.GetStatusRequest(), timeout=1.0)
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_unreachable_switches_bad_reports_and_signals(daemon: dict[str, Any]) -> None:
    from controller.proto import controller_pb2 as pb

    stub, st = _status(daemon["ctl"])
    assert st.switches == 4 and not st.healthy
    # a flood of garbage at the collector: counted, never fatal
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(500):
        tx.sendto(bytes([i % 256]) * (i % 90), ("127.0.0.1", daemon["udp"]))
    tx.close()
    deadline = time.monotonic() + 10
    while True:
        tel = stub.GetTelemetry(pb.GetTelemetryRequest(), timeout=2)
        if sum(tel.errors.values()) >= 450 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sum(tel.errors.values()) >= 450 and tel.reports == 0
    # the silent switch times out, the refused one fails to connect; both are retried
    time.sleep(6)
    sws = {s.name: s for s in stub.ListSwitches(pb.ListSwitchesRequest(), timeout=2).switches}
    assert not any(s.connected for s in sws.values())
    assert "no P4Runtime answer" in sws["leaf2"].last_error, sws["leaf2"]
    assert sws["leaf1"].last_error, sws["leaf1"]
    # the hanging and the absent agent: skipped, counted, the loop goes on
    st = stub.GetStatus(pb.GetStatusRequest(), timeout=2)
    assert (st.agents, st.agents_reachable) == (2, 0) and st.slow_loop_runs >= 3
    import urllib.request

    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{daemon['metrics']}/metrics", timeout=5)
        .read()
        .decode()
    )
    assert 'xingmai_controller_switch_connected{switch="leaf1"} 0.0' in text
    assert 'xingmai_controller_report_errors_total{reason="short"}' in text
    failures = [
        ln
        for ln in text.splitlines()
        if ln.startswith('xingmai_controller_agent_failures_total{host="h1"}')
    ]
    assert failures and float(failures[0].split()[-1]) >= 2
    # SIGHUP with a broken file: refused, the running config stays
    good = daemon["cfg"].read_text()
    daemon["cfg"].write_text("switches: [\n")
    daemon["proc"].send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert daemon["proc"].poll() is None
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=2).switches == 4
    assert "reload refused" in daemon["log"].read_text()
    daemon["cfg"].write_text(good)
    daemon["proc"].send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=2).config_reloads == 1
    # SIGTERM: a clean exit, promptly
    t0 = time.monotonic()
    daemon["proc"].send_signal(signal.SIGTERM)
    assert daemon["proc"].wait(timeout=15) == 0
    assert time.monotonic() - t0 < 10
    assert "controller stopped" in daemon["log"].read_text()


def _certs(d: Path) -> dict[str, Path]:
    """A CA, a server cert for 127.0.0.1 and a client cert, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")

    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ossl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=xingmai-test-ca",
    )
    for who, san in (("server", "IP:127.0.0.1"), ("client", "DNS:client")):
        ossl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{who}.key",
            "-out",
            f"{who}.csr",
            "-subj",
            f"/CN={who}",
        )
        (d / f"{who}.ext").write_text(f"subjectAltName={san}\n")
        ossl(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{who}.pem",
            "-days",
            "1",
            "-extfile",
            f"{who}.ext",
        )
    return {n: d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@needs_p4
def test_mtls_listener_requires_a_client_certificate(tmp_path: Path) -> None:
    from controller.proto import controller_pb2 as pb
    from controller.proto import controller_pb2_grpc as pb_grpc

    c = _certs(tmp_path)
    ctl = free_port()
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["pipeline"] = {"p4info": str(P4INFO), "bmv2_json": str(BMV2_JSON)}
    doc["controller"] = {
        "grpc_addr": f"127.0.0.1:{ctl}",
        "tls": {"cert": str(c["server.pem"]), "key": str(c["server.key"]), "ca": str(c["ca.pem"])},
    }
    doc["int"]["collector"]["listen"] = f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
    for sw in doc["switches"]:
        sw["grpc_addr"] = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller.daemon",
            "--config",
            str(cfg),
            "--log-file",
            str(tmp_path / "log"),
        ],
        cwd=REPO,
    )
    try:
        good = grpc.ssl_channel_credentials(
            c["ca.pem"].read_bytes(), c["client.key"].read_bytes(), c["client.pem"].read_bytes()
        )
        stub = pb_grpc.ControllerStub(grpc.secure_channel(f"127.0.0.1:{ctl}", good))
        deadline = time.monotonic() + 20
        while True:
            try:
                st = stub.GetStatus(pb.GetStatusRequest(), timeout=1)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert st.switches == 4
        anon = grpc.ssl_channel_credentials(c["ca.pem"].read_bytes())
        with pytest.raises(grpc.RpcError) as exc:
            pb_grpc.ControllerStub(grpc.secure_channel(f"127.0.0.1:{ctl}", anon)).GetStatus(
                pb.GetStatusRequest(), timeout=3
            )
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError):
            pb_grpc.ControllerStub(grpc.insecure_channel(f"127.0.0.1:{ctl}")).GetStatus(
                pb.GetStatusRequest(), timeout=3
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


@needs_p4
def test_sighup_applies_listener_and_tls_changes_or_refuses_them(tmp_path: Path) -> None:
    """Issue 18 defect 3: after adding controller.tls and SIGHUP the daemon said "reloaded"
    and still took plaintext. A reload now rebinds the gRPC API (address, TLS), the collector
    and the metrics server; a listener it cannot bind makes it refuse the reload loudly and
    keep the running ones."""
    from controller.proto import controller_pb2 as pb
    from controller.proto import controller_pb2_grpc as pb_grpc

    c = _certs(tmp_path)
    ctl = free_port()
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["pipeline"] = {"p4info": str(P4INFO), "bmv2_json": str(BMV2_JSON)}
    doc["controller"] = {"grpc_addr": f"127.0.0.1:{ctl}"}
    doc["int"]["collector"]["listen"] = f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
    for sw in doc["switches"]:
        sw["grpc_addr"] = f"127.0.0.1:{free_port()}"
    for h in doc["hosts"]:
        h.pop("agent", None)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    log = tmp_path / "log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.daemon", "--config", str(cfg), "--log-file", str(log)],
        cwd=REPO,
    )
    plain = pb_grpc.ControllerStub(grpc.insecure_channel(f"127.0.0.1:{ctl}"))
    good = grpc.ssl_channel_credentials(
        c["ca.pem"].read_bytes(), c["client.key"].read_bytes(), c["client.pem"].read_bytes()
    )
    secure = pb_grpc.ControllerStub(grpc.secure_channel(f"127.0.0.1:{ctl}", good))

    def status(stub: Any, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return stub.GetStatus(pb.GetStatusRequest(), timeout=1)
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    try:
        assert status(plain).switches == 4
        # add mTLS on the same address: plaintext is refused from then on
        doc["controller"]["tls"] = {
            "cert": str(c["server.pem"]),
            "key": str(c["server.key"]),
            "ca": str(c["ca.pem"]),
        }
        cfg.write_text(yaml.safe_dump(doc))
        proc.send_signal(signal.SIGHUP)
        st = status(secure)
        assert st.config_reloads == 1 and st.config_reload_failures == 0
        with pytest.raises(grpc.RpcError):
            plain.GetStatus(pb.GetStatusRequest(), timeout=3)
        # a new collector address that is taken: the reload is refused and said so
        taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        taken.bind(("127.0.0.1", 0))
        doc["int"]["collector"]["listen"] = f"127.0.0.1:{taken.getsockname()[1]}"
        doc["policy"] = {"interval_s": 7.0}
        cfg.write_text(yaml.safe_dump(doc))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while status(secure).config_reload_failures == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        st = status(secure)
        assert (st.config_reloads, st.config_reload_failures) == (1, 1)
        assert "reload refused: a listener could not be changed" in log.read_text()
        taken.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
