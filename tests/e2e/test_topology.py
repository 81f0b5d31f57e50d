"""Topology-aware routing (issue 31): with `trafficDistribution:
PreferClose` the endpoints controller hints every ready endpoint to its
node's zone (`topology.kubernetes.io/zone`), and each node's proxy sends
cluster traffic to the endpoints of its own zone; hints are ignored
unless every ready endpoint has one, a zone without endpoints falls back
to all of them, and without the field nothing is hinted; `topology-mode:
Auto` shares endpoints among zones by CPU. Two nodes on a LAN the test
makes, in zones east and west."""

import json
import subprocess

import pytest

from support.cluster_bed import NAMES, Bed, placed_pod
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

ZONE = "topology.kubernetes.io/zone"
# Bounded: enough requests that a proxy spreading over both backends
# would show it with probability 1 - 2^-16.
TRIES = 16


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("topology")
    with Bed(tmp, count=2) as bed:
        bed.kubectl("label", "node", NAMES[1], f"{ZONE}=east")
        bed.kubectl("label", "node", NAMES[2], f"{ZONE}=west")
        items = [placed_pod(f"server-{i}", bed.image, NAMES[i], {"app": "server"}, ["/bin/serve"]) for i in (1, 2)]
        items.append(placed_pod("client", bed.image, NAMES[1], {"app": "client"}, ["sleep", "3600"]))
        items.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
                      "spec": {"trafficDistribution": "PreferClose", "selector": {"app": "server"},
                               "ports": [{"port": 80, "targetPort": 8080}]}})
        bed.create(items)
        for name in ("server-1", "server-2", "client"):
            wait_for(lambda name=name: bed.pod_ready(name), f"{name} ready", timeout=120)
        yield bed


def hints(bed):
    """(pod, zone, hinted zones) of the Service's endpoints, by pod name
    (which node got which pod range, and so which address, varies)."""
    slices = json.loads(bed.kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "json").stdout)
    return sorted((e["targetRef"]["name"], e.get("zone"), [z["name"] for z in (e.get("hints") or {}).get("forZones", [])])
                  for s in slices["items"] for e in s["endpoints"])


def backends(bed, ip):
    seen = set()
    for _ in range(TRIES):
        result = bed.kubectl("exec", "client", "--", "timeout", "5", "wget", "-qO-", f"http://{ip}/name.txt", check=False)
        seen.add(result.stdout.strip() if result.returncode == 0 else None)
    return seen


def test_prefer_close_keeps_traffic_in_the_clients_zone(bed):
    ip = bed.core.read_namespaced_service("web", "default").spec.cluster_ip
    wait_for(lambda: [h[1:] for h in hints(bed)] == [("east", ["east"]), ("west", ["west"])] or None,
             "endpoints hinted to their zones", timeout=30)
    # node-1 is in east: only server-1 (once its proxy has the hints).
    wait_for(lambda: backends(bed, ip) == {"server-1"} or None, "traffic kept in east", timeout=30)


def test_hints_are_ignored_unless_complete_and_a_zone_without_endpoints_uses_them_all(bed):
    ip = bed.core.read_namespaced_service("web", "default").spec.cluster_ip
    # node-2 loses its zone: server-2 has no hint, so no hint counts.
    bed.kubectl("label", "node", NAMES[2], f"{ZONE}-")
    wait_for(lambda: backends(bed, ip) == {"server-1", "server-2"} or None, "hints ignored", timeout=30)
    assert [h[1:] for h in hints(bed)] == [("east", ["east"]), (None, [])]
    bed.kubectl("label", "node", NAMES[2], f"{ZONE}=west")
    wait_for(lambda: backends(bed, ip) == {"server-1"} or None, "traffic kept in east again", timeout=30)
    # No endpoint left in east: the client's node uses the others.
    bed.kubectl("delete", "pod", "server-1", "--wait=false")
    wait_for(lambda: backends(bed, ip) == {"server-2"} or None, "west's endpoint used from east", timeout=30)
    # Without trafficDistribution: zones stay, hints go.
    bed.kubectl("patch", "service", "web", "--type=json", "-p", '[{"op":"remove","path":"/spec/trafficDistribution"}]')
    wait_for(lambda: hints(bed) and all(h[2] == [] for h in hints(bed)) or None, "hints removed", timeout=30)
    # (server-1, deleted above, leaves the slice once it is gone.)
    wait_for(lambda: [h[1] for h in hints(bed)] == ["west"] or None, "only west's endpoint left", timeout=30)


