"""Fixtures that run the real `portal` binary and point real clients at it.

Each test gets its own data directory and a free port (`--api-bind
127.0.0.1:0`); the server is ready when it has written DIR/kubeconfig.
"""

import os
import pathlib
import signal
import subprocess
import tempfile
import time

import kubernetes
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("PORTAL_BIN", str(ROOT / "target" / "debug" / "portal"))
START_TIMEOUT = 30


# Every Portal started and not yet stopped: what a test started itself and
# left running (an assertion failed before its `stop`) is stopped after it.
RUNNING = set()


class Portal:
    """One `portal server` process on a data directory that outlives it."""

    def __init__(self, data_dir, extra_args=(), proxy=False, agent=False, api_bind="127.0.0.1:0", command="server", launcher=(),
                 data_dir_flag=True):
        self.data_dir = pathlib.Path(data_dir)
        # True: a test bed started it and stops it on its exit.
        self.owned_by_a_bed = False
        # False: `--data-dir` is not passed (a configuration file gives it).
        self.data_dir_flag = data_dir_flag
        # A command the binary runs under, as a user would start it (e.g.
        # `ip netns exec NODE`); it must exec the binary (same pid).
        self.launcher = list(launcher)
        self.api_bind = api_bind
        self.command = command
        # The proxy and the node agent change the network namespace they run
        # in: only tests that made a namespace for them (support/nodes.py) turn
        # them on.
        disabled = [name for name, on in (("proxy", proxy), ("agent", agent)) if not on]
        # `portal apiserver` runs nothing but the API server.
        if command != "server":
            disabled = []
        self.extra_args = list(extra_args) + (["--disable", ",".join(disabled)] if disabled else [])
        self.process = None
        self.log_path = self.data_dir / "portal.log"

    @property
    def kubeconfig(self):
        return str(self.data_dir / "kubeconfig")

    def start(self):
        kubeconfig = pathlib.Path(self.kubeconfig)
        if kubeconfig.exists():
            kubeconfig.unlink()
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [*self.launcher, BINARY, self.command, *(["--data-dir", str(self.data_dir)] if self.data_dir_flag else []),
             "--api-bind", self.api_bind, *self.extra_args],
            stdout=log,
            stderr=log,
        )
        RUNNING.add(self)
        deadline = time.monotonic() + START_TIMEOUT
        while not kubeconfig.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"portal exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"portal did not write its kubeconfig in time:\n{self.log()}")
            time.sleep(0.02)
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        RUNNING.discard(self)

    def kill(self):
        """kill -9: no chance to flush or close anything."""
        self.stop(signal.SIGKILL)

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def config(self):
        with open(self.kubeconfig) as f:
            return yaml.safe_load(f)

    @property
    def server(self):
        return self.config()["clusters"][0]["cluster"]["server"]

    @property
    def token(self):
        return self.config()["users"][0]["user"]["token"]

    def api_client(self):
        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)

    def core(self):
        return kubernetes.client.CoreV1Api(self.api_client())


@pytest.fixture(autouse=True)
def stop_what_the_test_started():
    """Stops the servers a test started and left running. Those of wider
    fixtures were started before this one, and a test bed (`AgentNode`,
    `Bed`) owns the servers it starts, also one restarted during a test:
    theirs to stop."""
    before = set(RUNNING)
    yield
    for server in RUNNING - before:
        if not server.owned_by_a_bed:
            server.stop()


@pytest.fixture(scope="session", autouse=True)
def stop_every_server():
    yield
    for server in list(RUNNING):
        server.stop()


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory(prefix="portal-e2e-") as d:
        yield pathlib.Path(d)


@pytest.fixture
def portal(data_dir, request):
    server = Portal(data_dir).start()
    yield server
    server.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(server.log())


MARKERS = {
    "root": "needs root (network namespaces, nftables, mounts, cgroups); fails, not skips, without it",
    "netns": "creates network namespaces (node and pod namespaces of support.nodes, support.agent_bed, support.lan) or runs pods",
    "etcd": "starts etcd (Debian's etcd-server) through support.etcd",
}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # A test that needs root fails without it (before its fixtures make
    # anything): a skip would hide the gap.
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.fail(f"{item.nodeid} needs root (marked `root`: it makes network namespaces, nftables rules, "
                    f"mounts or cgroups); run the suite as root, or deselect with -m 'not root'", pytrace=False)


@pytest.fixture
def start_portal(data_dir):
    """Starts `portal server` on the test's data directory with extra
    arguments; every server started is stopped at teardown, also when the
    test fails."""
    started = []

    def start(extra_args=()):
        server = Portal(data_dir, list(extra_args)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
