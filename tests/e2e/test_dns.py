"""Cluster DNS (issue 7, SPEC D2) through Debian's `dig` against the real
binary: `portal server --dns-bind 127.0.0.1:0`, objects created through the
API, answers checked record by record."""

import re
import subprocess
import time
import urllib.request
import ssl

import pytest

from conftest import BINARY, Portal

DOMAIN = "cluster.local"


def dns_addr(log_text):
    log_text = re.sub(r"\x1b\[[0-9;]*m", "", log_text)
    found = re.search(r"DNS serving addr=([\d.]+):(\d+)", log_text)
    return (found.group(1), int(found.group(2))) if found else None


def wait_for_dns(read_log, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        addr = dns_addr(read_log())
        if addr:
            return addr
        time.sleep(0.05)
    raise AssertionError("DNS did not start:\n" + read_log())


class Dig:
    def __init__(self, host, port):
        self.host, self.port = host, port

    def __call__(self, name, rtype="A", *options):
        result = subprocess.run(
            ["dig", f"@{self.host}", "-p", str(self.port), name, rtype, "+time=3", "+tries=1", *options],
            capture_output=True, text=True, timeout=20,
        )
        out = result.stdout
        status = re.search(r"status: (\w+)", out)
        flags = re.search(r";; flags: ([\w ]+);", out)
        answers = []
        section = None
        for line in out.splitlines():
            if line.startswith(";; ANSWER SECTION"):
                section = "answer"
            elif line.startswith(";; ADDITIONAL SECTION"):
                section = "additional"
            elif line.startswith(";; AUTHORITY SECTION"):
                section = "authority"
            elif not line.strip():
                section = None
            elif section and not line.startswith(";"):
                answers.append((section, line.split()))
        return {
            "status": status.group(1) if status else None,
            "flags": flags.group(1).split() if flags else [],
            "answer": [fields for s, fields in answers if s == "answer"],
            "additional": [fields for s, fields in answers if s == "additional"],
            "authority": [fields for s, fields in answers if s == "authority"],
            "out": out,
        }


@pytest.fixture
def cluster(data_dir):
    server = Portal(data_dir, ["--dns-bind", "127.0.0.1:0"]).start()
    host, port = wait_for_dns(server.log)
    yield server, Dig(host, port)
    server.stop()


def create_service(core, name, spec, namespace="default"):
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}
    return core.create_namespaced_service(namespace, body)


def create_slice(api_client, service, endpoints, ports, namespace="default", name=None):
    import kubernetes
    discovery = kubernetes.client.DiscoveryV1Api(api_client)
    body = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name or f"{service}-manual", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": ports, "endpoints": endpoints,
    }
    return discovery.create_namespaced_endpoint_slice(namespace, body)


def eventually(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.02)


def test_a_record_of_a_service_case_insensitive_and_authoritative(cluster):
    server, dig = cluster
    svc = create_service(server.core(), "web", {"ports": [{"name": "http", "port": 80}]})
    ip = svc.spec.cluster_ip
    got = eventually(lambda: dig(f"web.default.svc.{DOMAIN}")["answer"])
    assert got == [[f"web.default.svc.{DOMAIN}.", "5", "IN", "A", ip]]
    upper = dig(f"WEB.Default.SVC.{DOMAIN.upper()}")
    assert upper["status"] == "NOERROR" and upper["answer"][0][4] == ip
    # The question's case is kept in the answer (0x20 randomisation).
    assert upper["answer"][0][0] == f"WEB.Default.SVC.{DOMAIN.upper()}."
    assert "aa" in upper["flags"]


def test_srv_for_named_ports_with_additional_a(cluster):
    server, dig = cluster
    svc = create_service(server.core(), "web", {"ports": [{"name": "http", "port": 80}, {"name": "metrics", "port": 9090, "protocol": "UDP"}]})
    name = f"web.default.svc.{DOMAIN}."
    got = eventually(lambda: dig(f"_http._tcp.web.default.svc.{DOMAIN}", "SRV")["answer"])
    assert got == [[f"_http._tcp.{name}", "5", "IN", "SRV", "0", "100", "80", name]]
    full = dig(f"_http._tcp.web.default.svc.{DOMAIN}", "SRV")
    assert full["additional"] == [[name, "5", "IN", "A", svc.spec.cluster_ip]]
    udp = dig(f"_metrics._udp.web.default.svc.{DOMAIN}", "SRV")
    assert udp["answer"][0][4:7] == ["0", "100", "9090"]
    # The port exists over UDP only.
    assert dig(f"_metrics._tcp.web.default.svc.{DOMAIN}", "SRV")["status"] == "NXDOMAIN"


