"""Dual-stack Services (issue 31) through stock kubectl: with an IPv4 and an
IPv6 service CIDR, a RequireDualStack Service gets an address of each
family, a SingleStack one is upgraded by `kubectl patch` without its first
address changing and downgraded again (the IPv6 address is free again),
and the cluster DNS answers A and AAAA (and the IPv6 PTR); a single-stack
cluster refuses what it cannot give, with Kubernetes' messages."""

import json
import subprocess

import pytest

from conftest import BINARY, Portal
from test_dns import Dig, eventually, wait_for_dns

DUAL = "10.96.0.0/24,fd00:10:96::/112"


@pytest.fixture(scope="module")
def dual(tmp_path_factory):
    portal = Portal(tmp_path_factory.mktemp("dual"), ["--service-cluster-ip-range", DUAL, "--dns-bind", "127.0.0.1:0"]).start()
    yield portal
    portal.stop()


def kubectl(portal, *args, check=True):
    result = subprocess.run(["kubectl", "--kubeconfig", str(portal.kubeconfig), *args],
                            capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def create(portal, name, spec, check=True):
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80}], **spec}}
    return subprocess.run(["kubectl", "--kubeconfig", str(portal.kubeconfig), "create", "-f", "-"],
                          input=json.dumps(body), capture_output=True, text=True, timeout=60, check=check)


def spec_of(portal, name):
    return json.loads(kubectl(portal, "get", "service", name, "-o", "json").stdout)["spec"]


