"""Node lifecycle (issue 17, part; issue 19's Ready=Unknown): a node whose
agent goes silent is Unknown and tainted unreachable, its pods leave the
Service at once, are evicted once their toleration runs out and replaced by
their ReplicationController; the agent back makes the node Ready, the taints
go and the old pods are cleaned up. A node that never reported shows
Unknown conditions in `kubectl describe node`. One node namespace; the API
server and the agent are separate processes so the agent can be killed."""

import datetime
import signal
import subprocess
import threading
import time

import kubernetes
import pytest

from conftest import BINARY, Portal
from support import agent_bed, nodes
from support.agent_bed import NS, web_image
from support.waiting import holds_for, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

NODE = "life-1"
GRACE = "4s"
LEASE_SECONDS = "2"  # renewed every 0.5 s: well inside the grace period
TOLERATION = 8


def start_agent(tmp_path, agent_dir, kubeconfig, reg):
    log = open(tmp_path / "agent.log", "ab")
    return subprocess.Popen(
        [BINARY, "agent", "--kubeconfig", str(kubeconfig), "--data-dir", str(agent_dir),
         "--node-name", NODE, "--node-ip", nodes.NODE_IP, "--node-lease-duration-seconds", LEASE_SECONDS,
         "--registry-mirror", f"docker.io=http://{reg.host}"],
        stdout=log, stderr=subprocess.STDOUT,
    )


def ready_condition(core, name):
    try:
        node = core.read_node(name)
    except kubernetes.client.rest.ApiException as error:
        if error.status == 404:
            return None
        raise
    return next((c for c in (node.status.conditions or []) if c.type == "Ready"), None) if node.status else None


def taints(core, name):
    spec = core.read_node(name).spec
    return sorted((t.key, t.effect) for t in ((spec and spec.taints) or []))


