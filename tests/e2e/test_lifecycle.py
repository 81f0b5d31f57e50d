"""Pods live and die like on Kubernetes (issue 13, SPEC W1, E1, P2):
probes, restarts with back-off, graceful deletion with preStop and
SIGTERM, init containers, deadlines; the Service follows (terminating
pods leave the ready endpoints, and serve when nothing else can). Real
binary, real images, test-made network namespaces."""

import json
import subprocess
import threading
import time

import pytest

from support.agent_bed import NS, AgentNode, busybox_image, container_pids, dnat_targets, pod_manifest, running_containers_of, wait_endpoints_programmed, wait_programmed, wait_proxy_caught_up
from support.waiting import holds_for, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with AgentNode(tmp_path_factory.mktemp("lifecycle")) as node:
        node.busybox = busybox_image(node)
        yield node


def http(url, timeout=2):
    result = subprocess.run(["wget", "-qO-", "--tries=1", "-T", str(timeout), url], capture_output=True, text=True, timeout=timeout + 5)
    return result.stdout if result.returncode == 0 else None


# A web server that says who it is, traps SIGTERM (recording it in its
# termination message with what preStop left), and keeps serving meanwhile.
SERVER = (
    "echo $HOSTNAME > /tmp/name; "
    "trap 'echo \"sigterm after $(cat /tmp/prestop 2>/dev/null)\" > /dev/termination-log; kill $server; exit 0' TERM; "
    "httpd -f -p 8080 -h /tmp & server=$!; "
    "while true; do sleep 1; done"
)


def server_pod(node, name, labels, grace=10, pre_stop_sleep=2, **extra):
    body = pod_manifest(name, node.busybox, ["sh", "-c", SERVER], labels=labels, terminationGracePeriodSeconds=grace)
    container = body["spec"]["containers"][0]
    container["ports"] = [{"containerPort": 8080, "name": "http"}]
    container["readinessProbe"] = {"httpGet": {"path": "/name", "port": "http"}, "periodSeconds": 1}
    container["lifecycle"] = {"preStop": {"exec": {"command": ["sh", "-c", f"echo ran > /tmp/prestop; sleep {pre_stop_sleep}"]}}}
    container.update(extra)
    return body


def service(node, name, selector):
    node.core.create_namespaced_service(NS, {"metadata": {"name": name}, "spec": {"selector": selector, "ports": [{"port": 80, "targetPort": 8080}]}})
    return node.core.read_namespaced_service(name, NS).spec.cluster_ip


def ready(node, name):
    status = node.pod(name).status
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def slice_state(node, service_name):
    """{ip: (ready, serving, terminating)} of the Service's EndpointSlices."""
    discovery = __import__("kubernetes").client.DiscoveryV1Api(node.portal.api_client())
    slices = discovery.list_namespaced_endpoint_slice(NS, label_selector=f"kubernetes.io/service-name={service_name}").items
    return {e.addresses[0]: (e.conditions.ready, e.conditions.serving, e.conditions.terminating) for s in slices for e in s.endpoints or []}


def exec_in(node, pod_name, *argv):
    """Runs a command in the pod's (only) container, through its process."""
    pod = node.pod(pod_name)
    ids = [c.container_id.split("//")[1] for c in pod.status.container_statuses if c.container_id]
    pid = container_pids(node.data_dir / "agent")[ids[0]]
    subprocess.run(["nsenter", "-t", str(pid), "-m", "-p", "--", *argv], check=True, timeout=10)


class Load:
    """Requests through a Service from the node until stopped; counts failures."""

    def __init__(self, url):
        self.url, self.failures, self.served, self.done = url, [], [], threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        count = 0
        while not self.done.is_set() and count < 3000:
            answer = http(self.url, timeout=2)
            if answer is None:
                self.failures.append(time.monotonic())
            else:
                self.served.append(answer.strip())
            count += 1
            time.sleep(0.02)

    def stop(self):
        self.done.set()
        self.thread.join()


