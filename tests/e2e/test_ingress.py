"""Ingress through the built-in layer-7 proxy (issue 32), on loopback: two
HTTP backends in this process stand behind selector-less Services (their
EndpointSlices point at them); an Ingress of the default `portal` class
routes `a.example.test/` and `b.example.test/api` (Prefix) to them, over
HTTP/1.1 and h2c; TLS by SNI from a `kubernetes.io/tls` Secret, rotated
without a restart; WebSocket-style upgrades pass through; a refused
endpoint is skipped; and Kubernetes' validation, defaults and tables."""

import http.server
import json
import re
import socket
import socketserver
import subprocess
import threading
import time

import pytest

from conftest import Portal
from support.waiting import wait_for


class Backend:
    """An HTTP server answering `<name> <path>` (and echoing upgrades);
    `/slow` answers after two seconds; `seen` lists the paths asked."""

    def __init__(self, name):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                if self.headers.get("Upgrade") == "echo":
                    self.send_response(101)
                    self.send_header("Upgrade", "echo")
                    self.send_header("Connection", "Upgrade")
                    self.end_headers()
                    self.wfile.flush()
                    while data := self.rfile.read1(4096):
                        self.wfile.write(data)
                        self.wfile.flush()
                    return
                outer.seen.append(self.path)
                if self.path.startswith("/slow"):
                    time.sleep(2)
                body = json.dumps({"backend": outer.name, "path": self.path, "host": self.headers.get("Host"),
                                   "headers": {k.lower(): v for k, v in self.headers.items()},
                                   "forwarded_for": self.headers.get("X-Forwarded-For"),
                                   "cookie": ", ".join(self.headers.get_all("Cookie") or []),
                                   "proto": self.headers.get("X-Forwarded-Proto")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.name = name
        self.seen = []
        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    backends = {"a": Backend("a"), "b": Backend("b")}
    portal = start_with_proxy(tmp_path_factory.mktemp("ingress"))
    try:
        serve_backends(portal, backends)
        portal.backends = backends
        yield portal
    finally:
        portal.stop()
        for backend in backends.values():
            backend.close()


def start_with_proxy(data_dir):
    """A Portal whose layer-7 proxy listens on loopback; its ports are
    `http_port` and `https_port`."""
    portal = Portal(data_dir, ["--ingress-bind", "127.0.0.1:0", "--ingress-tls-bind", "127.0.0.1:0"]).start()
    listening = wait_for(lambda: re.search(r"ingress proxy listening http=127\.0\.0\.1:(\d+) https=127\.0\.0\.1:(\d+)",
                                           re.sub(r"\x1b\[[0-9;]*m", "", portal.log())), "the ingress proxy to listen")
    portal.http_port, portal.https_port = int(listening.group(1)), int(listening.group(2))
    return portal


def serve_backends(portal, backends, namespace="default"):
    """Each backend as a selector-less Service of its name (port 80,
    `http`) with a hand-written EndpointSlice pointing at it."""
    for name, backend in backends.items():
        apply(portal, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
                       "spec": {"ports": [{"name": "http", "port": 80}]}})
        manual = slice_of(name, [("127.0.0.1", backend.port)])
        manual["metadata"]["namespace"] = namespace
        apply(portal, manual)


def slice_of(service, endpoints):
    """A hand-written EndpointSlice of `service` (endpoints: address, port)."""
    ports = sorted({port for _, port in endpoints})
    assert len(ports) == 1, "one port per slice"
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-manual", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": ports[0], "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}} for address, _ in endpoints]}


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", str(portal.kubeconfig), *args],
                            input=stdin, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def apply(portal, body):
    return kubectl(portal, "apply", "-f", "-", stdin=json.dumps(body))


def curl(portal, url, *extra, host=None, tls=False):
    port = portal.https_port if tls else portal.http_port
    name = host or "a.example.test"
    result = subprocess.run(["curl", "-sS", "--max-time", "10", "--resolve", f"{name}:{port}:127.0.0.1",
                             *extra, "-w", "\n%{http_code} %{http_version}", f"{'https' if tls else 'http'}://{name}:{port}{url}"],
                            capture_output=True, text=True, timeout=30)
    body, _, status = result.stdout.rpartition("\n")
    code, version = (status.split() + ["", ""])[:2]
    return int(code or 0), version, body, result.stderr


def served(portal, ingress):
    """The Ingress once the proxy serves it (its status shows the address)."""
    def check():
        found = json.loads(kubectl(portal, "get", "ingress", ingress, "-o", "json").stdout)
        return found.get("status", {}).get("loadBalancer", {}).get("ingress")
    return wait_for(check, f"ingress {ingress} to be served")


def routing(bed):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "routes", "namespace": "default"},
            "spec": {"rules": [
                {"host": "a.example.test", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]}},
                {"host": "b.example.test", "http": {"paths": [
                    {"path": "/api", "pathType": "Prefix", "backend": {"service": {"name": "b", "port": {"name": "http"}}}}]}},
            ]}}


