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


def test_an_ipv6_primary_range_is_refused_until_pods_speak_ipv6(tmp_path):
    # Its kubernetes and kube-dns Services would get addresses no pod reaches.
    result = subprocess.run([BINARY, "server", "--data-dir", str(tmp_path), "--disable", "proxy,agent",
                             "--service-cluster-ip-range", "fd00:10:96::/112,10.96.0.0/24"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "the first (primary) range must be IPv4" in result.stderr, result.stderr