def test_readiness_gates_traffic(node):
    """Not ready until its probe passes: out of the ready endpoints and sent
    nothing; once the file exists, Ready within a period, then served."""
    core = node.core
    body = pod_manifest("gated", node.busybox, ["sh", "-c", "echo gated > /tmp/name; exec httpd -f -p 8080 -h /tmp"], labels={"app": "gated"})
    body["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1}
    core.create_namespaced_pod(NS, body)
    cluster_ip = service(node, "gated", {"app": "gated"})
    wait_programmed(cluster_ip, with_endpoints=False)
    wait_for(lambda: node.pod("gated").status.phase == "Running", "the pod to run")
    ip = node.pod("gated").status.pod_ip
    wait_for(lambda: slice_state(node, "gated").get(ip) == (False, False, False), "a not-ready endpoint")
    # The probe has run (and failed), and the proxy has seen the not-ready
    # endpoint.
    wait_for(lambda: any(r == "Unhealthy" and "Readiness probe failed" in m for _, r, m in node.events("gated")), "a failed readiness probe")
    wait_proxy_caught_up(core)
    assert not ready(node, "gated") and not node.pod("gated").status.container_statuses[0].ready
    assert http(f"http://{cluster_ip}/name", timeout=1) is None, "a not-ready pod got traffic"
    assert any(r == "Unhealthy" and "Readiness probe failed" in m for _, r, m in node.events("gated"))
    exec_in(node, "gated", "touch", "/tmp/ready")
    wait_for(lambda: ready(node, "gated"), "Ready after the file appeared", timeout=5)
    wait_for(lambda: http(f"http://{cluster_ip}/name", timeout=1) == "gated\n", "traffic to the ready pod")
    core.delete_namespaced_service("gated", NS)
    core.delete_namespaced_pod("gated", NS, grace_period_seconds=0)


def test_liveness_failure_restarts_the_container(node):
    body = pod_manifest("sick", node.busybox, ["sh", "-c", "touch /tmp/alive; sleep 2; rm /tmp/alive; sleep 3600"])
    body["spec"]["containers"][0]["livenessProbe"] = {"exec": {"command": ["cat", "/tmp/alive"]}, "periodSeconds": 1, "failureThreshold": 1}
    node.core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("sick").status.container_statuses and node.pod("sick").status.container_statuses[0].restart_count >= 1, "a restart", timeout=40)
    status = node.pod("sick").status.container_statuses[0]
    assert status.last_state.terminated is not None
    events = node.events("sick")
    assert any(r == "Unhealthy" and "Liveness probe failed" in m for _, r, m in events), events
    assert any(r == "Killing" and "failed liveness probe, will be restarted" in m for _, r, m in events), events
    node.core.delete_namespaced_pod("sick", NS, grace_period_seconds=0)


def test_crash_loop_back_off_grows(node):
    node.core.create_namespaced_pod(NS, pod_manifest("crasher", node.busybox, ["sh", "-c", "exit 1"]))

    def back_off(seconds):
        waiting = (node.pod("crasher").status.container_statuses or [None])[0]
        message = waiting.state.waiting.message if waiting and waiting.state.waiting else ""
        return f"back-off {seconds}s restarting failed container" in (message or "")
    wait_for(lambda: back_off(10), "the first back-off (10s)")
    wait_for(lambda: back_off(20), "the doubled back-off (20s)", timeout=30)
    assert node.pod("crasher").status.container_statuses[0].restart_count == 2
    node.core.delete_namespaced_pod("crasher", NS, grace_period_seconds=0)


