"""Several API servers on one etcd cluster (issue 16, SPEC O1, O2, S4).

A real 3-member etcd on loopback, three `portal apiserver` processes on it
(the second and third started with the first one's cluster token), real
clients. Allocation across servers, watches across servers, one cluster
identity, losing an etcd member or an API server, and two `portal
controllers` failing over."""

import concurrent.futures
import json
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time

import kubernetes
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from conftest import BINARY, Portal
from support.etcd import EtcdCluster
from support.metrics import scrape, value
from support.waiting import wait_for

pytestmark = [pytest.mark.etcd]

# These tests' bound (support.nodes.wait_for's, which they used before).
WAIT = 15

KUBECTL = shutil.which("kubectl") or "kubectl"


class Cluster:
    def __init__(self, etcd, servers, root):
        self.etcd, self.servers, self.root = etcd, servers, root

    def core(self, i):
        return client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=self.servers[i].kubeconfig))


# Published in the `kubernetes` Endpoints only (documentation addresses: no
# traffic is ever sent to them, no address is configured).
ADVERTISED = {"a": "192.0.2.1", "b": "192.0.2.2", "c": "192.0.2.3"}


def start_apiserver(root, name, etcd, token_file=None):
    data = root / name
    data.mkdir(exist_ok=True)
    args = ["--datastore-endpoint", etcd.endpoint, "--advertise-address", ADVERTISED[name]]
    if token_file:
        args += ["--token-file", str(token_file)]
    return Portal(data, extra_args=args, command="apiserver").start()


@pytest.fixture(scope="module")
def cluster():
    root = pathlib.Path(tempfile.mkdtemp(prefix="portal-ha-"))
    etcd = EtcdCluster(3).start()
    servers = []
    try:
        servers.append(start_apiserver(root, "a", etcd))
        token = root / "a" / "server-token"
        servers.append(start_apiserver(root, "b", etcd, token))
        servers.append(start_apiserver(root, "c", etcd, token))
        yield Cluster(etcd, servers, root)
    finally:
        for server in servers:
            server.stop()
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)


def namespace(core, name):
    core.create_namespace({"metadata": {"name": name}})
    return name