def test_a_lost_node_is_unknown_its_pods_leave_are_evicted_and_replaced(tmp_path):
    agent_dir = tmp_path / "agent"
    (tmp_path / "server").mkdir()
    with agent_bed.bare_node(agent_dir, NODE) as bed:
        reg = bed.registry
        portal = agent = None
        try:
            image = web_image(bed)
            portal = Portal(tmp_path / "server", ["--node-monitor-grace-period", GRACE]).start()
            core = portal.core()
            discovery = kubernetes.client.DiscoveryV1Api(core.api_client)
            agent = start_agent(tmp_path, agent_dir, portal.kubeconfig, reg)
            wait_for(lambda: (c := ready_condition(core, NODE)) and c.status == "True", "the node Ready", timeout=60)

            # A Node that never reports: Unknown after the grace period, and
            # kubectl describe says why.
            core.create_node({"metadata": {"name": "ghost"}})
            wait_for(lambda: (c := ready_condition(core, "ghost")) and c.status == "Unknown", "the silent node Unknown", timeout=30)
            described = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, "describe", "node", "ghost"], capture_output=True, text=True, timeout=60).stdout
            assert "Kubelet never posted node status." in described and "NodeStatusNeverUpdated" in described, described
            assert ("node.kubernetes.io/unreachable", "NoExecute") in wait_for(lambda: taints(core, "ghost") or None, "the silent node tainted")
            core.delete_node("ghost")

            template_spec = {
                "containers": [{"name": "web", "image": image, "ports": [{"containerPort": 8080}]}],
                "terminationGracePeriodSeconds": 1,
                "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATION}],
            }
            core.create_namespaced_replication_controller(NS, {
                "metadata": {"name": "web"},
                "spec": {"replicas": 2, "selector": {"app": "web"}, "template": {"metadata": {"labels": {"app": "web"}}, "spec": template_spec}},
            })
            core.create_namespaced_service(NS, {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})

            def ready_endpoints():
                slices = discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=web").items
                return [e for s in slices for e in (s.endpoints or []) if e.conditions.ready]

            wait_for(lambda: len(ready_endpoints()) == 2, "2 ready endpoints", timeout=60)
            first = {p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="app=web").items}
            # Pods got the API server's default toleration for not-ready nodes.
            pod = core.read_namespaced_pod(sorted(first)[0], NS)
            assert any(t.key == "node.kubernetes.io/not-ready" and t.toleration_seconds == 300 for t in pod.spec.tolerations)

            # Lose the node: its agent killed (its containers keep running).
            agent.send_signal(signal.SIGKILL)
            agent.wait()
            lost = time.monotonic()
            condition = wait_for(lambda: (c := ready_condition(core, NODE)) and c.status == "Unknown" and c, "the node Unknown", timeout=30)
            assert condition.reason == "NodeStatusUnknown" and condition.message == "Kubelet stopped posting node status."
            wait_for(lambda: {("node.kubernetes.io/unreachable", "NoExecute"), ("node.kubernetes.io/unreachable", "NoSchedule")} <= set(taints(core, NODE)), "the unreachable taints")
            wait_for(lambda: not ready_endpoints(), "the lost node's pods out of the Service", timeout=15)
            print(f"node lost -> endpoints not ready: {time.monotonic() - lost:.1f}s (grace {GRACE})")
            for name in first:
                ready = next(c for c in core.read_namespaced_pod(name, NS).status.conditions if c.type == "Ready")
                assert ready.status == "False"

            # Every node lost at once: the controller suspects itself cut
            # off and evicts nothing, as Kubernetes does (full disruption),
            # however long the pods' toleration has run out.
            tainted = next(t.time_added for t in core.read_node(NODE).spec.taints
                           if (t.key, t.effect) == ("node.kubernetes.io/unreachable", "NoExecute"))
            run_out = tainted + datetime.timedelta(seconds=TOLERATION)
            wait_for(lambda: datetime.datetime.now(datetime.timezone.utc) > run_out, "the pods' toleration to run out", timeout=TOLERATION + 30)
            # Then a node that is not Ready either (nothing changes the
            # disruption): once the controller has tainted it, it has looked
            # at every node after the toleration ran out.
            core.create_node({"metadata": {"name": "probe"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
            wait_for(lambda: ("node.kubernetes.io/not-ready", "NoExecute") in taints(core, "probe"), "the controller to taint a node made after the toleration ran out")
            holds_for(lambda: not any(core.read_namespaced_pod(n, NS).metadata.deletion_timestamp for n in first), "no eviction while every node is unready", 2)
            assert not any(core.read_namespaced_pod(n, NS).metadata.deletion_timestamp for n in first), "evicted while every node was unready"
            core.delete_node("probe")
            # A second, healthy node (its Lease renewed by the test, tainted so
            # nothing is scheduled there): now the lost node is the exception.
            coordination = kubernetes.client.CoordinationV1Api(core.api_client)
            core.create_node({
                "metadata": {"name": "witness"},
                "spec": {"taints": [{"key": "dedicated", "value": "witness", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            })
            coordination.create_namespaced_lease("kube-node-lease", {"metadata": {"name": "witness"}, "spec": {"holderIdentity": "witness", "leaseDurationSeconds": 2}})
            renewing = threading.Event()

            def renew():
                while not renewing.wait(0.5):
                    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    coordination.patch_namespaced_lease("witness", "kube-node-lease", {"spec": {"renewTime": now}})

            renewer = threading.Thread(target=renew, daemon=True)
            renewer.start()

            # After the toleration: evicted, and the RC makes new ones (which
            # cannot be scheduled while the only node is unreachable).
            wait_for(lambda: all(core.read_namespaced_pod(n, NS).metadata.deletion_timestamp for n in first), "the pods evicted", timeout=TOLERATION + 20)
            reasons = [e.reason for e in core.list_namespaced_event(NS).items if e.involved_object.name in first]
            assert "TaintManagerEviction" in reasons, reasons
            wait_for(lambda: len({p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="app=web").items} - first) == 2, "2 replacements")

            # The agent back: Ready, no taints, the evicted pods stopped and
            # gone, the replacements running.
            agent = start_agent(tmp_path, agent_dir, portal.kubeconfig, reg)
            wait_for(lambda: (c := ready_condition(core, NODE)) and c.status == "True", "the node Ready again", timeout=60)
            wait_for(lambda: not [t for t in taints(core, NODE) if t[0] == "node.kubernetes.io/unreachable"], "the taints gone")
            wait_for(lambda: not first & {p.metadata.name for p in core.list_namespaced_pod(NS).items}, "the evicted pods gone", timeout=60)
            wait_for(lambda: len(ready_endpoints()) == 2, "2 ready endpoints again", timeout=60)

            # kubectl drain: cordoned, the pods evicted through the eviction
            # API and stopped; the RC's new pods wait; uncordon places them.
            before = {p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="app=web").items}
            drained = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, "drain", NODE, "--ignore-daemonsets", "--timeout=90s"],
                                     capture_output=True, text=True, timeout=120)
            assert drained.returncode == 0, drained.stderr
            assert "evicting pod" in drained.stderr + drained.stdout and "drained" in drained.stdout, drained.stdout + drained.stderr
            assert core.read_node(NODE).spec.unschedulable
            remaining = {p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="app=web").items}
            assert not before & remaining, "drain returned before the pods were gone"
            wait_for(lambda: len(remaining := core.list_namespaced_pod(NS, label_selector="app=web").items) == 2 and all(not p.spec.node_name for p in remaining), "2 unscheduled replacements")
            subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, "uncordon", NODE], check=True, capture_output=True, timeout=60)
            wait_for(lambda: len(ready_endpoints()) == 2, "2 ready endpoints after uncordon", timeout=60)
            renewing.set()
            renewer.join()
            core.delete_node("witness")
            core.delete_namespaced_replication_controller("web", NS)
            for p in core.list_namespaced_pod(NS).items:
                core.delete_namespaced_pod(p.metadata.name, NS)
            wait_for(lambda: not core.list_namespaced_pod(NS).items, "the pods to go", timeout=60)
        finally:
            if agent and agent.poll() is None:
                agent.terminate()
                agent.wait(timeout=15)
            if portal:
                portal.stop()
