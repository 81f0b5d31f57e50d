"""Service IP ranges and addresses as objects (issue 31): the ServiceCIDR
`kubernetes` made from `--service-cluster-ip-range` and one IPAddress per
cluster IP (`networking.k8s.io/v1`, as Kubernetes 1.33), written with the
Service and gone with it; a full range extended at run time by a new
ServiceCIDR, which cannot go while Services hold its addresses; an address
a user holds is not handed out; and Kubernetes' validation."""

import json
import subprocess

import kubernetes
import pytest

from conftest import Portal
from support.waiting import wait_for

# .1 is the `kubernetes` Service's; .2 to .6 are handed out.
SMALL = "10.96.0.0/29"
STILL_IN_USE = ("There are still IPAddresses referencing the ServiceCIDR, "
                "please remove them or create a new ServiceCIDR")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    portal = Portal(tmp_path_factory.mktemp("service-cidrs"), ["--service-cluster-ip-range", SMALL]).start()
    yield portal
    portal.stop()


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", str(portal.kubeconfig), *args],
                            input=stdin, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def create(portal, body, check=True):
    return kubectl(portal, "create", "-f", "-", stdin=json.dumps(body), check=check)


def service(name, **spec):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": {"ports": [{"port": 80}], **spec}}


def service_cidr(name, cidrs):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": name},
            "spec": {"cidrs": cidrs}}


def get(portal, *what):
    result = kubectl(portal, "get", *what, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def ready(portal, name):
    """The ServiceCIDR's Ready condition once it is True, else None."""
    found = get(portal, "servicecidr", name) or {}
    conditions = found.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "Ready" and c["status"] == "True"), None)


def test_the_default_range_and_every_cluster_ip_are_objects(small):
    condition = wait_for(lambda: ready(small, "kubernetes"), "the default ServiceCIDR to be Ready")
    assert condition["message"] == "Kubernetes default Service CIDR is ready"
    default = get(small, "servicecidr", "kubernetes")
    assert default["spec"]["cidrs"] == [SMALL]
    assert default["metadata"]["finalizers"] == ["networking.k8s.io/service-cidr-finalizer"]
    table = kubectl(small, "get", "servicecidrs").stdout.split("\n")
    assert table[0].split() == ["NAME", "CIDRS", "AGE"] and table[1].split()[:2] == ["kubernetes", SMALL]
    table = kubectl(small, "get", "ip").stdout.split("\n")
    assert table[0].split() == ["NAME", "PARENTREF"]
    assert ["10.96.0.1", "services/default/kubernetes"] in [row.split() for row in table]

    # Written with the Service, gone with it: a watch sees both.
    networking = kubernetes.client.NetworkingV1Api(small.api_client())
    listed = networking.list_ip_address()
    create(small, service("watched"))
    ip = get(small, "service", "watched")["spec"]["clusterIP"]
    kubectl(small, "delete", "service", "watched")
    seen = []
    for event in kubernetes.watch.Watch().stream(networking.list_ip_address, resource_version=listed.metadata.resource_version,
                                                 timeout_seconds=20):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "ADDED":
            address = event["object"]
            assert address.spec.parent_ref.to_dict() == {"group": "", "resource": "services", "namespace": "default", "name": "watched"}
            assert address.metadata.labels == {"ipaddress.kubernetes.io/ip-family": "IPv4",
                                               "ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io"}
        if event["type"] == "DELETED":
            break
    assert seen == [("ADDED", ip), ("DELETED", ip)]


def test_a_service_cidr_extends_a_full_range_and_stays_while_used(small):
    made = []
    for i in range(8):
        result = create(small, service(f"fill-{i}"), check=False)
        if result.returncode != 0:
            assert "failed to allocate a serviceIP: range is full (10.96.0.0/29)" in result.stderr, result.stderr
            break
        made.append(f"fill-{i}")
    assert len(made) == 5, made

    create(small, service_cidr("more", ["10.100.0.0/28"]))
    condition = wait_for(lambda: ready(small, "more"), "the new ServiceCIDR to be Ready")
    assert condition["message"] == "Kubernetes Service CIDR is ready"
    create(small, service("spill"))
    assert get(small, "service", "spill")["spec"]["clusterIP"].startswith("10.100.0.")
    create(small, service("asked", clusterIP="10.100.0.14"))
    assert get(small, "ipaddress", "10.100.0.14")["spec"]["parentRef"]["name"] == "asked"
    broadcast = create(small, service("broadcast", clusterIP="10.100.0.15"), check=False)
    assert ("the provided IP (10.100.0.15) is not in the valid range. The range of valid IPs is 10.100.0.0/28"
            in broadcast.stderr), broadcast.stderr

    # Deleted while Services hold its addresses: it stays, and gives no more.
    kubectl(small, "delete", "servicecidr", "more", "--wait=false")

    def terminating():
        found = get(small, "servicecidr", "more") or {}
        conditions = found.get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Ready" and c["status"] == "False"), None)

    condition = wait_for(terminating, "the deleted ServiceCIDR to say it is still in use")
    assert (condition["reason"], condition["message"]) == ("Terminating", STILL_IN_USE)
    refused = create(small, service("late"), check=False)
    assert "range is full" in refused.stderr, refused.stderr
    # Its addresses freed, it goes (after a grace period of 10 s).
    kubectl(small, "delete", "service", "spill", "asked", *made)
    wait_for(lambda: get(small, "servicecidr", "more") is None, "the ServiceCIDR to go", timeout=60)


