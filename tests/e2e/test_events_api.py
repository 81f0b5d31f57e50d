"""events.k8s.io/v1 (issue 30): the same Events as core/v1, seen with the
newer names — written through one group, read, watched and selected
through the other, checked as upstream checks events.k8s.io Events."""

import json
import subprocess

import kubernetes
import pytest
from kubernetes import watch

from conftest import Portal

EVENT = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "synced"},
         "eventTime": "2026-11-27T00:00:00.000000Z", "reportingController": "example.com/ctl",
         "reportingInstance": "ctl-1", "action": "Sync", "reason": "Synced", "type": "Normal",
         "note": "all good", "regarding": {"kind": "Pod", "name": "web", "namespace": "default"}}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    portal = Portal(tmp_path_factory.mktemp("events-api")).start()
    yield portal
    portal.stop()


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], capture_output=True, text=True,
                            timeout=60, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def test_one_event_both_groups(api):
    kubectl(api, "apply", "-f", "-", stdin=json.dumps(EVENT))
    core = json.loads(kubectl(api, "get", "events", "synced", "-o", "json").stdout)
    assert core["apiVersion"] == "v1"
    assert core["message"] == "all good" and core["involvedObject"]["name"] == "web"
    assert core["reportingComponent"] == "example.com/ctl"
    assert "note" not in core and "regarding" not in core
    newer = json.loads(kubectl(api, "get", "events.events.k8s.io", "synced", "-o", "json").stdout)
    assert newer["apiVersion"] == "events.k8s.io/v1" and newer["note"] == "all good"
    assert newer["metadata"]["resourceVersion"] == core["metadata"]["resourceVersion"], "one object"
    # A core Event, written the old way, is an events.k8s.io Event too.
    client = kubernetes.config.new_client_from_config(config_file=api.kubeconfig)
    core_api, events_api = kubernetes.client.CoreV1Api(client), kubernetes.client.EventsV1Api(client)
    listed = events_api.list_namespaced_event("default")
    stream = watch.Watch().stream(events_api.list_namespaced_event, "default",
                                  resource_version=listed.metadata.resource_version, timeout_seconds=20)
    # (With an eventTime: the Python client refuses events.k8s.io Events
    # without one, which kube-apiserver serves as `null` too.)
    core_api.create_namespaced_event("default", {
        "metadata": {"name": "old-style"}, "involvedObject": {"kind": "Pod", "name": "db", "namespace": "default"},
        "eventTime": "2026-11-27T00:00:01.000000Z", "action": "Start", "reportingComponent": "kubelet",
        "reportingInstance": "node-1",
        "reason": "Started", "message": "started the db", "type": "Normal", "count": 2,
        "source": {"component": "kubelet"}})
    for event in stream:
        if event["object"].metadata.name == "old-style":
            seen = event["object"]
            break
    assert event["type"] == "ADDED"
    assert seen.note == "started the db" and seen.regarding.name == "db"
    assert seen.deprecated_count == 2 and seen.deprecated_source.component == "kubelet"
    # Field selectors by the newer names.
    names = kubectl(api, "get", "events.events.k8s.io", "--field-selector", "regarding.name=web",
                    "-o", "name").stdout.split()
    assert names == ["event.events.k8s.io/synced"]
    # Patches through either group change the one object.
    kubectl(api, "patch", "events.events.k8s.io", "synced", "-p", '{"note":"changed"}')
    assert kubectl(api, "get", "events", "synced", "-o", "jsonpath={.message}").stdout == "changed"


def test_newer_events_are_checked_as_upstream(api):
    bad = dict(EVENT, metadata={"name": "bad"}, type="Odd", action="")
    refused = kubectl(api, "apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert "action: Required value" in refused.stderr
    assert 'type: Unsupported value: "Odd": supported values: "Normal", "Warning"' in refused.stderr
    no_time = {k: v for k, v in EVENT.items() if k != "eventTime"}
    no_time["metadata"] = {"name": "untimed"}
    refused = kubectl(api, "apply", "-f", "-", stdin=json.dumps(no_time), check=False)
    assert "eventTime: Required value" in refused.stderr
