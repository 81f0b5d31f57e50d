"""Real etcd clusters for the end-to-end tests: `etcd` processes (Debian's
etcd-server) on free loopback ports, data in a temporary directory, all
killed and removed by `stop()` (also when a test fails).

Ports are taken below the kernel's ephemeral range (an outgoing connection
cannot grab one between our check and etcd's bind) and never twice by one
process; a cluster whose member exits or stays unhealthy is started again
on fresh ports, and a final failure shows the members' logs."""

import os
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request

START_TIMEOUT = 30
START_ATTEMPTS = 3
LOWEST_PORT = 20000
_taken_ports = set()


def _ephemeral_start():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            start = int(f.read().split()[0])
        return start if start > LOWEST_PORT + 1000 else 32768
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A loopback port nobody listens on, below the ephemeral range, not
    handed out before by this process."""
    for _ in range(1000):
        port = random.randrange(LOWEST_PORT, _ephemeral_start())
        if port in _taken_ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _taken_ports.add(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


class EtcdCluster:
    """`tls`: (ca, serving cert, serving key, client cert, client key) files:
    members serve https and require a client certificate of that CA."""

    def __init__(self, size, tls=None):
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.size = size
        self._place()

    def _place(self):
        """Fresh ports, data directory and cluster token."""
        self.dir = tempfile.mkdtemp(prefix="portal-etcd-")
        self.members = [{"name": f"m{i}", "client": free_port(), "peer": free_port(), "process": None}
                        for i in range(self.size)]
        self.initial = ",".join(f"{m['name']}=http://127.0.0.1:{m['peer']}" for m in self.members)
        self.token = f"portal-e2e-{os.getpid()}-{self.members[0]['client']}"

    def start(self):
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                for i in range(len(self.members)):
                    self.spawn(i)
                for i in range(len(self.members)):
                    self.wait_healthy(i)
                return self
            except RuntimeError as failure:
                logs = self.logs()
                self.stop()
                if attempt == START_ATTEMPTS:
                    raise RuntimeError(f"etcd cluster did not start in {START_ATTEMPTS} attempts: {failure}\n{logs}")
                print(f"etcd cluster did not start (attempt {attempt}: {failure}), trying again on fresh ports\n{logs}")
                self._place()
            except BaseException:
                self.stop()
                raise

    def logs(self):
        """The members' logs (errors only), for a failure message."""
        out = []
        for m in self.members:
            try:
                with open(f"{self.dir}/{m['name']}.log", errors="replace") as f:
                    out.append(f"--- {m['name']} log:\n{f.read().rstrip()}")
            except OSError:
                pass
        return "\n".join(out)

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
             "--initial-cluster-token", self.token,
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
            status = self.members[i]["process"].poll()
            if status is not None:
                raise RuntimeError(f"etcd member {i} exited ({status})")
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
        try:
            self.wait_healthy(i)
        except RuntimeError as failure:
            raise RuntimeError(f"{failure}\n{self.logs()}") from None

    def stop(self):
        for i in range(len(self.members)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)
