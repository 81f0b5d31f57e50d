"""Topology-aware routing (issue 31): with `trafficDistribution:
PreferClose` the endpoints controller hints every ready endpoint to its
node's zone (`topology.kubernetes.io/zone`), and each node's proxy sends
cluster traffic to the endpoints of its own zone; hints are ignored
unless every ready endpoint has one, a zone without endpoints falls back
to all of them, and without the field nothing is hinted. Two nodes on a LAN the test makes, in zones east and west."""

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
