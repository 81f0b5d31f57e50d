"""Certificates of a test cluster's CA and HTTPS servers that use them
(webhooks, extension API servers on loopback or in pods)."""

import contextlib
import http.server
import ssl
import subprocess
import threading


def cluster_signed(tmp, pki, subject_alt_name, common_name="test-server"):
    """A serving certificate for `subject_alt_name` (`DNS:…` or `IP:…`)
    signed by the cluster CA in `pki`: the paths of its certificate and key."""
    (tmp / "ext").write_text(f"subjectAltName={subject_alt_name}\nextendedKeyUsage=serverAuth\n")
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(tmp / "tls.key"), "-out", str(tmp / "tls.csr"), "-subj", f"/CN={common_name}"],
                   check=True, capture_output=True, timeout=60)
    subprocess.run(["openssl", "x509", "-req", "-in", str(tmp / "tls.csr"), "-CA", str(pki / "ca.crt"),
                    "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", str(tmp / "ext"),
                    "-out", str(tmp / "tls.crt")], check=True, capture_output=True, timeout=60)
    return tmp / "tls.crt", tmp / "tls.key"


@contextlib.contextmanager
def https_server(handler, certificate, key):
    """`handler` served over HTTPS on a free loopback port while the block
    runs (in a thread); yields the server."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certificate), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def agent_client_certificate(tmp, pki):
    """A client certificate from the agent API's CA (as the API server's)."""
    key, csr, crt = tmp / "client.key", tmp / "client.csr", tmp / "client.crt"
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", key, "-subj", "/CN=static-pod-test", "-out", csr], check=True, capture_output=True)
    ext = tmp / "client.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n")
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", pki / "kubelet-client-ca.crt", "-CAkey", pki / "kubelet-client-ca.key",
                    "-CAcreateserial", "-days", "1", "-out", crt, "-extfile", ext], check=True, capture_output=True)
    return crt, key
