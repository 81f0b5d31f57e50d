"""The node agent runs pods for real (issue 12, SPEC W1, D1, D2): images
pulled from a registry on the node's loopback, pods in their own network
namespaces with addresses from the node's pod range, Services reaching
them through the kernel proxy, the cluster DNS at the kube-dns address,
and nothing left behind. All inside network namespaces the tests make."""

import gzip
import hashlib
import io
import ipaddress
import json
import subprocess
import tarfile
import threading
import time

import pytest

from conftest import BINARY
from support import agent_bed, nodes, registry
from support.agent_bed import NS, AgentNode, busybox_image, container_pids, pod_manifest, web_image
from support.metrics import proxy_syncs, scrape, value
from support.waiting import holds_for, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


EXTERNAL_IP = "203.0.113.7"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    # An address from outside the cluster (a documentation range).
    with AgentNode(tmp_path_factory.mktemp("agent"), extra_args=["--node-external-ip", EXTERNAL_IP]) as node:
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
    result = subprocess.run(["wget", "-qO-", "--tries=1", "-T", str(timeout), url], capture_output=True, text=True, timeout=timeout + 5)
    return result.stdout if result.returncode == 0 else None


def pod_output(node, name, timeout=60):
    """Runs to completion; returns what the pod printed."""
    wait_for(lambda: node.pod(name).status.phase in ("Succeeded", "Failed"), f"pod {name} to finish", timeout)
    return node.log(name)


def test_the_node_publishes_its_addresses(node):
    """The reference tutorial finds a node's ExternalIP in `kubectl get
    nodes -o yaml`; `-o wide` shows both addresses."""
    addresses = {(a.type, a.address) for a in node.core.read_node(node.node_name).status.addresses}
    assert ("ExternalIP", EXTERNAL_IP) in addresses and ("InternalIP", nodes.NODE_IP) in addresses, addresses
    wide = node.kubectl("get", "nodes", "-o", "wide")
    columns = wide.splitlines()[0].split()
    row = next(line.split() for line in wide.splitlines()[1:] if line.startswith(node.node_name))
    assert row[columns.index("EXTERNAL-IP")] == EXTERNAL_IP, wide
    assert "ExternalIP" in node.kubectl("get", "nodes", "-o", "yaml")


def test_cluster_info_dump_carries_pod_logs(node):
    """`kubectl cluster-info dump` (what a newcomer is told to run when
    something is wrong) reads every kind it lists and each pod's log."""
    node.core.create_namespaced_pod(NS, pod_manifest("chatty", node.busybox,
                                                     ["sh", "-c", "echo hello from chatty; sleep 3600"]))
    try:
        node.wait_running("chatty")
        wait_for(lambda: "hello from chatty" in node.log("chatty"), "the pod's first line")
        out = node.kubectl("cluster-info", "dump", "--namespaces", NS)
        assert f"==== START logs for container chatty of pod {NS}/chatty ====" in out, out[-2000:]
        assert "hello from chatty" in out
    finally:
        node.core.delete_namespaced_pod("chatty", NS, grace_period_seconds=0)


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
    agent_bed.wait_programmed(cluster_ip)
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
    # The agent ends the containers within their grace period (1 s here),
    # then removes the pod's parts one after another (containers, sandbox,
    # network, volumes, lease): wait for all of them, the last go a moment
    # after the first (a CI run once saw the volume still mounted).
    nothing = {"processes": [], "mounts": [], "netns": [], "cgroups": [], "links": [], "sockets": [], "leases": []}

    def left():
        found = node.leftovers()
        found["leases"] = [p.name for p in (node.data_dir / "agent" / "leases").iterdir() if p.name != "last"]
        if container_pids(node.data_dir / "agent"):
            found["processes"] = found["processes"] or ["(a container)"]
        return found

    seen = [None]
    try:
        wait_for(lambda: seen.__setitem__(0, left()) or seen[0] == nothing, "the pods' sandboxes, containers, volumes and leases to go")
    except AssertionError:
        raise AssertionError(f"left on the node: {seen[0]}") from None
    core.patch_namespaced_replication_controller_scale("web", NS, {"spec": {"replicas": 3}})
    pods = wait_for(lambda: (lambda p: p if p and len(p) == 3 else None)(running_pods(node, "app=web")), "3 new pods", 60)
    new = {p.status.pod_ip for p in pods}
    assert not (new & old), f"new pods got old addresses at once: {new & old}"