def test_invalid_ranges_and_addresses_are_refused(small):
    cases = [
        (service_cidr("two-v4", ["10.100.0.0/24", "10.101.0.0/24"]),
         'spec.cidrs: Invalid value: []string{"10.100.0.0/24", "10.101.0.0/24"}: may specify no more than one IP for each IP family'),
        (service_cidr("host-bits", ["10.100.0.1/24"]),
         'spec.cidrs[0]: Invalid value: "10.100.0.1/24": must not have bits set beyond the prefix length'),
        (service_cidr("none", []), "spec.cidrs: Required value: at least one CIDR required"),
        ({"apiVersion": "networking.k8s.io/v1", "kind": "IPAddress", "metadata": {"name": "2001:db8:0::1"},
          "spec": {"parentRef": {"resource": "services", "name": "x"}}},
         'metadata.name: Invalid value: "2001:db8:0::1": must be in canonical form ("2001:db8::1")'),
        ({"apiVersion": "networking.k8s.io/v1", "kind": "IPAddress", "metadata": {"name": "10.96.0.9"}, "spec": {}},
         "spec.parentRef: Required value"),
    ]
    for body, message in cases:
        result = create(small, body, check=False)
        assert result.returncode != 0 and message in result.stderr, (message, result.stderr)
    # The first range never changes; a single-stack range may gain the other family.
    create(small, service_cidr("grows", ["10.120.0.0/24"]))
    moved = kubectl(small, "patch", "servicecidr", "grows", "--type=merge", "-p",
                    '{"spec":{"cidrs":["10.121.0.0/24"]}}', check=False)
    assert 'spec.cidrs[0]: Invalid value: "10.121.0.0/24": field is immutable' in moved.stderr, moved.stderr
    kubectl(small, "patch", "servicecidr", "grows", "--type=merge", "-p",
            '{"spec":{"cidrs":["10.120.0.0/24","fd00:120::/112"]}}')
    kubectl(small, "delete", "servicecidr", "grows")


def test_a_users_address_is_kept_and_a_deleted_record_comes_back(tmp_path):
    portal = Portal(tmp_path).start()
    try:
        held = {"apiVersion": "networking.k8s.io/v1", "kind": "IPAddress", "metadata": {"name": "10.96.0.200"},
                "spec": {"parentRef": {"group": "gateway.networking.k8s.io", "resource": "gateways",
                                       "namespace": "default", "name": "edge"}}}
        create(portal, held)
        refused = create(portal, service("wants", clusterIP="10.96.0.200"), check=False)
        assert "failed to allocate IP 10.96.0.200: provided IP is already allocated" in refused.stderr, refused.stderr
        create(portal, service("web"))
        ip = get(portal, "service", "web")["spec"]["clusterIP"]
        kubectl(portal, "delete", "ipaddress", ip)
        assert get(portal, "ipaddress", ip) is None
        # The repair pass (at start, then every minute) restores the
        # Service's record and leaves the user's alone.
        portal.stop()
        portal.start()
        restored = get(portal, "ipaddress", ip)
        assert restored["spec"]["parentRef"] == {"group": "", "resource": "services", "namespace": "default", "name": "web"}
        assert get(portal, "ipaddress", "10.96.0.200")["spec"]["parentRef"]["resource"] == "gateways"
    finally:
        portal.stop()


def test_the_default_range_becomes_dual_stack_with_the_flags(tmp_path):
    portal = Portal(tmp_path, ["--service-cluster-ip-range", "10.96.0.0/24"]).start()
    try:
        wait_for(lambda: ready(portal, "kubernetes"), "the default ServiceCIDR to be Ready")
        portal.stop()
        # Restarted with a second range of the other family: the default
        # ServiceCIDR gains it, its first range unchanged.
        portal.extra_args = [a if a != "10.96.0.0/24" else "10.96.0.0/24,fd00:10:96::/112" for a in portal.extra_args]
        portal.start()
        wait_for(lambda: (get(portal, "servicecidr", "kubernetes") or {}).get("spec", {}).get("cidrs")
                 == ["10.96.0.0/24", "fd00:10:96::/112"], "the default ServiceCIDR to be dual-stack")
        create(portal, service("both", ipFamilyPolicy="RequireDualStack"))
        ips = get(portal, "service", "both")["spec"]["clusterIPs"]
        assert ips[0].startswith("10.96.0.") and ips[1].startswith("fd00:10:96::")
        assert get(portal, "ipaddress", ips[1])["metadata"]["labels"]["ipaddress.kubernetes.io/ip-family"] == "IPv6"
    finally:
        portal.stop()
