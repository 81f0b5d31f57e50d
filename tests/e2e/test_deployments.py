"""Deployments (`apps/v1`, issue 27) on a real node: the reference Services
tutorial as written (its `my-nginx` Deployment, `expose`, `scale 0 → 2`),
rolling updates under load that lose no request, `kubectl rollout
status|history|undo|pause|resume|restart`, `set image`, a progress deadline
that a bad image runs into, Recreate, and cascading deletion — each
leaving nothing behind on the node."""

import ipaddress
import re
import subprocess
import threading
import time
import urllib.request

import pytest
from kubernetes import client

from support import agent_bed, registry
from support.agent_bed import NS, AgentNode, web_image
from support.kubectl import KUBECTLS, Kubectl, client_minor
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


def nginx_image(node):
    """`nginx` as the tutorial names it (Docker Hub's `library/nginx`,
    served by the test registry as the node's mirror): a busybox httpd on
    port 80 serving its name and environment."""
    script = (
        b"#!/bin/sh\n"
        b"mkdir -p /var/www\n"
        b"hostname > /var/www/index.html\n"
        # Stops on SIGTERM as nginx does (a shell as PID 1 would ignore it).
        b"httpd -f -p 80 -h /var/www &\n"
        b"trap 'kill $!; exit 0' TERM\n"
        b"wait\n"
    )
    registry.push_busybox(node.registry, "library/nginx", "latest", cmd=["/bin/serve"], files={"bin/serve": script})


# The load-balancer pool, routed to the node from the "world" namespace
# (the outside, as a client on the node's network sees it).
LB_POOL = "198.51.100.0/29"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    extra = ["--load-balancer-pool", LB_POOL, "--node-external-ip", agent_bed.nodes.NODE_IP]
    with AgentNode(tmp_path_factory.mktemp("deployments"), extra_args=extra) as node:
        outside("ip", "route", "add", LB_POOL, "via", agent_bed.nodes.NODE_IP, node=node)
        nginx_image(node)
        registry.push_busybox(node.registry, "library/busybox", "1.36")
        node.v1 = web_image(node, "web", "1")
        node.v2 = web_image(node, "web", "2")
        node.apps = client.AppsV1Api(node.portal.api_client())
        yield node


@pytest.fixture(autouse=True)
def clean_namespace(node):
    """After each test, whatever it left (also on failure) is removed, so
    one failure does not become the next test's leftovers."""
    yield

    def delete(remove, name):
        try:
            remove(name, NS)
        except client.ApiException as error:
            if error.status != 404:  # the garbage collector was first
                raise
    for d in node.apps.list_namespaced_deployment(NS).items:
        delete(node.apps.delete_namespaced_deployment, d.metadata.name)
    for rs in node.apps.list_namespaced_replica_set(NS).items:
        delete(node.apps.delete_namespaced_replica_set, rs.metadata.name)
    for s in node.core.list_namespaced_service(NS).items:
        if s.metadata.name != "kubernetes":
            delete(node.core.delete_namespaced_service, s.metadata.name)
    node.core.delete_collection_namespaced_pod(NS)
    wait_for(lambda: not node.core.list_namespaced_pod(NS).items and not node.apps.list_namespaced_replica_set(NS).items,
             "the namespace empty", 90)


@pytest.fixture
def kubectl(node, tmp_path):
    return Kubectl("kubectl", node.portal, tmp_path)


def outside(*command, node):
    """`command` run in the world namespace, outside the node."""
    return subprocess.run(["nsenter", f"--net=/run/netns/{node.cluster.world}", *command],
                          capture_output=True, text=True, timeout=30, check=True).stdout


def fetch_from_outside(node, url, host=None):
    """(status, body) of a GET from outside the node (0 when it fails)."""
    extra = ["-H", f"Host: {host}"] if host else []
    result = subprocess.run(["nsenter", f"--net=/run/netns/{node.cluster.world}", "curl", "-sS", "--max-time", "5",
                             *extra, "-w", "\n%{http_code}", url], capture_output=True, text=True, timeout=30)
    body, _, code = result.stdout.rpartition("\n")
    return int(code or 0), body.strip()