def agent_took_over(node, count):
    """The (restarted) server's agent holds `count` pods or more and has
    listed as many running containers (its relist reports both)."""
    text = scrape(node.portal)
    return (value(text, "kubelet_running_pods") or 0) >= count and (value(text, "kubelet_running_containers") or 0) >= count


def describe_containers(node, before, after):
    """Which pod and container each id is, for a failure message."""
    out = {}
    for cid in set(before) | set(after):
        try:
            meta = json.loads((node.data_dir / "agent" / "runtime" / "containers" / cid / "meta.json").read_text())
            out[cid] = (meta.get("pod_name"), meta.get("name"), meta.get("attempt"), cid in before, cid in after)
        except (OSError, ValueError):
            out[cid] = ("?", "?", "?", cid in before, cid in after)
    return out


def started_containers(node):
    return value(scrape(node.portal), "kubelet_started_containers_total")


def test_containers_outlive_a_killed_server(node):
    """kill -9 of portal server with pods serving: the same container
    processes afterwards, no restarts, and the Service keeps answering
    while the server is down (the kernel proxy's rules stay)."""
    core = node.core

    def settled():
        # The three web pods, none of them leaving, and on the node their
        # containers alone (what earlier tests deleted has stopped).
        pods = running_pods(node, "app=web")
        if not pods or len(pods) != 3 or any(p.metadata.deletion_timestamp for p in pods):
            return None
        return pods if len(container_pids(node.data_dir / "agent")) == 3 else None

    pods = wait_for(settled, "3 web pods and only their containers running")
    agent_bed.wait_endpoints_programmed({p.status.pod_ip for p in pods})
    before = container_pids(node.data_dir / "agent")
    cluster_ip = core.read_namespaced_service("web", NS).spec.cluster_ip
    failures, served, done = [], [], threading.Event()

    began = time.monotonic()
    # The pods' resolv.conf keeps the cluster DNS throughout (the restarted
    # agent knows it before it syncs a pod, even with the API still away).
    resolv_files = [node.data_dir / "agent" / "pods" / p.metadata.uid / "resolv.conf" for p in pods]
    lost_dns = []

    def load():
        count = 0
        while not done.is_set() and count < 2000:
            for path in resolv_files:
                text = path.read_text() if path.exists() else ""
                if text and "nameserver 10.96.0.10" not in text:
                    lost_dns.append(text)
            result = subprocess.run(["wget", "-qO-", "--tries=1", "-T", "2", f"http://{cluster_ip}/name.txt"], capture_output=True, text=True, timeout=10)
            if result.returncode != 0:
                failures.append((round(time.monotonic() - began, 2), result.stderr.strip()))
            else:
                served.append(time.monotonic())
            count += 1
            time.sleep(0.02)
    client = threading.Thread(target=load)
    client.start()
    try:
        wait_for(lambda: len(served) >= 10, "the Service answering before the kill")
        node.restart(kill=True)
        # The load goes on until the restarted server has taken the node
        # over: its proxy has synced and its agent has the pods again (from
        # the API) and has listed their containers, and a few more requests
        # were answered after that.
        wait_for(lambda: proxy_syncs(node.portal) >= 1, "the restarted proxy's first sync")
        wait_for(lambda: agent_took_over(node, len(pods)), "the restarted agent to take the pods on")
        settled = len(served)
        wait_for(lambda: len(served) >= settled + 10, "the Service answering after the restart")
    finally:
        done.set()
        client.join()
    assert not failures, f"{len(failures)} requests failed while the server restarted (seconds in, error): {failures}"
    assert not lost_dns, f"a running pod's resolv.conf lost the cluster DNS: {lost_dns[:1]}"
    after = container_pids(node.data_dir / "agent")
    assert after == before, f"containers were replaced: {describe_containers(node, before, after)}"
    # The restarted agent has its pods and their containers (above): it
    # starts no container meanwhile, and the pods report no restart.
    holds_for(lambda: started_containers(node) == 0, "no container started by the restarted agent", 2)
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