def test_one_identity_for_every_server(cluster):
    a, b, c = cluster.servers
    # Same CA and credentials: a's kubeconfig works against c.
    out = subprocess.run([KUBECTL, "--kubeconfig", a.kubeconfig, "--server", c.server, "get", "namespaces", "-o", "name"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "namespace/default" in out.stdout
    for name in ("pki/ca.crt", "admin.token", "node-token"):
        assert (a.data_dir / name).read_bytes() == (c.data_dir / name).read_bytes(), name
    # A server with the wrong token does not start, and says why.
    stranger = cluster.root / "stranger"
    stranger.mkdir()
    out = subprocess.run([BINARY, "apiserver", "--data-dir", str(stranger), "--api-bind", "127.0.0.1:0",
                          "--datastore-endpoint", cluster.etcd.endpoint, "--token", "not-the-token"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "does not open this cluster's identity" in out.stdout + out.stderr


def test_allocations_are_distinct_across_servers(cluster):
    cores = [cluster.core(i) for i in range(3)]
    ns = namespace(cores[0], "alloc")

    def create(i):
        body = {"metadata": {"name": f"s{i}"}, "spec": {"type": "NodePort", "selector": {"app": "x"}, "ports": [{"port": 80}]}}
        return cores[i % 3].create_namespaced_service(ns, body)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        created = list(pool.map(create, range(300)))
    ips = {s.spec.cluster_ip for s in created}
    ports = {s.spec.ports[0].node_port for s in created}
    assert len(ips) == 300 and len(ports) == 300
    # Every server lists the same 300 with the same allocations.
    for core in cores:
        listed = core.list_namespaced_service(ns).items
        assert {(s.metadata.name, s.spec.cluster_ip, s.spec.ports[0].node_port) for s in listed} == \
            {(s.metadata.name, s.spec.cluster_ip, s.spec.ports[0].node_port) for s in created}


def watch_events(core, ns, resource_version, count, timeout=20, opened=None):
    """The first `count` events of a watch on Services from
    `resource_version`; `opened` (a threading.Event) is set once the server
    has answered the watch request (its headers came)."""
    events = []
    response = core.list_namespaced_service(ns, watch=True, resource_version=resource_version, timeout_seconds=timeout,
                                            _preload_content=False)
    try:
        if opened is not None:
            opened.set()
        for line in kubernetes.watch.watch.iter_resp_lines(response):
            event = json.loads(line)
            assert event["type"] != "ERROR", event
            metadata = event["object"]["metadata"]
            events.append((event["type"], metadata["name"], int(metadata["resourceVersion"])))
            if len(events) == count:
                break
    finally:
        response.close()
        response.release_conn()
    return events


def test_watches_see_every_server_in_order_and_resume_anywhere(cluster):
    a, b, c = (cluster.core(i) for i in range(3))
    ns = namespace(a, "watched")
    start = a.list_namespaced_service(ns).metadata.resource_version
    result = {}
    opened = threading.Event()
    watcher = threading.Thread(target=lambda: result.setdefault("a", watch_events(a, ns, start, 30, opened=opened)))
    watcher.start()
    # The writes go to b and c once a's watch is open.
    assert opened.wait(30), "the watch on a was not answered"
    for i in range(30):
        (b if i % 2 else c).create_namespaced_service(ns, {"metadata": {"name": f"w{i:02}"}, "spec": {"ports": [{"port": 80}]}})
    watcher.join(30)
    seen = result["a"]
    assert [name for _, name, _ in seen] == [f"w{i:02}" for i in range(30)]
    revisions = [rv for _, _, rv in seen]
    assert revisions == sorted(revisions) and len(set(revisions)) == 30
    # Resumed on b from a resourceVersion a gave: the rest, nothing missed
    # or repeated.
    resumed = watch_events(b, ns, str(revisions[9]), 20)
    assert resumed == seen[10:]


def test_losing_an_etcd_member_under_sixteen_writers(cluster):
    cores = [cluster.core(i) for i in range(3)]
    ns = namespace(cores[0], "chaos")
    acknowledged, failed_after_kill = [], []
    killed = threading.Event()
    lock = threading.Lock()

    def writer(w):
        for j in range(25):
            name = f"w{w}-{j}"
            try:
                cores[(w + j) % 3].create_namespaced_service(ns, {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})
                with lock:
                    acknowledged.append((name, killed.is_set()))
            except ApiException as e:
                with lock:
                    failed_after_kill.append((name, e.status, killed.is_set()))
            if w == 0 and j == 8:
                cluster.etcd.kill(0)
                killed.set()

    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(writer, range(16)))
    finally:
        cluster.etcd.restart(0)
    after_kill = [name for name, late in acknowledged if late]
    print(f"acknowledged {len(acknowledged)} of 400, {len(after_kill)} after the kill; failed: {failed_after_kill}")
    assert len(after_kill) > 100, "writes must go on after losing a member"
    assert len(failed_after_kill) <= 4, failed_after_kill
    names = {s.metadata.name for s in cores[1].list_namespaced_service(ns).items}
    missing = {name for name, _ in acknowledged} - names
    assert not missing, f"acknowledged writes lost: {sorted(missing)}"


def make_ready_pod(core, ns, name, ip):
    core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": {"app": "fo"}},
                                    "spec": {"nodeName": "test-node",  # placed: the scheduler leaves it
                                             "containers": [{"name": "c", "image": "registry.local/app:1", "ports": [{"containerPort": 8080}]}]}})
    pod = core.read_namespaced_pod(name, ns)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    pod.status = client.V1PodStatus(phase="Running", pod_ip=ip, conditions=[client.V1PodCondition(type="Ready", status="True", last_transition_time=now)])
    core.replace_namespaced_pod_status(name, ns, pod)


def ready_ips(core, ns, name):
    try:
        ep = core.read_namespaced_endpoints(name, ns)
    except ApiException:
        return set()
    return {a.ip for s in ep.subsets or [] for a in s.addresses or []}


def test_controllers_fail_over(cluster):
    core = cluster.core(0)
    coordination = client.CoordinationV1Api(kubernetes.config.new_client_from_config(config_file=cluster.servers[0].kubeconfig))
    ns = namespace(core, "failover")
    timing = ["--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "1s"]
    processes, logs = [], []

    def own_identity(i):
        """The controllers run apart as system:kube-controller-manager, with
        only the roles the bootstrap policy binds to it."""
        path = cluster.root / f"controllers-{i}.kubeconfig"
        path.write_text(subprocess.run(
            [BINARY, "kubeconfig", "--data-dir", str(cluster.servers[i].data_dir),
             "--user", "system:kube-controller-manager", "--server", cluster.servers[i].server],
            check=True, capture_output=True, text=True, timeout=30).stdout)
        return str(path)
    try:
        for i in (0, 1):
            log = cluster.root / f"controllers-{i}.log"
            logs.append(log)
            processes.append(subprocess.Popen([BINARY, "controllers", "--kubeconfig", own_identity(i), *timing],
                                              stdout=open(log, "ab"), stderr=subprocess.STDOUT))
        holder = wait_for(lambda: (coordination.read_namespaced_lease("portal-controllers", "kube-system").spec.holder_identity
                                   if "portal-controllers" in {l.metadata.name for l in coordination.list_namespaced_lease("kube-system").items} else None),
                          "a leader", timeout=WAIT)
        def leaders():
            return [i for i, log in enumerate(logs) if "became leader" in log.read_text(errors="replace")]

        leader = wait_for(leaders, "the leader's log", timeout=WAIT)[0]
        follower = 1 - leader
        assert leaders() == [leader], "two leaders"
        core.create_namespaced_service(ns, {"metadata": {"name": "fo"}, "spec": {"selector": {"app": "fo"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        make_ready_pod(core, ns, "p1", "10.244.9.1")
        wait_for(lambda: ready_ips(core, ns, "fo") == {"10.244.9.1"}, "endpoints from the first leader", timeout=WAIT)

        processes[leader].kill()
        processes[leader].wait()
        killed = time.monotonic()
        wait_for(lambda: coordination.read_namespaced_lease("portal-controllers", "kube-system").spec.holder_identity != holder,
                 "another leader", timeout=15)
        took = time.monotonic() - killed
        print(f"controllers failed over in {took:.1f} s (lease 4 s, retry 1 s)")
        assert took < 4 + 2 * 1 + 1, f"failover took {took:.1f} s"
        # (Its log line follows the write the API already shows.)
        wait_for(lambda: "became leader" in logs[follower].read_text(errors="replace"), "the new leader's log", timeout=WAIT)
        # The new leader's controllers follow pods, for the Service the old
        # leader wrote the Endpoints of and for one made now. (`fo` once
        # stayed stale: a reconcile parked in kube-runtime's
        # `wait_until_ready` beside other waiters was never woken.)
        core.create_namespaced_service(ns, {"metadata": {"name": "settled"}, "spec": {"selector": {"app": "fo"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        make_ready_pod(core, ns, "p2", "10.244.9.2")
        for service in ("fo", "settled"):
            wait_for(lambda: ready_ips(core, ns, service) == {"10.244.9.1", "10.244.9.2"}, f"endpoints of {service} from the new leader", timeout=WAIT)

        # A leader stopped cleanly gives the Lease up: a third candidate
        # takes over without waiting for the lease to run out.
        third = cluster.root / "controllers-2.log"
        # It campaigns through server c, which no other client asks for the
        # Lease: once c has answered it a read of the Lease, it is a candidate.
        lease_reads = lambda: value(scrape(cluster.servers[2]), "apiserver_request_total", verb="GET", resource="leases") or 0
        reads_before = lease_reads()
        processes.append(subprocess.Popen([BINARY, "controllers", "--kubeconfig", own_identity(2), *timing],
                                          stdout=open(third, "ab"), stderr=subprocess.STDOUT))
        wait_for(lambda: lease_reads() > reads_before, "the third candidate to read the Lease", timeout=WAIT)
        holder = coordination.read_namespaced_lease("portal-controllers", "kube-system").spec.holder_identity
        processes[follower].terminate()
        processes[follower].wait(timeout=15)
        stopped = time.monotonic()
        wait_for(lambda: coordination.read_namespaced_lease("portal-controllers", "kube-system").spec.holder_identity not in (None, holder),
                 "the third candidate leading", timeout=15)
        took = time.monotonic() - stopped
        print(f"after a clean stop, taken over in {took:.1f} s (lease 4 s)")
        assert took < 4, f"the lease was not given up: {took:.1f} s"
        wait_for(lambda: "became leader" in third.read_text(errors="replace"), "the third candidate's log", timeout=WAIT)
    finally:
        for p in processes:
            p.kill()
            p.wait()


def kubernetes_endpoints(core):
    ep = core.read_namespaced_endpoints("kubernetes", "default")
    return {(a.ip, s.ports[0].port) for s in ep.subsets or [] for a in s.addresses or []}


def test_kubernetes_endpoints_list_the_live_servers(cluster):
    core = cluster.core(0)
    expected = {(ADVERTISED[n], int(s.server.rsplit(":", 1)[1])) for n, s in zip("abc", cluster.servers)}
    wait_for(lambda: kubernetes_endpoints(core) == expected, "every server in the kubernetes Endpoints", timeout=WAIT)


def test_losing_an_api_server(cluster):
    a, b, c = cluster.servers
    core_a, core_b = cluster.core(0), cluster.core(1)
    ns = namespace(core_a, "survivors")
    c_port = int(c.server.rsplit(":", 1)[1])
    c.kill()
    try:
        # Clients of the others notice nothing.
        core_a.create_namespaced_service(ns, {"metadata": {"name": "after"}, "spec": {"ports": [{"port": 80}]}})
        assert [s.metadata.name for s in core_b.list_namespaced_service(ns).items] == ["after"]
        # kubectl pointed at the dead one fails, clearly.
        out = subprocess.run([KUBECTL, "--kubeconfig", c.kubeconfig, "get", "svc", "--request-timeout", "5s"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        assert "refused" in out.stderr, out.stderr
        # The others drop it from the kubernetes Endpoints (15 s unrenewed).
        wait_for(lambda: (ADVERTISED["c"], c_port) not in kubernetes_endpoints(core_a) and len(kubernetes_endpoints(core_a)) == 2,
                 "the dead server out of the kubernetes Endpoints", timeout=30)
    finally:
        c.start()
    # Back (on a new port): it serves what was written while it was gone,
    # and is in the Endpoints again.
    assert [s.metadata.name for s in cluster.core(2).list_namespaced_service(ns).items] == ["after"]
    new_port = int(c.server.rsplit(":", 1)[1])
    wait_for(lambda: (ADVERTISED["c"], new_port) in kubernetes_endpoints(core_a), "the server back in the Endpoints", timeout=WAIT)


def test_migrating_an_embedded_cluster_to_etcd():
    root = pathlib.Path(tempfile.mkdtemp(prefix="portal-migrate-"))
    etcd = EtcdCluster(1).start()
    server = Portal(root / "dir", extra_args=["--disable", "controllers,dns"])
    (root / "dir").mkdir()
    try:
        server.start()
        core = server.core()
        for i in range(20):
            kind = "NodePort" if i % 2 else "ClusterIP"
            core.create_namespaced_service("default", {"metadata": {"name": f"m{i:02}"}, "spec": {"type": kind, "ports": [{"port": 80}]}})
        core.patch_namespaced_service("m03", "default", {"metadata": {"labels": {"touched": "yes"}}})
        core.create_namespaced_pod("default", {"metadata": {"name": "pod"}, "spec": {"containers": [{"name": "c", "image": "registry.local/app:1"}]}})

        def snapshot(core):
            # The `kubernetes` Service is the server's own (rewritten with its
            # new port at start): the users' objects are compared.
            services = [s for s in core.list_namespaced_service("default").items if s.metadata.name != "kubernetes"]
            by_version = [s.metadata.name for s in sorted(services, key=lambda s: int(s.metadata.resource_version))]
            return ({(s.metadata.name, s.metadata.uid, s.spec.cluster_ip, tuple(p.node_port or 0 for p in s.spec.ports),
                      tuple(sorted((s.metadata.labels or {}).items()))) for s in services}, by_version,
                    [p.metadata.uid for p in core.list_namespaced_pod("default").items])

        before = snapshot(core)
        server.stop()
        out = subprocess.run([BINARY, "store", "migrate", "--from", str(root / "dir"), "--to", etcd.endpoint],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        # Into a cluster that is not empty: refused.
        again = subprocess.run([BINARY, "store", "migrate", "--from", str(root / "dir"), "--to", etcd.endpoint],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode != 0 and "empty" in again.stdout + again.stderr

        server.extra_args += ["--datastore-endpoint", etcd.endpoint]
        server.start()
        core = server.core()
        assert snapshot(core) == before
        # A resourceVersion this cluster never issued (a client from before
        # the move, with larger numbers) is 410: the client lists again.
        issued = int(core.list_namespaced_service("default").metadata.resource_version)
        with pytest.raises(ApiException) as gone:
            core.list_namespaced_service("default", resource_version=str(issued + 100_000), watch=True, timeout_seconds=1)
        assert gone.value.status == 410
        # Allocations moved too: a requested address that is taken is refused.
        taken = next(ip for name, _, ip, _, _ in before[0] if name == "m05")
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_service("default", {"metadata": {"name": "dup"}, "spec": {"clusterIP": taken, "ports": [{"port": 80}]}})
        assert refused.value.status == 422
    finally:
        server.stop()
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)


def make_pki(directory):
    """A CA, a serving certificate for 127.0.0.1 and a client certificate,
    made with openssl."""
    d = pathlib.Path(directory)

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", "/CN=etcd-test-ca", "-keyout", "ca.key", "-out", "ca.crt")
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
            "-addext", "subjectAltName=IP:127.0.0.1", "-addext", f"extendedKeyUsage={usage}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-copy_extensions", "copyall", "-out", f"{name}.crt")
    return {name: str(d / name) for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def test_etcd_over_tls_with_a_client_certificate():
    root = pathlib.Path(tempfile.mkdtemp(prefix="portal-etcd-tls-"))
    pki = make_pki(root)
    etcd = EtcdCluster(1, tls=(pki["ca.crt"], pki["server.crt"], pki["server.key"], pki["client.crt"], pki["client.key"]))
    server = None
    try:
        etcd.start()
        store = ["--datastore-endpoint", etcd.endpoint, "--etcd-cafile", pki["ca.crt"]]
        # Without the client certificate etcd refuses, and the server says so.
        (root / "refused").mkdir()
        out = subprocess.run([BINARY, "apiserver", "--data-dir", str(root / "refused"), "--api-bind", "127.0.0.1:0", *store],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0
        assert "etcd" in out.stdout + out.stderr
        (root / "dir").mkdir()
        server = Portal(root / "dir", command="apiserver",
                        extra_args=store + ["--etcd-certfile", pki["client.crt"], "--etcd-keyfile", pki["client.key"]]).start()
        core = server.core()
        core.create_namespaced_service("default", {"metadata": {"name": "secure"}, "spec": {"ports": [{"port": 80}]}})
        assert "secure" in {s.metadata.name for s in core.list_namespaced_service("default").items}
    finally:
        if server:
            server.stop()
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)
