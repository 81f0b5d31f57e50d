"""Connection latency for the proxy benchmark: COUNT sequential TCP
connects to HOST:PORT, each timed from connect() to established (the SYN is
the packet the NAT rules decide on), closed with a reset so no TIME_WAIT
piles up. Prints JSON {"p50": ms, "p99": ms, "failures": n}."""

import json
import socket
import struct
import sys
import time

host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times, failures = [], 0
linger = struct.pack("ii", 1, 0)
for _ in range(count):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    sock.settimeout(2)
    started = time.perf_counter()
    try:
        sock.connect((host, port))
        times.append(time.perf_counter() - started)
    except OSError:
        failures += 1
    finally:
        sock.close()
times.sort()
pick = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1000 if times else float("nan")
print(json.dumps({"p50": pick(0.5), "p99": pick(0.99), "failures": failures, "count": count}))
