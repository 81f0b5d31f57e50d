"""Configuration and scratch space reach running pods (issue 28): ConfigMap
and Secret keys as environment variables (`env` key refs, `envFrom` with a
prefix), mounted as files with their modes, updated in place while the pod
runs (and not through `subPath`), the downward API, an `emptyDir` shared
by two containers, a `medium: Memory` one on tmpfs, a `hostPath`; missing
keys and objects reported as Kubernetes reports them; nothing mounted left
once the pods are gone. Pods run for real in a node namespace the test
makes."""

import base64
import json
import os
import subprocess

import pytest

from support.agent_bed import NS, AgentNode, busybox_image, mounts_under
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with AgentNode(tmp_path_factory.mktemp("volumes")) as node:
        node.busybox = busybox_image(node)
        yield node


def sh(node, pod, script, container=None):
    args = ["-n", NS, "exec", pod] + (["-c", container] if container else []) + ["--", "sh", "-c", script]
    return node.kubectl(*args)


def pod_body(name, containers, volumes, **spec):
    return {"metadata": {"name": name, "labels": {"app": name, "tier": "test"}},
            "spec": {"containers": containers, "volumes": volumes, "terminationGracePeriodSeconds": 1, **spec}}


def sleeper(node, name, **fields):
    return {"name": name, "image": node.busybox, "command": ["sh", "-c", "exec sleep 100000"], **fields}


