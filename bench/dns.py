#!/usr/bin/env python3
"""Cluster DNS benchmark (issue 7): Portal DNS against Knot DNS, one run.

Fills a `portal server` with N Services (each with a named port) and their
EndpointSlices (M endpoints in all), starts `portal dns` against it and
`knotd` on a zone file generated from the same Services, both with the same
number of server threads, then runs dnsperf against each with the same
query file (an A query per Service name, shuffled). Also measures DNS
programming latency (Service created -> answerable, polled over UDP) and the
memory of the `portal dns` process.

Writes a Markdown table to $BENCH_OUT (or stdout). Traffic stays on
127.0.0.1. Usage: bench/dns.py [--services N] [--endpoints M] [--threads T]
"""

import argparse
import concurrent.futures
import os
import pathlib
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PORTAL = ROOT / "target" / "release" / "portal"
NAMESPACE = "bench-dns"
DOMAIN = "cluster.local"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        return udp.getsockname()[1]


def wait_for(check, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def query_packet(name, qid):
    header = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.strip(".").split("."))
    return header + labels + b"\x00" + struct.pack(">HH", 1, 1)


def answered(sock, addr, name, qid):
    """One UDP A query; True when the answer has at least one record."""
    sock.sendto(query_packet(name, qid), addr)
    try:
        data, _ = sock.recvfrom(4096)
    except socket.timeout:
        return False
    rid, flags, _, ancount = struct.unpack(">HHHH", data[:8])
    return rid == qid and flags & 0xF == 0 and ancount > 0


def dnsperf(port, queries, threads, seconds, extra=()):
    out = subprocess.run(
        ["dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", str(queries), "-l", str(seconds),
         "-T", str(threads), "-c", str(threads * 4), "-q", "200", *extra],
        capture_output=True, text=True, check=True,
    ).stdout
    return out


def parse_throughput(out):
    qps = float(re.search(r"Queries per second:\s+([\d.]+)", out).group(1))
    avg = float(re.search(r"Average Latency \(s\):\s+([\d.]+)", out).group(1))
    lost = re.search(r"Queries lost:\s+(\d+)", out).group(1)
    completed = re.search(r"Queries completed:\s+(\d+)", out).group(1)
    return qps, avg, int(lost), int(completed)


