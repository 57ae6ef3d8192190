"""`replay-tf`: command line for replay_tf. `replay-tf serve` runs a standalone replay server from a table config.

The config is JSON or YAML (YAML needs PyYAML)::

    port: 8000                   # optional; --port wins
    tables:
      - name: replay
        sampler: {prioritized: {priority_exponent: 0.8}}   # uniform | fifo | lifo | max_heap | min_heap
        remover: fifo
        max_size: 100000
        max_times_sampled: 0     # optional
        rate_limiter: {sample_to_insert_ratio: {samples_per_insert: 4.0, min_size_to_sample: 100,
                                                error_buffer: 50}}       # or {min_size: 1}
        signature:               # optional; leaves are {shape: [...], dtype: ...} (+ minimum, maximum: bounded)
          observation: {shape: [10, 5], dtype: float32}
          action: {shape: [], dtype: int64}
      - name: actions
        queue: 1000              # Table.queue(name, 1000); `stack: N` for Table.stack

Then ``replay-tf serve --config tables.yaml --port 8000`` serves the tables (Reverb's gRPC protocol: dm-reverb
clients and `replay_tf.Client` connect to ``host:port``) and prints per-table statistics every
``--stats-interval`` seconds. With ``--checkpoint-dir`` the checkpoint written last there is restored at start
(its path is printed) and a checkpoint is written on exit (and every ``--checkpoint-interval`` seconds,
independently of the stats interval; one that fails, e.g. on a full disk, is reported and retried at the next
interval while the server keeps serving and the previous checkpoint stays). Ctrl-C, SIGTERM or SIGHUP stops
cleanly: the tables first refuse inserts (writers get UNAVAILABLE and keep their unconfirmed items to send
again), then the exit checkpoint is written, so it holds every item whose insert was confirmed. A server whose
gRPC listener stops answering calls (an error ended its thread) writes the exit checkpoint the same way and
exits with status 1, to be restarted.
``--tls-cert cert.pem --tls-key key.pem`` serves over TLS and ``--auth-token-file token.txt`` requires the token
in that file from every client (`replay_tf.set_connection_options` or REPLAY_TF_AUTH_TOKEN on the client side).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from replay_tf import rate_limiters
from replay_tf import selectors

_SELECTORS = ("uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap")
_RATE_LIMITERS = ("min_size", "sample_to_insert_ratio", "queue", "stack")
_TABLE_KEYS = ("name", "sampler", "remover", "max_size", "rate_limiter", "max_times_sampled", "signature",
               "queue", "stack")


class ConfigError(ValueError):
    """The table config is invalid; the message names the path of the offending entry."""


def load_config(path: str) -> Dict[str, Any]:
    """Reads a JSON (`.json`) or YAML (anything else; needs PyYAML) table config file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from e
    else:
        try:
            import yaml  # noqa: PLC0415  (optional: only YAML configs need it)
        except ImportError as e:
            raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install pyyaml), or write the config as "
                              f"JSON (a .json file)") from e
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if isinstance(config, list):
        config = {"tables": config}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the config must be a mapping with a 'tables' list, got {type(config).__name__}")
    return config


def _one_key(value: Any, where: str, known: Sequence[str]) -> tuple:
    """`'fifo'` -> ('fifo', {}); `{'prioritized': {...}}` -> ('prioritized', {...})."""
    if isinstance(value, str):
        name, args = value, {}
    elif isinstance(value, Mapping) and len(value) == 1:
        [(name, args)] = value.items()
        args = {} if args is None else args
    else:
        raise ConfigError(f"{where}: expected one of {list(known)} as a string or a one-key mapping, got {value!r}")
    if name not in known:
        raise ConfigError(f"{where}: unknown {name!r}; known: {list(known)}")
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where}.{name}: arguments must be a mapping, got {args!r}")
    return name, dict(args)


def _selector(value: Any, where: str):
    name, args = _one_key(value, where, _SELECTORS)
    cls = {"uniform": selectors.Uniform, "prioritized": selectors.Prioritized, "fifo": selectors.Fifo,
           "lifo": selectors.Lifo, "max_heap": selectors.MaxHeap, "min_heap": selectors.MinHeap}[name]
    try:
        return cls(**args)
    except TypeError as e:
        raise ConfigError(f"{where}.{name}: {e}") from e


