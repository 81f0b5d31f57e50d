"""A pod's server for the proxy tests: answers every TCP connection and
every UDP datagram with "NAME PEER-IP" (so tests see which backend answered
and which source address it saw). TCP connections stay open for more
lines until the client closes, so long-lived connections can be tested."""

import hashlib
import socket
import sys
import threading

name, tcp_port, udp_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def serve_tcp():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", tcp_port))
    listener.listen(512)
    while True:
        conn, peer = listener.accept()
        threading.Thread(target=answer, args=(conn, peer), daemon=True).start()


PATTERN = bytes(range(256)) * 4096  # 1 MiB


def answer(conn, peer):
    """Greets; then per line: "big N" sends N MiB of PATTERN and closes,
    "sink N" reads N bytes and answers their SHA-256; anything else is
    answered with the greeting again."""
    with conn:
        try:
            conn.sendall(f"{name} {peer[0]}\n".encode())
            reader = conn.makefile("rb")
            for line in reader:
                words = line.split()
                if words[:1] == [b"big"]:
                    for _ in range(int(words[1])):
                        conn.sendall(PATTERN)
                    return
                if words[:1] == [b"sink"]:
                    data = reader.read(int(words[1]))
                    conn.sendall(hashlib.sha256(data).hexdigest().encode() + b"\n")
                    continue
                conn.sendall(f"{name} {peer[0]}\n".encode())
        except OSError:
            pass


def serve_udp():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", udp_port))
    while True:
        _, peer = sock.recvfrom(2048)
        sock.sendto(f"{name} {peer[0]}".encode(), peer)


threading.Thread(target=serve_udp, daemon=True).start()
print("ready", flush=True)
serve_tcp()
