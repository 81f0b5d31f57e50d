"""Looking inside running pods (issue 14, SPEC W5): `kubectl logs`,
`exec`, `attach`, `port-forward`, `cp` and `run -it`, through the API
server to the node agent, with every kubectl the machine has (1.32 speaks
WebSocket first, 1.20 only SPDY) and the Python client's `stream`. Pods
run for real in a node namespace the test makes."""

import fcntl
import hashlib
import os
import pty
import select
import signal
import socket
import ssl
import struct
import subprocess
import termios
import threading
import time

import pytest
from kubernetes.stream import portforward, stream

from support import nodes
from support.agent_bed import NS, AgentNode, busybox_image, pod_manifest, web_image
from support.kubectl import KUBECTLS
from support.waiting import holds_for, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

KUBECTL_IDS = lambda p: "kubectl-1.20" if "1.20" in p else "kubectl"  # noqa: E731


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with AgentNode(tmp_path_factory.mktemp("streams")) as node:
        node.web = web_image(node)
        node.busybox = busybox_image(node)
        node.core.create_namespaced_service(NS, {"metadata": {"name": "my-nginx"}, "spec": {"selector": {"app": "shell"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        shell = pod_manifest("shell", node.busybox, ["sh", "-c", "echo started; exec sleep 100000"], labels={"app": "shell"})
        node.core.create_namespaced_pod(NS, shell)
        node.wait_running("shell")
        yield node


def kubectl(node, binary, *args, input=None, env=None, timeout=60):
    return subprocess.run(
        [binary, "--kubeconfig", node.portal.kubeconfig, "-n", NS, *args],
        capture_output=True, input=input, timeout=timeout, env={**os.environ, **(env or {})},
    )


def in_terminal(node, binary, command, timeout=60, cols=123, rows=45):
    """Runs a kubectl command line on a pseudo-terminal of the given size
    (util-linux `script`), returning what the terminal showed."""
    line = f"stty cols {cols} rows {rows}; {binary} --kubeconfig {node.portal.kubeconfig} -n {NS} {command}"
    result = subprocess.run(["script", "-qefc", line, "/dev/null"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return result.returncode, result.stdout.decode(errors="replace")


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_exec_shows_service_variables_and_exit_codes(node, binary):
    printed = kubectl(node, binary, "exec", "shell", "--", "env")  # (Debian's busybox has no printenv)
    assert printed.returncode == 0, printed.stderr
    env = printed.stdout.decode()
    assert "MY_NGINX_SERVICE_HOST=" in env and "MY_NGINX_SERVICE_PORT=80" in env
    failed = kubectl(node, binary, "exec", "shell", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert failed.returncode == 3, failed.stderr
    assert failed.stdout == b"out\n" and b"err\n" in failed.stderr


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_exec_with_stdin_piped_in(node, binary):
    data = os.urandom(300_000)
    result = kubectl(node, binary, "exec", "-i", "shell", "--", "sha256sum", input=data)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split()[0] == hashlib.sha256(data).hexdigest()


def test_exec_over_spdy_when_websockets_are_off(node):
    result = kubectl(node, KUBECTLS[0], "exec", "-i", "shell", "--", "sh", "-c", "cat; exit 7", input=b"spdy\n", env={"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"})
    assert result.returncode == 7 and result.stdout == b"spdy\n", result.stderr


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_exec_on_a_terminal_with_its_size(node, binary):
    # (runc applies the size a moment after the command starts, as
    # containerd does: a command that asks at once may see 0x0.)
    code, screen = in_terminal(node, binary, "exec -it shell -- sh -c 'sleep 0.5; tty; stty size'")
    assert code == 0, screen
    assert "/dev/pts/" in screen and "45 123" in screen


# Every interactive protocol: kubectl 1.32 over WebSocket and SPDY, and
# kubectl 1.20 (SPDY only) when it is there.
SESSIONS = [(KUBECTLS[0], "true"), (KUBECTLS[0], "false")] + [(k, "false") for k in KUBECTLS[1:]]
SESSION_IDS = ["websocket", "spdy"] + ["kubectl-1.20-spdy" for _ in KUBECTLS[1:]]


class TerminalSession:
    """`kubectl exec -it shell -- ARGV` on a pseudo-terminal of ours."""

    def __init__(self, node, binary, websockets, argv, size=(24, 80)):
        pid, self.terminal = pty.fork()
        if pid == 0:
            # The child never returns into the test process's code.
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
                os.execvpe(binary, [
                    binary, "--kubeconfig", str(node.portal.kubeconfig), "-n", NS, "exec", "-it", "shell", "--", *argv],
                    {**os.environ, "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": websockets})
            finally:
                os._exit(127)
        self.pid = pid
        self.seen = b""

    def read_until(self, marker, timeout=60):
        deadline = time.monotonic() + timeout
        while marker not in self.seen:
            assert time.monotonic() < deadline, f"no {marker!r} in {self.seen!r}"
            if select.select([self.terminal], [], [], 0.5)[0]:
                chunk = os.read(self.terminal, 4096)
                assert chunk, f"the session ended: {self.seen!r}"
                self.seen += chunk

    def resize(self, rows, cols):
        # The kernel tells the terminal's foreground process (kubectl) with
        # SIGWINCH, as when a user resizes the window.
        fcntl.ioctl(self.terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.terminal)


@pytest.mark.parametrize(("binary", "websockets"), SESSIONS, ids=SESSION_IDS)
def test_a_terminal_session_reads_only_what_was_typed(node, binary, websockets):
    """Nothing but what the user types reaches the container's terminal
    (kubectl once showed `^@^@` before the first prompt: NUL bytes at the
    start of every interactive session). The container, in raw mode,
    reports the first six bytes it reads."""
    session = TerminalSession(node, binary, websockets, ["sh", "-c", "stty raw; echo READY; dd bs=1 count=6 2>/dev/null | od -c"])
    try:
        session.read_until(b"READY")
        os.write(session.terminal, b"abcdef")
        session.read_until(b"0000006")
    finally:
        session.close()
    report = session.seen.split(b"READY", 1)[1]
    assert b"a   b   c   d   e   f" in report and b"\\0" not in report, session.seen


@pytest.mark.parametrize(("binary", "websockets"), SESSIONS, ids=SESSION_IDS)
def test_a_terminal_follows_its_window_when_resized(node, binary, websockets):
    """Resizing the user's window mid-session resizes the container's
    terminal (kubectl's resize stream / channel 4)."""
    script = "while read line; do echo \"size=$(stty size | tr ' ' x)\"; done"
    session = TerminalSession(node, binary, websockets, ["sh", "-c", script], size=(30, 100))

    def until_size(expected):
        """Asks (a line) until the container reports `expected`."""
        deadline = time.monotonic() + 30
        while expected not in session.seen:
            assert time.monotonic() < deadline, session.seen
            os.write(session.terminal, b"\n")
            if select.select([session.terminal], [], [], 0.3)[0]:
                session.seen += os.read(session.terminal, 4096)

    try:
        # (The first size is applied a moment after the start, as by runc.)
        until_size(b"size=30x100")
        session.resize(52, 140)
        until_size(b"size=52x140")
    finally:
        session.close()


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_logs_with_options(node, binary):
    script = "i=0; while [ $i -lt 5 ]; do echo line$i; i=$((i+1)); done; sleep 1; echo to-stderr >&2; sleep 1; echo late; exec sleep 100000"
    manifest = pod_manifest(f"logs-{len(binary)}", node.busybox, ["sh", "-c", script])
    manifest["spec"]["containers"].append({"name": "second", "image": node.busybox, "command": ["sh", "-c", "echo from-second; exec sleep 100000"]})
    name = manifest["metadata"]["name"]
    node.core.create_namespaced_pod(NS, manifest)
    node.wait_running(name)
    first = manifest["spec"]["containers"][0]["name"]
    wait_for(lambda: b"late" in kubectl(node, binary, "logs", name, "-c", first).stdout, "the late line")
    whole = kubectl(node, binary, "logs", name, "-c", first).stdout.decode()
    assert whole == "line0\nline1\nline2\nline3\nline4\nto-stderr\nlate\n"
    assert kubectl(node, binary, "logs", name, "-c", first, "--tail=2").stdout == b"to-stderr\nlate\n"
    stamped = kubectl(node, binary, "logs", name, "-c", first, "--timestamps", "--tail=1").stdout.decode()
    stamp, text = stamped.rstrip("\n").split(" ", 1)
    assert text == "late" and stamp.endswith("Z") and len(stamp.split(".")[1]) == 10
    assert kubectl(node, binary, "logs", name, "-c", "second").stdout == b"from-second\n"
    assert kubectl(node, binary, "logs", name, "-c", first, "--since=1h").stdout.decode() == whole
    assert kubectl(node, binary, "logs", name, "-c", first, "--limit-bytes=8").stdout == b"line0\nli"
    missing = kubectl(node, binary, "logs", name, "-c", first, "--previous")
    assert missing.returncode != 0 and b"previous terminated container" in missing.stderr


def test_logs_follow_sees_lines_as_written(node):
    name = "follow"
    node.core.create_namespaced_pod(NS, pod_manifest(name, node.busybox, ["sh", "-c", "echo first; sleep 3; echo second; sleep 1"], restartPolicy="Never"))
    node.wait_running(name)
    proc = subprocess.Popen([KUBECTLS[0], "--kubeconfig", node.portal.kubeconfig, "-n", NS, "logs", "-f", name], stdout=subprocess.PIPE)
    try:
        started = time.monotonic()
        assert proc.stdout.readline() == b"first\n"
        assert proc.stdout.readline() == b"second\n"
        assert time.monotonic() - started < 30
        # The stream ends with the container.
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_logs_previous_after_a_restart(node):
    name = "restarts"
    node.core.create_namespaced_pod(NS, pod_manifest(name, node.busybox, ["sh", "-c", "echo run-$(date +%s%N); sleep 1; exit 1"]))
    wait_for(lambda: (node.pod(name).status.container_statuses or [None])[0] and node.pod(name).status.container_statuses[0].restart_count >= 1, "a restart", 60)
    previous = kubectl(node, KUBECTLS[0], "logs", name, "--previous")
    assert previous.returncode == 0 and previous.stdout.startswith(b"run-"), previous.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Forward:
    """`kubectl port-forward TARGET LOCAL:REMOTE` in the background."""

    def __init__(self, node, binary, target, remote, env=None):
        self.local = free_port()
        self.proc = subprocess.Popen(
            [binary, "--kubeconfig", node.portal.kubeconfig, "-n", NS, "port-forward", target, f"{self.local}:{remote}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline().decode()
        assert "Forwarding from" in line, line + self.proc.stderr.read().decode()

    def get(self, path):
        with socket.create_connection(("127.0.0.1", self.local), timeout=10) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def web(node):
    node.core.create_namespaced_pod(NS, pod_manifest("web", node.web, labels={"app": "web"}))
    node.core.create_namespaced_service(NS, {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    node.wait_running("web")
    return "web"


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_port_forward_to_a_pod_and_a_service(node, web, binary):
    for target in ("pod/web", "svc/web"):
        forward = Forward(node, binary, target, 8080 if target.startswith("pod") else 80)
        try:
            results = [None] * 6

            def fetch(i):
                results[i] = forward.get("/name.txt")

            threads = [threading.Thread(target=fetch, args=(i,)) for i in range(len(results))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert all(r and r.startswith(b"HTTP/1.") and r.endswith(b"web\n") for r in results), results
            assert forward.proc.poll() is None
        finally:
            forward.close()


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_port_forward_to_a_closed_port_reports_and_keeps_going(node, web, binary):
    forward = Forward(node, binary, "pod/web", 9999)
    # What kubectl says, read as it comes.
    said = []

    def read():
        while chunk := os.read(forward.proc.stderr.fileno(), 4096):
            said.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        with socket.create_connection(("127.0.0.1", forward.local), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            s.settimeout(15)
            try:
                assert s.recv(100) == b""
            except ConnectionResetError:
                pass
        # kubectl has reported the remote error (then it has handled it).
        wait_for(lambda: b"refused" in b"".join(said), "kubectl to report the refused connection")
        if "1.20" in binary:
            # kubectl 1.20 reports and goes on; since 1.23 kubectl ends the
            # whole forward on any remote error (as against a kubelet).
            holds_for(lambda: forward.proc.poll() is None, "kubectl 1.20 forwarding on after the error", 1)
            assert forward.proc.poll() is None
    finally:
        forward.close()
        reader.join(10)
    stderr = b"".join(said).decode()
    assert "9999" in stderr and "refused" in stderr, stderr


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_cp_into_a_pod_and_back(node, binary, tmp_path):
    data = os.urandom(2_000_000)
    source = tmp_path / "in.bin"
    source.write_bytes(data)
    up = kubectl(node, binary, "cp", str(source), "shell:/tmp/copied.bin")
    assert up.returncode == 0, up.stderr
    back = tmp_path / "back.bin"
    down = kubectl(node, binary, "cp", "shell:/tmp/copied.bin", str(back))
    assert down.returncode == 0, down.stderr
    assert back.read_bytes() == data


@pytest.mark.parametrize("binary", KUBECTLS, ids=KUBECTL_IDS)
def test_run_interactively_then_removed(node, web, binary):
    name = f"t{len(binary)}"
    code, screen = in_terminal(node, binary, f"run -it --rm {name} --image={node.busybox} --restart=Never -- nslookup web.{NS}.svc.cluster.local", timeout=120)
    cluster_ip = node.core.read_namespaced_service("web", NS).spec.cluster_ip
    assert cluster_ip in screen, screen
    assert code == 0, screen
    wait_for(lambda: name not in [p.metadata.name for p in node.core.list_namespaced_pod(NS).items], f"pod {name} removed")


def test_attach_to_a_shell_on_a_terminal(node):
    manifest = pod_manifest("attached", node.busybox, ["sh"])
    manifest["spec"]["containers"][0].update({"stdin": True, "tty": True})
    node.core.create_namespaced_pod(NS, manifest)
    node.wait_running("attached")
    line = f"sleep 2; printf 'echo $((6*7))\\r'; sleep 2; printf 'exit\\r'; sleep 5"
    result = subprocess.run(
        ["script", "-qefc", f"{KUBECTLS[0]} --kubeconfig {node.portal.kubeconfig} -n {NS} attach -it attached", "/dev/null"],
        stdin=subprocess.Popen(["sh", "-c", line], stdout=subprocess.PIPE).stdout, capture_output=False, stdout=subprocess.PIPE, timeout=60,
    )
    assert b"42" in result.stdout, result.stdout
    wait_for(lambda: node.pod("attached").status.container_statuses[0].restart_count >= 1 or node.pod("attached").status.container_statuses[0].state.terminated, "the shell to end")


def test_python_client_exec_and_port_forward(node, web):
    out = stream(node.core.connect_get_namespaced_pod_exec, "shell", NS, command=["sh", "-c", "echo py-$((1+2))"], stderr=True, stdin=False, stdout=True, tty=False)
    assert out == "py-3\n"
    client = stream(node.core.connect_get_namespaced_pod_exec, "shell", NS, command=["sh", "-c", "read x; echo got-$x; exit 4"], stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
    client.write_stdin("hello\n")
    output = ""
    deadline = time.monotonic() + 30
    while client.is_open() and time.monotonic() < deadline:
        client.update(timeout=1)
        output += client.read_stdout() if client.peek_stdout() else ""
    assert "got-hello" in output
    assert client.returncode == 4
    pf = portforward(node.core.connect_get_namespaced_pod_portforward, "web", NS, ports="8080")
    sock = pf.socket(8080)
    sock.setblocking(True)
    sock.sendall(b"GET /name.txt HTTP/1.0\r\n\r\n")
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    assert received.endswith(b"web\n"), received
    assert pf.error(8080) is None


def test_agent_api_refuses_anything_but_the_api_server(node, tmp_path):
    """No client certificate, a certificate from another CA, or a user's
    bearer token: the agent's port answers none of them."""
    address = (nodes.NODE_IP, 10250)
    path = f"/exec/{NS}/shell/shell?command=id&output=1"

    def request(context, headers=""):
        with socket.create_connection(address, timeout=10) as raw:
            with context.wrap_socket(raw) as tls:
                tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
                return tls.recv(4096)

    plain = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    plain.check_hostname = False
    plain.verify_mode = ssl.CERT_NONE
    token = open(node.data_dir / "admin.token").read().strip()
    for headers in ("", f"Authorization: Bearer {token}\r\n"):
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            answer = request(plain, headers)
            assert answer == b"", answer
            raise ConnectionError("closed without an answer")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=portal-apiserver-kubelet-client", "-keyout", tmp_path / "k.pem", "-out", tmp_path / "c.pem", "-days", "1", "-addext", "extendedKeyUsage=clientAuth"], check=True, capture_output=True)
    forged = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    forged.check_hostname = False
    forged.verify_mode = ssl.CERT_NONE
    forged.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        answer = request(forged)
        assert answer == b"", answer
        raise ConnectionError("closed without an answer")


def test_100_mib_through_exec_and_port_forward_arrive_intact(node, web, tmp_path):
    size = 100 * 1024 * 1024
    made = kubectl(node, KUBECTLS[0], "exec", "web", "--", "sh", "-c", f"head -c {size} /dev/urandom > /var/www/big && sha256sum /var/www/big", timeout=120)
    assert made.returncode == 0, made.stderr
    digest = made.stdout.decode().split()[0]
    through_exec = subprocess.run(
        [KUBECTLS[0], "--kubeconfig", node.portal.kubeconfig, "-n", NS, "exec", "web", "--", "cat", "/var/www/big"],
        capture_output=True, timeout=300,
    )
    assert through_exec.returncode == 0 and len(through_exec.stdout) == size
    assert hashlib.sha256(through_exec.stdout).hexdigest() == digest
    forward = Forward(node, KUBECTLS[0], "pod/web", 8080)
    try:
        body = forward.get("/big").split(b"\r\n\r\n", 1)[1]
    finally:
        forward.close()
    assert len(body) == size and hashlib.sha256(body).hexdigest() == digest


def test_pod_and_service_proxy_for_kubectl_proxy_users(node, web):
    base = f"/api/v1/namespaces/{NS}"
    for path in (f"{base}/pods/web:8080/proxy/name.txt", f"{base}/services/web/proxy/name.txt", f"{base}/services/http:web:80/proxy/name.txt"):
        raw = kubectl(node, KUBECTLS[0], "get", "--raw", path)
        assert raw.returncode == 0 and raw.stdout == b"web\n", (path, raw.stderr)
    missing = kubectl(node, KUBECTLS[0], "get", "--raw", f"{base}/services/my-nginx:80/proxy/")
    assert missing.returncode != 0
    port = free_port()
    proxy = subprocess.Popen([KUBECTLS[0], "--kubeconfig", node.portal.kubeconfig, "proxy", f"--port={port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert b"Starting to serve" in proxy.stdout.readline()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(f"GET {base}/services/web/proxy/env.txt HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n")[0] and b"HOSTNAME=web" in answer, answer[:300]
    finally:
        proxy.kill()
        proxy.wait()


def test_bad_requests_get_a_status_with_the_right_code(node, web):
    """Bad input to the pod subresources and proxies: a Kubernetes Status
    with the right reason (kubectl prints it), never a 500."""
    base = f"/api/v1/namespaces/{NS}"
    cases = [
        (f"{base}/pods/shell/log?container=nope", "BadRequest", "container nope is not valid for pod shell"),
        (f"{base}/pods/shell/log?tailLines=x", "BadRequest", "tailLines"),
        (f"{base}/pods/shell/log?sinceSeconds=1&sinceTime=2026-01-01T00:00:00Z", "BadRequest", "at most one of sinceTime or sinceSeconds"),
        (f"{base}/pods/missing/log", "NotFound", 'pods "missing" not found'),
        (f"{base}/services/https:web:443/proxy/", "BadRequest", "HTTP only"),
        (f"{base}/services/web:nope/proxy/", "ServiceUnavailable", "no such port"),
        (f"{base}/pods/web:notaport/proxy/", "BadRequest", "has no port"),
    ]
    for path, reason, words in cases:
        result = kubectl(node, KUBECTLS[0], "get", "--raw", path)
        stderr = result.stderr.decode()
        assert result.returncode != 0 and f"({reason})" in stderr and words in stderr, (path, stderr)