def test_exited_container_restarts_and_keeps_the_previous_log(node):
    """restartPolicy Always: a container that exits 1 is restarted (the
    first time at once, then with back-off: CrashLoopBackOff), its last
    run in lastState, and the previous instance's log kept."""
    node.core.create_namespaced_pod(NS, pod_manifest("crash", node.busybox, ["sh", "-c", "echo run; exit 1"]))

    def restarted():
        statuses = node.pod("crash").status.container_statuses or []
        return statuses[0] if statuses and statuses[0].restart_count >= 1 and statuses[0].last_state.terminated else None
    status = wait_for(restarted, "a restart")
    assert status.last_state.terminated.exit_code == 1 and status.last_state.terminated.reason == "Error"
    waiting = wait_for(lambda: (lambda s: s.state.waiting if s.state.waiting and s.state.waiting.reason == "CrashLoopBackOff" else None)(node.pod("crash").status.container_statuses[0]), "CrashLoopBackOff")
    assert "back-off 10s restarting failed container=crash" in waiting.message, waiting.message
    assert node.pod("crash").status.phase == "Running"
    assert node.log("crash", attempt=0).strip() == "run" and node.log("crash", attempt=1).strip() == "run"
    row = node.kubectl("get", "pod", "crash").splitlines()[1].split()
    assert row[2] in ("CrashLoopBackOff", "Error") and row[3].startswith("1"), row
    assert any(r == "BackOff" for _, r, _ in node.events("crash"))
    node.core.delete_namespaced_pod("crash", NS)


def test_metrics_and_health(node):
    result = subprocess.run(["curl", "-sk", "-H", f"Authorization: Bearer {node.portal.token}", f"{node.portal.server}/metrics"], capture_output=True, text=True, timeout=20)
    for name in ("kubelet_pod_start_sli_duration_seconds_count", "kubelet_running_pods", "kubelet_running_containers", "kubelet_started_containers_total", "portal_agent_image_pulls_total"):
        assert name in result.stdout, name
    count = next(float(l.split()[-1]) for l in result.stdout.splitlines() if l.startswith("kubelet_pod_start_sli_duration_seconds_count"))
    assert count >= 1
    health = subprocess.run(["curl", "-sk", "-H", f"Authorization: Bearer {node.portal.token}", f"{node.portal.server}/healthz"], capture_output=True, text=True, timeout=20)
    assert health.stdout.strip() == "ok", health.stdout


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


def test_pull_through_a_registry_mirror(node):
    """`busybox:1.36` means docker.io/library/busybox:1.36; the node's
    `--registry-mirror docker.io=http://…` serves it from the test registry."""
    registry.push_busybox(node.registry, "library/busybox", "1.36")
    node.core.create_namespaced_pod(NS, pod_manifest("hub", "busybox:1.36", ["echo", "from the mirror"], restartPolicy="Never"))
    assert pod_output(node, "hub").strip() == "from the mirror"
    status = node.pod("hub").status.container_statuses[0]
    assert status.image_id.startswith("docker.io/library/busybox@sha256:"), status.image_id
    node.core.delete_namespaced_pod("hub", NS)