def test_config_maps_and_secrets_as_variables_and_live_files(node, tmp_path):
    core = node.core
    core.create_namespaced_config_map(NS, {"metadata": {"name": "app"}, "data": {"mode": "fast", "app.conf": "level=1\n"}})
    core.create_namespaced_secret(NS, {"metadata": {"name": "creds"}, "stringData": {"user": "admin", "password": "s3cret"}})
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "greeting").write_text("from the node\n")
    app = sleeper(node, "app",
                  env=[{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                       {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}},
                       {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                  envFrom=[{"configMapRef": {"name": "app"}, "prefix": "CFG_"}],
                  volumeMounts=[{"name": "conf", "mountPath": "/etc/app"},
                                {"name": "conf", "mountPath": "/etc/pinned.conf", "subPath": "app.conf"},
                                {"name": "creds", "mountPath": "/var/run/creds"},
                                {"name": "strict", "mountPath": "/var/run/strict"},
                                {"name": "info", "mountPath": "/etc/podinfo"},
                                {"name": "shared", "mountPath": "/shared"},
                                {"name": "fast", "mountPath": "/fast"},
                                {"name": "host", "mountPath": "/host", "readOnly": True}])
    writer = {"name": "writer", "image": node.busybox,
              "command": ["sh", "-c", "echo hello from writer > /out/note; exec sleep 100000"],
              "volumeMounts": [{"name": "shared", "mountPath": "/out"}]}
    volumes = [{"name": "conf", "configMap": {"name": "app"}},
               {"name": "creds", "secret": {"secretName": "creds"}},
               {"name": "strict", "secret": {"secretName": "creds", "defaultMode": 0o400,
                                             "items": [{"key": "password", "path": "pw"}]}},
               {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
               {"name": "shared", "emptyDir": {}},
               {"name": "fast", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
               {"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}}]
    core.create_namespaced_pod(NS, pod_body("configured", [app, writer], volumes))
    node.wait_running("configured")

    env = sh(node, "configured", "env")
    for line in ["PASSWORD=s3cret", "MODE=fast", "CFG_mode=fast"]:
        assert line in env.splitlines(), env
    assert sh(node, "configured", "cat /etc/app/app.conf /etc/pinned.conf") == "level=1\nlevel=1\n"
    assert sh(node, "configured", "cat /var/run/creds/user") == "admin"
    # Modes as asked: 0644 by default (through the `..data` link), 0400 when given.
    modes = sh(node, "configured", "stat -L -c '%a %n' /var/run/creds/user /var/run/strict/pw")
    assert modes.split("\n")[:2] == ["644 /var/run/creds/user", "400 /var/run/strict/pw"], modes
    assert sh(node, "configured", "cat /etc/podinfo/labels") == 'app="configured"\ntier="test"'
    wait_for(lambda: sh(node, "configured", "cat /shared/note 2>/dev/null || true") == "hello from writer\n",
             "the writer's file in the shared emptyDir")
    mounts = sh(node, "configured", "cat /proc/mounts")
    assert any(line.split()[1] == "/fast" and line.split()[2] == "tmpfs" for line in mounts.splitlines()), mounts
    assert any(line.split()[1] == "/var/run/creds" and line.split()[2] == "tmpfs" for line in mounts.splitlines()), mounts
    assert sh(node, "configured", "cat /host/greeting") == "from the node\n"
    refused = subprocess.run(["kubectl", "--kubeconfig", node.portal.kubeconfig, "-n", NS, "exec", "configured", "--",
                              "sh", "-c", "echo x > /etc/app/new"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused.stderr

    # An update reaches the running pod through the volume (not subPath,
    # not the environment), as in Kubernetes.
    core.patch_namespaced_config_map("app", NS, {"data": {"app.conf": "level=2\n"}})
    wait_for(lambda: sh(node, "configured", "cat /etc/app/app.conf") == "level=2\n",
             "the ConfigMap update in the mounted volume", timeout=60)
    assert sh(node, "configured", "cat /etc/pinned.conf") == "level=1\n"
    assert "MODE=fast" in sh(node, "configured", "env")

    core.delete_namespaced_pod("configured", NS, grace_period_seconds=0)
    wait_for(lambda: not node.core.list_namespaced_pod(NS, field_selector="metadata.name=configured").items,
             "the pod to be gone")
    wait_for(lambda: not [m for m in mounts_under(node.data_dir / "agent") if "/volumes/" in m],
             "the pod's tmpfs volumes to be unmounted")


def test_missing_keys_and_objects_are_reported(node):
    core = node.core
    core.create_namespaced_secret(NS, {"metadata": {"name": "partial"}, "stringData": {"present": "x"}})
    bad_key = sleeper(node, "app", env=[{"name": "K", "valueFrom": {"secretKeyRef": {"name": "partial", "key": "absent"}}}])
    core.create_namespaced_pod(NS, pod_body("bad-key", [bad_key], []))

    def waiting_reason():
        statuses = node.pod("bad-key").status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses and statuses[0].state else None
        return waiting if waiting and waiting.reason == "CreateContainerConfigError" else None
    waiting = wait_for(waiting_reason, "CreateContainerConfigError")
    assert waiting.message == f"couldn't find key absent in Secret {NS}/partial"

    # A volume of a ConfigMap that is not there yet: FailedMount, then the
    # pod starts once it is made.
    needs = sleeper(node, "app", volumeMounts=[{"name": "later", "mountPath": "/later"}])
    core.create_namespaced_pod(NS, pod_body("waits", [needs], [{"name": "later", "configMap": {"name": "later"}}]))
    event = wait_for(lambda: [e for e in node.events("waits") if e[1] == "FailedMount"], "a FailedMount event")
    assert event[0][2] == 'MountVolume.SetUp failed for volume "later" : configmap "later" not found', event
    core.create_namespaced_config_map(NS, {"metadata": {"name": "later"}, "data": {"k": "v"}})
    node.wait_running("waits")
    assert sh(node, "waits", "cat /later/k") == "v"
    for name in ["bad-key", "waits"]:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_an_empty_dir_past_its_size_limit_evicts_the_pod(node):
    core = node.core
    hog = sleeper(node, "app", command=["sh", "-c", "dd if=/dev/zero of=/scratch/fill bs=1M count=4; exec sleep 100000"],
                  volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}])
    core.create_namespaced_pod(NS, pod_body("hog", [hog], [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]))
    pod = wait_for(lambda: (p := node.pod("hog")).status.phase == "Failed" and p, "the pod to be evicted", timeout=60)
    assert pod.status.reason == "Evicted"
    assert pod.status.message == 'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". '
    assert any(e[1] == "Evicted" for e in node.events("hog"))
    core.delete_namespaced_pod("hog", NS, grace_period_seconds=0)
