"""`portal proxy` as its own process against the API server (issue 6, SPEC
O1, O4): it programs the node, serves /metrics with kube-proxy's names and
a /healthz that fails while syncs fail; after a failure the next sync is a
full one and repairs everything; traffic keeps flowing while the proxy and
the API server are down."""

import os
import stat
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import BINARY, Portal
from support.nodes import NODE_IP, Cluster, make_service, register_pod, sh, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

NS = "default"
BACKENDS = {"web-a": "10.244.0.31", "web-b": "10.244.0.32"}
METRICS = "127.0.0.1:10249"


def http_get(path):
    try:
        with urllib.request.urlopen(f"http://{METRICS}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None, ""


@pytest.fixture
def setup(tmp_path):
    with Cluster() as cluster:
        for name, ip in BACKENDS.items():
            cluster.add_pod(name, ip)
            cluster.start_backend(name)
        cluster.add_pod("client", "10.244.0.70")
        (tmp_path / "data").mkdir()
        portal = Portal(tmp_path / "data", ["--node-ip", NODE_IP]).start()
        # `nft` through a wrapper that fails while a flag file exists.
        wrapper = tmp_path / "bin" / "nft"
        wrapper.parent.mkdir()
        flag = tmp_path / "break-nft"
        wrapper.write_text(f"#!/bin/sh\n[ -e {flag} ] && {{ echo injected failure >&2; exit 1; }}\nexec {sh('which', 'nft').strip()} \"$@\"\n")
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
        env = {**os.environ, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
        argv = [BINARY, "proxy", "--kubeconfig", portal.kubeconfig, "--node-name", "node-1", "--node-ip", NODE_IP, "--mode", "nftables",
                "--min-sync-period", "100ms", "--sync-period", "2s", "--metrics-bind", METRICS]
        log = open(tmp_path / "proxy.log", "ab")
        proxy = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        cluster.processes.append(proxy)
        core = portal.core()
        for name, ip in BACKENDS.items():
            register_pod(core, name, ip, {"app": "web"})
        try:
            yield cluster, portal, proxy, flag, argv, env, log
        finally:
            portal.stop()


def programmed(vip):
    return f"{vip} . tcp . 80 : goto svc-" in sh("nft", "list", "map", "ip", "portal", "cluster-ips", check=False)


def test_standalone_proxy_metrics_health_and_recovery(setup):
    cluster, portal, proxy, flag, argv, env, log = setup
    core = portal.core()
    vip = make_service(core, "web").spec.cluster_ip
    wait_for(lambda: programmed(vip), "the Service in the kernel")
    result = cluster.client("client", vip, 80, count=50)
    assert result["failures"] == 0 and set(result["answers"]) == set(BACKENDS), result
    assert http_get("/healthz")[0] == 200
    status, metrics = http_get("/metrics")
    for name in ("kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_network_programming_duration_seconds_count",
                 "kubeproxy_sync_full_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_endpoint_changes_pending"):
        assert name in metrics, name

    # Syncs fail: /healthz fails once a change has waited twice the sync period.
    flag.touch()
    second = make_service(core, "second").spec.cluster_ip
    wait_for(lambda: http_get("/healthz")[0] == 503, "/healthz to fail", timeout=20)
    assert not programmed(second)
    assert "kubeproxy_sync_proxy_rules_nftables_sync_failures_total" in http_get("/metrics")[1]
    # Traffic that was programmed keeps flowing meanwhile.
    assert cluster.client("client", vip, 80, count=20)["failures"] == 0
    # nft works again: the full resync programs what was missed; healthy again.
    flag.unlink()
    wait_for(lambda: programmed(second), "the missed Service after the full resync", timeout=20)
    wait_for(lambda: http_get("/healthz")[0] == 200, "/healthz to recover", timeout=20)

    # Someone deletes the table (a firewall reload): the next periodic sync
    # notices and rebuilds it.
    sh("nft", "delete", "table", "ip", "portal")
    wait_for(lambda: programmed(vip) and programmed(second), "the table rebuilt", timeout=20)
    assert cluster.client("client", vip, 80, count=20)["failures"] == 0

    # A Service deleted while the proxy is down is removed at its next start.
    proxy.terminate()
    proxy.wait(timeout=10)
    core.delete_namespaced_service("second", NS)
    proxy = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    cluster.processes.append(proxy)
    wait_for(lambda: "default/second/" not in sh("nft", "list", "table", "ip", "portal"), "the stale chain to go")
    assert programmed(vip)

    # Proxy and API server down: the kernel keeps forwarding.
    proxy.terminate()
    proxy.wait(timeout=10)
    portal.kill()
    result = cluster.client("client", vip, 80, count=50)
    assert result["failures"] == 0 and set(result["answers"]) == set(BACKENDS), result
    # The node address comes from the Node object when --node-ip is not given: none here.
    no_node = subprocess.run([a for a in argv if a not in ("--node-ip", NODE_IP)], env=env, capture_output=True, text=True, timeout=30)
    assert no_node.returncode != 0 and "node-1" in no_node.stderr