def test_graceful_deletion_under_load(node):
    """One of 3 pods deleted while a client sends requests through their
    Service: no request fails; its preStop ran, then it saw SIGTERM, and it
    went within its grace period."""
    core = node.core
    for i in range(3):
        core.create_namespaced_pod(NS, server_pod(node, f"gentle-{i}", {"app": "gentle"}))
    cluster_ip = service(node, "gentle", {"app": "gentle"})
    wait_for(lambda: all(ready(node, f"gentle-{i}") for i in range(3)), "3 ready pods")
    wait_for(lambda: len([s for s in slice_state(node, "gentle").values() if s[0]]) == 3, "3 ready endpoints")
    wait_endpoints_programmed({node.pod(f"gentle-{i}").status.pod_ip for i in range(3)})
    events = subprocess.Popen(
        ["kubectl", "--kubeconfig", node.portal.kubeconfig, "get", "pod", "gentle-0", "-w", "-o", "json", "--output-watch-events"],
        stdout=subprocess.PIPE, text=True,
    )
    load = Load(f"http://{cluster_ip}/name")
    try:
        wait_for(lambda: len(load.served) >= 10, "the Service answering the load")
        gone_ip = node.pod("gentle-0").status.pod_ip
        began = time.monotonic()
        core.delete_namespaced_pod("gentle-0", NS)
        assert node.pod("gentle-0").metadata.deletion_timestamp is not None, "marked, not gone"
        wait_for(lambda: "gentle-0" not in [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="app=gentle").items], "the pod to go", timeout=20)
        took = time.monotonic() - began
        # The load goes on until the kernel no longer sends to the gone pod
        # and more requests were answered after that.
        wait_for(lambda: gone_ip not in dnat_targets(), "the gone pod out of the proxy's rules")
        then = len(load.served)
        wait_for(lambda: len(load.served) >= then + 10, "the Service answering after the pod went")
    finally:
        load.stop()
        events.kill()
    assert not load.failures, f"{len(load.failures)} of {len(load.failures) + len(load.served)} requests failed"
    assert took < 10 + 2, f"took {took:.1f}s, grace period 10s"
    assert took >= 2, "gone before its preStop hook (2 s) ended"
    # The last status written before it went names what it saw.
    messages = []
    decoder = json.JSONDecoder()
    text = events.stdout.read()
    while text.strip():
        event, end = decoder.raw_decode(text.lstrip())
        text = text.lstrip()[end:]
        for status in event["object"].get("status", {}).get("containerStatuses", []):
            terminated = status.get("state", {}).get("terminated") or {}
            if terminated.get("message"):
                messages.append(terminated["message"].strip())
    assert "sigterm after ran" in messages, messages
    for i in (1, 2):
        core.delete_namespaced_pod(f"gentle-{i}", NS, grace_period_seconds=0)
    core.delete_namespaced_service("gentle", NS)


def test_only_terminating_pod_keeps_serving(node):
    """A Service whose only pod is terminating keeps serving through it
    (serving-terminating fallback) until it exits."""
    core = node.core
    core.create_namespaced_pod(NS, server_pod(node, "last", {"app": "last"}, grace=8, pre_stop_sleep=5))
    cluster_ip = service(node, "last", {"app": "last"})
    wait_programmed(cluster_ip, with_endpoints=False)
    wait_for(lambda: ready(node, "last") and http(f"http://{cluster_ip}/name", timeout=1), "the Service to answer")
    ip = node.pod("last").status.pod_ip
    core.delete_namespaced_pod("last", NS)
    wait_for(lambda: slice_state(node, "last").get(ip) == (False, True, True), "a serving, terminating endpoint")
    # Through the rules the proxy made after it saw the pod terminating.
    wait_proxy_caught_up(core)
    assert http(f"http://{cluster_ip}/name", timeout=2) == "last\n", "the terminating pod stopped serving too early"
    wait_for(lambda: not core.list_namespaced_pod(NS, field_selector="metadata.name=last").items, "the pod to go", timeout=20)
    core.delete_namespaced_service("last", NS)


def test_sigterm_ignored_means_sigkill_after_grace(node):
    core = node.core
    body = pod_manifest("stubborn", node.busybox, ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"], terminationGracePeriodSeconds=3)
    core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("stubborn").status.phase == "Running", "the pod to run")
    began = time.monotonic()
    core.delete_namespaced_pod("stubborn", NS)
    wait_for(lambda: not core.list_namespaced_pod(NS, field_selector="metadata.name=stubborn").items, "the pod to go", timeout=20)
    took = time.monotonic() - began
    assert 3 <= took < 9, f"gone after {took:.1f}s with a 3 s grace period"


def test_force_delete_is_immediate(node):
    core = node.core
    body = pod_manifest("forced", node.busybox, ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"], terminationGracePeriodSeconds=5)
    core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("forced").status.phase == "Running", "the pod to run")
    uid = node.pod("forced").metadata.uid
    node.kubectl("delete", "pod", "forced", "--force", "--grace-period=0")
    assert not core.list_namespaced_pod(NS, field_selector="metadata.name=forced").items
    # The node still stops what ran, within the spec's grace period (the
    # container ignores SIGTERM: SIGKILL ends it), as Kubernetes' docs say
    # of force deletion.
    agent_dir = node.data_dir / "agent"
    wait_for(lambda: not running_containers_of(agent_dir, uid), "its containers to stop", timeout=30)


