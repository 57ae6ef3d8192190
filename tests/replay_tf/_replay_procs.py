"""Processes of the load and fault tests: `python _replay_procs.py ROLE JSON_CONFIG`.

Every role prints `READY ...` once it has imported everything and reached the server, then waits for a line
`GO` on stdin (the coordinator's barrier, so that start-up is outside the measured window), works until a
line `STOP` (or forever), and prints its report as one `REPORT {json}` line before exiting 0.

Roles:
  serve         a `Server` (gRPC on loopback) with the tables of `config["tables"]` ("load" or "faults") and an
                optional `DirectoryCheckpointer(config["checkpoint_dir"])`; prints `READY <port>`; a SIGINT
                (or a line `STOP`) stops it gracefully (`Server.stop`), SIGKILL crashes it.
  load_writer   a `TrajectoryWriter` writing episodes of `EPISODE_STEPS` steps and an item of the last 3 steps
                after every step from the third on, alternately into 'ratio' and 'prio'; reports the items it
                had confirmed per table, its episodes per table and its flush (`end_episode`) latencies.
  load_sampler  samples 'ratio' (`TrajectoryDataset`, ends on rate-limiter timeouts) or 'prio' (`client.sample`
                or `TrajectoryDataset(max_samples=...)`, then updates priorities and deletes some of the items
                it owns: key % num_samplers == its index). Every sample's content is checked against the
                writer's formula. On STOP it drains (never abandons a sample the server already took).
  fault_writer  writes `config["items"]` items into 'q' (flushing), then one item into 'full' (admitted) and a
                second one (blocked by the queue's rate limiter: the server holds its chunks for this stream),
                prints `STUCK` and sleeps until killed.
"""
import json
import os
import signal
import sys
import threading
import time

EPISODE_STEPS = 12
ITEM_STEPS = 3
OBS_SIZE = 16


def step_data(writer: int, episode: int, step: int):
    """The step a writer appends; samplers check every sample against it."""
    import numpy as np
    base = writer * 1_000_000 + episode * 100 + step
    return {"obs": np.arange(OBS_SIZE, dtype=np.float32) + np.float32(base % 65536),
            "ids": np.array([writer, episode, step], np.int32)}


def check_sample(obs, ids) -> None:
    """Raises AssertionError unless `ids` ([ITEM_STEPS, 3]) are consecutive steps of one episode of one writer
    and `obs` matches `step_data` for each of them."""
    import numpy as np
    ids = np.asarray(ids)
    obs = np.asarray(obs)
    assert ids.shape == (ITEM_STEPS, 3) and obs.shape == (ITEM_STEPS, OBS_SIZE), (ids.shape, obs.shape)
    writer, episode, first = (int(v) for v in ids[0])
    for t in range(ITEM_STEPS):
        expected = step_data(writer, episode, first + t)
        assert (ids[t] == expected["ids"]).all(), f"sample ids {ids.tolist()} are not consecutive steps"
        assert (obs[t] == expected["obs"]).all(), f"sample obs of {ids[t].tolist()} is not the writer's"


def _percentiles(values) -> dict:
    import numpy as np
    if not values:
        return {"count": 0}
    ms = np.asarray(values) * 1000.0
    return {"count": len(values), "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


class _Control:
    """GO/STOP lines from stdin."""

    def __init__(self):
        self.go = threading.Event()
        self.stop = threading.Event()
        self.stop_time = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in sys.stdin:
            word = line.strip()
            if word == "GO":
                self.go.set()
            elif word == "STOP":
                self.stop_time = time.monotonic()
                self.stop.set()
        self.go.set()
        self.stop.set()  # the coordinator went away


def _report(payload: dict) -> None:
    sys.stdout.write("REPORT " + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _ready(text: str = "") -> None:
    sys.stdout.write(f"READY {text}\n")
    sys.stdout.flush()


# --- server ---

def _tables(kind: str):
    import replay_tf as reverb
    if kind == "load":
        return [
            reverb.Table("ratio", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                         max_size=10_000_000,
                         rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
                             samples_per_insert=2.0, min_size_to_sample=32, error_buffer=(0.0, 512.0))),
            reverb.Table("prio", sampler=reverb.selectors.Prioritized(0.8), remover=reverb.selectors.Fifo(),
                         max_size=10_000_000, rate_limiter=reverb.rate_limiters.MinSize(1)),
        ]
    if kind == "faults":
        return [
            reverb.Table("q", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                         max_size=1_000_000, rate_limiter=reverb.rate_limiters.MinSize(1)),
            reverb.Table.queue("full", 1),
        ]
    if kind == "checkpoint":
        return checkpoint_tables()
    raise ValueError(f"unknown tables {kind!r}")


def checkpoint_tables():
    """The tables of the checkpoint fault tests (the test restores them in its own process too)."""
    import replay_tf as reverb
    return [
        reverb.Table("prio", sampler=reverb.selectors.Prioritized(0.6), remover=reverb.selectors.Fifo(),
                     max_size=100_000, rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
                         samples_per_insert=4.0, min_size_to_sample=2, error_buffer=(-1000.0, 1000.0))),
        reverb.Table("uniform", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                     max_size=100_000, rate_limiter=reverb.rate_limiters.MinSize(1)),
        reverb.Table.queue("empty", 10),  # never written: samplers of it wait until the server goes
    ]


