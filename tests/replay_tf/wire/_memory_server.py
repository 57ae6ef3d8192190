"""A replay server process for the memory-bound tests: `python _memory_server.py JSON_CONFIG`.

Config keys: `signature` (bool: the table 'signed' has an `obs` column of uint8 [84, 84, 4] steps, else the table
'plain' has no signature), `auth_token`, `max_message_bytes`, and `limits` ({name: value} set on
`replay_tf.wire.limits` before the server starts, to keep the tests' sizes small).

Prints `READY <port>`, then answers stdin lines: `RSS` -> `RSS <VmRSS kB> <VmHWM kB>` after a garbage
collection and `malloc_trim` (so that RSS measures live memory); `RESET` -> resets the peak (VmHWM) to the current
RSS and prints `RESET`; `STOP` (or end of input) stops the server and exits.
"""
import ctypes
import gc
import json
import sys


def _status_kb() -> tuple:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


def _trim() -> None:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def main() -> None:
    config = json.loads(sys.argv[1])
    import numpy as np
    import tensorflow as tf
    import replay_tf as reverb
    from replay_tf.wire import limits

    for name, value in config.get("limits", {}).items():
        if not hasattr(limits, name):
            raise SystemExit(f"unknown limit {name}")
        setattr(limits, name, value)
    if config.get("signature"):
        table = reverb.Table("signed", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                             reverb.rate_limiters.MinSize(1),
                             signature={"obs": tf.TensorSpec([None, 84, 84, 4], tf.uint8)})
    else:
        table = reverb.Table("plain", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                             reverb.rate_limiters.MinSize(1))
    server = reverb.Server([table], port=None, max_message_bytes=config.get("max_message_bytes"),
                           auth_token=config.get("auth_token"))
    np.zeros(1)  # (imports settled before the first measurement)
    print(f"READY {server.port}", flush=True)
    for line in sys.stdin:
        word = line.strip()
        if word == "RSS":
            _trim()
            rss, peak = _status_kb()
            print(f"RSS {rss} {peak}", flush=True)
        elif word == "RESET":
            _trim()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            print("RESET", flush=True)
        elif word == "STOP":
            break
    server.stop()


if __name__ == "__main__":
    main()
