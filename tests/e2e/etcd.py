"""Real etcd clusters for the end-to-end tests: `etcd` processes (Debian's
etcd-server) on free loopback ports, data in a temporary directory, all
killed and removed by `stop()` (also when a test fails)."""

import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request

START_TIMEOUT = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdCluster:
    """`tls`: (ca, serving cert, serving key, client cert, client key) files:
    members serve https and require a client certificate of that CA."""

    def __init__(self, size, tls=None):
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.dir = tempfile.mkdtemp(prefix="portal-etcd-")
        self.members = [{"name": f"m{i}", "client": free_port(), "peer": free_port(), "process": None} for i in range(size)]
        self.initial = ",".join(f"{m['name']}=http://127.0.0.1:{m['peer']}" for m in self.members)

    def start(self):
        try:
            for i in range(len(self.members)):
                self.spawn(i)
            for i in range(len(self.members)):
                self.wait_healthy(i)
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self, i):
        m = self.members[i]
        client, peer = f"{self.scheme}://127.0.0.1:{m['client']}", f"http://127.0.0.1:{m['peer']}"
        secure = []
        if self.tls:
            ca, cert, key, _, _ = self.tls
            secure = ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth"]
        log = open(f"{self.dir}/{m['name']}.log", "ab")
        m["process"] = subprocess.Popen(
            ["etcd", "--name", m["name"], "--data-dir", f"{self.dir}/{m['name']}",
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", self.initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", f"portal-e2e-{self.members[0]['client']}",
             "--logger", "zap", "--log-level", "error", *secure],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def wait_healthy(self, i):
        url = f"{self.scheme}://127.0.0.1:{self.members[i]['client']}/health"
        handlers = [urllib.request.ProxyHandler({})]
        if self.tls:
            ca, _, _, cert, key = self.tls
            context = ssl.create_default_context(cafile=ca)
            context.load_cert_chain(cert, key)
            handlers.append(urllib.request.HTTPSHandler(context=context))
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                # Never through a proxy the environment may name.
                opener = urllib.request.build_opener(*handlers)
                with opener.open(url, timeout=2) as answer:
                    if b'"health":"true"' in answer.read():
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd member {i} not healthy in {START_TIMEOUT} s")
            time.sleep(0.1)

    @property
    def endpoint(self):
        """A `--datastore-endpoint` naming every member."""
        if self.tls:
            return ",".join(f"https://127.0.0.1:{m['client']}" for m in self.members)
        return "etcd://" + ",".join(f"127.0.0.1:{m['client']}" for m in self.members)

    def kill(self, i):
        process = self.members[i]["process"]
        if process and process.poll() is None:
            process.kill()
            process.wait()
        self.members[i]["process"] = None

    def restart(self, i):
        self.kill(i)
        self.spawn(i)
        self.wait_healthy(i)

    def stop(self):
        for i in range(len(self.members)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)
