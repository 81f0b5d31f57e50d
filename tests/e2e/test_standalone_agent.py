"""A standalone agent (issue 15, SPEC W2): `portal agent` with static pods
and no API server runs them (network, image, status kept on the node);
restarted with a kubeconfig while the API server is still down it adopts
the running containers; once `portal server` starts, its Node and the
mirror pods appear, with the same containers still running."""

import pathlib
import signal
import subprocess

import pytest
import yaml

from conftest import BINARY, Portal
from support import agent_bed, nodes
from support.agent_bed import NS, container_pids, web_image
from support.metrics import scrape_url, value
from support.waiting import holds_for, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

NODE = "solo"
POD_CIDR = "10.244.77.0/24"
API_BIND = "127.0.0.1:16443"


class Agent:
    """One `portal agent` process."""

    def __init__(self, data_dir, args):
        self.log_path = data_dir / "agent.log"
        self.process = subprocess.Popen([BINARY, "agent", *args], stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


AGENT_METRICS = "http://127.0.0.1:10248/metrics"


def agent_metric(name):
    try:
        return value(scrape_url(AGENT_METRICS), name)
    except OSError:
        return None  # not serving yet


def agent_has(pods):
    """The agent's relist reports `pods` pods and as many running containers."""
    return agent_metric("kubelet_running_pods") == pods and (agent_metric("kubelet_running_containers") or 0) >= pods


def started_containers():
    return agent_metric("kubelet_started_containers_total")


def http(url, timeout=2):
    result = subprocess.run(["wget", "-qO-", "--tries=1", "-T", str(timeout), url], capture_output=True, text=True, timeout=timeout + 5)
    return result.stdout if result.returncode == 0 else None


def test_standalone_agent_runs_static_pods_and_mirrors_them_once_the_api_server_comes(tmp_path):
    agent_dir = tmp_path / "agent"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    with agent_bed.bare_node(agent_dir, NODE) as bed:
        reg = bed.registry
        agent = portal = None
        try:
            image = web_image(bed)
            (manifests / "web.yaml").write_text(yaml.safe_dump({
                "metadata": {"name": "web", "labels": {"app": "solo-web"}},
                "spec": {"containers": [{"name": "web", "image": image}], "terminationGracePeriodSeconds": 1},
            }))
            common = [
                "--data-dir", str(agent_dir), "--node-name", NODE, "--node-ip", nodes.NODE_IP,
                "--pod-manifest-path", str(manifests), "--pod-cidr", POD_CIDR,
                "--registry-mirror", f"docker.io=http://{reg.host}",
            ]

            # 1. No kubeconfig at all: the static pod runs and serves.
            agent = Agent(tmp_path, common)
            leases = lambda: [p for p in (agent_dir / "leases").glob("10.*")] if (agent_dir / "leases").is_dir() else []
            lease = wait_for(lambda: next((p for p in leases() if p.read_text().strip()), None), "a pod address leased", timeout=60)
            uid = lease.read_text().strip()
            ip = lease.name
            assert ip.startswith("10.244.77."), ip
            wait_for(lambda: http(f"http://{ip}:8080/name.txt") == f"web-{NODE}\n", "the static pod serving on the node", timeout=60)
            pids = container_pids(agent_dir)
            assert pids
            agent.stop()
            assert container_pids(agent_dir) == pids, "containers outlive the agent"

            # 2. A kubeconfig, but the API server is down: the same containers
            # are adopted, nothing restarts.
            portal = Portal(server_dir, api_bind=API_BIND).start()
            kubeconfig = tmp_path / "agent.kubeconfig"
            kubeconfig.write_text(pathlib.Path(portal.kubeconfig).read_text())
            portal.stop()
            portal = None
            agent = Agent(tmp_path, [*common, "--kubeconfig", str(kubeconfig)])
            # It has tried the API server, has the static pod and has listed
            # its running container; then it starts nothing and keeps running.
            wait_for(lambda: "registering the node; retrying" in agent.log() or agent.process.poll() is not None, "the agent to try the API server")
            wait_for(lambda: agent_has(1) or agent.process.poll() is not None, "the restarted agent to take the static pod on")
            assert agent.process.poll() is None, agent.log()
            holds_for(lambda: agent.process.poll() is None and started_containers() == 0, "the restarted agent running, starting no container", 2)
            assert agent.process.poll() is None, agent.log()
            assert container_pids(agent_dir) == pids, "the restarted agent restarted the static pod"
            assert http(f"http://{ip}:8080/name.txt") == f"web-{NODE}\n"
            assert "registering the node; retrying" in agent.log()

            # 3. The API server comes: the Node (with the agent's pod range) and
            # the mirror pod appear, with the pod's address and status.
            portal = Portal(server_dir, api_bind=API_BIND).start()
            core = portal.core()

            def mirrored():
                try:
                    pod = core.read_namespaced_pod(f"web-{NODE}", NS)
                except Exception:
                    return None
                statuses = pod.status.container_statuses or []
                return pod if pod.status.phase == "Running" and statuses and statuses[0].ready and pod.status.pod_ip == ip else None

            pod = wait_for(mirrored, "the mirror pod Running with the pod's address", timeout=60)
            assert pod.metadata.annotations["kubernetes.io/config.mirror"] == uid
            assert core.read_node(NODE).spec.pod_cidr == POD_CIDR
            assert container_pids(agent_dir) == pids, "the API server's coming restarted the static pod"
            assert http(f"http://{ip}:8080/name.txt") == f"web-{NODE}\n"

            # Its manifest removed: the pod stops and its mirror goes.
            (manifests / "web.yaml").unlink()
            wait_for(lambda: not container_pids(agent_dir), "the static pod's containers to stop")
            wait_for(lambda: not core.list_namespaced_pod(NS).items, "the mirror pod to go")
        finally:
            if agent:
                agent.stop()
            if portal:
                portal.stop()
    assert not any(agent_bed.leftovers(agent_dir, bed.tag).values())