def test_require_dual_stack_gets_both_families_and_dns_answers_both(dual):
    create(dual, "both", {"ipFamilyPolicy": "RequireDualStack"})
    spec = spec_of(dual, "both")
    assert spec["ipFamilies"] == ["IPv4", "IPv6"] and spec["ipFamilyPolicy"] == "RequireDualStack"
    v4, v6 = spec["clusterIPs"]
    assert v4.startswith("10.96.0.") and v6.startswith("fd00:10:96::") and spec["clusterIP"] == v4
    dig = Dig(*wait_for_dns(dual.log))
    name = "both.default.svc.cluster.local"
    # The DNS follows a watch: the records come once it has the Service.
    assert eventually(lambda: [a[4] for a in dig(name, "A")["answer"] if a[3] == "A"]) == [v4]
    assert [a[4] for a in dig(name, "AAAA")["answer"] if a[3] == "AAAA"] == [v6]
    reverse = subprocess.run(["dig", "-x", v6, f"@{dig.host}", "-p", str(dig.port), "+short"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    assert reverse == [name + "."], reverse
    # IPv6 first, by asking.
    create(dual, "six", {"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"]})
    spec = spec_of(dual, "six")
    assert spec["ipFamilies"] == ["IPv6", "IPv4"] and ":" in spec["clusterIP"]


def test_upgrade_keeps_the_first_address_and_downgrade_frees_the_second(dual):
    create(dual, "grow", {})
    single = spec_of(dual, "grow")
    assert single["ipFamilies"] == ["IPv4"] and single["ipFamilyPolicy"] == "SingleStack"
    kubectl(dual, "patch", "service", "grow", "-p", '{"spec":{"ipFamilyPolicy":"PreferDualStack"}}')
    grown = spec_of(dual, "grow")
    assert grown["clusterIPs"][0] == single["clusterIP"] and len(grown["clusterIPs"]) == 2
    assert grown["ipFamilies"] == ["IPv4", "IPv6"]
    released = grown["clusterIPs"][1]
    # Releasing the secondary without saying SingleStack is refused.
    refused = kubectl(dual, "patch", "service", "grow", "--type=json", "-p",
                      '[{"op":"remove","path":"/spec/clusterIPs/1"}]', check=False)
    assert "must be 'SingleStack' to release the secondary cluster IP" in refused.stderr, refused.stderr
    kubectl(dual, "patch", "service", "grow", "-p", '{"spec":{"ipFamilyPolicy":"SingleStack"}}')
    shrunk = spec_of(dual, "grow")
    assert shrunk["clusterIPs"] == [single["clusterIP"]] and shrunk["ipFamilies"] == ["IPv4"]
    # The IPv6 address went back to the pool: another Service may take it
    # (IPv6 alone: any IPv4 address asked for might be taken already).
    create(dual, "taker", {"ipFamilies": ["IPv6"], "clusterIPs": [released], "clusterIP": released})
    assert spec_of(dual, "taker")["clusterIPs"] == [released]
    # The first address may never change.
    moved = kubectl(dual, "patch", "service", "grow", "-p", '{"spec":{"clusterIP":"10.96.0.201","clusterIPs":["10.96.0.201"]}}', check=False)
    assert "may not change once set" in moved.stderr, moved.stderr


def test_a_single_stack_cluster_refuses_dual_stack(portal):
    required = create(portal, "req", {"ipFamilyPolicy": "RequireDualStack"}, check=False)
    assert 'spec.ipFamilyPolicy: Invalid value: "RequireDualStack": this cluster is not configured for dual-stack services' in required.stderr, required.stderr
    six = create(portal, "six", {"ipFamilies": ["IPv6"]}, check=False)
    assert 'spec.ipFamilies[0]: Invalid value: "IPv6": not configured on this cluster' in six.stderr, six.stderr
    create(portal, "pref", {"ipFamilyPolicy": "PreferDualStack"})
    spec = spec_of(portal, "pref")
    assert spec["ipFamilies"] == ["IPv4"] and spec["ipFamilyPolicy"] == "PreferDualStack"


def test_an_ipv6_primary_range_needs_an_ipv6_advertised_address(tmp_path):
    # As kube-apiserver: the kubernetes Service's endpoint is the advertised
    # address, so it must be of the primary family (IPv6-first clusters:
    # tests/e2e/test_ipv6_first.py).
    result = subprocess.run([BINARY, "server", "--data-dir", str(tmp_path), "--disable", "proxy,agent",
                             "--node-ip", "192.0.2.1",
                             "--service-cluster-ip-range", "fd00:10:96::/112,10.96.0.0/24"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "the primary range's family must be the advertised address's (192.0.2.1)" in result.stderr, result.stderr


def test_coredns_style_fixture_answers_a_aaaa_srv_and_ptr(dual):
    """CoreDNS's own Kubernetes fixture, in spirit: selector-less Services
    whose Endpoints are written by hand with IPv4 and IPv6 addresses. The
    mirroring controller makes a slice per address type, and the DNS
    answers as the Kubernetes DNS specification says."""
    ns = "testns"
    kubectl(dual, "create", "namespace", ns)
    objects = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hdls1", "namespace": ns},
         "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "hdls1", "namespace": ns},
         "subsets": [{"addresses": [{"ip": "172.0.0.2"}, {"ip": "172.0.0.3", "hostname": "dual"},
                                    {"ip": "5678:abcd::1"}, {"ip": "5678:abcd::2", "hostname": "dual"}],
                      "notReadyAddresses": [{"ip": "172.0.0.9"}, {"ip": "5678:abcd::9"}],
                      "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}]},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc6", "namespace": ns},
         "spec": {"ipFamilies": ["IPv6"], "ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc4", "namespace": ns},
         "spec": {"ports": [{"name": "http", "port": 80}]}},
    ]
    subprocess.run(["kubectl", "--kubeconfig", str(dual.kubeconfig), "create", "-f", "-"],
                   input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
                   capture_output=True, text=True, timeout=60, check=True)
    # A headless Service without a selector is dual-stack where the cluster is.
    headless = json.loads(kubectl(dual, "get", "service", "hdls1", "-n", ns, "-o", "json").stdout)["spec"]
    assert headless["ipFamilies"] == ["IPv4", "IPv6"] and headless["ipFamilyPolicy"] == "RequireDualStack", headless
    svc6 = json.loads(kubectl(dual, "get", "service", "svc6", "-n", ns, "-o", "json").stdout)["spec"]["clusterIP"]

    def mirrors():
        listed = json.loads(kubectl(dual, "get", "endpointslices", "-n", ns, "-l",
                                    "kubernetes.io/service-name=hdls1", "-o", "json").stdout)["items"]
        return {s["addressType"]: sorted(a for e in s["endpoints"] for a in e["addresses"]) for s in listed}

    assert eventually(lambda: len(mirrors()) == 2), mirrors()
    assert mirrors() == {"IPv4": ["172.0.0.2", "172.0.0.3", "172.0.0.9"],
                         "IPv6": ["5678:abcd::1", "5678:abcd::2", "5678:abcd::9"]}

    dig = Dig(*wait_for_dns(dual.log))
    zone = f"{ns}.svc.cluster.local"
    hdls = f"hdls1.{zone}"

    def addresses(name, rtype):
        return sorted(a[4] for a in dig(name, rtype)["answer"] if a[3] == rtype)

    assert eventually(lambda: addresses(hdls, "AAAA") == ["5678:abcd::1", "5678:abcd::2"]), dig(hdls, "AAAA")["out"]
    assert addresses(hdls, "A") == ["172.0.0.2", "172.0.0.3"]
    # An endpoint's name: its hostname, else its address with dashes.
    assert addresses(f"dual.{hdls}", "A") == ["172.0.0.3"]
    assert addresses(f"dual.{hdls}", "AAAA") == ["5678:abcd::2"]
    assert addresses(f"5678-abcd--1.{hdls}", "AAAA") == ["5678:abcd::1"]
    assert dig(f"5678-abcd--9.{hdls}", "AAAA")["status"] == "NXDOMAIN"  # not ready
    # SRV: one target per ready endpoint, each target's addresses alongside.
    srv = dig(f"_http._tcp.{hdls}", "SRV")
    targets = sorted({a[7] for a in srv["answer"]})
    assert targets == sorted(f"{label}.{hdls}." for label in ("172-0-0-2", "5678-abcd--1", "dual")), srv["out"]
    assert all(a[6] == "80" for a in srv["answer"])
    extra = sorted((a[3], a[4]) for a in srv["additional"])
    assert extra == [("A", "172.0.0.2"), ("A", "172.0.0.3"), ("AAAA", "5678:abcd::1"), ("AAAA", "5678:abcd::2")], srv["out"]
    # PTR in ip6.arpa, for an endpoint and for a cluster IP.
    def reverse(address):
        return subprocess.run(["dig", "-x", address, f"@{dig.host}", "-p", str(dig.port), "+short"],
                              capture_output=True, text=True, timeout=20).stdout.split()

    assert reverse("5678:abcd::1") == [f"5678-abcd--1.{hdls}."]
    assert reverse("5678:abcd::2") == [f"dual.{hdls}."]
    assert eventually(lambda: reverse(svc6)) == [f"svc6.{zone}."]
    # Single-stack Services answer their family and NODATA for the other.
    assert addresses(f"svc6.{zone}", "AAAA") == [svc6] and addresses(f"svc6.{zone}", "A") == []
    nodata = dig(f"svc4.{zone}", "AAAA")
    assert nodata["status"] == "NOERROR" and nodata["answer"] == [] and addresses(f"svc4.{zone}", "A")
    # Endpoints rewritten with IPv6 addresses only: the IPv4 mirror goes.
    kubectl(dual, "patch", "endpoints", "hdls1", "-n", ns, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/subsets/0/addresses", "value": [{"ip": "5678:abcd::7"}]},
         {"op": "remove", "path": "/subsets/0/notReadyAddresses"}]))
    assert eventually(lambda: mirrors() == {"IPv6": ["5678:abcd::7"]}), mirrors()
    assert eventually(lambda: addresses(hdls, "AAAA") == ["5678:abcd::7"])
    # (The IPv4 slice is deleted after the IPv6 one is replaced.)
    assert eventually(lambda: addresses(hdls, "A") == [])