def oci_archive(path, name, layer, config):
    """An OCI image layout in a tar (what `skopeo copy … oci-archive:` writes)."""
    blobs = {}

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return f"sha256:{digest}"
    config_blob = json.dumps({"architecture": "amd64", "os": "linux", "config": config, "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest()]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": blob(layer), "size": len(layer)}],
    }).encode()
    manifest_digest = blob(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest, "size": len(manifest), "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "1"}}]}).encode()
    with tarfile.open(path, "w") as archive:
        for member, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)] + [(f"blobs/sha256/{d}", b) for d, b in blobs.items()]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def docker_save_archive(path, name, layer, config):
    """A `docker save` tarball: manifest.json, the config, plain layer tars."""
    raw_layer = gzip.decompress(layer)
    config_blob = json.dumps({"architecture": "amd64", "os": "linux", "config": config, "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw_layer).hexdigest()]}}).encode()
    config_name = hashlib.sha256(config_blob).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": ["layer1/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as archive:
        for member, data in [("manifest.json", manifest), (config_name, config_blob), ("layer1/layer.tar", raw_layer)]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_images_import_for_air_gapped_nodes(node, tmp_path):
    """`portal images import` of an OCI archive and of a `docker save`
    tarball: pods with `imagePullPolicy: Never` run them."""
    layer = registry.busybox_layer()
    oci_archive(tmp_path / "oci.tar", "offline.example/app:1", layer, {"Cmd": ["echo", "from an OCI archive"]})
    docker_save_archive(tmp_path / "docker.tar", "offline.example/saved:2", layer, {"Entrypoint": ["echo"], "Cmd": ["from docker save"]})
    for archive in ("oci.tar", "docker.tar"):
        result = subprocess.run([BINARY, "images", "import", str(tmp_path / archive), "--data-dir", str(node.data_dir / "agent")], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    for pod, image, expected in [("oci", "offline.example/app:1", "from an OCI archive"), ("saved", "offline.example/saved:2", "from docker save")]:
        body = pod_manifest(pod, image, restartPolicy="Never")
        body["spec"]["containers"][0]["imagePullPolicy"] = "Never"
        node.core.create_namespaced_pod(NS, body)
        assert pod_output(node, pod).strip() == expected
        node.core.delete_namespaced_pod(pod, NS)
    # A corrupted blob is refused.
    with tarfile.open(tmp_path / "oci.tar") as archive:
        members = {m.name: archive.extractfile(m).read() if m.isfile() else None for m in archive.getmembers()}
    layer_name = next(n for n, d in members.items() if d == layer)
    members[layer_name] = layer[:-10] + b"0123456789"
    with tarfile.open(tmp_path / "bad.tar", "w") as archive:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    result = subprocess.run([BINARY, "images", "import", str(tmp_path / "bad.tar"), "--data-dir", str(tmp_path / "other")], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "expected sha256:" in result.stderr, result.stderr


def test_pods_reach_the_api_server_through_the_kubernetes_service(node):
    """The `kubernetes` Service points at the API server, whose certificate
    names the Service's cluster IP (in-cluster clients connect by it)."""
    service_ip = node.core.read_namespaced_service("kubernetes", NS).spec.cluster_ip
    ca = node.data_dir / "pki" / "ca.crt"
    result = subprocess.run(["curl", "-sf", "--cacert", str(ca), "-H", f"Authorization: Bearer {node.portal.token}", f"https://{service_ip}/version"], capture_output=True, text=True, timeout=20)
    assert result.returncode == 0 and "gitVersion" in result.stdout, result.stderr
    # From a pod: the TCP connection is made (busybox has no TLS client).
    script = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT >/dev/null; echo rc=$?"
    node.core.create_namespaced_pod(NS, pod_manifest("apiclient", node.busybox, ["sh", "-c", script], restartPolicy="Never"))
    out = pod_output(node, "apiclient")
    assert "rc=0" in out, out
    node.core.delete_namespaced_pod("apiclient", NS)


def test_a_second_agent_gets_a_pod_range_of_its_own(node, tmp_path):
    """`portal agent` in a second node namespace, against the same server:
    its Node gets its own pod range and runs a pod bound to it."""
    second = f"{node.cluster.tag}-node2"
    agent_dir = tmp_path / "node2"
    agent = None
    nodes.sh("ip", "netns", "add", second)
    try:
        # node-1 (this namespace) ↔ node-2 on a link of their own.
        nodes.sh("ip", "link", "add", "to-node2", "type", "veth", "peer", "name", "eth0", "netns", second)
        nodes.sh("ip", "addr", "add", "192.168.98.1/24", "dev", "to-node2")
        nodes.sh("ip", "link", "set", "to-node2", "up")
        for args in (["link", "set", "lo", "up"], ["link", "set", "eth0", "up"], ["addr", "add", "192.168.98.2/24", "dev", "eth0"], ["route", "add", "default", "via", "192.168.98.1"]):
            nodes.sh("ip", "-n", second, *args)
        config = node.portal.config()
        port = config["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1]
        config["clusters"][0]["cluster"]["server"] = f"https://{nodes.NODE_IP}:{port}"
        kubeconfig = tmp_path / "node2.kubeconfig"
        kubeconfig.write_text(json.dumps(config))
        # nsenter, not `ip netns exec`: the agent must share the machine's
        # mount namespace (its pods' namespace files live there).
        agent = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{second}", BINARY, "agent", "--kubeconfig", str(kubeconfig), "--node-name", "node-2", "--node-ip", "192.168.98.2", "--data-dir", str(agent_dir), "--insecure-registry", f"{nodes.NODE_IP}:{node.registry.port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "node2.log", "wb"),
        )
        ranges = wait_for(lambda: (lambda n: n.spec.pod_cidr if n and n.spec.pod_cidr else None)(next(iter(node.core.list_node(field_selector="metadata.name=node-2").items), None)), "node-2 to get a pod range")
        assert ranges != node.core.read_node(node.node_name).spec.pod_cidr
        body = pod_manifest("far", node.busybox, ["hostname"], restartPolicy="Never", nodeName="node-2")
        # node-2 reaches node-1's registry through node-1's address.
        body["spec"]["containers"][0]["image"] = f"{nodes.NODE_IP}:{node.registry.port}/busybox:1.36"
        body["spec"]["containers"][0]["imagePullPolicy"] = "Always"
        node.core.create_namespaced_pod(NS, body)
        wait_for(lambda: node.pod("far").status.phase == "Succeeded", "the pod on node-2 to run", 60)
        pod = node.pod("far")
        assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(ranges)
        assert pod.status.host_ip == "192.168.98.2"
        node.core.delete_namespaced_pod("far", NS)
        wait_for(lambda: not agent_bed.netns_of(agent_bed.agent_tag(agent_dir, "node-2")), "node-2's pod sandbox to go")
    finally:
        if agent and agent.poll() is None:
            agent.terminate()
            agent.wait(timeout=10)
        agent_bed.cleanup(agent_dir, agent_bed.agent_tag(agent_dir, "node-2"))
        subprocess.run(["ip", "netns", "del", second], capture_output=True)
        subprocess.run(["ip", "link", "del", "to-node2"], capture_output=True)
        try:
            node.core.delete_node("node-2")
        except Exception:
            pass


def test_host_port_reaches_the_pod_and_is_held_once(node):
    """`hostPort` (issue 28): the pod's port at the node's address, DNAT in
    the node's nftables; a second pod asking for the same port on the same
    node stays Pending with Kubernetes' reason."""
    core = node.core
    ported = pod_manifest("ported", node.web, labels={"app": "ported"})
    ported["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 18080}]
    core.create_namespaced_pod(NS, ported)
    node.wait_running("ported")
    assert wait_for(lambda: http(f"http://{nodes.NODE_IP}:18080/name.txt"), "the host port to answer") == "ported\n"
    clash = pod_manifest("clash", node.web)
    clash["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 18080}]
    core.create_namespaced_pod(NS, clash)
    event = wait_for(lambda: [e for e in node.events("clash") if e[1] == "FailedScheduling"], "FailedScheduling")
    assert "didn't have free ports for the requested pod ports" in event[0][2], event
    assert node.pod("clash").status.phase == "Pending"
    for name in ["clash", "ported"]:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(lambda: http(f"http://{nodes.NODE_IP}:18080/name.txt", timeout=1) is None, "the mapping to go")


def test_set_image_on_a_running_pod_restarts_its_container(node):
    """`kubectl set image pod/…` (issue 28): the container is made again
    from the new image, whatever the restart policy, with the kubelet's
    event."""
    newer = web_image(node, "web", "2")
    pod = pod_manifest("swap", node.web, restartPolicy="Never")
    node.core.create_namespaced_pod(NS, pod)
    node.wait_running("swap")
    node.kubectl("-n", NS, "set", "image", "pod/swap", f"swap={newer}")

    def on_new_image():
        statuses = node.pod("swap").status.container_statuses or []
        return statuses and statuses[0].image == newer and statuses[0].state.running and statuses[0]
    status = wait_for(on_new_image, "the container running the new image", timeout=60)
    assert status.restart_count == 1
    assert any(e[1] == "Killing" and "definition changed" in e[2] for e in node.events("swap"))
    node.core.delete_namespaced_pod("swap", NS, grace_period_seconds=0)