def test_headless_service_answers_each_ready_endpoint(cluster):
    server, dig = cluster
    create_service(server.core(), "db", {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]})
    name = f"db.default.svc.{DOMAIN}"
    # No ready endpoints: the name does not exist.
    assert eventually(lambda: dig(name)["status"] == "NXDOMAIN")
    create_slice(
        server.api_client(), "db",
        [
            {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": True}},
            {"addresses": ["10.244.1.6"], "conditions": {"ready": True}},
            {"addresses": ["10.244.1.7"], "conditions": {"ready": False}},
        ],
        [{"name": "pg", "port": 5432, "protocol": "TCP"}],
    )
    got = eventually(lambda: sorted(a[4] for a in dig(name)["answer"]) == ["10.244.1.5", "10.244.1.6"])
    assert got, dig(name)["out"]
    assert dig(f"db-0.{name}")["answer"][0][4] == "10.244.1.5"
    assert dig(f"10-244-1-6.{name}")["answer"][0][4] == "10.244.1.6"
    srv = dig(f"_pg._tcp.{name}", "SRV")
    assert sorted(a[7] for a in srv["answer"]) == sorted([f"db-0.{name}.", f"10-244-1-6.{name}."])
    assert sorted(a[4] for a in srv["additional"]) == ["10.244.1.5", "10.244.1.6"]
    ptr = dig("-x", "10.244.1.5")
    assert ptr["answer"][0][3:] == ["PTR", f"db-0.{name}."]


def test_nxdomain_nodata_and_empty_non_terminals(cluster):
    server, dig = cluster
    create_service(server.core(), "web", {"ports": [{"port": 80}]})
    assert eventually(lambda: dig(f"web.default.svc.{DOMAIN}")["answer"])
    missing = dig(f"nope.default.svc.{DOMAIN}")
    assert missing["status"] == "NXDOMAIN" and missing["authority"][0][3] == "SOA"
    nodata = dig(f"web.default.svc.{DOMAIN}", "AAAA")
    assert nodata["status"] == "NOERROR" and nodata["answer"] == []
    assert nodata["authority"][0][3] == "SOA"
    for parent in (f"default.svc.{DOMAIN}", f"svc.{DOMAIN}"):
        empty = dig(parent)
        assert empty["status"] == "NOERROR" and empty["answer"] == [], empty["out"]


def test_ptr_of_a_cluster_ip(cluster):
    server, dig = cluster
    svc = create_service(server.core(), "web", {"ports": [{"port": 80}]})
    got = eventually(lambda: dig("-x", svc.spec.cluster_ip)["answer"])
    assert got[0][3:] == ["PTR", f"web.default.svc.{DOMAIN}."]


def test_external_name_is_a_cname(cluster):
    server, dig = cluster
    create_service(server.core(), "ext", {"type": "ExternalName", "externalName": "db.example.com"})
    got = eventually(lambda: dig(f"ext.default.svc.{DOMAIN}")["answer"])
    assert got[0][3:] == ["CNAME", "db.example.com."]


def test_external_name_into_the_cluster_is_followed(cluster):
    server, dig = cluster
    svc = create_service(server.core(), "web", {"ports": [{"port": 80}]})
    create_service(server.core(), "alias", {"type": "ExternalName", "externalName": f"web.default.svc.{DOMAIN}"})
    got = eventually(lambda: len(dig(f"alias.default.svc.{DOMAIN}")["answer"]) == 2)
    answer = dig(f"alias.default.svc.{DOMAIN}")["answer"]
    assert got, answer
    assert answer[0][3:] == ["CNAME", f"web.default.svc.{DOMAIN}."]
    assert answer[1] == [f"web.default.svc.{DOMAIN}.", "5", "IN", "A", svc.spec.cluster_ip]


def test_outside_names_are_refused_without_upstream(cluster):
    _, dig = cluster
    refused = dig("example.com")
    assert refused["status"] == "REFUSED" and refused["answer"] == []
    assert "ra" not in refused["flags"]


def test_dns_version_and_the_kube_dns_service(cluster):
    server, dig = cluster
    txt = dig(f"dns-version.{DOMAIN}", "TXT")
    assert txt["answer"][0][3:] == ["TXT", '"1.1.0"']
    kube_dns = server.core().read_namespaced_service("kube-dns", "kube-system")
    assert kube_dns.spec.cluster_ip == "10.96.0.10"
    assert {(p.port, p.protocol) for p in kube_dns.spec.ports} == {(53, "UDP"), (53, "TCP")}
    # The DNS answers for its own Service.
    got = eventually(lambda: dig(f"kube-dns.kube-system.svc.{DOMAIN}")["answer"])
    assert got[0][4] == "10.96.0.10"


def test_large_headless_answer_is_truncated_over_udp_then_complete_over_tcp(cluster):
    server, dig = cluster
    create_service(server.core(), "big", {"clusterIP": "None", "ports": [{"port": 80}]})
    endpoints = [{"addresses": [f"10.244.2.{i}"], "conditions": {"ready": True}} for i in range(1, 101)]
    create_slice(server.api_client(), "big", endpoints, [{"port": 80, "protocol": "TCP"}])
    name = f"big.default.svc.{DOMAIN}"
    assert eventually(lambda: len(dig(name, "A", "+tcp")["answer"]) == 100)
    udp = dig(name, "A", "+ignore", "+noedns")
    assert "tc" in udp["flags"] and udp["answer"] == []
    assert len(udp["out"]) > 0
    # Without +ignore dig retries over TCP on its own, as resolvers do.
    assert len(dig(name)["answer"]) == 100


def test_new_service_answerable_at_once_and_gone_after_delete(cluster):
    server, dig = cluster
    name = f"fresh.default.svc.{DOMAIN}"
    assert dig(name)["status"] == "NXDOMAIN"
    svc = create_service(server.core(), "fresh", {"ports": [{"port": 80}]})
    start = time.monotonic()
    assert eventually(lambda: dig(name)["answer"], timeout=2), "not answerable within 2 s"
    assert dig(name)["answer"][0][4] == svc.spec.cluster_ip
    server.core().delete_namespaced_service("fresh", "default")
    assert eventually(lambda: dig(name)["status"] == "NXDOMAIN", timeout=2)
    assert time.monotonic() - start < 4


def test_queries_are_counted_in_metrics(cluster):
    server, dig = cluster
    dig("example.com")
    dig(f"nope.default.svc.{DOMAIN}")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(server.server + "/metrics", headers={"Authorization": f"Bearer {server.token}"})
    scrape = lambda: urllib.request.urlopen(request, context=context, timeout=10).read().decode()
    # A query is counted once its answer is sent.
    counted = lambda text: (re.search(r'portal_dns_queries_total\{type="A",rcode="REFUSED"\} [1-9]', text)
                            and re.search(r'portal_dns_queries_total\{type="A",rcode="NXDOMAIN"\} [1-9]', text))
    assert eventually(lambda: counted(scrape()), timeout=5)
    text = scrape()
    assert "dns_programming_duration_seconds" in text


def test_standalone_dns_forwards_to_an_upstream(cluster, tmp_path):
    """`portal dns --upstream`: a second server, for another domain, answers
    what the first is not authoritative for. It runs as `system:portal-dns`
    with a kubeconfig from `portal kubeconfig`: its role is all it needs."""
    server, dig = cluster
    svc = create_service(server.core(), "web", {"ports": [{"port": 80}]})
    own_identity = tmp_path / "dns.kubeconfig"
    own_identity.write_text(subprocess.run(
        [BINARY, "kubeconfig", "--data-dir", str(server.data_dir), "--user", "system:portal-dns"],
        check=True, capture_output=True, text=True, timeout=30).stdout)
    as_dns = ["kubectl", "--kubeconfig", str(own_identity)]
    whoami = subprocess.run([*as_dns, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
                            capture_output=True, text=True, timeout=30)
    assert whoami.stdout == "system:portal-dns", whoami.stderr
    secrets = subprocess.run([*as_dns, "get", "secrets", "-A"], capture_output=True, text=True, timeout=30)
    assert secrets.returncode != 0 and "forbidden" in secrets.stderr, secrets.stderr
    log = tmp_path / "dns.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [BINARY, "dns", "--kubeconfig", str(own_identity), "--bind", "127.0.0.1:0",
             "--cluster-domain", "edge.test", "--upstream", f"{dig.host}:{dig.port}", "--dns-threads", "1"],
            stdout=out, stderr=out,
        )
    try:
        host, port = wait_for_dns(lambda: log.read_text(errors="replace"))
        edge = Dig(host, port)
        own = eventually(lambda: edge("web.default.svc.edge.test")["answer"])
        assert own[0][4] == svc.spec.cluster_ip
        forwarded = edge(f"web.default.svc.{DOMAIN}")
        assert forwarded["answer"][0][4] == svc.spec.cluster_ip, forwarded["out"]
        # With an upstream the server offers recursion.
        assert "ra" in edge("web.default.svc.edge.test")["flags"]
        assert edge(f"web.default.svc.{DOMAIN}", "A", "+tcp")["answer"][0][4] == svc.spec.cluster_ip
        # An ExternalName to a name only the upstream knows is followed
        # through it: the stub resolver gets the CNAME and the address.
        create_service(server.core(), "outside", {"type": "ExternalName", "externalName": f"web.default.svc.{DOMAIN}"})
        chased = eventually(lambda: len(edge("outside.default.svc.edge.test")["answer"]) == 2)
        answer = edge("outside.default.svc.edge.test")["answer"]
        assert chased, answer
        assert answer[0][3:] == ["CNAME", f"web.default.svc.{DOMAIN}."]
        assert answer[1][3:] == ["A", svc.spec.cluster_ip]
        assert edge("outside.default.svc.edge.test", "A", "+tcp")["answer"][1][4] == svc.spec.cluster_ip
        # The upstream refuses what nobody serves; that answer is relayed.
        assert edge("example.com")["status"] == "REFUSED"
    finally:
        process.terminate()
        process.wait(timeout=10)
