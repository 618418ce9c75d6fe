"""Logs in to one server address with pylibmc (libmemcached, binary protocol, SASL PLAIN) as
each user given, and prints one line per attempt: what a set and a get returned or raised.
The end-to-end test runs it against memcached -S and through memroute and compares."""
import sys

import pylibmc


def attempt(address, user, password):
    options = {"binary": True, "behaviors": {"connect_timeout": 2000}}
    if user:
        options.update(username=user, password=password)
    try:
        mc = pylibmc.Client([address], **options)
        stored = mc.set("sasl-key", "sasl-value")
        return f"set {stored!r} get {mc.get('sasl-key')!r}"
    except pylibmc.Error as error:
        return f"error {type(error).__name__}: {error}"


def main(address, logins):
    for login in logins:
        user, _, password = login.partition(":")
        print(f"{login or '(no login)'}: {attempt(address, user, password)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
