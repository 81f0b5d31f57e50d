"""Two nodes (issue 17, part): the first runs `portal server` (API,
controllers, proxy, its agent); the second, on the same link, runs
`portal agent` against it. Each agent routes the other node's pod range
via the other node's address (host-gw), so a pod on one node reaches a pod
on the other directly, keeping its own address; a Node that goes takes its
route with it. The second node joins with the node token."""

import signal
import subprocess

import pytest

from conftest import BINARY
from support import agent_bed, nodes, registry
from support.agent_bed import NS, AgentNode
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

PEER = (
    "#!/bin/sh\n"
    "printf 'Content-Type: text/plain\\r\\n\\r\\n%s\\n' \"$REMOTE_ADDR\"\n"
)


def peer_image(node):
    """httpd whose /cgi-bin/peer answers with the client's address."""
    serve = b"#!/bin/sh\nexec httpd -f -p 8080 -h /www\n"
    registry.push_busybox(node.registry, "library/peer", "1", cmd=["/bin/serve"], files={"bin/serve": serve, "www/cgi-bin/peer": PEER.encode()})
    # A Docker Hub name: each node pulls it through its --registry-mirror.
    return "peer:1"


def routes(netns=None):
    prefix = ["ip", "netns", "exec", netns] if netns else []
    out = subprocess.run([*prefix, "ip", "-4", "route", "show", "proto", "117"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[0] + " via " + line.split()[2] for line in out.splitlines() if " via " in line)


def test_pods_on_two_nodes_reach_each_other_directly(tmp_path):
    (tmp_path / "a").mkdir()
    with AgentNode(tmp_path / "a", node_name="node-a") as node:
        image = peer_image(node)
        world = node.cluster.world
        b_dir = tmp_path / "b"
        b_tag = agent_bed.agent_tag(b_dir, "node-b")
        port = node.portal.server.rsplit(":", 1)[1]
        registry_port = node.registry.host.rsplit(":", 1)[1]
        # Into the namespace by setns, not `ip netns exec`: that also makes
        # a mount namespace with a fresh /sys, without the cgroup mounts
        # runc needs.
        agent = subprocess.Popen(
            [BINARY, "agent", "--server", f"https://{nodes.NODE_IP}:{port}",
             "--token-file", str(tmp_path / "a" / "node-token"), "--data-dir", str(b_dir),
             "--node-name", "node-b", "--node-ip", nodes.WORLD_IP,
             "--registry-mirror", f"docker.io=http://{nodes.NODE_IP}:{registry_port}",
             "--insecure-registry", f"{nodes.NODE_IP}:{registry_port}"],
            stdout=open(tmp_path / "agent-b.log", "ab"), stderr=subprocess.STDOUT,
            preexec_fn=lambda: nodes._setns(f"/var/run/netns/{world}"),
        )
        try:
            def b_ready():
                try:
                    n = node.core.read_node("node-b")
                except Exception:
                    return None
                ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])) if n.status else False
                return n.spec.pod_cidr if ready and n.spec.pod_cidr else None

            b_range = wait_for(b_ready, "node-b Ready with a pod range", timeout=60)
            a_range = node.core.read_node("node-a").spec.pod_cidr
            wait_for(lambda: routes() == [f"{b_range} via {nodes.WORLD_IP}"], "node-a's route to node-b's pods")
            wait_for(lambda: routes(world) == [f"{a_range} via {nodes.NODE_IP}"], "node-b's route to node-a's pods")

            # Pinned by nodeName: a server on node-a, a client on node-b.
            node.core.create_namespaced_pod(NS, {"metadata": {"name": "server"}, "spec": {
                "nodeName": "node-a", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "server", "image": image}]}})
            server = node.wait_running("server")
            script = f"for i in 1 2 3 4 5; do wget -qO- http://{server.status.pod_ip}:8080/cgi-bin/peer && exit 0; sleep 1; done; exit 1"
            node.core.create_namespaced_pod(NS, {"metadata": {"name": "client"}, "spec": {
                "nodeName": "node-b", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "client", "image": image, "command": ["sh", "-c", script]}]}})
            wait_for(lambda: node.pod("client").status.phase in ("Succeeded", "Failed"), "the client to finish", timeout=60)
            client = node.pod("client")
            assert client.status.phase == "Succeeded", client.status
            assert client.status.pod_ip.startswith(b_range.rsplit(".", 2)[0])
            log = next((b_dir / "logs").glob(f"{NS}_client_*/client/0.log")).read_text()
            # httpd listens on IPv6 too: IPv4 peers read as [::ffff:a.b.c.d].
            said = [line.split(" ", 3)[3].removeprefix("[::ffff:").rstrip("]") for line in log.splitlines() if line.count(" ") >= 3]
            assert said == [client.status.pod_ip], f"the server saw {said}, not the client's own address {client.status.pod_ip}"

            # Leaving the pod ranges (to node-b's own address, which has no
            # route to node-a's pods): masqueraded behind node-a's address.
            outside = subprocess.Popen(["ip", "netns", "exec", world, "python3", "-m", "http.server", "18099", "--bind", nodes.WORLD_IP],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
            try:
                fetch = f"for i in 1 2 3 4 5; do wget -qO- http://{nodes.WORLD_IP}:18099/ >/dev/null && exit 0; sleep 1; done; exit 1"
                node.core.create_namespaced_pod(NS, {"metadata": {"name": "egress"}, "spec": {
                    "nodeName": "node-a", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "egress", "image": image, "command": ["sh", "-c", fetch]}]}})
                wait_for(lambda: node.pod("egress").status.phase in ("Succeeded", "Failed"), "the egress pod to finish", timeout=60)
                assert node.pod("egress").status.phase == "Succeeded"
            finally:
                outside.terminate()
                seen = outside.communicate(timeout=10)[1]
            assert f"{nodes.NODE_IP} - -" in seen, seen

            for name in ("client", "server", "egress"):
                node.core.delete_namespaced_pod(name, NS)
            wait_for(lambda: not node.core.list_namespaced_pod(NS).items, "the pods to go", timeout=60)
            # A Node that goes takes its route with it.
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=15)
            node.core.delete_node("node-b")
            wait_for(lambda: routes() == [], "node-a's route to node-b removed")
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            agent_bed.cleanup(b_dir, b_tag)
        assert not any(agent_bed.leftovers(b_dir, b_tag).values())