def test_hosts_and_paths_reach_their_backends(bed):
    # The proxy makes the `portal` class, the default one: an Ingress
    # naming no class gets it.
    wait_for(lambda: kubectl(bed, "get", "ingressclass", "portal", check=False).returncode == 0, "the portal IngressClass")
    apply(bed, routing(bed))
    status = served(bed, "routes")
    assert status == [{"ip": "127.0.0.1"}]
    ingress = json.loads(kubectl(bed, "get", "ingress", "routes", "-o", "json").stdout)
    assert ingress["spec"]["ingressClassName"] == "portal"
    table = kubectl(bed, "get", "ingress", "routes").stdout.split("\n")
    assert table[0].split() == ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]
    assert table[1].split()[:5] == ["routes", "portal", "a.example.test,b.example.test", "127.0.0.1", "80"]

    code, version, body, _ = curl(bed, "/anything", host="a.example.test")
    assert (code, json.loads(body)["backend"]) == (200, "a")
    answer = json.loads(body)
    assert answer["host"].startswith("a.example.test") and answer["forwarded_for"] == "127.0.0.1" and answer["proto"] == "http"
    code, _, body, _ = curl(bed, "/api/v1?x=1", host="b.example.test")
    assert (code, json.loads(body)["backend"], json.loads(body)["path"]) == (200, "b", "/api/v1?x=1")
    assert curl(bed, "/apis", host="b.example.test")[0] == 404
    assert curl(bed, "/", host="nowhere.example.test")[0] == 404
    # HTTP/2 without TLS (h2c, prior knowledge) to HTTP/1.1 backends.
    code, version, body, _ = curl(bed, "/h2", "--http2-prior-knowledge", host="a.example.test")
    assert (code, version, json.loads(body)["backend"]) == (200, "2", "a")
    metrics = kubectl(bed, "get", "--raw", "/metrics").stdout
    assert re.search(r'portal_ingress_requests_total\{ingress="default/routes",backend="default/a:80",code="200"\} [1-9]', metrics)


def test_wildcard_hosts_and_http2_cookies(bed):
    apply(bed, {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "wild", "namespace": "default"},
                "spec": {"rules": [{"host": "*.wild.example.test", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "b", "port": {"number": 80}}}}]}}]}})
    served(bed, "wild")
    code, _, body, _ = curl(bed, "/", host="x.wild.example.test")
    assert (code, json.loads(body)["backend"]) == (200, "b")
    assert curl(bed, "/", host="y.x.wild.example.test")[0] == 404, "a wildcard covers one label"
    # HTTP/2 sends each cookie as a field of its own: the HTTP/1.1 backend
    # gets one Cookie header.
    code, version, body, _ = curl(bed, "/cookies", "--http2-prior-knowledge", "-H", "Cookie: a=1", "-H", "Cookie: b=2",
                                  host="x.wild.example.test")
    assert (code, version) == (200, "2")
    assert json.loads(body)["cookie"] == "a=1; b=2"
    kubectl(bed, "delete", "ingress", "wild")


def test_tls_by_sni_and_a_rotated_secret_without_restart(bed, tmp_path):
    def certificate(name):
        key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=secure.example.test",
                        "-addext", "subjectAltName=DNS:secure.example.test", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=60)
        return key, cert

    key, cert = certificate("first")
    kubectl(bed, "create", "secret", "tls", "secure-tls", f"--cert={cert}", f"--key={key}")
    apply(bed, {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "secure", "namespace": "default"},
                "spec": {"ingressClassName": "portal", "tls": [{"hosts": ["secure.example.test"], "secretName": "secure-tls"}],
                         "rules": [{"host": "secure.example.test", "http": {"paths": [
                             {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "b", "port": {"number": 80}}}}]}}]}})
    served(bed, "secure")
    code, version, body, err = wait_for(
        lambda: (lambda r: r if r[0] == 200 else None)(curl(bed, "/", "--cacert", str(cert), host="secure.example.test", tls=True)),
        "the certificate of the Secret to be served")
    assert json.loads(body)["backend"] == "b" and json.loads(body)["proto"] == "https"
    assert version == "2", "ALPN offers h2"
    # A new certificate in the same Secret: served without a restart.
    key2, cert2 = certificate("second")
    rotated = kubectl(bed, "create", "secret", "tls", "secure-tls", f"--cert={cert2}", f"--key={key2}",
                      "--dry-run=client", "-o", "json").stdout
    kubectl(bed, "apply", "-f", "-", stdin=rotated)
    wait_for(lambda: curl(bed, "/", "--cacert", str(cert2), host="secure.example.test", tls=True)[0] == 200,
             "the rotated certificate to be served")
    assert curl(bed, "/", "--cacert", str(cert), host="secure.example.test", tls=True)[0] == 0, "the old one is gone"
    # A name no Ingress covers gets the default certificate, not the Secret's.
    _, _, _, err = curl(bed, "/", "--cacert", str(cert2), host="other.example.test", tls=True)
    assert "certificate" in err.lower() or "SSL" in err, err


