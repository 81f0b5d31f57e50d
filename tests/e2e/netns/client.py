"""A client pod's load for the proxy tests: COUNT requests (TCP connections,
or UDP datagrams from one socket) to HOST:PORT, one at a time; prints JSON
{"answers": {name: count}, "peers": [...], "failures": n, "errors": [...]}.
With --seconds S it keeps going for S seconds instead (COUNT ignored); with
--until FILE, until FILE exists. --progress FILE: the number of requests
answered so far, rewritten after each (for a test to wait on)."""

import argparse
import collections
import json
import os
import socket
import time

parser = argparse.ArgumentParser()
parser.add_argument("host")
parser.add_argument("port", type=int)
parser.add_argument("count", type=int)
parser.add_argument("--udp", action="store_true")
parser.add_argument("--seconds", type=float)
parser.add_argument("--pause", type=float, default=0.0)
parser.add_argument("--until")
parser.add_argument("--progress")
args = parser.parse_args()

answers, peers, errors = collections.Counter(), set(), collections.Counter()
failures = 0


def tcp_once():
    with socket.create_connection((args.host, args.port), timeout=2) as conn:
        return conn.makefile().readline().strip()


udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if args.udp else None
if udp:
    udp.settimeout(2)


def udp_once():
    udp.sendto(b"ping", (args.host, args.port))
    data, _ = udp.recvfrom(2048)
    return data.decode()


once = udp_once if args.udp else tcp_once
deadline = time.monotonic() + args.seconds if args.seconds else None


def going():
    if args.until:
        return not os.path.exists(args.until)
    if deadline:
        return time.monotonic() < deadline
    return done < args.count


def report():
    temporary = args.progress + ".tmp"
    with open(temporary, "w") as f:
        f.write(str(sum(answers.values())))
    os.replace(temporary, args.progress)


done = 0
while going():
    done += 1
    try:
        line = once()
        name, peer = line.split()
        answers[name] += 1
        peers.add(peer)
    except (OSError, ValueError) as error:
        failures += 1
        errors[type(error).__name__ + ": " + str(error)] += 1
    if args.progress:
        report()
    if args.pause:
        time.sleep(args.pause)
print(json.dumps({"answers": answers, "peers": sorted(peers), "failures": failures, "errors": errors, "sent": done}))