def serve(config: dict) -> None:
    import replay_tf as reverb
    checkpointer = None
    if config.get("checkpoint_dir"):
        checkpointer = reverb.checkpointers.DefaultCheckpointer(config["checkpoint_dir"])
    server = reverb.Server(_tables(config["tables"]), port=config.get("port"), checkpointer=checkpointer)

    def stop_on_line():
        for line in sys.stdin:
            if line.strip() == "STOP":
                break
        server.stop()

    threading.Thread(target=stop_on_line, daemon=True).start()
    _ready(str(server.port))
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    _report({"stopped": True})


# --- load ---

def load_writer(config: dict) -> None:
    import numpy as np
    import replay_tf as reverb

    index = config["index"]
    client = reverb.Client(config["address"])
    client.server_info()
    control = _Control()
    rng = np.random.default_rng(index)
    _ready()
    control.go.wait()
    confirmed = {"ratio": 0, "prio": 0}
    episodes = {"ratio": 0, "prio": 0}
    flushes = []
    episode = 0
    started = time.monotonic()
    with client.trajectory_writer(num_keep_alive_refs=ITEM_STEPS) as writer:
        while not control.stop.is_set():
            created = {"ratio": 0, "prio": 0}
            for step in range(EPISODE_STEPS):
                writer.append(step_data(index, episode, step))
                if step >= ITEM_STEPS - 1:
                    table = "ratio" if step % 2 == 0 else "prio"
                    history = writer.history
                    writer.create_item(table, priority=float(rng.uniform(0.1, 2.0)),
                                       trajectory={"obs": history["obs"][-ITEM_STEPS:],
                                                   "ids": history["ids"][-ITEM_STEPS:]})
                    created[table] += 1
            t0 = time.monotonic()
            writer.end_episode()  # blocks until every item is confirmed
            flushes.append(time.monotonic() - t0)
            for table in created:
                confirmed[table] += created[table]
                episodes[table] += created[table] > 0
            episode += 1
    elapsed = time.monotonic() - started
    _report({"role": "writer", "index": index, "items": confirmed, "episodes": episodes, "seconds": elapsed,
             "flush": _percentiles(flushes), "rss_kb": _rss_kb()})


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def load_sampler(config: dict) -> None:
    import numpy as np
    import tensorflow as tf
    import replay_tf as reverb

    index, mode = config["index"], config["mode"]
    num_owners = config["num_samplers"]
    client = reverb.Client(config["address"])
    client.server_info()
    table = "ratio" if mode == "ratio_dataset" else "prio"
    batch = 16
    if mode != "prio_client":
        dtypes = {"obs": tf.float32, "ids": tf.int32}
        shapes = {"obs": tf.TensorShape([ITEM_STEPS, OBS_SIZE]), "ids": tf.TensorShape([ITEM_STEPS, 3])}
        if mode == "ratio_dataset":
            # Iterations end on a rate-limiter timeout (writers are slower than 2 samples per insert).
            dataset = reverb.TrajectoryDataset(config["address"], table, dtypes, shapes,
                                               max_in_flight_samples_per_worker=batch, rate_limiter_timeout_ms=500)
        else:
            # One request of `batch` samples per iteration: stopping between iterations abandons nothing.
            dataset = reverb.TrajectoryDataset(config["address"], table, dtypes, shapes,
                                               max_in_flight_samples_per_worker=batch, max_samples=batch,
                                               rate_limiter_timeout_ms=-1)
        iter(dataset)  # builds the input pipeline before READY
    control = _Control()
    rng = np.random.default_rng(100 + index)
    _ready()
    control.go.wait()
    samples = 0
    keys = set()
    deleted = []
    updates = 0
    iterations = 0
    waits = []       # seconds per sample call (client.sample batch, or per dataset element)
    started = time.monotonic()
    while True:
        stopping = control.stop.is_set()
        if stopping and mode != "ratio_dataset":
            break
        got = []
        if mode == "prio_client":
            t0 = time.monotonic()
            for sample in client.sample(table, num_samples=batch, emit_timesteps=False):
                waits.append(time.monotonic() - t0)
                check_sample(sample.data[1], sample.data[0])  # flattened in key order: ids, obs
                got.append((int(sample.info.key), int(sample.info.table_size)))
                t0 = time.monotonic()
        else:
            iterations += 1
            t0 = time.monotonic()
            for sample in dataset:
                waits.append(time.monotonic() - t0)
                check_sample(sample.data["obs"].numpy(), sample.data["ids"].numpy())
                got.append((int(sample.info.key), int(sample.info.table_size)))
                t0 = time.monotonic()
            if mode == "ratio_dataset" and stopping:
                samples += len(got)
                keys.update(k for k, _ in got)
                break  # the iteration that started after STOP ran until the limiter blocked: drained
        samples += len(got)
        keys.update(k for k, _ in got)
        if table == "prio" and got:
            mine = sorted({k for k, _ in got if k % num_owners == index and k not in deleted_set(deleted)})
            updates_now = {k: float(rng.uniform(0.1, 3.0)) for k in mine}
            deletes_now = []
            if mine and min(size for _, size in got) > 200 and rng.random() < 0.5:
                deletes_now = [mine[0]]
                del updates_now[mine[0]]
            if updates_now or deletes_now:
                client.mutate_priorities(table, updates=updates_now, deletes=deletes_now)
                updates += len(updates_now)
                deleted.extend(deletes_now)
    elapsed = time.monotonic() - started
    _report({"role": "sampler", "index": index, "mode": mode, "table": table, "samples": samples,
             "unique_keys": sorted(keys), "deleted": deleted, "updates": updates, "seconds": elapsed,
             "sample_wait": _percentiles(waits), "rss_kb": _rss_kb(),
             "drain_s": time.monotonic() - (control.stop_time or time.monotonic()),
             "dataset_iterations": iterations})