def latency_p99(port, queries, rate):
    """Per-query latencies at a fixed rate (dnsperf -v), p50 and p99."""
    out = dnsperf(port, queries, 1, 5, ["-Q", str(rate), "-v"])
    samples = sorted(float(line.split()[-1]) for line in out.splitlines() if line.startswith("> "))
    if not samples:
        return float("nan"), float("nan")
    return samples[len(samples) // 2], samples[int(len(samples) * 0.99)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    import kubernetes  # noqa: E402

    work = pathlib.Path(tempfile.mkdtemp(prefix="portal-bench-dns-"))
    processes = []
    try:
        server = subprocess.Popen(
            [PORTAL, "server", "--data-dir", work / "data", "--api-bind", "127.0.0.1:0", "--disable", "controllers,proxy"],
            stdout=open(work / "server.log", "wb"), stderr=subprocess.STDOUT,
        )
        processes.append(server)
        kubeconfig = work / "data" / "kubeconfig"
        wait_for(kubeconfig.exists, 60, "the API server")
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        client.configuration.connection_pool_maxsize = 32
        core = kubernetes.client.CoreV1Api(client)
        discovery = kubernetes.client.DiscoveryV1Api(client)
        core.create_namespace({"metadata": {"name": NAMESPACE}})

        per_service = max(1, args.endpoints // args.services)
        started = time.monotonic()

        def fill(i):
            svc = core.create_namespaced_service(NAMESPACE, {
                "metadata": {"name": f"s{i}"},
                "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
            })
            endpoints = [
                {"addresses": [f"10.{100 + (i * per_service + j) // 65536}.{(i * per_service + j) // 256 % 256}.{(i * per_service + j) % 256}"],
                 "conditions": {"ready": True}}
                for j in range(per_service)
            ]
            discovery.create_namespaced_endpoint_slice(NAMESPACE, {
                "metadata": {"name": f"s{i}-1", "labels": {"kubernetes.io/service-name": f"s{i}"}},
                "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": endpoints,
            })
            return f"s{i}.{NAMESPACE}.svc.{DOMAIN}.", svc.spec.cluster_ip

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            services = list(pool.map(fill, range(args.services)))
        fill_seconds = time.monotonic() - started

        # Portal DNS, standalone so its memory is its own.
        portal_port = free_port()
        dns = subprocess.Popen(
            [PORTAL, "dns", "--kubeconfig", kubeconfig, "--bind", f"127.0.0.1:{portal_port}",
             "--cluster-domain", DOMAIN, "--dns-threads", str(args.threads)],
            stdout=open(work / "dns.log", "wb"), stderr=subprocess.STDOUT,
        )
        processes.append(dns)
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.settimeout(0.5)
        last_name = services[-1][0]
        wait_for(lambda: answered(probe, ("127.0.0.1", portal_port), last_name, 1), 120, "Portal DNS to load")
        time.sleep(1)
        portal_rss = rss_mib(dns.pid)

        # Knot DNS on a zone file with the same names.
        zone = work / f"{DOMAIN}.zone"
        with open(zone, "w") as f:
            f.write(f"$ORIGIN {DOMAIN}.\n$TTL 5\n")
            f.write(f"@ SOA ns.dns.{DOMAIN}. hostmaster.{DOMAIN}. 1 7200 1800 86400 5\n@ NS ns.dns.{DOMAIN}.\n")
            for name, ip in services:
                f.write(f"{name} A {ip}\n_http._tcp.{name} SRV 0 100 80 {name}\n")
        knot_port = free_port()
        (work / "knot").mkdir()
        conf = work / "knot.conf"
        conf.write_text(
            f"server:\n  listen: 127.0.0.1@{knot_port}\n  udp-workers: {args.threads}\n  tcp-workers: 1\n"
            f"  background-workers: 1\n  rundir: {work / 'knot'}\n"
            f"database:\n  storage: {work / 'knot'}\n"
            f"zone:\n  - domain: {DOMAIN}\n    file: {zone}\n    storage: {work}\n    semantic-checks: off\n    zonefile-sync: -1\n    journal-content: none\n"
        )
        knot = subprocess.Popen(["knotd", "-c", str(conf)], stdout=open(work / "knot.log", "wb"), stderr=subprocess.STDOUT)
        processes.append(knot)
        wait_for(lambda: answered(probe, ("127.0.0.1", knot_port), last_name, 2), 60, "Knot to load")
        knot_rss = rss_mib(knot.pid)

        queries = work / "queries.txt"
        lines = [f"{name} A\n" for name, _ in services]
        random.Random(7).shuffle(lines)
        queries.write_text("".join(lines))

        results = {}
        for label, port in (("Knot DNS", knot_port), ("Portal DNS", portal_port)):
            dnsperf(port, queries, 1, 2)  # warm-up
            qps, avg, lost, completed = parse_throughput(dnsperf(port, queries, 1, args.seconds))
            p50, p99 = latency_p99(port, queries, 10_000)
            results[label] = (qps, avg, p50, p99, lost, completed)

        # Programming latency: Service acknowledged by the API -> answerable.
        latencies = []
        for i in range(args.samples):
            name = f"new{i}.{NAMESPACE}.svc.{DOMAIN}."
            # From before the request: the API's durable write is included.
            created = time.monotonic()
            core.create_namespaced_service(NAMESPACE, {
                "metadata": {"name": f"new{i}"}, "spec": {"ports": [{"port": 80}]}})
            qid = 1000 + i
            probe.settimeout(0.2)
            while not answered(probe, ("127.0.0.1", portal_port), name, qid % 65536):
                qid += 1
                if time.monotonic() - created > 5:
                    raise SystemExit(f"{name} not answerable after 5 s")
            latencies.append(time.monotonic() - created)
        latencies.sort()
        time.sleep(1)
        portal_rss_after = rss_mib(dns.pid)
        p = lambda q: latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1000

        coredns_mb = 49 + 0.86 * (args.endpoints + args.services) / 1000
        knot, ours = results["Knot DNS"], results["Portal DNS"]
        table = [
            "| server | queries/s | avg latency | p50 at 10k q/s | p99 at 10k q/s | lost |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for label, (qps, avg, p50, p99, lost, completed) in results.items():
            table.append(f"| {label} | {qps:,.0f} | {avg * 1e6:.0f} µs | {p50 * 1e6:.0f} µs | {p99 * 1e6:.0f} µs | {lost} of {completed + lost} |")
        table += [
            "",
            "| measure | value |",
            "| --- | ---: |",
            f"| Portal / Knot queries/s | **{ours[0] / knot[0]:.2f}×** |",
            f"| Service create request → answerable p50 | {p(0.5):.2f} ms |",
            f"| Service create request → answerable p99 | {p(0.99):.2f} ms |",
            f"| `portal dns` RSS ({args.services} Services, {args.endpoints} endpoints), right after the initial list | {portal_rss:.0f} MiB |",
            f"| `portal dns` RSS at the end of the run (steady state) | {portal_rss_after:.0f} MiB |",
            f"| Knot RSS (the same names as a zone) | {knot_rss:.0f} MiB |",
            f"| CoreDNS's published formula for this size | {coredns_mb:.0f} MB |",
            f"| fill ({args.services} Services + slices through the API) | {fill_seconds:.1f} s |",
            "",
            f"{args.threads} server thread(s) each; dnsperf with 1 thread, {args.seconds} s, "
            f"an A query per Service name in random order; latency percentiles from a "
            f"separate 5 s run at 10,000 queries/s (dnsperf -v). Programming latency: "
            f"{args.samples} Services, from sending the create request (the API's fsync "
            f"included) to the first UDP answer, polled back to back.",
        ]
        text = "\n".join(table) + "\n"
        out = os.environ.get("BENCH_OUT")
        if out:
            pathlib.Path(out).write_text(text)
        print(text)
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    main()
