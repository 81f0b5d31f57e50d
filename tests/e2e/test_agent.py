"""The node agent runs pods for real (issue 12, SPEC W1, D1, D2): images
pulled from a registry on the node's loopback, pods in their own network
namespaces with addresses from the node's pod range, Services reaching
them through the kernel proxy, the cluster DNS at the kube-dns address,
and nothing left behind. All inside network namespaces the tests make."""

import ipaddress
import subprocess
import threading
import time

import pytest

import nodes
from agent_bed import NS, AgentNode, busybox_image, container_pids, pod_manifest, wait_for, web_image


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with AgentNode(tmp_path_factory.mktemp("agent")) as node:
        node.web = web_image(node)
        node.busybox = busybox_image(node)
        yield node


def rc(name, image, replicas, labels):
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": labels,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": image, "ports": [{"containerPort": 8080, "name": "http"}]}], "terminationGracePeriodSeconds": 1},
            },
        },
    }


def service(name, selector=None, port=80, target=8080):
    spec = {"ports": [{"port": port, "targetPort": target}]}
    if selector:
        spec["selector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def running_pods(node, selector):
    pods = node.core.list_namespaced_pod(NS, label_selector=selector).items
    ready = [p for p in pods if p.status.phase == "Running" and all(s.ready for s in p.status.container_statuses or [])]
    return ready if len(ready) == len(pods) else None


def http(url, timeout=5):
    result = subprocess.run(["wget", "-qO-", "-T", str(timeout), url], capture_output=True, text=True, timeout=timeout + 5)
    return result.stdout if result.returncode == 0 else None


def pod_output(node, name, timeout=60):
    """Runs to completion; returns what the pod printed."""
    wait_for(lambda: node.pod(name).status.phase in ("Succeeded", "Failed"), f"pod {name} to finish", timeout)
    return node.log(name)


def test_replicated_pods_behind_a_service(node):
    """An RC of 3 + a Service: pods Running on the node's range, listed in
    the Endpoints, reachable by cluster IP and by name from a pod, each
    with the Service variables of the Services that existed when it
    started (and not of later ones)."""
    core = node.core
    labels = {"app": "web"}
    core.create_namespaced_service(NS, service("before", {"app": "nothing"}))
    core.create_namespaced_service(NS, service("web", labels))
    core.create_namespaced_replication_controller(NS, rc("web", node.web, 3, labels))
    pods = wait_for(lambda: running_pods(node, "app=web") if len(core.list_namespaced_pod(NS, label_selector="app=web").items) == 3 else None, "3 web pods running", 60)
    core.create_namespaced_service(NS, service("after", {"app": "nothing"}))
    pod_range = ipaddress.ip_network(core.read_node(node.node_name).spec.pod_cidr)
    ips = sorted(p.status.pod_ip for p in pods)
    assert all(ipaddress.ip_address(ip) in pod_range for ip in ips), (ips, pod_range)
    assert len(set(ips)) == 3
    assert all(p.spec.node_name == node.node_name and p.status.host_ip == nodes.NODE_IP for p in pods)

    def endpoint_ips():
        subsets = core.read_namespaced_endpoints("web", NS).subsets or []
        return sorted(a.ip for s in subsets for a in s.addresses or [])
    wait_for(lambda: endpoint_ips() == ips, "the Endpoints to list the pods")

    # Each pod serves the environment it started with.
    for pod in pods:
        env = http(f"http://{pod.status.pod_ip}:8080/env.txt")
        assert env is not None, f"{pod.metadata.name} does not serve"
        variables = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
        web_ip = core.read_namespaced_service("web", NS).spec.cluster_ip
        assert variables.get("WEB_SERVICE_HOST") == web_ip
        assert variables.get("WEB_SERVICE_PORT") == "80"
        assert variables.get("WEB_PORT") == f"tcp://{web_ip}:80"
        assert variables.get("WEB_PORT_80_TCP_ADDR") == web_ip
        assert "BEFORE_SERVICE_HOST" in variables
        assert "AFTER_SERVICE_HOST" not in variables, "a Service made after the pod started"
        assert variables.get("KUBERNETES_SERVICE_HOST") == core.read_namespaced_service("kubernetes", NS).spec.cluster_ip
        assert variables.get("HOSTNAME") == pod.metadata.name

    # A client pod reaches the Service by address and by every name form,
    # once the proxy has programmed it (it rejects until then).
    cluster_ip = core.read_namespaced_service("web", NS).spec.cluster_ip
    wait_for(lambda: http(f"http://{cluster_ip}/name.txt", timeout=1), "the Service to answer from the node")
    script = (
        f"for target in {cluster_ip} web web.{NS} web.{NS}.svc.cluster.local; do "
        # (busybox-static's wget -T segfaults: the timeout applet bounds it.)
        "  echo \"$target $(timeout 5 wget -qO- http://$target/name.txt)\"; "
        "done; nslookup web | grep -c Address; cat /etc/resolv.conf"
    )
    core.create_namespaced_pod(NS, pod_manifest("client", node.busybox, ["sh", "-c", script], restartPolicy="Never"))
    out = pod_output(node, "client")
    names = {p.metadata.name for p in pods}
    lines = out.splitlines()
    for target in [cluster_ip, "web", f"web.{NS}", f"web.{NS}.svc.cluster.local"]:
        line = next((l for l in lines if l.startswith(f"{target} ")), "")
        assert line.split(" ", 1)[-1] in names, f"{target} did not reach a web pod:\n{out}"
    assert f"search {NS}.svc.cluster.local svc.cluster.local cluster.local" in out
    assert "nameserver 10.96.0.10" in out and "options ndots:5" in out
    assert node.pod("client").status.phase == "Succeeded"
    core.delete_namespaced_pod("client", NS)
    for name in ("before", "after"):
        core.delete_namespaced_service(name, NS)


def test_scale_to_zero_and_back_leaves_nothing(node):
    core = node.core
    old = {p.status.pod_ip for p in running_pods(node, "app=web")}
    core.patch_namespaced_replication_controller_scale("web", NS, {"spec": {"replicas": 0}})
    wait_for(lambda: not core.list_namespaced_pod(NS, label_selector="app=web").items, "the pods to go")
    # The agent ends the containers within their grace period (1 s here).
    wait_for(lambda: not node.leftovers()["netns"] and not container_pids(node.data_dir / "agent"), "the pods' sandboxes and containers to go")
    left = node.leftovers()
    assert left == {"processes": [], "mounts": [], "netns": [], "cgroups": []}, left
    leases = [p.name for p in (node.data_dir / "agent" / "leases").iterdir() if p.name != "last"]
    assert leases == [], f"addresses still leased: {leases}"
    core.patch_namespaced_replication_controller_scale("web", NS, {"spec": {"replicas": 3}})
    pods = wait_for(lambda: (lambda p: p if p and len(p) == 3 else None)(running_pods(node, "app=web")), "3 new pods", 60)
    new = {p.status.pod_ip for p in pods}
    assert not (new & old), f"new pods got old addresses at once: {new & old}"


def test_containers_outlive_a_killed_server(node):
    """kill -9 of portal server with pods serving: the same container
    processes afterwards, no restarts, and the Service keeps answering
    while the server is down (the kernel proxy's rules stay)."""
    core = node.core
    wait_for(lambda: (lambda p: p if p and len(p) == 3 else None)(running_pods(node, "app=web")), "3 web pods")
    before = container_pids(node.data_dir / "agent")
    cluster_ip = core.read_namespaced_service("web", NS).spec.cluster_ip
    failures, done = [], threading.Event()

    def load():
        count = 0
        while not done.is_set() and count < 2000:
            if http(f"http://{cluster_ip}/name.txt", timeout=2) is None:
                failures.append(time.monotonic())
            count += 1
            time.sleep(0.02)
    client = threading.Thread(target=load)
    client.start()
    try:
        time.sleep(1)
        node.restart(kill=True)
        time.sleep(3)
    finally:
        done.set()
        client.join()
    assert not failures, f"{len(failures)} requests failed while the server restarted"
    after = container_pids(node.data_dir / "agent")
    assert after == before, "containers were replaced"
    time.sleep(2)
    pods = running_pods(node, "app=web")
    assert pods and all(s.restart_count == 0 for p in pods for s in p.status.container_statuses)


def test_missing_image_backs_off(node):
    core = node.core
    core.create_namespaced_pod(NS, pod_manifest("ghost", f"{node.registry.host}/nope:1"))

    def reason():
        statuses = node.pod("ghost").status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting.reason if waiting else None
    wait_for(lambda: reason() == "ErrImagePull", "ErrImagePull")
    wait_for(lambda: reason() == "ImagePullBackOff", "ImagePullBackOff")
    events = node.events("ghost")
    assert any(t == "Warning" and r == "Failed" and "Failed to pull image" in m for t, r, m in events), events
    assert any(r == "BackOff" and "Back-off pulling image" in m for _, r, m in events), events
    assert node.pod("ghost").status.phase == "Pending"
    row = node.kubectl("get", "pod", "ghost").splitlines()[1].split()
    assert row[2] in ("ErrImagePull", "ImagePullBackOff"), row
    core.delete_namespaced_pod("ghost", NS)


def test_bad_command_is_reported_and_others_keep_running(node):
    core = node.core
    core.create_namespaced_pod(NS, pod_manifest("broken", node.busybox, ["/no/such/binary"]))

    def terminated():
        statuses = node.pod("broken").status.container_statuses or []
        state = statuses[0] if statuses else None
        last = state and (state.state.terminated or (state.last_state and state.last_state.terminated))
        return last
    last = wait_for(terminated, "the failed start to be reported")
    assert last.reason == "StartError" and "no/such/binary" in (last.message or ""), last
    assert any(r == "Failed" for _, r, _ in node.events("broken"))
    assert running_pods(node, "app=web"), "other pods stopped"
    core.delete_namespaced_pod("broken", NS)


def test_memory_limit_is_enforced(node):
    core = node.core
    body = pod_manifest("hog", node.busybox, ["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"], restartPolicy="Never")
    body["spec"]["containers"][0]["resources"] = {"limits": {"memory": "32Mi"}}
    core.create_namespaced_pod(NS, body)
    wait_for(lambda: node.pod("hog").status.phase == "Failed", "the pod to fail", 60)
    state = node.pod("hog").status.container_statuses[0].state.terminated
    assert state.reason == "OOMKilled" and state.exit_code == 137, state
    assert "survived" not in node.log("hog")
    core.delete_namespaced_pod("hog", NS)


def test_host_network_and_dns_policy_default(node):
    core = node.core
    body = pod_manifest("hostnet", node.busybox, ["sh", "-c", "cat /etc/resolv.conf; echo; ip -4 addr show eth0 2>/dev/null | grep -c 192.168.99.1"], restartPolicy="Never", hostNetwork=True)
    core.create_namespaced_pod(NS, body)
    out = pod_output(node, "hostnet")
    assert node.pod("hostnet").status.pod_ip == nodes.NODE_IP
    assert "nameserver 10.96.0.10" not in out, "a host-network pod keeps the node's DNS"
    assert out.strip().splitlines()[-1] == "1", f"not in the node's network:\n{out}"
    body = pod_manifest("plaindns", node.busybox, ["cat", "/etc/resolv.conf"], restartPolicy="Never", dnsPolicy="Default")
    core.create_namespaced_pod(NS, body)
    out = pod_output(node, "plaindns")
    host = open("/etc/resolv.conf").read()
    assert [l for l in out.splitlines() if l.startswith("nameserver")] == [l for l in host.splitlines() if l.startswith("nameserver")]
    for name in ("hostnet", "plaindns"):
        core.delete_namespaced_pod(name, NS)
