#!/usr/bin/env python3
"""Streaming throughput (issue 14), one run: 100 MiB out of a pod through
`kubectl exec` (WebSocket v5, and SPDY), `kubectl port-forward` (SPDY in a
WebSocket, and SPDY with kubectl 1.20 where present), against the floor: a
direct TCP connection from the node to the pod (the same HTTP server, the
same file). In a test-made node network namespace; every run's bytes are
checked (sha256).

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/streams.py [--mib 100] [--runs 3]
"""

import argparse
import hashlib
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from support.agent_bed import NS, AgentNode, pod_manifest, web_image  # noqa: E402
from test_kubectl import KUBECTLS  # noqa: E402
from test_streams import Forward  # noqa: E402


def fetch(host, port, path):
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        digest, total, head = hashlib.sha256(), 0, b""
        header_done = False
        while chunk := s.recv(1 << 20):
            if not header_done:
                head += chunk
                if b"\r\n\r\n" not in head:
                    continue
                chunk = head.split(b"\r\n\r\n", 1)[1]
                header_done = True
            digest.update(chunk)
            total += len(chunk)
    return total, digest.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    size = args.mib << 20
    rows = []
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="streams-bench-"))
    with AgentNode(data_dir) as node:
        image = web_image(node)
        node.core.create_namespaced_pod(NS, pod_manifest("web", image))
        pod = node.wait_running("web")
        kubeconfig = node.portal.kubeconfig
        made = subprocess.run(
            [KUBECTLS[0], "--kubeconfig", kubeconfig, "-n", NS, "exec", "web", "--", "sh", "-c",
             f"head -c {size} /dev/urandom > /var/www/big && sha256sum /var/www/big"],
            capture_output=True, check=True, timeout=300,
        )
        digest = made.stdout.decode().split()[0]

        def exec_cat(binary, env=None):
            def run():
                proc = subprocess.Popen([binary, "--kubeconfig", kubeconfig, "-n", NS, "exec", "web", "--", "cat", "/var/www/big"],
                                        stdout=subprocess.PIPE, env={**os.environ, **(env or {})})
                h, total = hashlib.sha256(), 0
                while chunk := proc.stdout.read(1 << 20):
                    h.update(chunk)
                    total += len(chunk)
                proc.wait()
                return total, h.hexdigest()
            return run

        def forwarded(binary, env=None):
            def run():
                forward = Forward(node, binary, "pod/web", 8080, env=env)
                try:
                    return fetch("127.0.0.1", forward.local, "/big")
                finally:
                    forward.close()
            return run

        cases = [("direct TCP to the pod (floor)", lambda: fetch(pod.status.pod_ip, 8080, "/big"))]
        cases.append(("kubectl exec cat (WebSocket v5)", exec_cat(KUBECTLS[0])))
        cases.append(("kubectl exec cat (SPDY)", exec_cat(KUBECTLS[0], {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"})))
        cases.append(("kubectl port-forward (SPDY in WebSocket)", forwarded(KUBECTLS[0])))
        cases.append(("kubectl port-forward (SPDY)", forwarded(KUBECTLS[0], {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"})))
        server = node.portal.process.pid

        def cpu_seconds():
            # The server (API server and agent in one process) and the
            # children that ended (kubectl, runc exec).
            fields = open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            ticks = os.sysconf("SC_CLK_TCK")
            return (int(fields[11]) + int(fields[12])) / ticks, children.ru_utime + children.ru_stime

        results, cpu = {}, {}
        for _ in range(args.runs):
            for name, run in cases:
                before = cpu_seconds()
                started = time.monotonic()
                total, got = run()
                took = time.monotonic() - started
                after = cpu_seconds()
                assert total == size and got == digest, f"{name}: {total} bytes, digest {got}"
                results.setdefault(name, []).append(args.mib / took)
                cpu.setdefault(name, []).append((after[0] - before[0], after[1] - before[1]))
        floor = statistics.median(results[cases[0][0]])
        for name, _ in cases:
            mibs = statistics.median(results[name])
            server_cpu = statistics.median(c[0] for c in cpu[name])
            client_cpu = statistics.median(c[1] for c in cpu[name])
            rows.append(f"| {name} | {mibs:.0f} MiB/s | {mibs / floor:.2f} | {server_cpu:.2f} s | {client_cpu:.2f} s |")
    table = (
        f"{args.mib} MiB out of a pod, median of {args.runs} runs, bytes checked every run; CPU of "
        "`portal server` (API server and agent, without the runc it starts) and of kubectl:\n\n"
        "| path | throughput | of the floor | portal CPU | kubectl CPU |\n| --- | --- | --- | --- | --- |\n"
        + "\n".join(rows) + "\n"
    )
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
