"""A real cluster (issue 17): three node namespaces on one LAN the test
makes; `portal server` on node-1, `portal node` (agent + proxy) joined
with the node token on node-2 and node-3. Nodes join with their own
certificates (a wrong token, another CA or a taken name is refused; a node
credential is no admin's); an RC spreads over the three; pods reach
Services and each other across nodes with their own addresses; node ports
answer on every node; a lost node's pods leave the Service, are evicted
and replaced, and the node comes back clean; drain moves pods off a node.

The tests share one cluster and run in order."""

import json
import re
import subprocess
import threading
import time

import kubernetes
import pytest
import yaml

from support import agent_bed
from support.agent_bed import NS
from support.cluster_bed import GRACE, TOLERATION, Bed
from support.cluster_bed import NAMES as ALL_NAMES
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

# This file's cluster: three nodes.
NAMES = {i: ALL_NAMES[i] for i in (1, 2, 3)}

@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with Bed(tmp_path_factory.mktemp("cluster")) as bed:
        yield bed
        bed.core.delete_collection_namespaced_replication_controller(NS)
        bed.core.delete_collection_namespaced_pod(NS)
        try:
            wait_for(lambda: not bed.core.list_namespaced_pod(NS).items, "every pod gone", timeout=60)
        except AssertionError:
            # A node lost by a failed test never confirms: forced.
            bed.core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
            raise
    for i in (1, 2, 3):
        tag = agent_bed.agent_tag(bed.agent_dir(i), NAMES[i])
        left = agent_bed.leftovers(bed.agent_dir(i), tag)
        assert not any(v for k, v in left.items() if k != "links"), f"{NAMES[i]} left {left}"