def pods_of(node, selector):
    return [p for p in node.core.list_namespaced_pod(NS, label_selector=selector).items if p.metadata.deletion_timestamp is None]


def ready(pod):
    statuses = pod.status.container_statuses or []
    return pod.status.phase == "Running" and statuses and all(s.ready for s in statuses)


def all_gone(node, selector):
    """No pod of the selector exists any more and the node keeps nothing of
    them (processes, mounts, namespaces, cgroups, links)."""
    return not node.core.list_namespaced_pod(NS, label_selector=selector).items and not any(node.leftovers().values())


TUTORIAL = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: my-nginx
spec:
  selector:
    matchLabels:
      run: my-nginx
  replicas: 2
  template:
    metadata:
      labels:
        run: my-nginx
    spec:
      containers:
      - name: my-nginx
        image: nginx
        ports:
        - containerPort: 80
"""


def test_the_services_tutorial(node, kubectl):
    """`services-tutorial.txt` from its first command: the Deployment, its
    pods (`<deployment>-<hash>-<5>`), `expose`, the Service's variables in
    pods made after it (`scale 0 → 2`), reached by name."""
    assert "deployment.apps/my-nginx created" in kubectl.apply(TUTORIAL)
    pods = wait_for(lambda: (p := pods_of(node, "run=my-nginx")) and len(p) == 2 and all(ready(x) for x in p) and p, "2 my-nginx pods running", 90)
    rs = node.apps.list_namespaced_replica_set(NS, label_selector="run=my-nginx").items
    assert len(rs) == 1
    hash_ = rs[0].metadata.labels["pod-template-hash"]
    assert rs[0].metadata.name == f"my-nginx-{hash_}"
    for pod in pods:
        prefix, suffix = pod.metadata.name.rsplit("-", 1)
        assert prefix == f"my-nginx-{hash_}" and len(suffix) == 5, pod.metadata.name
        assert pod.metadata.labels["pod-template-hash"] == hash_
    out = kubectl.out("get", "pods", "-l", "run=my-nginx", "-o", "wide")
    assert all(p.metadata.name in out for p in pods)
    line = wait_for(lambda: (l := kubectl.out("get", "deployment", "my-nginx").splitlines()[1]) and l.split()[1:4] == ["2/2", "2", "2"] and l, "READY 2/2")
    assert line.split()[0] == "my-nginx"

    assert "service/my-nginx exposed" in kubectl.out("expose", "deployment/my-nginx")
    service = node.core.read_namespaced_service("my-nginx", NS)
    assert service.spec.selector == {"run": "my-nginx"} and service.spec.ports[0].port == 80
    ips = sorted(p.status.pod_ip for p in pods)
    wait_for(lambda: f"{ips[0]}:80" in kubectl.out("describe", "svc", "my-nginx"), "the endpoints in describe")

    # Pods made before the Service do not have its variables; after a
    # scale to zero and back, the new ones do (`env`: the test busybox
    # has no `printenv` applet).
    env = kubectl.out("exec", pods[0].metadata.name, "--", "env")
    assert "MY_NGINX_SERVICE_HOST" not in env
    old_ips = {p.status.pod_ip for p in pods}
    kubectl.out("scale", "deployment", "my-nginx", "--replicas=0")
    wait_for(lambda: not pods_of(node, "run=my-nginx"), "the pods to go")
    kubectl.out("scale", "deployment", "my-nginx", "--replicas=2")
    pods = wait_for(lambda: (p := pods_of(node, "run=my-nginx")) and len(p) == 2 and all(ready(x) for x in p) and p, "2 new pods running", 90)
    env = kubectl.out("exec", pods[0].metadata.name, "--", "env")
    assert f"MY_NGINX_SERVICE_HOST={service.spec.cluster_ip}" in env
    assert "MY_NGINX_SERVICE_PORT=80" in env
    assert len(node.apps.list_namespaced_replica_set(NS, label_selector="run=my-nginx").items) == 1, "a scale is not a rollout"

    # Reached through the Service, by name, from a pod, once the proxy
    # sends to the new pods only.
    new_ips = {p.status.pod_ip for p in pods}
    wait_for(lambda: new_ips <= (targets := agent_bed.dnat_targets()) and not (old_ips - new_ips) & targets,
             "the proxy to program the new pods only")
    names = {p.metadata.name for p in pods}
    out = kubectl.run_to_completion("curl", "busybox:1.36", "sh", "-c",
                                    "timeout 5 wget -qO- http://my-nginx/; nslookup my-nginx | grep -c Address")
    assert out.split()[0] in names, out

    # Exposing the Service: a NodePort on the node's ExternalIP, then
    # `kubectl edit` to type LoadBalancer, an address from the pool; both
    # reached from outside the node.
    kubectl.out("patch", "svc", "my-nginx", "-p", '{"spec": {"type": "NodePort"}}')
    yaml_text = kubectl.out("get", "svc", "my-nginx", "-o", "yaml")
    node_port = int(re.search(r"nodePort: (\d+)", yaml_text).group(1))
    assert re.search(rf"address: {re.escape(agent_bed.nodes.NODE_IP)}\s+type: ExternalIP", kubectl.out("get", "nodes", "-o", "yaml"))
    code, name = wait_for(lambda: (r := fetch_from_outside(node, f"http://{agent_bed.nodes.NODE_IP}:{node_port}/"))[0] == 200 and r,
                          "my-nginx on the node port from outside")
    assert name in names, name
    editor = kubectl.tmp / "to-load-balancer.sh"
    editor.write_text("#!/bin/sh\nsed -i 's/type: NodePort/type: LoadBalancer/' \"$1\"\n")
    editor.chmod(0o755)
    assert "service/my-nginx edited" in kubectl.out("edit", "svc", "my-nginx", env={"KUBE_EDITOR": str(editor), "EDITOR": str(editor)})
    line = wait_for(lambda: (l := kubectl.out("get", "svc", "my-nginx").splitlines()[1].split()) and l[3] != "<pending>" and l,
                    "an EXTERNAL-IP for my-nginx")
    assert line[1] == "LoadBalancer" and ipaddress.ip_address(line[3]) in ipaddress.ip_network(LB_POOL), line
    code, name = wait_for(lambda: (r := fetch_from_outside(node, f"http://{line[3]}/"))[0] == 200 and r,
                          "my-nginx on its load-balancer address from outside")
    assert name in names, name

    kubectl.out("delete", "service", "my-nginx")
    kubectl.out("delete", "deployment", "my-nginx")
    wait_for(lambda: all_gone(node, "run=my-nginx"), "the pods and everything on the node to go", 60)
    wait_for(lambda: not node.apps.list_namespaced_replica_set(NS, label_selector="run=my-nginx").items, "the ReplicaSet collected")


def web_deployment(name, image, replicas, **spec):
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "web",
                        "image": image,
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1},
                        # Serve until the endpoints have dropped the pod, as users do.
                        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "2"]}}},
                    }],
                },
            },
            **spec,
        },
    }


class Load:
    """Requests to a URL, one after another on a thread, until stopped
    (bounded: at most `limit` requests)."""

    def __init__(self, url, limit=20000, headers=None):
        self.url, self.limit, self.headers = url, limit, headers or {}
        self.ok = 0
        self.failed = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        for _ in range(self.limit):
            if self.stop.is_set():
                return
            try:
                with urllib.request.urlopen(urllib.request.Request(self.url, headers=self.headers), timeout=5) as response:
                    response.read()
                self.ok += 1
            except Exception as error:  # noqa: BLE001 - every failure counts
                self.failed.append(repr(error))
            time.sleep(0.005)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)


def test_rolling_update_under_load_loses_no_request(node, kubectl):
    """4 replicas behind a Service, maxUnavailable 0: `set image` rolls
    them all while a client keeps asking, and none of its requests fail;
    history, undo, pause/resume and restart as kubectl shows them."""
    body = web_deployment("roll", node.v1, 4, strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    node.apps.create_namespaced_deployment(NS, body)
    node.core.create_namespaced_service(NS, {"metadata": {"name": "roll"}, "spec": {"selector": {"app": "roll"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    assert 'deployment "roll" successfully rolled out' in kubectl.out("rollout", "status", "deployment/roll", "--timeout=90s")
    ip = node.core.read_namespaced_service("roll", NS).spec.cluster_ip
    agent_bed.wait_programmed(ip)
    first = {p.metadata.name for p in pods_of(node, "app=roll")}

    with Load(f"http://{ip}/name.txt") as load:
        wait_for(lambda: load.ok > 10, "the load to run")
        assert "image updated" in kubectl.out("set", "image", "deployment/roll", f"web={node.v2}")
        out = kubectl.out("rollout", "status", "deployment/roll", "--timeout=120s")
        assert 'deployment "roll" successfully rolled out' in out
        done = load.ok
        wait_for(lambda: load.ok > done + 10, "more requests after the rollout")
    assert not load.failed, f"{len(load.failed)} of {load.ok + len(load.failed)} requests failed: {load.failed[:5]}"
    pods = pods_of(node, "app=roll")
    assert len(pods) == 4 and not first & {p.metadata.name for p in pods}
    assert {p.spec.containers[0].image for p in pods} == {node.v2}

    deployment = node.apps.read_namespaced_deployment("roll", NS)
    assert deployment.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    conditions = {c.type: (c.status, c.reason) for c in deployment.status.conditions}
    assert conditions == {"Available": ("True", "MinimumReplicasAvailable"), "Progressing": ("True", "NewReplicaSetAvailable")}
    sets = node.apps.list_namespaced_replica_set(NS, label_selector="app=roll").items
    sizes = sorted((s.metadata.annotations["deployment.kubernetes.io/revision"], s.spec.replicas) for s in sets)
    assert sizes == [("1", 0), ("2", 4)]
    events = [e.message for e in node.core.list_namespaced_event(NS, field_selector="involvedObject.name=roll").items]
    assert any(m.startswith("Scaled down replica set roll-") for m in events), events

    history = kubectl.out("rollout", "history", "deployment/roll")
    assert history.split("\n")[0].startswith("deployment.apps/roll")
    assert [l.split()[0] for l in history.splitlines()[2:] if l.strip()] == ["1", "2"], history

    # Back to the first template: its ReplicaSet again, as revision 3.
    assert "rolled back" in kubectl.out("rollout", "undo", "deployment/roll")
    kubectl.out("rollout", "status", "deployment/roll", "--timeout=120s")
    assert {p.spec.containers[0].image for p in pods_of(node, "app=roll")} == {node.v1}
    sets = node.apps.list_namespaced_replica_set(NS, label_selector="app=roll").items
    assert len(sets) == 2
    first_rs = next(s for s in sets if s.spec.template.spec.containers[0].image == node.v1)
    assert first_rs.metadata.annotations["deployment.kubernetes.io/revision"] == "3"
    assert first_rs.metadata.annotations["deployment.kubernetes.io/revision-history"] == "1"

    # Paused: template changes wait; resumed: they roll out.
    assert "paused" in kubectl.out("rollout", "pause", "deployment/roll")
    kubectl.out("set", "image", "deployment/roll", f"web={node.v2}")
    wait_for(lambda: (d := node.apps.read_namespaced_deployment("roll", NS)).status.observed_generation == d.metadata.generation
             and any(c.reason == "DeploymentPaused" for c in d.status.conditions), "the pause observed")
    assert len(node.apps.list_namespaced_replica_set(NS, label_selector="app=roll").items) == 2, "no rollout while paused"
    assert "resumed" in kubectl.out("rollout", "resume", "deployment/roll")
    kubectl.out("rollout", "status", "deployment/roll", "--timeout=120s")
    assert {p.spec.containers[0].image for p in pods_of(node, "app=roll")} == {node.v2}

    before = {p.metadata.name for p in pods_of(node, "app=roll")}
    assert "restarted" in kubectl.out("rollout", "restart", "deployment/roll")
    kubectl.out("rollout", "status", "deployment/roll", "--timeout=120s")
    wait_for(lambda: len(p := pods_of(node, "app=roll")) == 4 and not before & {x.metadata.name for x in p}, "all pods replaced")

    node.core.delete_namespaced_service("roll", NS)
    kubectl.out("delete", "deployment", "roll")
    wait_for(lambda: all_gone(node, "app=roll"), "nothing left of roll", 60)


def test_an_ingress_routes_to_deployments_and_a_rollout_through_it_loses_no_request(node, kubectl):
    """Issue 32's acceptance on a real node: two Deployments behind
    Services, an Ingress routing `a.example.test/` and
    `b.example.test/api` (Prefix) to them through the built-in proxy,
    published as a LoadBalancer Service with an address from the pool;
    rolling `a` while a client asks through the Ingress loses no request."""
    # `b` serves under /api/ (a site of its own).
    script = (b"#!/bin/sh\nmkdir -p /var/www/api\nhostname > /var/www/api/name.txt\n"
              b"exec httpd -f -p 8080 -h /var/www\n")
    registry.push_busybox(node.registry, "apiweb", "1", cmd=["/bin/serve"], files={"bin/serve": script})
    b_deployment = web_deployment("ing-b", f"{node.registry.host}/apiweb:1", 1)
    probe = b_deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGet"]["path"] = "/api/name.txt"
    node.apps.create_namespaced_deployment(NS, web_deployment("ing-a", node.v1, 2, strategy={
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}))
    node.apps.create_namespaced_deployment(NS, b_deployment)
    for name in ("ing-a", "ing-b"):
        kubectl.out("expose", "deployment", name, "--port=80", "--target-port=8080")
        kubectl.out("rollout", "status", f"deployment/{name}", "--timeout=90s")
    kubectl.out("create", "ingress", "sites", "--rule=a.example.test/*=ing-a:80", "--rule=b.example.test/api*=ing-b:80")
    networking = client.NetworkingV1Api(node.portal.api_client())
    status = wait_for(lambda: networking.read_namespaced_ingress("sites", NS).status.load_balancer.ingress,
                      "the Ingress to be served")
    # The proxy is published as the LoadBalancer Service
    # kube-system/portal-ingress (its endpoint: the node's ports 80 and
    # 443); the Ingress shows the address the pool gave it.
    published = node.core.read_namespaced_service("portal-ingress", "kube-system")
    assert published.spec.type == "LoadBalancer" and [p.port for p in published.spec.ports] == [80, 443]
    given = wait_for(lambda: node.core.read_namespaced_service("portal-ingress", "kube-system").status.load_balancer.ingress,
                     "an address for the ingress proxy")[0].ip
    assert ipaddress.ip_address(given) in ipaddress.ip_network(LB_POOL)
    status = wait_for(lambda: (s := networking.read_namespaced_ingress("sites", NS).status.load_balancer.ingress)
                      and s[0].ip == given and s, "the Ingress to show the load-balancer address")
    address = status[0].ip
    slices = client.DiscoveryV1Api(node.portal.api_client()).list_namespaced_endpoint_slice(
        "kube-system", label_selector="kubernetes.io/service-name=portal-ingress").items
    assert [(e.addresses, e.node_name) for s in slices for e in s.endpoints] == [([agent_bed.nodes.NODE_IP], "node-1")]

    def fetch(host, path):
        request = urllib.request.Request(f"http://{address}{path}", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode().strip()
        except urllib.error.HTTPError as error:
            return error.code, ""

    # The endpoints may reach the proxy after the Ingress: wait for them.
    wait_for(lambda: fetch("a.example.test", "/name.txt")[0] == 200, "a's pods behind the Ingress")
    code, name = fetch("a.example.test", "/name.txt")
    assert name.startswith("ing-a-"), name
    code, name = wait_for(lambda: (r := fetch("b.example.test", "/api/name.txt"))[0] == 200 and r, "b's pod behind the Ingress")
    assert name.startswith("ing-b-"), name
    assert fetch("b.example.test", "/name.txt")[0] == 404, "only /api goes to b"
    # From outside the node, as users reach it.
    code, name = wait_for(lambda: (r := fetch_from_outside(node, f"http://{address}/api/name.txt", host="b.example.test"))[0] == 200
                          and r, "b through the load-balancer address from outside")
    assert name.startswith("ing-b-"), name

    with Load(f"http://{address}/name.txt", headers={"Host": "a.example.test"}) as load:
        wait_for(lambda: load.ok > 10, "the load to run")
        kubectl.out("set", "image", "deployment/ing-a", f"web={node.v2}")
        kubectl.out("rollout", "status", "deployment/ing-a", "--timeout=120s")
        done = load.ok
        wait_for(lambda: load.ok > done + 10, "more requests after the rollout")
    assert not load.failed, f"{len(load.failed)} of {load.ok + len(load.failed)} requests failed: {load.failed[:5]}"
    print(f"through the Ingress during the rollout: {load.ok} requests, none failed")
    kubectl.out("delete", "ingress", "sites")
    kubectl.out("delete", "deployment", "ing-a", "ing-b")
    wait_for(lambda: all_gone(node, "app in (ing-a,ing-b)"), "nothing left of the sites", 60)


def test_a_bad_image_runs_into_the_progress_deadline(node, kubectl):
    """A rollout to an image that does not exist stalls: the old pods keep
    serving, and `rollout status` reports the deadline."""
    node.apps.create_namespaced_deployment(NS, web_deployment("stall", node.v1, 2, progressDeadlineSeconds=8))
    kubectl.out("rollout", "status", "deployment/stall", "--timeout=90s")
    kubectl.out("set", "image", "deployment/stall", f"web={node.registry.host}/web:missing")
    result = kubectl("rollout", "status", "deployment/stall", "--timeout=90s", check=False)
    assert result.returncode != 0
    assert 'deployment "stall" exceeded its progress deadline' in result.stderr, result.stderr
    deployment = node.apps.read_namespaced_deployment("stall", NS)
    progressing = next(c for c in deployment.status.conditions if c.type == "Progressing")
    assert (progressing.status, progressing.reason) == ("False", "ProgressDeadlineExceeded")
    assert progressing.message.endswith("has timed out progressing.")
    ready_old = [p for p in pods_of(node, "app=stall") if p.spec.containers[0].image == node.v1 and ready(p)]
    assert len(ready_old) == 2, "maxUnavailable 25% of 2 rounds down to 0: both old pods stay"
    kubectl.out("delete", "deployment", "stall")
    wait_for(lambda: all_gone(node, "app=stall"), "nothing left of stall", 60)


def test_recreate_stops_old_pods_before_starting_new_ones(node, kubectl):
    node.apps.create_namespaced_deployment(NS, web_deployment("recreate", node.v1, 2, strategy={"type": "Recreate"}))
    kubectl.out("rollout", "status", "deployment/recreate", "--timeout=90s")
    old = {p.metadata.uid for p in pods_of(node, "app=recreate")}
    seen_together = []

    def watch():
        for _ in range(4000):
            pods = node.core.list_namespaced_pod(NS, label_selector="app=recreate").items
            images = {p.spec.containers[0].image for p in pods}
            if len(images) > 1:
                seen_together.append([p.metadata.name for p in pods])
            if pods and all(p.metadata.uid not in old and ready(p) for p in pods) and len(pods) == 2:
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    kubectl.out("set", "image", "deployment/recreate", f"web={node.v2}")
    kubectl.out("rollout", "status", "deployment/recreate", "--timeout=120s")
    watcher.join(timeout=60)
    assert not seen_together, f"old and new pods at once: {seen_together[:3]}"
    assert {p.spec.containers[0].image for p in pods_of(node, "app=recreate")} == {node.v2}
    kubectl.out("delete", "deployment", "recreate")
    wait_for(lambda: all_gone(node, "app=recreate"), "nothing left of recreate", 60)


def test_cascading_deletion_foreground_and_orphan(node, kubectl):
    """Foreground: pods, then the ReplicaSet, then the Deployment. Orphan:
    the ReplicaSet and its pods stay."""
    node.apps.create_namespaced_deployment(NS, web_deployment("fg", node.v1, 2))
    kubectl.out("rollout", "status", "deployment/fg", "--timeout=90s")
    kubectl.out("delete", "deployment", "fg", "--cascade=foreground", "--wait=true", "--timeout=90s")
    assert not node.apps.list_namespaced_replica_set(NS, label_selector="app=fg").items
    assert not pods_of(node, "app=fg")
    wait_for(lambda: all_gone(node, "app=fg"), "nothing left of fg", 60)

    node.apps.create_namespaced_deployment(NS, web_deployment("orphan", node.v1, 2))
    kubectl.out("rollout", "status", "deployment/orphan", "--timeout=90s")
    kubectl.out("delete", "deployment", "orphan", "--cascade=orphan")
    wait_for(lambda: not node.apps.list_namespaced_deployment(NS, field_selector="metadata.name=orphan").items, "the Deployment gone")
    sets = node.apps.list_namespaced_replica_set(NS, label_selector="app=orphan").items
    assert len(sets) == 1 and not sets[0].metadata.owner_references
    assert len([p for p in pods_of(node, "app=orphan") if ready(p)]) == 2
    node.apps.delete_namespaced_replica_set(sets[0].metadata.name, NS)
    wait_for(lambda: all_gone(node, "app=orphan"), "nothing left of orphan", 60)


@pytest.mark.parametrize("binary", KUBECTLS)
def test_create_set_image_and_undo_with_each_kubectl(node, tmp_path, binary):
    """`create deployment` (protobuf from kubectl 1.32), `set image`, and
    `rollout undo` back to the first template re-use its ReplicaSet with
    every kubectl (1.20 sends the template back as JSON it decoded)."""
    kubectl = Kubectl(binary, node.portal, tmp_path)
    name = f"undo-{client_minor(binary)}"
    kubectl.out("create", "deployment", name, f"--image={node.v1}", "--replicas=1", "--port=8080")
    template = node.apps.read_namespaced_deployment(name, NS).spec.template
    assert template.metadata.creation_timestamp is None
    assert not template.spec.containers[0].stdin and "stdin" not in kubectl.out("get", "deployment", name, "-o", "yaml")
    kubectl.out("rollout", "status", f"deployment/{name}", "--timeout=90s")
    kubectl.out("set", "image", f"deployment/{name}", f"*={node.v2}")
    kubectl.out("rollout", "status", f"deployment/{name}", "--timeout=90s")
    kubectl.out("rollout", "undo", f"deployment/{name}")
    kubectl.out("rollout", "status", f"deployment/{name}", "--timeout=90s")
    sets = node.apps.list_namespaced_replica_set(NS, label_selector=f"app={name}").items
    revisions = sorted((s.metadata.annotations["deployment.kubernetes.io/revision"], s.spec.template.spec.containers[0].image) for s in sets)
    assert revisions == [("2", node.v2), ("3", node.v1)], revisions
    kubectl.out("delete", "deployment", name)
    wait_for(lambda: all_gone(node, f"app={name}"), f"nothing left of {name}", 60)