def _rate_limiter(value: Any, where: str):
    if isinstance(value, Mapping) and len(value) == 1:
        [(key, argument)] = value.items()
        if isinstance(argument, (int, float)) and not isinstance(argument, bool):  # {min_size: 1}, {queue: 10}
            value = {key: {"min_size_to_sample" if key == "min_size" else "size": argument}}
    name, args = _one_key(value, where, _RATE_LIMITERS)
    cls = {"min_size": rate_limiters.MinSize, "sample_to_insert_ratio": rate_limiters.SampleToInsertRatio,
           "queue": rate_limiters.Queue, "stack": rate_limiters.Stack}[name]
    try:
        return cls(**args)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}.{name}: {e}") from e


_SPEC_KEYS = {"shape", "dtype", "name", "minimum", "maximum"}


def _signature(value: Any, where: str):
    """Nests of mappings/lists whose leaves are `{shape: [...], dtype: ...}` -> nests of `tf.TensorSpec`.

    A leaf with `minimum` and `maximum` becomes TF's `BoundedTensorSpec` (the class of TF-Agents' bounded
    specs, e.g. a `Trajectory`'s discount: TF-Agents compares table signatures with `==`, which holds only
    between specs of the same class and bounds).
    """
    import tensorflow as tf  # noqa: PLC0415  (imports TF: after argument parsing)

    from rlds_tf import structure_coder  # noqa: PLC0415  (imports TF: after argument parsing)

    if isinstance(value, Mapping) and "dtype" in value and set(value) <= _SPEC_KEYS:
        bounds = [k for k in ("minimum", "maximum") if k in value]
        try:
            if len(bounds) == 1:
                raise ValueError(f"'{bounds[0]}' needs the other bound too: give both minimum and maximum")
            if bounds:
                return structure_coder.bounded_tensor_spec(value.get("shape", []), tf.as_dtype(value["dtype"]),
                                                            value["minimum"], value["maximum"],
                                                            name=value.get("name"))
            return tf.TensorSpec(value.get("shape", []), tf.as_dtype(value["dtype"]), name=value.get("name"))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: invalid tensor spec {dict(value)}: {e}") from e
    if isinstance(value, Mapping):
        return {str(k): _signature(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_signature(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise ConfigError(f"{where}: expected a {{shape, dtype}} leaf, a mapping or a list, got {value!r}")


def build_tables(config: Mapping[str, Any]) -> List[Any]:
    """The `replay_tf.Table`s a config describes (see the module docstring).

    Raises:
      ConfigError: with the path of the bad entry (`tables[1].rate_limiter.min_size: ...`).
    """
    import replay_tf  # noqa: PLC0415  (imports TF: after argument parsing)

    tables = config.get("tables")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"the config needs a non-empty 'tables' list, got {tables!r}")
    result = []
    for i, entry in enumerate(tables):
        where = f"tables[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {entry!r}")
        unknown = sorted(set(entry) - set(_TABLE_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}; known: {list(_TABLE_KEYS)}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: a non-empty table name is required, got {name!r}")
        signature = _signature(entry["signature"], f"{where}.signature") if "signature" in entry else None
        try:
            for shortcut in ("queue", "stack"):
                if shortcut in entry:
                    clashes = sorted(set(entry) - {"name", "signature", shortcut})
                    if clashes:
                        raise ConfigError(f"{where}: '{shortcut}' sets the selectors and rate limiter itself; "
                                          f"remove {clashes}")
                    make = replay_tf.Table.queue if shortcut == "queue" else replay_tf.Table.stack
                    result.append(make(name, int(entry[shortcut]), signature=signature))
                    break
            else:
                missing = [k for k in ("sampler", "remover", "max_size", "rate_limiter") if k not in entry]
                if missing:
                    raise ConfigError(f"{where}: missing {missing} (or use 'queue: N' / 'stack: N')")
                result.append(replay_tf.Table(
                    name, sampler=_selector(entry["sampler"], f"{where}.sampler"),
                    remover=_selector(entry["remover"], f"{where}.remover"), max_size=int(entry["max_size"]),
                    rate_limiter=_rate_limiter(entry["rate_limiter"], f"{where}.rate_limiter"),
                    max_times_sampled=int(entry.get("max_times_sampled", 0)), signature=signature))
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where} ({name}): {e}") from e
    return result


class StatsReporter:
    """Per-table size and insert/sample rates between two `report()` calls."""

    def __init__(self, server):
        self._server = server
        self._last_time = time.monotonic()
        self._last = self._counts()

    def _counts(self) -> Dict[str, tuple]:
        counts = {}
        for name, table in sorted(self._server.tables.items()):
            info = table.info
            limiter = info.rate_limiter_info
            counts[name] = (info.current_size, info.max_size, limiter.insert_stats.completed,
                            limiter.sample_stats.completed)
        return counts

    def report(self) -> List[str]:
        now = time.monotonic()
        counts = self._counts()
        elapsed = max(now - self._last_time, 1e-9)
        lines = []
        for name, (size, max_size, inserts, samples) in counts.items():
            _, _, last_inserts, last_samples = self._last.get(name, (0, 0, 0, 0))
            lines.append(f"table {name}: size {size}/{max_size}, inserts {inserts} "
                         f"({(inserts - last_inserts) / elapsed:.1f}/s), samples {samples} "
                         f"({(samples - last_samples) / elapsed:.1f}/s)")
        self._last, self._last_time = counts, now
        return lines


def serve(args: argparse.Namespace) -> int:
    from replay_tf import Server  # noqa: PLC0415  (imports TF: after argument parsing)
    from replay_tf.checkpointing import DirectoryCheckpointer  # noqa: PLC0415  (imports TF: after argument parsing)

    try:
        config = load_config(args.config)
        tables = build_tables(config)
    except (ConfigError, OSError) as e:
        print(f"replay-tf serve: {e}", file=sys.stderr)
        return 2
    port = args.port if args.port is not None else config.get("port")
    host = args.host or config.get("host") or "localhost"
    checkpoint_dir = args.checkpoint_dir or config.get("checkpoint_dir")
    checkpointer = DirectoryCheckpointer(checkpoint_dir) if checkpoint_dir else None
    try:
        server_credentials, auth_token = _security_options(args)
    except (ConfigError, OSError) as e:
        print(f"replay-tf serve: {e}", file=sys.stderr)
        return 2
    try:
        server = Server(tables, port=port, checkpointer=checkpointer, host=host,
                        server_credentials=server_credentials, auth_token=auth_token,
                        max_streams=args.max_streams)
    except (ValueError, OSError) as e:
        print(f"replay-tf serve: cannot start the server: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    status = 0
    try:
        restored = {name: table.size() for name, table in server.tables.items() if table.size()}
        protection = [name for name, on in (("TLS", server_credentials), ("auth token", auth_token)) if on]
        print(f"replay-tf: serving tables {sorted(server.tables)} on {host}:{server.port}"
              + (f" with {' and '.join(protection)}" if protection else "")
              + (f" (restored from {getattr(checkpointer, 'restored_checkpoint', None) or checkpoint_dir}: "
                 f"{restored})" if restored else ""), flush=True)
        dropped = getattr(checkpointer, "dropped_items", None)
        if dropped:
            print(f"replay-tf: the restore left out {len(dropped)} items whose chunks cannot be decoded: "
                  f"{[(d.table, d.key) for d in dropped]}", file=sys.stderr, flush=True)
        if run_until_stopped(server, stop, stats_interval=args.stats_interval,
                             checkpoint_interval=args.checkpoint_interval if checkpointer else None):
            print("replay-tf: stopping", flush=True)
        else:
            status = 1
            print("replay-tf: the gRPC server stopped answering calls (an error ended its thread, see above) and "
                  "cannot recover: writing the exit checkpoint and exiting; restart the server",
                  file=sys.stderr, flush=True)
        # No insert may be confirmed after the exit checkpoint has read the tables.
        server.refuse_inserts()
        if checkpointer is not None and _checkpoint(server) is None:
            status = 1
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("replay-tf: stopped", flush=True)
    return status


# SIGHUP (the terminal or ssh session went away) would otherwise end the process without the exit checkpoint.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _checkpoint(server) -> Optional[str]:
    """Writes a checkpoint and prints its path; prints why and returns None when writing fails with OSError
    (e.g. a full disk: the save removed what it wrote, and the previous checkpoint stays) or CheckpointError
    (the checkpointer refuses the root as it is)."""
    from replay_tf.checkpointing import CheckpointError  # noqa: PLC0415  (imports TF, as `serve` does)
    try:
        path = server.checkpoint()
    except (OSError, CheckpointError) as e:
        print(f"replay-tf: checkpoint failed, the previous checkpoint stays: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        return None
    print(f"checkpoint: {path}", flush=True)
    return path


#: How often `run_until_stopped` checks that the server still answers calls.
_WATCH_INTERVAL_S = 0.5


def run_until_stopped(server, stop: threading.Event, *, stats_interval: float,
                      checkpoint_interval: Optional[float] = None) -> bool:
    """Prints per-table statistics every `stats_interval` seconds and checkpoints every `checkpoint_interval`
    seconds (None: never) until `stop` is set (returns True) or the server no longer answers calls (its
    `serving` turned False: returns False). The two schedules are independent: the loop wakes at whichever is
    due first, so a long stats interval never delays a checkpoint. A checkpoint that fails is reported and
    tried again one interval later; serving goes on."""
    reporter = StatsReporter(server)
    now = time.monotonic()
    next_stats = now + stats_interval
    next_checkpoint = now + checkpoint_interval if checkpoint_interval else None
    while True:
        due = next_stats if next_checkpoint is None else min(next_stats, next_checkpoint)
        if stop.wait(max(0.0, min(_WATCH_INTERVAL_S, due - time.monotonic()))):
            return True
        if not getattr(server, "serving", True):
            return False
        if time.monotonic() >= next_stats:
            for line in reporter.report():
                print(line, flush=True)
            next_stats = time.monotonic() + stats_interval
        if next_checkpoint is not None and time.monotonic() >= next_checkpoint:
            _checkpoint(server)
            # From the end of this one: a checkpoint slower than the interval does not queue up the next.
            next_checkpoint = time.monotonic() + checkpoint_interval


def _security_options(args: argparse.Namespace) -> tuple:
    """`(grpc.ServerCredentials or None, token or None)` from --tls-cert/--tls-key and --auth-token-file."""
    credentials = token = None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together (the PEM certificate chain and its private key)")
    if args.tls_cert:
        import grpc  # noqa: PLC0415  (imports TF: after argument parsing)
        with open(args.tls_cert, "rb") as cert, open(args.tls_key, "rb") as key:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
    if args.auth_token_file:
        with open(args.auth_token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise ConfigError(f"--auth-token-file ({args.auth_token_file}) is empty: it must hold the token")
    return credentials, token


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replay-tf", description="replay_tf command line: run a standalone Reverb-compatible replay server.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve_parser = commands.add_parser(
        "serve", help="serve replay tables from a JSON/YAML config",
        description=__doc__.split("\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    serve_parser.add_argument("--config", required=True, help="tables config file (.json, or YAML otherwise)")
    serve_parser.add_argument("--host", default=None,
                              help="interface to bind (default localhost; 0.0.0.0 serves every interface: "
                                   "use --tls-cert/--tls-key and --auth-token-file there)")
    serve_parser.add_argument("--port", type=int, default=None, help="port (default: the config's, else a free one)")
    serve_parser.add_argument("--tls-cert", default=None, metavar="PEM",
                              help="serve over TLS with this certificate chain (needs --tls-key)")
    serve_parser.add_argument("--tls-key", default=None, metavar="PEM", help="private key of --tls-cert")
    serve_parser.add_argument("--auth-token-file", default=None, metavar="FILE",
                              help="require the token in FILE from every client, as 'authorization: Bearer "
                                   "<token>' metadata (a file, so the token never shows in the process list)")
    serve_parser.add_argument("--max-streams", type=int, default=None, metavar="N",
                              help="most streams (writers, samplers) open at once; one more fails at once with "
                                   "RESOURCE_EXHAUSTED (default 4096)")
    serve_parser.add_argument("--checkpoint-dir", default=None,
                              help="restore the newest checkpoint from here at start; checkpoint here on exit")
    serve_parser.add_argument("--checkpoint-interval", type=float, default=None, metavar="SECONDS",
                              help="also checkpoint every SECONDS (needs --checkpoint-dir)")
    serve_parser.add_argument("--stats-interval", type=float, default=5.0, metavar="SECONDS",
                              help="print per-table statistics every SECONDS (default 5)")
    serve_parser.set_defaults(run=serve)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `replay-tf` console script."""
    args = _parser().parse_args(argv)
    for option, seconds in (("--stats-interval", args.stats_interval),
                            ("--checkpoint-interval", args.checkpoint_interval)):
        # NaN would wake the loop without pause, infinity overflow its wait, a negative checkpoint interval
        # checkpoint without pause.
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            print(f"replay-tf serve: {option} ({seconds}) must be a finite number > 0", file=sys.stderr)
            return 2
    if args.checkpoint_interval is not None and not args.checkpoint_dir:
        print("replay-tf serve: --checkpoint-interval needs --checkpoint-dir", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
