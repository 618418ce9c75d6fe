"""The storm scenario of scripts/bench: a hot key on one of two memcached.

    64 closed-loop connections, 2 memcached, one memroute worker; half the keys of gets
    are one hot key (`hotkey:0000000`, a 10 KB value), the rest uniform over 100,000 keys
    (64-byte values); sets (1 - --get-ratio of ops) go to those keys only.
    Targets: direct (the hot key's server alone, a reference), twemproxy, memroute with
    collapsing off (collapse_gets = false), on (the default), and with the hot cache on
    (hot_cache = { ttl = TTL, keys = 32 }).

What is counted, per run: memcached's own counters read when the load generator starts and
ends its measured window (its stderr markers; populate and warmup left out, so the hot-key
sampler has named the key hot): `cmd_get` of each server, and the gets of the hot key itself
from `stats detail dump` (memcached's per-prefix counts; the hot key is alone under prefix
`hotkey`), against the gets of the hot key the load generator sent in the same window (its
`hot_gets_window`). The hot cache's bound is one get per ttl per worker over the window.
"""

import json
import socket
import statistics
import subprocess
import threading
import time

HOT_PREFIX = "hotkey"
HOT_VALUE = 10 * 1024
STORM_KEYS = 100_000
STORM_CONNECTIONS = 64


def ask(port, command, until):
    """One admin command to memcached at `port`; the reply up to and including `until`."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(command)
        out = b""
        while not out.endswith(until):
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"memcached :{port} closed during {command!r}")
            out += chunk
        return out.decode()


def detail_on(port):
    """Turns on memcached's per-prefix counts (`stats detail on`)."""
    reply = ask(port, b"stats detail on\r\n", b"\r\n")
    if not reply.startswith("OK"):
        raise RuntimeError(f"memcached :{port}: stats detail on: {reply.strip()}")


def counters(port):
    """(cmd_get, gets of the hot key) of memcached at `port`."""
    stats = ask(port, b"stats\r\n", b"END\r\n")
    cmd_get = next(int(line.split()[2]) for line in stats.splitlines() if line.startswith("STAT cmd_get "))
    hot = 0
    for line in ask(port, b"stats detail dump\r\n", b"END\r\n").splitlines():
        # PREFIX hotkey get 12 hit 12 set 1 del 0
        words = line.split()
        if len(words) >= 4 and words[0] == "PREFIX" and words[1] == HOT_PREFIX:
            hot = int(words[3])
    return cmd_get, hot


def pool_lines(mode, ttl):
    """The memroute pool's extra lines and extra sections for a storm target."""
    if mode == "off":
        return "collapse_gets = false\n", ""
    if mode == "hotcache":
        return f'hot_cache = {{ ttl = "{ttl}", keys = 32 }}\n', ""
    return "", ""


def run_counted(cmd, ports, timeout):
    """Runs memroute-load (`cmd`, its --quiet dropped so it marks its window on stderr),
    reading the servers' counters at the window's start and end. Its JSON summary, with
    the servers' counts of the window added."""
    cmd = [c for c in cmd if c != "--quiet"]
    # The whole run's counts too (populate and warmup included), as runs were once counted:
    # the gets sent before the sampler names the key hot show as their difference.
    first = {p: counters(p) for p in ports}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    marks = {}
    try:
        for line in proc.stderr:
            if line.startswith("# measure start"):
                marks["start"] = ({p: counters(p) for p in ports}, time.monotonic())
            elif line.startswith("# measure end"):
                marks["end"] = ({p: counters(p) for p in ports}, time.monotonic())
        out = proc.stdout.read()
        proc.wait()
    finally:
        timer.cancel()
    if proc.returncode != 0 or "start" not in marks or "end" not in marks:
        raise RuntimeError(f"memroute-load failed or was killed (status {proc.returncode})")
    last = {p: counters(p) for p in ports}
    res = json.loads(out.strip().splitlines()[-1])
    (before, t0), (after, t1) = marks["start"], marks["end"]
    res["server_hot_gets_run"] = sum(last[p][1] - first[p][1] for p in ports)
    return record(res, before, after, ports, t1 - t0)


def record(res, before, after, ports, window_s):
    """Adds the servers' counts of one run's window to its result."""
    res["server_cmd_get"] = {str(p): after[p][0] - before[p][0] for p in ports}
    res["server_hot_gets"] = sum(after[p][1] - before[p][1] for p in ports)
    hot_port = max(ports, key=lambda p: after[p][1] - before[p][1])
    res["hot_server_cmd_get"] = after[hot_port][0] - before[hot_port][0]
    res["window_s"] = window_s
    client = res.get("hot_gets_window", 0)
    res["hot_ratio"] = res["server_hot_gets"] / client if client else None
    return res


def ttl_seconds(ttl):
    if ttl.endswith("ms"):
        return float(ttl[:-2]) / 1000
    if ttl.endswith("s"):
        return float(ttl[:-1])
    raise ValueError(f"ttl {ttl!r}: use e.g. 500ms or 1s")


def summarize(targets, runs, ttl):
    """Medians over rounds per target."""
    out = {}
    for name in targets:
        rs = [r for r in runs if r["target"] == name]
        if not rs:
            continue
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        row = {
            "ops_per_sec": med(lambda r: r["ops_per_sec"]),
            "p50_us": med(lambda r: r["lat_us"]["p50"]),
            "p99_us": med(lambda r: r["lat_us"]["p99"]),
            "client_hot_gets": med(lambda r: r["hot_gets_window"]),
            "server_hot_gets": med(lambda r: r["server_hot_gets"]),
            "server_hot_gets_run": med(lambda r: r["server_hot_gets_run"]),
            "hot_server_cmd_get": med(lambda r: r["hot_server_cmd_get"]),
            "errors": sum(r["errors"] for r in rs),
            "runs": len(rs),
        }
        ratios = [r["hot_ratio"] for r in rs if r["hot_ratio"] is not None]
        row["hot_ratio"] = statistics.median(ratios) if ratios else None
        if name.endswith("hotcache-w1"):
            row["hot_gets_per_ttl"] = med(lambda r: r["server_hot_gets"] / (r["window_s"] / ttl_seconds(ttl)))
        out[name] = row
    return out


def table(summary, ttl, rounds):
    lines = [f"(storm) 2 memcached, 64 connections, 50% of gets for one 10 KB key, memroute workers=1; "
             f"medians of {rounds} interleaved rounds; hot cache ttl {ttl}",
             "counts are of the measured window (memcached's stats detail at the load generator's window marks)",
             f"{'target':<24}{'ops/s':>10}{'p50 us':>9}{'p99 us':>9}{'client hot gets':>17}"
             f"{'server hot gets':>17}{'server/client':>15}{'hot server cmd_get':>20}{'errors':>8}"]
    for name, row in summary.items():
        ratio = "-" if row["hot_ratio"] is None else f"{row['hot_ratio']:.4f}"
        lines.append(f"{name:<24}{row['ops_per_sec']:>10.0f}{row['p50_us']:>9.1f}{row['p99_us']:>9.1f}"
                     f"{row['client_hot_gets']:>17.0f}{row['server_hot_gets']:>17.0f}{ratio:>15}"
                     f"{row['hot_server_cmd_get']:>20.0f}{row['errors']:>8}")
        if "hot_gets_per_ttl" in row:
            lines.append(f"{'':<24}hot cache: {row['hot_gets_per_ttl']:.2f} gets of the hot key per ttl (bound: 1 per "
                         f"ttl per worker); {row['server_hot_gets_run']:.0f} over the whole run (populate and warmup "
                         f"included)")
    return "\n".join(lines)


