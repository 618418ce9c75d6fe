"""Test certificates for the TLS benchmarks (scripts/bench --scenarios tls, scripts/bench-tls).

make_certs(dir, key_type) writes, with the openssl command:
    ca.pem / ca.key          a CA (P-256 or RSA 2048)
    server.pem / server.key  localhost and 127.0.0.1, signed by the CA
Files are world-readable: memcached drops to `-u nobody` before it reads its certificate.
"""

import os
import subprocess


def make_certs(d, key_type="ec"):
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    new_key = {"ec": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"],
               "rsa": ["-newkey", "rsa:2048", "-nodes"]}[key_type]
    run("req", "-x509", *new_key, "-days", "2", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=bench-ca")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("req", *new_key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-out", "server.pem", "-extfile", "ext")
    os.chmod(d, 0o755)
    for name in ("ca.pem", "server.pem", "server.key"):
        os.chmod(os.path.join(d, name), 0o644)
    return tuple(os.path.join(d, n) for n in ("ca.pem", "server.pem", "server.key"))