def auto_hints(bed):
    """(pod's zone, hinted zone) of the `auto` Service's endpoints, sorted."""
    slices = json.loads(bed.kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=auto", "-o", "json").stdout)
    return sorted((e.get("zone"), ",".join(z["name"] for z in (e.get("hints") or {}).get("forZones", [])))
                  for s in slices["items"] for e in s["endpoints"] if e["conditions"].get("ready"))


def auto_events(bed, reason):
    return bed.kubectl("get", "events", "--field-selector", f"involvedObject.name=auto,reason={reason}",
                       "-o", "jsonpath={.items[*].message}").stdout


def test_topology_mode_auto_shares_endpoints_by_zone_cpu(bed):
    """`service.kubernetes.io/topology-mode: Auto`: the zones (one node each,
    the same CPU) get equal shares of the ready endpoints; a zone holding
    more gives some to the other, too few to share safely means no hints
    (and a warning), and removing the annotation removes them."""
    pods = [placed_pod(f"auto-{i}", bed.image, NAMES[node], {"app": "auto"}, ["/bin/serve"]) for i, node in ((1, 1), (2, 2))]
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "auto", "namespace": "default",
                            "annotations": {"service.kubernetes.io/topology-mode": "Auto"}},
               "spec": {"selector": {"app": "auto"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    bed.create([*pods, service])
    try:
        # One each: each to its own zone.
        wait_for(lambda: auto_hints(bed) == [("east", "east"), ("west", "west")] or None, "hints to own zones", timeout=60)
        wait_for(lambda: "Topology Aware Hints has been enabled, addressType: IPv4" in auto_events(bed, "TopologyAwareHintsEnabled"),
                 "the enabled event", timeout=30)
        ip = bed.core.read_namespaced_service("auto", "default").spec.cluster_ip
        wait_for(lambda: backends(bed, ip) == {"auto-1"} or None, "east's client kept in east", timeout=30)
        # Three (two in east): each zone's minimum is 2, more than there is.
        bed.create([placed_pod("auto-3", bed.image, NAMES[1], {"app": "auto"}, ["/bin/serve"])])
        wait_for(lambda: auto_hints(bed) == [("east", ""), ("east", ""), ("west", "")] or None, "hints withheld", timeout=60)
        assert "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold (3 endpoints, 2 zones), addressType: IPv4" \
            in wait_for(lambda: auto_events(bed, "TopologyAwareHintsDisabled"), "the warning", timeout=30)
        # Four (three in east): one of east's serves west.
        bed.create([placed_pod("auto-4", bed.image, NAMES[1], {"app": "auto"}, ["/bin/serve"])])
        wait_for(lambda: auto_hints(bed) == [("east", "east"), ("east", "east"), ("east", "west"), ("west", "west")] or None,
                 "one of east's endpoints hinted to west", timeout=60)
        # Without the annotation: no hints.
        bed.kubectl("annotate", "service", "auto", "service.kubernetes.io/topology-mode-")
        wait_for(lambda: (found := auto_hints(bed)) and all(h == "" for _, h in found) or None, "hints removed", timeout=30)
    finally:
        bed.kubectl("delete", "service", "auto", check=False)
        bed.kubectl("delete", "pod", "-l", "app=auto", "--wait=false", check=False)
