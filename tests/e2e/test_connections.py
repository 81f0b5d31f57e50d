"""Slow and idle clients cannot exhaust the API server: connections that
never finish TLS are closed after the handshake timeout while real clients
keep being served, and past `--max-connections` new connections are closed
at once (and counted)."""

import resource
import subprocess
import socket

from conftest import Portal
from support.waiting import wait_for

IDLE = 4000


def api_address(portal):
    server = portal.config()["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    return host, int(port)


def open_idle(address, count):
    """TCP connections that never start TLS."""
    sockets = []
    for _ in range(count):
        s = socket.create_connection(address, timeout=10)
        s.setblocking(False)
        sockets.append(s)
    return sockets


def closed_by_server(s):
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_are_closed_while_clients_are_served(data_dir):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, IDLE + 1000)), hard))
    portal = Portal(data_dir, ["--tls-handshake-timeout", "3"]).start()
    idle = []
    try:
        idle = open_idle(api_address(portal), IDLE)
        # Real clients are served while the idle connections are held.
        core = portal.core()
        assert core.read_namespace("default").metadata.name == "default"
        # The handshake timeout is 3 s: all are gone well within 30.
        still_open = idle

        def all_closed():
            nonlocal still_open
            still_open = [s for s in still_open if not closed_by_server(s)]
            return not still_open

        wait_for(all_closed, f"the {IDLE} idle connections to be closed", timeout=30, interval=0.5)
        assert not still_open, f"{len(still_open)} of {IDLE} idle connections still open"
        assert core.read_namespace("default").metadata.name == "default"
    finally:
        for s in idle:
            s.close()
        portal.stop()


def test_connections_past_the_maximum_are_refused_at_once(data_dir):
    portal = Portal(data_dir, ["--max-connections", "64", "--tls-handshake-timeout", "30"]).start()
    idle = []
    try:
        idle = open_idle(api_address(portal), 100)
        # Closed by the server well before their 30 s handshake timeout: refused.
        def refused_ones():
            refused = [s for s in idle if closed_by_server(s)]
            return refused if len(refused) >= 100 - 64 else None

        refused = wait_for(refused_ones, f"{100 - 64} connections refused", timeout=10)
        assert len(refused) >= 100 - 64, len(refused)
        for s in idle:
            s.close()
        idle = []
        # Freed slots serve again (once the server has seen the connections
        # close), and the refusals were counted.
        metrics = wait_for(lambda: (r := subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, "get", "--raw", "/metrics"],
                                                         capture_output=True, text=True, timeout=30)).returncode == 0 and r.stdout,
                           "a request served in a freed slot")
        count = next(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("portal_apiserver_refused_connections_total"))
        assert count >= 100 - 64
    finally:
        for s in idle:
            s.close()
        portal.stop()
