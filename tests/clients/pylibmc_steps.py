"""Runs the same pylibmc (libmemcached, binary protocol) steps against one server address and
prints one line per step: what the client library returned or raised. The end-to-end test
runs it against memcached directly and through memroute and compares the two outputs."""
import sys

import pylibmc

def version_is_numeric(stats):
    version = stats.get("version", stats.get(b"version", b""))
    if isinstance(version, bytes):
        version = version.decode()
    return version.split(".")[0].isdigit()

def main(address):
    mc = pylibmc.Client([address], binary=True, behaviors={
        "cas": True,
        "connect_timeout": 2000,
        "receive_timeout": 2000000,
        "send_timeout": 2000000,
    })

    def step(name, call):
        try:
            result = call()
        except (pylibmc.Error, ValueError) as error:
            result = "error " + type(error).__name__
        print(f"{name}: {result!r}")

    step("set", lambda: mc.set("k1", "v1"))
    step("get hit", lambda: mc.get("k1"))
    step("get miss", lambda: mc.get("nokey"))
    step("set flags (int)", lambda: mc.set("n1", 41))
    step("get int", lambda: mc.get("n1"))
    step("set_multi", lambda: mc.set_multi({"m%d" % i: "value%d" % i for i in range(20)}))
    step("get_multi", lambda: sorted(mc.get_multi(["m%d" % i for i in range(25)]).items()))
    step("add existing", lambda: mc.add("k1", "x"))
    step("add new", lambda: mc.add("k2", "x"))
    step("replace missing", lambda: mc.replace("nokey", "x"))
    step("replace existing", lambda: mc.replace("k2", "y"))
    step("append", lambda: mc.append("k1", "-tail"))
    step("prepend", lambda: mc.prepend("k1", "head-"))
    step("get appended", lambda: mc.get("k1"))
    step("append missing", lambda: mc.append("nokey", "x"))
    step("set counter", lambda: mc.set("c", "10"))
    step("incr", lambda: mc.incr("c", 5))
    step("decr", lambda: mc.decr("c", 20))
    step("incr missing", lambda: mc.incr("nocounter"))
    step("gets", lambda: mc.gets("k2")[0])
    step("cas ok", lambda: mc.cas("k2", "z", mc.gets("k2")[1]))
    step("cas stale", lambda: mc.cas("k2", "w", 1))
    step("get after cas", lambda: mc.get("k2"))
    step("touch", lambda: mc.touch("k2", 100))
    step("touch missing", lambda: mc.touch("nokey", 100))
    step("delete", lambda: mc.delete("k2"))
    step("delete missing", lambda: mc.delete("k2"))
    step("large value", lambda: mc.set("big", "x" * (2 * 1024 * 1024)))
    step("binary-ish key", lambda: mc.set("key with space", "s"))
    step("get binary-ish key", lambda: mc.get("key with space"))
    step("flush_all", lambda: mc.flush_all())
    step("get after flush", lambda: mc.get("k1"))
    # Values differ (pid, uptime); that stats parse and carry a numeric version is the point.
    step("stats version", lambda: [version_is_numeric(s) for _, s in mc.get_stats()])
    # libmemcached drops the connection after this one (on memcached too): keep it last.
    step("set text", lambda: mc.set("t", "abc"))
    step("incr non-numeric", lambda: mc.incr("t"))

if __name__ == "__main__":
    main(sys.argv[1])
