"""memtier_benchmark as scripts/bench's second load generator (scenarios a and b).

memtier_benchmark (Redis Labs, C++/libevent) is not packaged by Debian: build it from its
public source (github.com/RedisLabs/memtier_benchmark: autoreconf -ivf && ./configure &&
make && make install). scripts/bench uses it only when `memtier_benchmark` is on PATH and
says so when it is not; nothing else needs it.

A run gives the same record as memroute-load's JSON line (ops_per_sec, keys_per_sec,
lat_us, cpu, hits, misses, errors), so scripts/bench summarises both alike:

- Load: ONE memtier thread, --connections clients, memcache_text, values of --value-size
  bytes, keys memtier-1..memtier-KEYS drawn at random (R:R), 1 set per 9 gets. In (b)
  every get is a 20-key multi-get (--multi-key-get 20 with a 1:180 ratio: memtier counts
  the keys of its multi-gets against the ratio, so 9 multi-gets of 20 keys per set).
- Window: memtier runs warmup + duration + 1 s. CPU (utime+stime from /proc/PID/stat of
  every process named, and of memtier itself as "load") is sampled when the warmup ends
  and again `duration` later; the ops of that window come from memtier's per-second
  series ("Time-Serie"), each second weighted by its overlap with the window.
- Latency: memtier's percentiles over the whole run (ms, turned into µs).
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

BINARY = "memtier_benchmark"


def available():
    return shutil.which(BINARY) is not None


def populate(addr, args, pin):
    """Sets every key once (sequentially, all clients), so gets hit as memroute-load's do.
    Returns False (the gets then miss more) when memtier failed or did not finish in time."""
    host, port = addr.rsplit(":", 1)
    cmd = _pinned(pin) + [BINARY, "-s", host, "-p", port, "-P", "memcache_text", "-t", "1", "-c", "4",
                          "--ratio", "1:0", "--key-pattern", "P:P", "--key-minimum", "1",
                          "--key-maximum", str(args.keys), "-n", "allkeys", "-d", str(args.value_size),
                          "--hide-histogram"]
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60 + args.keys / 1000)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return False
    return True


def run(addr, args, multiget, cpu_targets, pin, clk_tck):
    """One closed-loop run against `addr`; returns a memroute-load-shaped record."""
    host, port = addr.rsplit(":", 1)
    out_dir = tempfile.mkdtemp(prefix="memroute-bench-memtier-")
    json_path = os.path.join(out_dir, "run.json")
    seconds = int(args.warmup + args.duration + 1.999)
    ratio = f"1:{9 * multiget}" if multiget > 1 else "1:9"
    cmd = _pinned(pin) + [BINARY, "-s", host, "-p", port, "-P", "memcache_text", "-t", "1",
                          "-c", str(args.connections), "--ratio", ratio, "--key-pattern", "R:R",
                          "--key-minimum", "1", "--key-maximum", str(args.keys), "-d", str(args.value_size),
                          "--pipeline", str(args.pipeline), "--distinct-client-seed",
                          "--test-time", str(seconds), "--hide-histogram", "--json-out-file", json_path]
    if multiget > 1:
        cmd += ["--multi-key-get", str(multiget)]
    log_path = os.path.join(out_dir, "run.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        targets = list(cpu_targets) + [("load", proc.pid)]
        time.sleep(args.warmup)
        t0, before = time.time(), _sample(targets, clk_tck)
        time.sleep(args.duration)
        t1, after = time.time(), _sample(targets, clk_tck)
        # memtier does not stop at --test-time while a connection waits for a reply it
        # could not parse (an error line it does not know): bounded here.
        proc.wait(timeout=seconds + 15)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"memtier_benchmark did not end within {seconds + 15}s (see {log_path})") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0 or not os.path.exists(json_path):
        with open(log_path, errors="replace") as f:
            raise RuntimeError(f"memtier_benchmark failed (status {proc.returncode}): {f.read()[-2000:]}")
    with open(json_path) as f:
        stats = json.load(f)["ALL STATS"]
    ops = _ops_in_window(stats, t0, t1)
    window = t1 - t0
    cpu = {}
    for (name, pid), b, a in zip(targets, before, after):
        if b is None or a is None:
            continue
        cpu_s = a - b
        cpu[name] = {"pid": pid, "cpu_s": cpu_s, "cpu_util": cpu_s / window,
                     "us_per_op": cpu_s * 1e6 / ops if ops else 0.0}
    totals, gets = stats["Totals"], stats["Gets"]
    pct = totals["Percentile Latencies"]
    ops_per_sec = ops / window
    # memtier counts a multi-get's keys in Hits/Misses; a single get is one key.
    keys_per_sec = ops_per_sec * (0.1 + 0.9 * multiget) if multiget > 1 else ops_per_sec
    return {
        "generator": "memtier",
        "ops_per_sec": ops_per_sec,
        "keys_per_sec": keys_per_sec,
        "lat_us": {"p50": pct["p50.00"] * 1000, "p99": pct["p99.00"] * 1000, "p999": pct["p99.90"] * 1000},
        "cpu": cpu,
        "hits": round(gets["Hits/sec"] * window),
        "misses": round(gets["Misses/sec"] * window),
        "errors": int(totals.get("Connection Errors", 0)),
    }


def _pinned(pin):
    return ["taskset", "-c", str(pin)] if pin is not None else []


def _sample(targets, clk_tck):
    out = []
    for _, pid in targets:
        try:
            with open(f"/proc/{pid}/stat") as f:
                # Fields after the command name (which may hold spaces): utime is the 14th
                # field overall, stime the 15th; for a process they cover all its threads.
                fields = f.read().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / clk_tck)
        except (OSError, IndexError, ValueError):
            out.append(None)
    return out


def _ops_in_window(stats, t0, t1):
    """Requests memtier completed between wall-clock times t0 and t1 (seconds)."""
    start = stats["Runtime"]["Start time"] / 1000.0
    total = 0.0
    for second, row in stats["Totals"]["Time-Serie"].items():
        lo = start + int(second)
        overlap = max(0.0, min(t1, lo + 1) - max(t0, lo))
        total += row["Count"] * overlap
    return total