def fetch(bed, where, url, count=1, timeout=2):
    """GETs `url` `count` times from node `where` ("lan": outside every
    node); the bodies, None for failures."""
    script = (
        "import json, sys, urllib.request\n"
        "out = []\n"
        f"for _ in range({count}):\n"
        "    try:\n"
        f"        out.append(urllib.request.urlopen({url!r}, timeout={timeout}).read().decode().strip())\n"
        "    except Exception:\n"
        "        out.append(None)\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(bed.lan.run(where, "python3", "-c", script, timeout=count * (timeout + 1) + 10).stdout)


def test_joining_needs_the_token_and_the_cluster_ca(bed):
    nodes = {n.metadata.name: n for n in bed.core.list_node().items}
    assert sorted(nodes) == ["node-1", "node-2", "node-3"]
    for i in (2, 3):
        # Its own credential, no admin token on the node.
        config = yaml.safe_load((bed.tmp / f"n{i}" / "node.kubeconfig").read_text())
        user = config["users"][0]
        assert user["name"] == f"system:node:{NAMES[i]}"
        assert "client-certificate-data" in user["user"] and "token" not in user["user"]
        # Node IPAM gives every joined node a pod range (a controller: it
        # may come a moment after the Node).
        wait_for(lambda: bed.core.read_node(NAMES[i]).spec.pod_cidr, f"{NAMES[i]}'s pod range")
    token = bed.token_file.read_text().strip()
    cases = {
        "wrong secret": (token.rsplit(":", 1)[0] + ":not-the-secret", "401"),
        "another CA": ("K10" + "0" * 64 + "::node:" + token.rsplit(":", 1)[1], "not the one the token pins"),
        "a taken name": (token, "already joined with another key"),
        "the server's own name": (token, "already joined with another key"),
    }
    for what, (text, said) in cases.items():
        data_dir = bed.tmp / f"intruder-{what.replace(' ', '-')}"
        data_dir.mkdir()
        token_file = data_dir / "token"
        token_file.write_text(text)
        # A taken name: node-3's name from another machine (another key).
        name = {"a taken name": NAMES[3], "the server's own name": NAMES[1]}.get(what, "intruder")
        result = bed.lan.run(3, *bed.worker_args(3, data_dir=data_dir, token_file=token_file, name=name), check=False, timeout=60)
        assert result.returncode != 0, f"{what}: joined"
        assert said in result.stderr + result.stdout, f"{what}: {result.stderr[-2000:]}"
        assert not (data_dir / "node.kubeconfig").exists()
    assert "intruder" not in {n.metadata.name for n in bed.core.list_node().items}


def test_a_node_credential_is_no_admin(bed):
    bed.core.create_namespaced_service(NS, {"metadata": {"name": "keep"}, "spec": {"selector": {"app": "keep"}, "ports": [{"port": 80}]}})
    node_config = bed.tmp / "n2" / "node.kubeconfig"
    # What a node needs works...
    assert bed.kubectl("get", "pods", "-A", kubeconfig=node_config).returncode == 0
    assert "keep" in bed.kubectl("get", "svc", kubeconfig=node_config).stdout
    # ...what an admin may do does not.
    result = bed.kubectl("delete", "svc", "keep", kubeconfig=node_config, check=False)
    assert result.returncode != 0
    assert 'services "keep" is forbidden: User "system:node:node-2" cannot delete resource "services"' in result.stderr
    result = bed.kubectl("get", "rc", kubeconfig=node_config, check=False)
    assert "forbidden" in result.stderr
    result = bed.kubectl("label", "node", "node-1", "stolen=yes", kubeconfig=node_config, check=False)
    assert "forbidden" in result.stderr
    result = bed.kubectl("run", "sneaky", "--image", "peer:1", kubeconfig=node_config, check=False)
    assert "can only create mirror pods" in result.stderr
    # Its own Node: labels yes; taints (they keep pods away) and its pod
    # range (every node routes it) no.
    bed.kubectl("label", "node", "node-2", "mine=yes", kubeconfig=node_config)
    result = bed.kubectl("taint", "node", "node-2", "evil=yes:NoSchedule", kubeconfig=node_config, check=False)
    assert 'node "node-2" is not allowed to modify taints' in result.stderr, result.stderr
    result = bed.kubectl("patch", "node", "node-2", "-p", '{"spec":{"podCIDR":"10.244.99.0/24","podCIDRs":["10.244.99.0/24"]}}', kubeconfig=node_config, check=False)
    assert "may not change podCIDR" in result.stderr, result.stderr
    bed.kubectl("label", "node", "node-2", "mine-")
    assert bed.core.read_namespaced_service("keep", NS)
    bed.core.delete_namespaced_service("keep", NS)


def web_rc(bed, replicas=6):
    tolerations = [{"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATION}
                   for t in ("unreachable", "not-ready")]
    return {"metadata": {"name": "web"}, "spec": {"replicas": replicas, "selector": {"app": "web"}, "template": {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"terminationGracePeriodSeconds": 1, "tolerations": tolerations,
                 "containers": [{"name": "web", "image": bed.image, "ports": [{"containerPort": 8080}],
                                 "readinessProbe": {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1}}]}}}}


def by_node(pods):
    counts = {}
    for pod in pods:
        counts[pod.spec.node_name] = counts.get(pod.spec.node_name, 0) + 1
    return counts


def test_spread_and_reach_across_nodes(bed):
    core = bed.core
    core.create_namespaced_replication_controller(NS, web_rc(bed))
    core.create_namespaced_service(NS, {"metadata": {"name": "web"}, "spec": {
        "type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    pods = wait_for(lambda: bed.running("app=web", 6), "6 web pods running", timeout=120)
    assert by_node(pods) == {"node-1": 2, "node-2": 2, "node-3": 2}

    reach_across_nodes(bed)


def reach_across_nodes(bed):
    """A client pod on node-3 reaches "far" (pods on node-1 and node-2) by
    cluster IP and by names, and a far pod directly, with its own address."""
    core = bed.core
    for i in (1, 2):
        core.create_namespaced_pod(NS, {"metadata": {"name": f"far-{i}", "labels": {"app": "far"}}, "spec": {
            "nodeName": NAMES[i], "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "far", "image": bed.image}]}})
    core.create_namespaced_service(NS, {"metadata": {"name": "far"}, "spec": {"selector": {"app": "far"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    far = wait_for(lambda: bed.running("app=far", 2), "the far pods", timeout=90)
    far_ip = core.read_namespaced_service("far", NS).spec.cluster_ip
    wait_for(lambda: len([e for s in core.list_namespaced_endpoints(NS, field_selector="metadata.name=far").items for s in (s.subsets or []) for e in (s.addresses or [])]) == 2, "far's endpoints")
    direct = far[0].status.pod_ip
    # node-3's proxy sends the Service to both (a first answer from one
    # alone, as the client's loop below waits for, is not enough).
    wait_for(lambda: {p.status.pod_ip for p in far} <= set(re.findall(r"dnat to (\d+\.\d+\.\d+\.\d+):8080",
                                                                      bed.lan.run(3, "nft", "list", "table", "ip", "portal").stdout)),
             "node-3's proxy to program both far endpoints")
    script = (
        # Until node-3's proxy has the endpoints (it rejects before).
        f"for i in $(seq 1 40); do timeout 5 wget -qO- http://{far_ip}/name.txt >/dev/null && break; sleep 0.5; done; "
        f"for target in {far_ip} far far.{NS}.svc.cluster.local; do for i in 1 2 3 4 5 6 7 8; do "
        "  echo \"$target $(timeout 5 wget -qO- http://$target/name.txt)\"; done; done; "
        f"echo \"direct $(timeout 5 wget -qO- http://{direct}:8080/cgi-bin/peer)\"; "
        f"echo \"viaservice $(timeout 5 wget -qO- http://far/cgi-bin/peer)\"; "
        "echo \"me $(hostname -i)\""
    )
    core.create_namespaced_pod(NS, {"metadata": {"name": "client"}, "spec": {
        "nodeName": NAMES[3], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "client", "image": bed.image, "command": ["sh", "-c", script]}]}})
    out = bed.pod_output("client")
    lines = [line.split(" ", 1) for line in out.splitlines() if " " in line]
    me = next(v for k, v in lines if k == "me").strip()
    client_ip = core.read_namespaced_pod("client", NS).status.pod_ip
    assert me == client_ip
    for target in (far_ip, "far", f"far.{NS}.svc.cluster.local"):
        seen = {v.strip() for k, v in lines if k == target}
        assert seen <= {"far-1", "far-2"} and seen, f"{target}: {seen}\n{out}"
    assert {v.strip() for k, v in lines if k in (far_ip, "far")} == {"far-1", "far-2"}, out
    # httpd listens on IPv6 too: IPv4 peers read as [::ffff:a.b.c.d].
    peer = lambda key: next(v for k, v in lines if k == key).strip().removeprefix("[::ffff:").rstrip("]")
    assert peer("direct") == client_ip, out
    assert peer("viaservice") == client_ip, out
    for name in ("client", "far-1", "far-2"):
        core.delete_namespaced_pod(name, NS)
    core.delete_namespaced_service("far", NS)


def test_node_ports_answer_on_every_node(bed):
    node_port = bed.core.read_namespaced_service("web", NS).spec.ports[0].node_port
    names = {p.metadata.name for p in bed.pods("app=web")}
    for i in (1, 2, 3):
        answers = wait_for(lambda i=i: [a for a in fetch(bed, "lan", f"http://{bed.lan.address(i)}:{node_port}/name.txt", count=6) if a] or None,
                           f"node port on {NAMES[i]}")
        assert set(answers) <= names, answers


def status_of(bed, where, url, timeout=2):
    """(HTTP status, body) of one GET from node `where`; (None, error) when
    nothing answered."""
    script = (
        "import json, urllib.request, urllib.error\n"
        "try:\n"
        f"    r = urllib.request.urlopen({url!r}, timeout={timeout}); print(json.dumps([r.status, r.read().decode()]))\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(json.dumps([e.code, e.read().decode()]))\n"
        "except Exception as e:\n"
        "    print(json.dumps([None, str(e)]))\n"
    )
    return tuple(json.loads(bed.lan.run(where, "python3", "-c", script, timeout=timeout + 10).stdout))


def test_local_traffic_policies(bed):
    """externalTrafficPolicy: Local: a node port serves only on the node
    with an endpoint, the backend sees the client's own address, and the
    health check node port says which node can serve; internalTrafficPolicy:
    Local: the cluster IP reaches only this node's endpoints."""
    core = bed.core
    core.create_namespaced_pod(NS, {"metadata": {"name": "lp", "labels": {"app": "lp"}}, "spec": {
        "nodeName": NAMES[1], "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "lp", "image": bed.image}]}})
    wait_for(lambda: bed.running("app=lp", 1), "the lp pod", timeout=60)
    core.create_namespaced_service(NS, {"metadata": {"name": "lp"}, "spec": {
        "type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": {"app": "lp"},
        "ports": [{"port": 80, "targetPort": 8080}]}})
    spec = core.read_namespaced_service("lp", NS).spec
    node_port, health = spec.ports[0].node_port, spec.health_check_node_port
    assert health and health != node_port
    one, two = bed.lan.address(1), bed.lan.address(2)
    # On node-1 (the endpoint's): served, with the client's own address.
    peer = wait_for(lambda: fetch(bed, "lan", f"http://{one}:{node_port}/cgi-bin/peer")[0], "lp's node port on node-1")
    assert peer.removeprefix("[::ffff:").rstrip("]") == "192.168.99.254"
    def answered(address, want=None):
        result = status_of(bed, "lan", f"http://{address}:{health}/")
        return result if result[0] is not None and want in (None, result[0]) else None

    code, body = wait_for(lambda: answered(one, 200), "node-1's health check")
    assert json.loads(body) == {"service": {"namespace": NS, "name": "lp"}, "localEndpoints": 1, "serviceProxyHealthy": True}
    # On node-2 (none there): unhealthy, and the node port does not serve.
    code, body = wait_for(lambda: answered(two), "node-2's health check")
    assert code == 503 and json.loads(body)["localEndpoints"] == 0
    assert fetch(bed, "lan", f"http://{two}:{node_port}/name.txt", count=2) == [None, None]

    # internalTrafficPolicy: Local.
    core.create_namespaced_service(NS, {"metadata": {"name": "ilp"}, "spec": {
        "internalTrafficPolicy": "Local", "selector": {"app": "lp"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    cluster_ip = core.read_namespaced_service("ilp", NS).spec.cluster_ip
    wait_for(lambda: fetch(bed, 1, f"http://{cluster_ip}/name.txt")[0] == "lp", "ilp from node-1")
    # node-3 has no endpoint: dropped there, once its proxy has programmed
    # the Service (as a drop).
    wait_for(lambda: re.search(rf"{re.escape(cluster_ip)} \. tcp \. 80 : drop\b",
                               bed.lan.run(3, "nft", "list", "map", "ip", "portal", "cluster-ips").stdout),
             "node-3's proxy to program ilp as a drop")
    assert fetch(bed, 3, f"http://{cluster_ip}/name.txt", count=2) == [None, None]
    core.delete_namespaced_service("ilp", NS)
    core.delete_namespaced_service("lp", NS)
    core.delete_namespaced_pod("lp", NS)


def test_requests_fit_allocatable(bed):
    """Each node offers its CPUs: pods asking three quarters of one go one
    per node; the fourth waits, with Kubernetes' reason."""
    core = bed.core
    cpus = {n.metadata.name: n.status.allocatable["cpu"] for n in core.list_node().items}
    millis = min(int(float(c) * 1000) for c in cpus.values())
    core.create_namespaced_replication_controller(NS, {"metadata": {"name": "big"}, "spec": {
        "replicas": 4, "selector": {"app": "big"}, "template": {"metadata": {"labels": {"app": "big"}}, "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "big", "image": bed.image, "resources": {"requests": {"cpu": f"{millis * 3 // 4}m"}}}]}}}})
    wait_for(lambda: len([p for p in bed.pods("app=big") if p.spec.node_name]) == 3 and len(bed.pods("app=big")) == 4, "three big pods placed")
    pods = bed.pods("app=big")
    placed = [p for p in pods if p.spec.node_name]
    assert sorted(p.spec.node_name for p in placed) == ["node-1", "node-2", "node-3"]
    waiting = next(p for p in pods if not p.spec.node_name)
    def failed_scheduling():
        events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={waiting.metadata.name}").items
        return next((e for e in events if e.reason == "FailedScheduling"), None)
    assert wait_for(failed_scheduling, "FailedScheduling").message == "0/3 nodes are available: 3 Insufficient cpu."
    # A node change makes the scheduler try every pending pod again: once
    # it has (the Event counted twice), the pod is still not placed.
    bed.kubectl("label", "node", NAMES[1], "retry-scheduling=yes")
    try:
        again = wait_for(lambda: (e := failed_scheduling()) and (e.count or 1) >= 2 and e, "the scheduler to try the pod again")
    finally:
        bed.kubectl("label", "node", NAMES[1], "retry-scheduling-")
    assert again.message == "0/3 nodes are available: 3 Insufficient cpu."
    assert not core.read_namespaced_pod(waiting.metadata.name, NS).spec.node_name
    core.delete_namespaced_replication_controller("big", NS)
    wait_for(lambda: not bed.pods("app=big"), "the big pods gone", timeout=60)


def test_a_lost_node_leaves_the_service_and_its_pods_move(bed):
    core = bed.core
    cluster_ip = core.read_namespaced_service("web", NS).spec.cluster_ip
    on_two = {p.metadata.name for p in bed.pods("app=web") if p.spec.node_name == "node-2"}
    assert len(on_two) == 2
    # Requests through the Service from node-3, every 0.1 s, while node-2 is
    # lost; each sample (seconds since the probe's start, answered) is
    # printed as it is taken, after the start's CLOCK_MONOTONIC reading.
    # The probe stops once 50 requests in a row were answered after a
    # failure (the lost endpoints have left), or after 90 s.
    probe = (
        "import json, time, urllib.request\n"
        "start = time.monotonic(); print(start, flush=True)\n"
        "failed, streak = False, 0\n"
        "while time.monotonic() - start < 90 and not (failed and streak >= 50):\n"
        "    t = time.monotonic() - start\n"
        "    try:\n"
        f"        urllib.request.urlopen('http://{cluster_ip}/name.txt', timeout=0.5).read(); ok = True\n"
        "    except Exception:\n"
        "        ok = False\n"
        "    failed, streak = failed or not ok, (streak + 1) if ok else 0\n"
        "    print(json.dumps([t, ok]), flush=True)\n"
        "    time.sleep(0.1)\n"
    )
    watcher = subprocess.Popen(["ip", "netns", "exec", bed.lan.netns(3), "python3", "-c", probe], stdout=subprocess.PIPE, text=True)
    try:
        start = float(watcher.stdout.readline())
        samples = []
        # The Service answers the probe before the node is lost.
        while sum(ok for _, ok in samples) < 5:
            line = watcher.stdout.readline()
            assert line, f"the probe ended before the Service answered it: {samples}"
            samples.append(json.loads(line))
        bed.workers[2].kill()
        bed.lan.cut(2)
        # (Both clocks are the machine's CLOCK_MONOTONIC.)
        lost = time.monotonic() - start
        samples += [json.loads(line) for line in watcher.communicate(timeout=120)[0].splitlines()]
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    failures = [t for t, ok in samples if not ok]
    assert failures, "the lost node's endpoints should fail before they leave the Service"
    last_failure = max(failures) - lost
    print(f"node lost -> Service serving only live endpoints: {last_failure:.1f}s (grace {GRACE})")
    # No timing threshold (machines are noisy; bench/cluster.sh measures
    # it): the lost endpoints left, and from then on every request was
    # answered, 50 in a row at least.
    assert all(ok for t, ok in samples if t > max(failures)), "after the endpoints left, every request succeeded"
    assert sum(1 for t, ok in samples if t > max(failures)) >= 50, f"the Service did not recover: {samples[-5:]}"
    slices = kubernetes.client.DiscoveryV1Api(core.api_client).list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=web").items
    ready = [e for s in slices for e in s.endpoints or [] if e.conditions.ready]
    assert ready and all(e.node_name != "node-2" for e in ready)

    # After the toleration: evicted, replaced on node-1 and node-3 (until
    # the eviction, node-2's pods may still count as running: wait for the
    # end state, not the first moment six run).
    def moved():
        pods = bed.running("app=web", 6)
        return pods if pods and set(by_node(pods)) == {"node-1", "node-3"} else None

    pods = wait_for(moved, "6 web pods running on node-1 and node-3", timeout=90)
    assert not on_two & {p.metadata.name for p in pods}

    # node-2 back: Ready, untainted, and none of its old pods left.
    bed.lan.mend(2)
    bed.start_worker(2)
    wait_for(lambda: bed.ready("node-2"), "node-2 Ready again", timeout=60)
    wait_for(lambda: not core.read_node("node-2").spec.taints, "node-2's taints gone", timeout=30)
    wait_for(lambda: not on_two & {p.metadata.name for p in core.list_namespaced_pod(NS).items}, "node-2's old pods cleaned up", timeout=60)
    assert len(bed.running("app=web", 6)) == 6


def test_drain_moves_pods_and_uncordon_takes_them_again(bed):
    core = bed.core
    on_three = {p.metadata.name for p in bed.pods("app=web") if p.spec.node_name == "node-3"}
    assert on_three
    bed.kubectl("drain", "node-3", "--ignore-daemonsets", "--timeout=90s")
    assert core.read_node("node-3").spec.unschedulable
    pods = wait_for(lambda: bed.running("app=web", 6), "6 web pods after the drain", timeout=90)
    assert "node-3" not in by_node(pods)
    bed.kubectl("uncordon", "node-3")
    assert not core.read_node("node-3").spec.unschedulable
    # Schedulable again: a pod that must go there does.
    core.create_namespaced_pod(NS, {"metadata": {"name": "back"}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": "node-3"}, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "back", "image": bed.image}]}})
    wait_for(lambda: core.read_namespaced_pod("back", NS).status.phase == "Running", "a pod on node-3 again", timeout=60)
    core.delete_namespaced_replication_controller("web", NS)
    core.delete_namespaced_service("web", NS)


def daemon_pods(bed):
    """The DaemonSet's live pods by the node they are for."""
    pods = {}
    for pod in bed.pods("app=node-agent"):
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
        pods.setdefault(terms[0].match_fields[0].values[0], []).append(pod)
    return pods


def test_a_daemon_set_runs_one_pod_per_node_and_rolls_node_by_node(bed):
    """A DaemonSet: a pod on each of the three nodes, pinned by node
    affinity and bound by the scheduler; a node that registers gets one
    and loses it when it goes; a rolling update replaces them one at a
    time (maxUnavailable 1); history, undo; drain --ignore-daemonsets
    leaves it."""
    apps = kubernetes.client.AppsV1Api(bed.portal.api_client())
    template = {"metadata": {"labels": {"app": "node-agent"}}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "agent", "image": bed.image, "env": [{"name": "VERSION", "value": "1"}],
                        "readinessProbe": {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1}}]}}
    apps.create_namespaced_daemon_set(NS, {"metadata": {"name": "node-agent"}, "spec": {
        "selector": {"matchLabels": {"app": "node-agent"}}, "template": template}})
    out = bed.kubectl("rollout", "status", "daemonset/node-agent", "--timeout=120s").stdout
    assert 'daemon set "node-agent" successfully rolled out' in out
    pods = daemon_pods(bed)
    assert sorted(pods) == ["node-1", "node-2", "node-3"]
    assert all(len(p) == 1 and p[0].spec.node_name == node for node, p in pods.items())
    status = apps.read_namespaced_daemon_set("node-agent", NS).status
    assert (status.desired_number_scheduled, status.current_number_scheduled, status.number_ready,
            status.updated_number_scheduled, status.number_available) == (3, 3, 3, 3, 3)
    line = bed.kubectl("get", "ds", "node-agent").stdout.splitlines()[1].split()
    assert line[:7] == ["node-agent", "3", "3", "3", "3", "3", "<none>"], line
    tolerations = {(t.key, t.effect) for t in pods["node-1"][0].spec.tolerations}
    assert ("node.kubernetes.io/unreachable", "NoExecute") in tolerations
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in tolerations

    # A node that registers gets a pod (it stays Pending: no agent runs
    # it); one that goes loses it.
    bed.core.create_node({"metadata": {"name": "node-4", "labels": {"kubernetes.io/hostname": "node-4"}}})
    wait_for(lambda: "node-4" in daemon_pods(bed) and apps.read_namespaced_daemon_set("node-agent", NS).status.desired_number_scheduled == 4,
             "a pod for node-4")
    bed.core.delete_node("node-4")
    wait_for(lambda: "node-4" not in daemon_pods(bed) and apps.read_namespaced_daemon_set("node-agent", NS).status.desired_number_scheduled == 3,
             "node-4's pod gone")

    # A rolling update: one node at a time, never two of three unavailable.
    first = {p.metadata.name for ps in daemon_pods(bed).values() for p in ps}
    fewest = [3]
    stop = threading.Event()

    def watch_readiness():
        while not stop.is_set():
            ready = [p for p in bed.pods("app=node-agent")
                     if p.status.phase == "Running" and all(s.ready for s in p.status.container_statuses or [])]
            fewest[0] = min(fewest[0], len(ready))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_readiness, daemon=True)
    watcher.start()
    bed.kubectl("set", "env", "daemonset/node-agent", "VERSION=2")
    bed.kubectl("rollout", "status", "daemonset/node-agent", "--timeout=180s")
    stop.set()
    watcher.join(timeout=10)
    assert fewest[0] >= 2, f"{3 - fewest[0]} nodes were without a ready pod at once"
    pods = daemon_pods(bed)
    assert sorted(pods) == ["node-1", "node-2", "node-3"] and not first & {p.metadata.name for ps in pods.values() for p in ps}
    history = bed.kubectl("rollout", "history", "daemonset/node-agent").stdout
    assert [l.split()[0] for l in history.splitlines()[2:] if l.strip()] == ["1", "2"], history
    assert "rolled back" in bed.kubectl("rollout", "undo", "daemonset/node-agent").stdout
    bed.kubectl("rollout", "status", "daemonset/node-agent", "--timeout=180s")
    envs = {p.spec.containers[0].env[0].value for ps in daemon_pods(bed).values() for p in ps}
    assert envs == {"1"}, envs
    revisions = apps.list_namespaced_controller_revision(NS, label_selector="app=node-agent").items
    assert sorted(r.revision for r in revisions) == [2, 3]

    # Drain leaves DaemonSet pods where they are.
    on_two = daemon_pods(bed)["node-2"][0].metadata.name
    bed.kubectl("drain", "node-2", "--ignore-daemonsets", "--timeout=90s")
    assert daemon_pods(bed)["node-2"][0].metadata.name == on_two
    bed.kubectl("uncordon", "node-2")

    apps.delete_namespaced_daemon_set("node-agent", NS)
    wait_for(lambda: not bed.core.list_namespaced_pod(NS, label_selector="app=node-agent").items, "the DaemonSet's pods gone", timeout=60)
    wait_for(lambda: not apps.list_namespaced_controller_revision(NS, label_selector="app=node-agent").items, "its revisions collected")


def test_drain_waits_for_a_disruption_budget(bed):
    """A 2-replica Deployment with a PodDisruptionBudget minAvailable 2:
    `kubectl drain` of a node with one of its pods is refused (429) and
    waits; once a third replica is Ready elsewhere it proceeds."""
    apps = kubernetes.client.AppsV1Api(bed.portal.api_client())
    policy = kubernetes.client.PolicyV1Api(bed.portal.api_client())
    apps.create_namespaced_deployment(NS, {"metadata": {"name": "guarded"}, "spec": {
        "replicas": 2, "selector": {"matchLabels": {"app": "guarded"}},
        "template": {"metadata": {"labels": {"app": "guarded"}}, "spec": {
            "terminationGracePeriodSeconds": 1, "containers": [{"name": "web", "image": bed.image,
                "readinessProbe": {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1}}]}}}})
    policy.create_namespaced_pod_disruption_budget(NS, {"metadata": {"name": "guarded"}, "spec": {
        "minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}})
    pods = wait_for(lambda: bed.running("app=guarded", 2), "2 guarded pods", timeout=90)
    wait_for(lambda: (s := policy.read_namespaced_pod_disruption_budget("guarded", NS).status)
             and s.current_healthy == 2 and s.desired_healthy == 2 and s.disruptions_allowed == 0, "the budget's status")
    line = bed.kubectl("get", "pdb", "guarded").stdout.splitlines()[1].split()
    assert line[:4] == ["guarded", "2", "N/A", "0"], line
    node = pods[0].spec.node_name
    victim = pods[0].metadata.name

    # The eviction API refuses, with the budget's numbers.
    try:
        bed.core.create_namespaced_pod_eviction(victim, NS, {"metadata": {"name": victim, "namespace": NS}})
        raise AssertionError("evicted")
    except kubernetes.client.rest.ApiException as error:
        assert error.status == 429, error
        assert "The disruption budget guarded needs 2 healthy pods and has 2 currently" in error.body

    drain = subprocess.Popen(["kubectl", "--kubeconfig", str(bed.portal.kubeconfig), "drain", node,
                              "--ignore-daemonsets", "--timeout=150s"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    reader = threading.Thread(target=lambda: said.extend(drain.stdout), daemon=True)
    reader.start()
    try:
        # kubectl says it was refused and retries.
        wait_for(lambda: any("would violate the pod's disruption budget" in line for line in said), "the drain refused", timeout=60)
        assert drain.poll() is None, "drain finished while the budget forbade it"
        assert any(p.metadata.name == victim for p in bed.pods("app=guarded")), "the pod stayed"
        apps.patch_namespaced_deployment_scale("guarded", NS, {"spec": {"replicas": 3}})
        drain.wait(timeout=150)
        reader.join(timeout=10)
    finally:
        if drain.poll() is None:
            drain.kill()
    out = "".join(said)
    assert drain.returncode == 0, out
    assert f"node/{node} drained" in out, out
    pods = wait_for(lambda: bed.running("app=guarded", 2) or bed.running("app=guarded", 3), "the guarded pods after the drain", timeout=90)
    assert victim not in {p.metadata.name for p in pods}
    assert all(p.spec.node_name != node for p in pods)
    bed.kubectl("uncordon", node)
    policy.delete_namespaced_pod_disruption_budget("guarded", NS)
    apps.delete_namespaced_deployment("guarded", NS)
    wait_for(lambda: not bed.core.list_namespaced_pod(NS, label_selector="app=guarded").items, "the guarded pods gone", timeout=60)


def test_a_stateful_set_goes_one_pod_per_node_by_anti_affinity(bed):
    """A StatefulSet whose pods avoid each other by hostname: `db-0…2` start
    in order, one on each of the three nodes; `db-3` has nowhere to go and
    stays Pending with the anti-affinity reason."""
    apps = kubernetes.client.AppsV1Api(bed.portal.api_client())
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    apps.create_namespaced_stateful_set(NS, {"metadata": {"name": "db"}, "spec": {
        "replicas": 4, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
        "template": {"metadata": {"labels": {"app": "db"}}, "spec": {
            "terminationGracePeriodSeconds": 1, "affinity": apart,
            "containers": [{"name": "db", "image": bed.image,
                            "readinessProbe": {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1}}]}}}})

    try:
        def placed():
            pods = {p.metadata.name: p for p in bed.pods("app=db")}
            ready = [p for p in pods.values() if p.status.phase == "Running" and all(s.ready for s in p.status.container_statuses or [])]
            return pods if len(ready) == 3 and "db-3" in pods else None
        pods = wait_for(placed, "db-0..2 running and db-3 made", timeout=120)
        nodes = {pods[f"db-{i}"].spec.node_name for i in range(3)}
        assert nodes == set(NAMES.values()), nodes
        assert not pods["db-3"].spec.node_name
        events = wait_for(lambda: bed.core.list_namespaced_event(
            NS, field_selector="reason=FailedScheduling,involvedObject.name=db-3").items, "db-3's FailedScheduling")
        assert events[0].message == "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.", events[0].message
    finally:
        apps.delete_namespaced_stateful_set("db", NS)
        wait_for(lambda: not bed.core.list_namespaced_pod(NS, label_selector="app=db").items, "the db pods gone", timeout=60)


def test_joined_nodes_read_only_what_their_pods_name(bed):
    """Configuration and storage on a joined node (issue 28), through its
    own credential: a pod on node-2 gets its Secret as a variable, its
    ConfigMap as files and a local-path claim provisioned on node-2; the
    node may read those objects and no others (the Node authorizer's
    rule), and node-3 may not read them at all."""
    core = bed.core
    core.create_namespaced_config_map(NS, {"metadata": {"name": "site"}, "data": {"greeting": "hello"}})
    core.create_namespaced_secret(NS, {"metadata": {"name": "login"}, "stringData": {"password": "s3cret"}})
    core.create_namespaced_secret(NS, {"metadata": {"name": "unrelated"}, "stringData": {"x": "y"}})
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "notes"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Mi"}}}})
    script = "echo \"$PASSWORD\" > /data/pw; cat /site/greeting > /data/greeting; exec sleep 100000"
    core.create_namespaced_pod(NS, {"metadata": {"name": "configured", "labels": {"app": "configured"}}, "spec": {
        "terminationGracePeriodSeconds": 1, "nodeSelector": {"kubernetes.io/hostname": NAMES[2]},
        "containers": [{"name": "app", "image": bed.image, "command": ["sh", "-c", script],
                        "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "login", "key": "password"}}}],
                        "volumeMounts": [{"name": "site", "mountPath": "/site"}, {"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "site", "configMap": {"name": "site"}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "notes"}}]}})
    try:
        wait_for(lambda: bed.running("app=configured", 1), "the pod running on node-2", timeout=120)
        out = bed.kubectl("-n", NS, "exec", "configured", "--", "cat", "/data/pw", "/data/greeting").stdout
        assert out == "s3cret\nhello", out
        claim = core.read_namespaced_persistent_volume_claim("notes", NS)
        volume = core.read_persistent_volume(claim.spec.volume_name)
        assert volume.spec.host_path.path.startswith(str(bed.agent_dir(2).resolve() / "storage")), volume.spec.host_path.path
        node2, node3 = bed.tmp / "n2" / "node.kubeconfig", bed.tmp / "n3" / "node.kubeconfig"
        assert bed.kubectl("-n", NS, "get", "secret", "login", kubeconfig=node2).returncode == 0
        for config, name in [(node2, "unrelated"), (node3, "login")]:
            result = bed.kubectl("-n", NS, "get", "secret", name, kubeconfig=config, check=False)
            assert "no relationship found between node" in result.stderr, result.stderr
        assert bed.kubectl("-n", NS, "get", "secrets", kubeconfig=node2, check=False).returncode != 0
    finally:
        core.delete_namespaced_pod("configured", NS, grace_period_seconds=0)
        wait_for(lambda: not bed.pods("app=configured"), "the pod gone", timeout=60)
        core.delete_namespaced_persistent_volume_claim("notes", NS)
        for name in ["login", "unrelated"]:
            core.delete_namespaced_secret(name, NS)
        core.delete_namespaced_config_map("site", NS)


def test_vxlan_overlay_across_subnets(tmp_path):
    """Nodes on three subnets (no shared link, host-gw cannot route): with
    `--pod-network vxlan` the same client-to-Service test passes, through
    the overlay device. The pod network is dual-stack: the overlay carries
    IPv6 between pods too, over the IPv4 underlay (the nodes have no IPv6
    address at all)."""
    dual = ["--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56"]
    with Bed(tmp_path, routed=True, extra=["--pod-network", "vxlan"], server_extra=dual) as bed:
        try:
            for i in (1, 2, 3):
                for family in ("-4", "-6"):
                    wait_for(lambda i=i, family=family: bed.lan.run(i, "ip", family, "route", "show", "proto", "117").stdout.count("dev portal.vxlan") == 2,
                             f"{NAMES[i]}'s overlay routes ({family})")
            reach_across_nodes(bed)
            # IPv6 from node-3 to a pod on node-1, through the overlay; the
            # server sees the client's own IPv6 address (nothing NATed).
            far_v6 = next(ip.ip for ip in bed.core.read_namespaced_pod("far-1", NS).status.pod_ips if ":" in ip.ip)
            bed.core.create_namespaced_pod(NS, {"metadata": {"name": "client6"}, "spec": {
                "nodeName": NAMES[3], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "client", "image": bed.image, "command": [
                    "sh", "-c", f"echo \"name $(timeout 5 wget -qO- http://[{far_v6}]:8080/name.txt)\"; "
                                f"echo \"peer $(timeout 5 wget -qO- http://[{far_v6}]:8080/cgi-bin/peer)\""]}]}})
            out = bed.pod_output("client6")
            client_v6 = next(ip.ip for ip in bed.core.read_namespaced_pod("client6", NS).status.pod_ips if ":" in ip.ip)
            assert "name far-1" in out and f"peer [{client_v6}]" in out, out
            # Pods get the overlay's MTU (underlay 1500 less 50).
            core = bed.core
            core.create_namespaced_pod(NS, {"metadata": {"name": "mtu"}, "spec": {
                "nodeName": NAMES[2], "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "mtu", "image": bed.image}]}})
            pod = wait_for(lambda: (p := core.read_namespaced_pod("mtu", NS)).status.phase == "Running" and p, "the mtu pod", 60)
            netns = f"portal-{agent_bed.agent_tag(bed.agent_dir(2), NAMES[2])}-{pod.metadata.uid}"
            link = json.loads(subprocess.run(["ip", "netns", "exec", netns, "ip", "-j", "link", "show", "eth0"], capture_output=True, text=True, check=True).stdout)
            assert link[0]["mtu"] == 1450, link
            macs = {n.metadata.name: n.metadata.annotations.get("portal.dev/vxlan-mac") for n in bed.core.list_node().items}
            assert all(macs.values()) and len(set(macs.values())) == 3, macs
        finally:
            bed.core.delete_collection_namespaced_pod(NS)
            wait_for(lambda: not bed.core.list_namespaced_pod(NS).items, "every pod gone", timeout=60)
