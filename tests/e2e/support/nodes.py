"""Network namespaces for data-plane tests (DESIGN "Tests and benchmarks"):
a "node" namespace that runs `portal server` (with its proxy), and "pod"
namespaces joined to it by veth pairs on a bridge. Everything lives in
namespaces this module creates, with unique names, and is deleted
afterwards, also on failure: nothing is routed or NATed in the machine's
own namespace.

The test process itself enters the node namespace (setns on its thread),
so the API client, kubectl and the `portal` process it starts all run
there. Pods get a /32 address and reach everything through the node (also
each other), so every packet crosses the node's nftables hooks.
"""

import ctypes
import itertools
import json
import os
import pathlib
import subprocess
import time

from kubernetes import client

from support import waiting

# The scripts run in pods stay in tests/e2e/netns (bench/proxy.py uses them too).
NETNS_SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "netns"
CLONE_NEWNET = 0x40000000
GATEWAY = "10.244.0.1"
NODE_IP = "192.168.99.1"
WORLD_IP = "192.168.99.2"
_counter = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)


def sh(*argv, check=True):
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result.stdout


def _setns(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


class Cluster:
    """One node namespace with pods; `with Cluster() as c:` enters it."""

    def __init__(self, bridge=True):
        """`bridge=False` leaves the pod network to a node agent."""
        tag = f"pt{os.getpid()}x{next(_counter)}"
        self.bridge = bridge
        self.node = f"{tag}-node"
        self.world = f"{tag}-world"
        self.tag = tag
        self.namespaces = []
        self.processes = []
        self.pods = {}
        self._home = None

    def __enter__(self):
        try:
            self._create_node()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _create_node(self):
        for ns in (self.node, self.world):
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
        for args in (["link", "set", "lo", "up"],):
            sh("ip", "netns", "exec", self.world, "ip", *args)
        # Remember where this thread was, then live in the node.
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        _setns(f"/var/run/netns/{self.node}")
        bridge = (
            # A fixed address: otherwise the bridge takes the lowest address
            # of its ports, changes it when a pod joins with a lower one, and
            # the pods' cached gateway address goes stale (lost packets).
            ["link", "add", "br0", "address", "02:00:0a:f4:00:01", "type", "bridge"],
            ["addr", "add", f"{GATEWAY}/24", "dev", "br0"],
            ["link", "set", "br0", "up"],
        ) if self.bridge else ()
        for args in (
            ["link", "set", "lo", "up"],
            *bridge,
            # The node's own address, on a link to an "outside" namespace,
            # and a default route there so traffic for Service addresses
            # is routed at all (then NATed or rejected).
            ["link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", self.world],
            ["addr", "add", f"{NODE_IP}/24", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            ["route", "add", "default", "dev", "eth0"],
        ):
            sh("ip", *args)
        for args in (["link", "set", "eth0", "up"], ["addr", "add", f"{WORLD_IP}/24", "dev", "eth0"]):
            sh("ip", "netns", "exec", self.world, "ip", *args)
        # Pods are routed (a /32 each, via the node), so bridged frames need
        # no netfilter: with br_netfilter's default the kernel bridges a
        # packet DNATed back to its own sender without the SNAT hook, and a
        # pod could not reach itself through its Service (hairpin).
        settings = (
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.br0.send_redirects", "0"),
            ("net.bridge.bridge-nf-call-iptables", "0"),
        )
        for key, value in settings if self.bridge else ():
            sh("sysctl", "-qw", f"{key}={value}")

    def add_pod(self, name, ip):
        """A pod namespace with `ip`, plugged into the node's bridge."""
        ns = f"{self.tag}-{name}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        port = f"vp{len(self.pods)}"
        sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", port, "master", "br0", "up")
        for args in (
            ["link", "set", "lo", "up"],
            ["link", "set", "eth0", "up"],
            ["addr", "add", f"{ip}/32", "dev", "eth0"],
            ["route", "add", GATEWAY, "dev", "eth0", "scope", "link"],
            ["route", "add", "default", "via", GATEWAY],
        ):
            sh("ip", "netns", "exec", ns, "ip", *args)
        self.pods[name] = (ns, ip)
        return ns

    def start_backend(self, name, tcp_port=8080, udp_port=5353):
        ns, _ = self.pods[name]
        process = subprocess.Popen(
            ["ip", "netns", "exec", ns, "python3", str(NETNS_SCRIPTS / "backend.py"), name, str(tcp_port), str(udp_port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.processes.append(process)
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"backend {name} did not start")
        return process

    def client(self, pod, host, port, count=300, udp=False, seconds=None, background=False, until=None, progress=None):
        """Runs netns/client.py in `pod` (None: on the node); returns its
        JSON result, or the process when `background`. `until`: it keeps
        going until that file exists; `progress`: a file it keeps the number
        of answered requests in (see `answered`)."""
        argv = ["python3", str(NETNS_SCRIPTS / "client.py"), host, str(port), str(count)]
        if udp:
            argv.append("--udp")
        if seconds:
            argv += ["--seconds", str(seconds), "--pause", "0.01"]
        if until:
            argv += ["--until", str(until), "--pause", "0.01"]
        if progress:
            argv += ["--progress", str(progress)]
        if pod is not None:
            argv = ["ip", "netns", "exec", self.pods[pod][0], *argv]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if background:
            self.processes.append(process)
            return process
        return result_of(process)

    def close(self):
        for process in self.processes:
            # SIGTERM first: a server (nginx) stops its own workers then.
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._home is not None:
            if _libc.setns(self._home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace")
            os.close(self._home)
            self._home = None
        for ns in reversed(self.namespaces):
            # Deleting a namespace ends its interfaces; processes in it were killed above.
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


def answered(progress):
    """How many requests a client started with `progress=` has had answered."""
    try:
        return int(pathlib.Path(progress).read_text() or 0)
    except FileNotFoundError:
        return 0


def result_of(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"client failed: {err}")
    return json.loads(out)


def wait_for(check, what, timeout=15):
    """support.waiting.wait_for with this module's bound (15 s) and pace."""
    return waiting.wait_for(check, what, timeout=timeout, interval=0.05)


# Pods and Services through the API, as a node agent and a user would make them.
NS = "default"


def register_pod(core, name, ip, labels, ready=True):
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(node_name="node-1", containers=[client.V1Container(name="c", image="registry.local/app:1", ports=[client.V1ContainerPort(name="web", container_port=8080), client.V1ContainerPort(name="echo", container_port=5353, protocol="UDP")])]),
    )
    core.create_namespaced_pod(NS, pod)
    set_ready(core, name, ip, ready)


def set_ready(core, name, ip, ready):
    pod = core.read_namespaced_pod(name, NS)
    condition = client.V1PodCondition(type="Ready", status="True" if ready else "False", last_transition_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    pod.status = client.V1PodStatus(phase="Running", pod_ip=ip, conditions=[condition])
    core.replace_namespaced_pod_status(name, NS, pod)


def make_service(core, name, **spec):
    body = {"metadata": {"name": name}, "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "web"}], **spec}}
    return core.create_namespaced_service(NS, body)
