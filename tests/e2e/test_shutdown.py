"""SIGTERM drains the API server: requests in flight are answered, watches
end with a clean end of stream, the process exits within 10 s, and the
store is whole at the next start."""

import http.client
import json
import signal
import socket
import ssl
import threading
import time
import urllib.parse

from support.api import portal_ca
from support.waiting import wait_for

WRITERS = 12
EXIT_WITHIN = 10


class Writer(threading.Thread):
    """Creates Services, one connection per request, until the server goes;
    sorts every attempt by how it ended."""

    def __init__(self, portal, index):
        super().__init__(daemon=True)
        self.index = index
        self.acknowledged = []  # 201 received
        self.unanswered = []  # request sent, connection closed without an answer
        self.broken = []  # a partial answer, or an error status
        url = urllib.parse.urlparse(portal.server)
        self.host, self.port = url.hostname, url.port
        self.context = ssl.create_default_context()
        self.context.load_verify_locations(cadata=portal_ca(portal))
        self.headers = {
            "Authorization": f"Bearer {portal.token}",
            "Content-Type": "application/json",
            "Connection": "close",
        }

    def run(self):
        for n in range(100_000):
            name = f"w{self.index}-{n}"
            body = json.dumps({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=15)
            try:
                conn.connect()
            except OSError:
                return  # not accepted: the server stopped listening
            try:
                conn.request("POST", "/api/v1/namespaces/default/services", body, self.headers)
            except OSError:
                return  # closed before the request was read
            try:
                response = conn.getresponse()
                response.read()
            except http.client.RemoteDisconnected:
                self.unanswered.append(name)
                return
            except (OSError, http.client.HTTPException) as error:
                self.broken.append(f"{name}: {error!r}")
                return
            finally:
                conn.close()
            if response.status == 201:
                self.acknowledged.append(name)
            else:
                self.broken.append(f"{name}: HTTP {response.status}")
                return


class Watcher(threading.Thread):
    """One watch of Services over a raw TLS socket, read to the end: a
    clean end is the chunked body's last chunk (`0\\r\\n\\r\\n`) before the
    connection closes, not a connection cut mid-stream."""

    def __init__(self, portal):
        super().__init__(daemon=True)
        url = urllib.parse.urlparse(portal.server)
        self.host, self.port = url.hostname, url.port
        self.context = ssl.create_default_context()
        self.context.load_verify_locations(cadata=portal_ca(portal))
        self.token = portal.token
        self.received = b""
        self.ending = None

    def names(self):
        body = self.received.partition(b"\r\n\r\n")[2]
        return [line for line in body.split(b"\n") if b'"name":"before"' in line]

    def run(self):
        with socket.create_connection((self.host, self.port), timeout=30) as raw:
            with self.context.wrap_socket(raw, server_hostname=self.host) as tls:
                tls.sendall(
                    b"GET /api/v1/namespaces/default/services?watch=true HTTP/1.1\r\n"
                    + f"Host: {self.host}\r\nAuthorization: Bearer {self.token}\r\n\r\n".encode()
                )
                try:
                    while chunk := tls.recv(65536):
                        self.received += chunk
                except (OSError, ssl.SSLError) as error:
                    self.ending = repr(error)
                    return
        self.ending = "clean" if self.received.endswith(b"\r\n0\r\n\r\n") else "cut short"


def test_sigterm_drains_requests_and_watches(start_portal):
    portal = start_portal()
    core = portal.core()
    watcher = Watcher(portal)
    watcher.start()
    core.create_namespaced_service("default", {"metadata": {"name": "before"}, "spec": {"ports": [{"port": 80}]}})
    wait_for(watcher.names, "the watch to see a create")

    writers = [Writer(portal, i) for i in range(WRITERS)]
    for w in writers:
        w.start()
    wait_for(lambda: sum(len(w.acknowledged) for w in writers) >= 100, "writes to be under way")

    process = portal.process
    process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    process.wait(timeout=EXIT_WITHIN + 5)
    took = time.monotonic() - started
    portal.process = None
    for w in writers:
        w.join(20)
    watcher.join(5)

    log = portal.log()
    assert process.returncode == 0, log[-3000:]
    assert took < EXIT_WITHIN, f"exited {took:.1f} s after SIGTERM"
    assert "API server stopped" in log
    assert watcher.ending == "clean", f"the watch ended with {watcher.ending}"
    broken = [b for w in writers for b in w.broken]
    assert not broken, f"requests cut short: {broken[:5]}"

    # Nothing acknowledged is lost, and nothing was done without an answer:
    # a request the server took on was answered.
    portal.start()
    acknowledged = {name for w in writers for name in w.acknowledged}
    unanswered = {name for w in writers for name in w.unanswered}
    stored = {s.metadata.name for s in portal.core().list_namespaced_service("default").items}
    assert acknowledged <= stored, f"lost: {sorted(acknowledged - stored)[:5]}"
    assert not (unanswered & stored), f"done but never answered: {sorted(unanswered & stored)[:5]}"
    print(f"{len(acknowledged)} writes acknowledged, {len(unanswered)} closed unread, exit after {took:.2f} s")
    portal.core().create_namespaced_service("default", {"metadata": {"name": "after"}, "spec": {"ports": [{"port": 80}]}})
