"""The `scale` scenario of scripts/bench: resident memory per client connection.

For each target (twemproxy, memroute with each worker count asked for) over one memcached:

    baseline RSS
    -> N idle connections (spread over client processes: 20,000 open files per process at most)
       RSS -> idle KiB per connection
    -> one 4 KiB `set` + `get` on every connection, then idle again
       RSS -> KiB per connection after traffic
    -> all closed: RSS above baseline (MB)
    -> ratchet: R rounds of M connections (connect, one get each, close), RSS above baseline
       after each round (MB): memory that does not come back shows up as growth per round

RSS is VmRSS from /proc/PID/status, read once the numbers stop moving (the proxy may still
be accepting or freeing). Run as `scripts/bench --scenarios scale`; this file is also the
client process (`python3 bench_scale.py client PORT COUNT`).
"""

import os
import resource
import socket
import subprocess
import sys
import time

VALUE = b"x" * 4096


def raise_nofile():
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def recv_until(sock, ending):
    data = b""
    while not data.endswith(ending):
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def client(port, count):
    """Holds `count` connections; obeys `traffic`, `get` and `close` lines on stdin."""
    raise_nofile()
    socks = []
    for _ in range(count):
        for attempt in range(50):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=30))
                break
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.05)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "traffic":
            for i, s in enumerate(socks):
                key = f"scale:{os.getpid()}:{i}".encode()
                s.sendall(b"set " + key + b" 0 0 4096\r\n" + VALUE + b"\r\n")
                recv_until(s, b"STORED\r\n")
                s.sendall(b"get " + key + b"\r\n")
                recv_until(s, b"END\r\n")
        elif cmd == "get":
            for s in socks:
                s.sendall(b"get scale:none\r\n")
                recv_until(s, b"END\r\n")
        elif cmd == "close":
            for s in socks:
                s.close()
            socks = []
        print("done", flush=True)
        if cmd == "close":
            return


class Clients:
    """`total` connections to `port`, spread over processes of at most `per_process` each."""

    def __init__(self, port, total, per_process=5000):
        self.procs = []
        left = total
        while left > 0:
            n = min(per_process, left)
            left -= n
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "client", str(port), str(n)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.procs.append(p)
        for p in self.procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a scale client could not connect")

    def command(self, cmd):
        for p in self.procs:
            p.stdin.write(cmd + "\n")
            p.stdin.flush()
        for p in self.procs:
            if p.stdout.readline().strip() != "done":
                raise RuntimeError(f"a scale client failed at {cmd!r}")

    def close(self):
        self.command("close")
        for p in self.procs:
            p.wait(timeout=30)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def settled_rss(pid, timeout=10.0):
    """RSS once two readings 0.3 s apart agree within 64 KiB (or at the timeout)."""
    deadline = time.time() + timeout
    last = rss_kib(pid)
    while time.time() < deadline:
        time.sleep(0.3)
        now = rss_kib(pid)
        if abs(now - last) <= 64:
            return now
        last = now
    return last


def measure(name, pid, port, counts, ratchet_rounds, ratchet_conns, log):
    res = {"target": name, "levels": [], "ratchet_mb": []}
    base = settled_rss(pid)
    res["baseline_mb"] = round(base / 1024, 1)
    for n in counts:
        clients = Clients(port, n)
        idle = settled_rss(pid)
        clients.command("traffic")
        after = settled_rss(pid)
        clients.close()
        closed = settled_rss(pid)
        level = {"connections": n,
                 "idle_kib_per_conn": round((idle - base) / n, 2),
                 "after_traffic_kib_per_conn": round((after - base) / n, 2),
                 "after_close_mb": round((closed - base) / 1024, 1)}
        log(f"scale {name}: {level}")
        res["levels"].append(level)
    start = settled_rss(pid)
    for r in range(ratchet_rounds):
        clients = Clients(port, ratchet_conns)
        clients.command("get")
        clients.close()
        res["ratchet_mb"].append(round((settled_rss(pid) - start) / 1024, 1))
    log(f"scale {name}: ratchet over {ratchet_rounds} x {ratchet_conns} connections (MB above the start): {res['ratchet_mb']}")
    return res


def table(results):
    lines = ["scale: RSS per client connection (KiB), above the process's baseline",
             f"{'target':<22}{'conns':>7}{'idle':>9}{'traffic':>9}{'closed MB':>11}"]
    for res in results:
        for lv in res["levels"]:
            lines.append(f"{res['target']:<22}{lv['connections']:>7}{lv['idle_kib_per_conn']:>9}"
                         f"{lv['after_traffic_kib_per_conn']:>9}{lv['after_close_mb']:>11}")
        lines.append(f"{res['target']:<22} ratchet MB above start per round: {res['ratchet_mb']}")
    return "\n".join(lines)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "client":
    client(int(sys.argv[2]), int(sys.argv[3]))