_DELETED_CACHE = {}


def deleted_set(deleted: list) -> set:
    cached = _DELETED_CACHE.get(id(deleted))
    if cached is None or len(cached) != len(deleted):
        cached = set(deleted)
        _DELETED_CACHE[id(deleted)] = cached
    return cached


# --- faults ---

def fault_writer(config: dict) -> None:
    import numpy as np
    import replay_tf as reverb

    index = config["index"]
    client = reverb.Client(config["address"])
    _ready()
    with client.trajectory_writer(num_keep_alive_refs=4) as writer:
        for i in range(config["items"]):
            writer.append({"x": np.full([64], i, np.float32), "w": np.int32(index)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:], "w": writer.history["w"][-1:]})
        writer.flush()
        if config.get("block"):
            writer.append({"x": np.full([64], -1, np.float32), "w": np.int32(index)})
            writer.create_item("full", 1.0, {"x": writer.history["x"][-1:], "w": writer.history["w"][-1:]})
            # A step with a new column: the second item's chunk is referred to by no other item.
            writer.append({"x": np.full([64], -2, np.float32), "w": np.int32(index),
                           "z": np.full([1024], 7, np.float32)})
            writer.create_item("full", 1.0, {"z": writer.history["z"][-1:]})
            try:  # sends both: the first is in; the second waits on the queue's rate limiter
                writer.flush(timeout_ms=1000)
            except reverb.errors.DeadlineExceededError:
                pass
            else:
                raise AssertionError("the second 'full' item should wait on the rate limiter")
            sys.stdout.write("STUCK\n")
            sys.stdout.flush()
            time.sleep(3600)
        if config.get("pause"):  # half written; the rest once the coordinator says GO
            control = _Control()
            sys.stdout.write("HALF\n")
            sys.stdout.flush()
            control.go.wait()
            for i in range(config["items"], 2 * config["items"]):
                writer.append({"x": np.full([64], i, np.float32), "w": np.int32(index)})
                writer.create_item("q", 1.0, {"x": writer.history["x"][-1:], "w": writer.history["w"][-1:]})
            writer.flush()
    _report({"items": 2 * config["items"] if config.get("pause") else config["items"]})


def main() -> None:
    role, config = sys.argv[1], json.loads(sys.argv[2])
    {"serve": serve, "load_writer": load_writer, "load_sampler": load_sampler,
     "fault_writer": fault_writer}[role](config)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