def test_init_containers_run_in_order_and_failures_show(node):
    core = node.core
    body = pod_manifest("initok", node.busybox, ["sleep", "3600"])
    body["spec"]["initContainers"] = [
        {"name": "first", "image": node.busybox, "command": ["sleep", "1"]},
        {"name": "second", "image": node.busybox, "command": ["true"]},
    ]
    core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("initok").status.phase == "Running", "the pod to run after its init containers")
    status = node.pod("initok").status
    first, second = status.init_container_statuses
    app = status.container_statuses[0]
    assert first.state.terminated.finished_at <= second.state.terminated.started_at
    assert second.state.terminated.finished_at <= app.state.running.started_at
    assert any(c.type == "Initialized" and c.status == "True" for c in status.conditions)
    row = node.kubectl("get", "pod", "initok").splitlines()[1].split()
    assert row[1:3] == ["1/1", "Running"], row

    failing = pod_manifest("initbad", node.busybox, ["sleep", "3600"], restartPolicy="Never")
    failing["spec"]["initContainers"] = [{"name": "broken", "image": node.busybox, "command": ["sh", "-c", "exit 3"]}]
    core.create_namespaced_pod(NS, failing)
    wait_for(lambda: node.pod("initbad").status.phase == "Failed", "the pod to fail")
    row = node.kubectl("get", "pod", "initbad").splitlines()[1].split()
    assert row[2] == "Init:Error", row
    assert node.pod("initbad").status.container_statuses[0].state.running is None

    pending = pod_manifest("initwait", node.busybox, ["sleep", "3600"])
    pending["spec"]["initContainers"] = [{"name": "slow", "image": node.busybox, "command": ["sleep", "3600"]}, {"name": "next", "image": node.busybox, "command": ["true"]}]
    core.create_namespaced_pod(NS, pending)
    wait_for(lambda: node.kubectl("get", "pod", "initwait").splitlines()[1].split()[2] == "Init:0/2", "Init:0/2")
    for name in ("initok", "initbad", "initwait"):
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_sidecar_runs_alongside(node):
    body = pod_manifest("withside", node.busybox, ["sleep", "3600"])
    body["spec"]["initContainers"] = [{"name": "side", "image": node.busybox, "command": ["sleep", "3600"], "restartPolicy": "Always"}]
    node.core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("withside").status.phase == "Running" and ready(node, "withside"), "the pod to run with its sidecar")
    side = node.pod("withside").status.init_container_statuses[0]
    assert side.state.running is not None and side.started
    node.core.delete_namespaced_pod("withside", NS, grace_period_seconds=0)


def test_active_deadline(node):
    body = pod_manifest("late", node.busybox, ["sleep", "3600"], activeDeadlineSeconds=2)
    node.core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("late").status.phase == "Failed", "the deadline to end it", timeout=30)
    status = node.pod("late").status
    assert status.reason == "DeadlineExceeded", status.reason
    # A finished pod stays finished (restartPolicy Always would otherwise
    # bring it back as its killed container ends): once that container has
    # ended, it stays Failed.
    uid = node.pod("late").metadata.uid
    wait_for(lambda: not running_containers_of(node.data_dir / "agent", uid), "the killed container to end")
    holds_for(lambda: node.pod("late").status.phase == "Failed", "the finished pod Failed", 3)
    assert any(r == "DeadlineExceeded" for _, r, _ in node.events("late"))
    node.core.delete_namespaced_pod("late", NS)
    wait_for(lambda: not node.core.list_namespaced_pod(NS, field_selector="metadata.name=late").items, "a finished pod to go at once")


