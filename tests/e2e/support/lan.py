"""Several node namespaces on one LAN, for multi-node tests (issue 17).

The LAN is a bridge in a namespace of its own (`<tag>-lan`); node i is
namespace `<tag>-n<i>` with `eth0` = 192.168.99.i/24 plugged into it and
a default route out of it (so Service addresses are routed at all, then
NATed by the node's proxy). With `ipv6=True` (shared link only) each node
also has fd00:99::i/64, the LAN fd00:99::fe, and an IPv6 default route. The test thread enters node 1, like
nodes.Cluster: `portal server`, the API client and kubectl run there;
other nodes' processes are started with `start(i, argv)`, which enters
node i's network namespace only (setns, not `ip netns exec`, whose fresh
/sys hides the cgroup mounts runc needs).

Nothing is added to the machine's own namespace; every namespace is
deleted on exit, also after a failure.
"""

import ctypes
import itertools
import os
import subprocess

from support import nodes
from support.nodes import sh

SUBNET = "192.168.99"
SUBNET6 = "fd00:99::"
_counter = itertools.count()


class Lan:
    """`routed=True`: no shared link; node i alone on 192.168.(100+i).0/24,
    the LAN namespace routing between them (nodes that need an overlay)."""

    def __init__(self, count=3, routed=False, ipv6=False):
        assert not (routed and ipv6), "IPv6 on the shared link only"
        self.tag = f"pl{os.getpid()}x{next(_counter)}"
        self.count = count
        self.routed = routed
        self.ipv6 = ipv6
        self.lan = f"{self.tag}-lan"
        self.namespaces = []
        self.processes = []
        self._home = None

    def address(self, i):
        return f"192.168.{100 + i}.1" if self.routed else f"{SUBNET}.{i}"

    def address6(self, i):
        return f"{SUBNET6}{i}"

    def netns(self, i):
        return f"{self.tag}-n{i}"

    def __enter__(self):
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _create(self):
        sh("ip", "netns", "add", self.lan)
        self.namespaces.append(self.lan)
        in_lan = ["ip", "netns", "exec", self.lan]
        for args in (["link", "set", "lo", "up"], ["link", "add", "br0", "type", "bridge"], ["link", "set", "br0", "up"]):
            sh(*in_lan, "ip", *args)
        # The LAN's own address: "outside" every node, for node-port checks.
        sh(*in_lan, "ip", "addr", "add", f"{SUBNET}.254/24", "dev", "br0")
        if self.ipv6:
            sh(*in_lan, "ip", "addr", "add", f"{SUBNET6}fe/64", "dev", "br0", "nodad")
        if self.routed:
            sh(*in_lan, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for i in range(1, self.count + 1):
            ns = self.netns(i)
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            port = f"{self.tag}p{i}"
            sh("ip", "link", "add", port, "netns", self.lan, "type", "veth", "peer", "name", "eth0", "netns", ns)
            if self.routed:
                router = f"192.168.{100 + i}.254"
                sh(*in_lan, "ip", "addr", "add", f"{router}/24", "dev", port)
                sh(*in_lan, "ip", "link", "set", port, "up")
                default = ["route", "add", "default", "via", router]
            else:
                sh(*in_lan, "ip", "link", "set", port, "master", "br0", "up")
                default = ["route", "add", "default", "dev", "eth0"]
            for args in (
                ["link", "set", "lo", "up"],
                ["addr", "add", f"{self.address(i)}/24", "dev", "eth0"],
                ["link", "set", "eth0", "up"],
                default,
            ):
                sh("ip", "netns", "exec", ns, "ip", *args)
            if self.ipv6:
                for args in (
                    ["addr", "add", f"{self.address6(i)}/64", "dev", "eth0", "nodad"],
                    ["-6", "route", "add", "default", "dev", "eth0"],
                ):
                    sh("ip", "netns", "exec", ns, "ip", *args)
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        nodes._setns(f"/var/run/netns/{self.netns(1)}")

    def start(self, i, argv, log):
        """Starts `argv` in node i's network namespace."""
        process = subprocess.Popen(
            argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
            preexec_fn=lambda: nodes._setns(f"/var/run/netns/{self.netns(i)}"),
        )
        self.processes.append(process)
        return process

    def run(self, where, *argv, check=True, timeout=60):
        """Runs a command in node i's namespace (or "lan"); its result."""
        ns = self.lan if where == "lan" else self.netns(where)
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=check, timeout=timeout)

    def cut(self, i):
        """Takes node i off the LAN (its cable pulled)."""
        sh("ip", "netns", "exec", self.lan, "ip", "link", "set", f"{self.tag}p{i}", "down")

    def mend(self, i):
        sh("ip", "netns", "exec", self.lan, "ip", "link", "set", f"{self.tag}p{i}", "up")

    def close(self):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        if self._home is not None:
            if nodes._libc.setns(self._home, nodes.CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace")
            os.close(self._home)
            self._home = None
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()