def test_upgrades_pass_through_and_refused_endpoints_are_left_out(bed):
    apply(bed, routing(bed))
    served(bed, "routes")
    with socket.create_connection(("127.0.0.1", bed.http_port), timeout=10) as conn:
        conn.sendall(b"GET /ws HTTP/1.1\r\nHost: a.example.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        conn.sendall(b"ping through the proxy")
        echoed = b""
        while len(echoed) < len(b"ping through the proxy"):
            echoed += conn.recv(4096)
        assert echoed == b"ping through the proxy"

    # A second endpoint of `a` that refuses connections: the same port on
    # 127.0.0.2, where nothing listens (the backend is bound to 127.0.0.1).
    def counter(name):
        found = re.search(rf"{name}_total (\d+)", kubectl(bed, "get", "--raw", "/metrics").stdout)
        return int(found.group(1)) if found else 0

    retried, ejected = counter("portal_ingress_connect_retries"), counter("portal_ingress_endpoint_ejections")
    body = slice_of("a", [("127.0.0.1", bed.backends["a"].port)])
    body["endpoints"].append({"addresses": ["127.0.0.2"], "conditions": {"ready": True}})
    apply(bed, body)
    # Requests until one meets the refusing endpoint (the new slice is in
    # the table): retried on the other endpoint, answered.
    wait_for(lambda: curl(bed, "/retry", host="a.example.test")[0] == 200
             and counter("portal_ingress_connect_retries") > retried, "a request to meet the refusing endpoint")
    after = counter("portal_ingress_connect_retries")
    # The refusing endpoint is left out: no later request tries it (round
    # robin alone would send every second one there first).
    codes = [curl(bed, f"/retry/{i}", host="a.example.test")[0] for i in range(12)]
    assert codes == [200] * 12, codes
    assert counter("portal_ingress_connect_retries") == after
    assert counter("portal_ingress_endpoint_ejections") - ejected == 1


def test_validation_defaults_and_kubectl_create(bed):
    bad = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "bad", "namespace": "default"},
           "spec": {"rules": [{"host": "10.0.0.1", "http": {"paths": [
               {"path": "api", "pathType": "Prefix", "backend": {"service": {"name": "a", "port": {"number": 80}}}}]}}]}}
    result = kubectl(bed, "create", "-f", "-", stdin=json.dumps(bad), check=False)
    assert 'spec.rules[0].host: Invalid value: "10.0.0.1": must be a DNS name, not an IP address' in result.stderr, result.stderr
    assert 'spec.rules[0].http.paths[0].path: Invalid value: "api": must be an absolute path' in result.stderr, result.stderr
    kubectl(bed, "create", "ingress", "made", "--rule=made.example.test/api*=a:80", "--class=portal")
    made = json.loads(kubectl(bed, "get", "ingress", "made", "-o", "json").stdout)
    path = made["spec"]["rules"][0]["http"]["paths"][0]
    assert (path["path"], path["pathType"]) == ("/api", "Prefix")
    served(bed, "made")
    assert json.loads(curl(bed, "/api/x", host="made.example.test")[2])["backend"] == "a"
    classes = kubectl(bed, "get", "ingressclass").stdout.split("\n")
    assert classes[0].split() == ["NAME", "CONTROLLER", "PARAMETERS", "AGE"]
    assert classes[1].split()[:3] == ["portal", "portal.dev/ingress", "<none>"]
    deprecated = kubectl(bed, "create", "-f", "-", check=False, stdin=json.dumps(
        {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
         "metadata": {"name": "old-style", "namespace": "default", "annotations": {"kubernetes.io/ingress.class": "portal"}},
         "spec": {"defaultBackend": {"service": {"name": "a", "port": {"number": 80}}}}}))
    assert "annotation \"kubernetes.io/ingress.class\" is deprecated" in deprecated.stderr, deprecated.stderr


def test_kubectl_describe_shows_rules_tls_and_address(bed):
    kubectl(bed, "create", "ingress", "described", "--rule=d.example.test/*=a:80",
            "--rule=e.example.test/api*=b:80,tls=described-tls")
    served(bed, "described")
    out = kubectl(bed, "describe", "ingress", "described").stdout
    assert re.search(r"^Address:\s+127\.0\.0\.1$", out, re.M), out
    assert re.search(r"^Ingress Class:\s+portal$", out, re.M), out
    assert re.search(r"described-tls terminates e\.example\.test", out), out
    # Rules, each path with its backend Service and port (the selector-less
    # Services here have no Endpoints object, as kubectl then says).
    assert re.search(r"d\.example\.test\s*\n\s+/\s+a:80 ", out), out
    assert re.search(r"e\.example\.test\s*\n\s+/api\s+b:80 ", out), out