def test_namespace_deletion_waits_for_its_pods(node):
    core = node.core
    core.create_namespace({"metadata": {"name": "doomed"}})
    body = pod_manifest("inside", node.busybox, ["sh", "-c", "trap 'sleep 2; exit 0' TERM; while true; do sleep 1; done"])
    core.create_namespaced_pod("doomed", body)
    wait_for(lambda: core.read_namespaced_pod("inside", "doomed").status.phase == "Running", "the pod to run")
    core.delete_namespace("doomed")
    assert core.read_namespace("doomed").status.phase == "Terminating"
    # Changing it meanwhile does not end its termination early.
    node.kubectl("label", "namespace", "doomed", "touched=yes")
    assert core.read_namespace("doomed").status.phase == "Terminating"
    # The namespace controller marks its pods after the namespace.
    wait_for(lambda: core.read_namespaced_pod("inside", "doomed").metadata.deletion_timestamp,
             "the pod to be deleted with its namespace")
    wait_for(lambda: not [n for n in core.list_namespace().items if n.metadata.name == "doomed"], "the namespace to go", timeout=30)


def test_post_start_hook_and_termination_message_from_logs(node):
    """postStart runs before the container is reported running (its file is
    there); a failed container with FallbackToLogsOnError and no message
    file reports the end of its log."""
    body = pod_manifest("hooked", node.busybox, ["sh", "-c", "sleep 1; cat /tmp/hook; echo oops; exit 2"], restartPolicy="Never")
    container = body["spec"]["containers"][0]
    container["lifecycle"] = {"postStart": {"exec": {"command": ["sh", "-c", "echo hooked > /tmp/hook"]}}}
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    node.core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("hooked").status.phase == "Failed", "the pod to end")
    terminated = node.pod("hooked").status.container_statuses[0].state.terminated
    assert terminated.exit_code == 2
    assert terminated.message.strip().splitlines() == ["hooked", "oops"], terminated.message
    node.core.delete_namespaced_pod("hooked", NS)


def test_startup_probe_gates_readiness(node):
    """Until the startup probe passes the container is neither started nor
    ready (readiness waits for it)."""
    body = pod_manifest("slowstart", node.busybox, ["sh", "-c", "sleep 3; touch /tmp/started; sleep 3600"])
    container = body["spec"]["containers"][0]
    container["startupProbe"] = {"exec": {"command": ["cat", "/tmp/started"]}, "periodSeconds": 1, "failureThreshold": 30}
    container["readinessProbe"] = {"exec": {"command": ["true"]}, "periodSeconds": 1}
    node.core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("slowstart").status.phase == "Running", "the pod to run")
    status = node.pod("slowstart").status.container_statuses[0]
    assert status.started is False and status.ready is False, status
    wait_for(lambda: ready(node, "slowstart"), "Ready once started", timeout=20)
    assert node.pod("slowstart").status.container_statuses[0].started is True
    node.core.delete_namespaced_pod("slowstart", NS, grace_period_seconds=0)


def test_node_lease_is_renewed(node):
    def renewed():
        lease = json.loads(node.kubectl("get", "lease", node.node_name, "-n", "kube-node-lease", "-o", "json"))
        return lease["spec"]
    first = renewed()
    assert first["holderIdentity"] == node.node_name and first["leaseDurationSeconds"] == 40
    wait_for(lambda: renewed()["renewTime"] != first["renewTime"], "the lease to be renewed", timeout=25)
    assert node.kubectl("get", "leases", "-n", "kube-node-lease").split()[:3] == ["NAME", "HOLDER", "AGE"]


def test_finalizer_holds_a_deletion_until_released(node):
    core = node.core
    core.create_namespaced_service(NS, {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}, "spec": {"ports": [{"port": 80}]}})
    node.kubectl("delete", "service", "held", "--wait=false")
    held = core.read_namespaced_service("held", NS)
    assert held.metadata.deletion_timestamp is not None, "marked, kept while a finalizer holds it"
    node.kubectl("patch", "service", "held", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_for(lambda: not core.list_namespaced_service(NS, field_selector="metadata.name=held").items, "the service to go")


def test_server_dry_run_delete_changes_nothing(node):
    core = node.core
    core.create_namespaced_pod(NS, pod_manifest("kept", node.busybox, ["sleep", "3600"]))
    wait_for(lambda: node.pod("kept").status.phase == "Running", "the pod to run")
    out = node.kubectl("delete", "pod", "kept", "--dry-run=server")
    assert "(server dry run)" in out, out
    pod = node.pod("kept")
    assert pod.metadata.deletion_timestamp is None and pod.status.phase == "Running"
    core.delete_namespaced_pod("kept", NS, grace_period_seconds=0)
