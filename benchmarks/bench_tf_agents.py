"""TF-Agents' replay paths side by side with dm-reverb 0.14 and TF-Agents 0.19: `python -m benchmarks.run tf_agents`.

Workload: a static table of 5,000 items of 2 steps, written as TF-Agents'
`ReverbAddTrajectoryObserver(sequence_length=2)` writes them (one trajectory_writer, an item of the last two
steps per step), of a small `Trajectory`-like step (observation f32[4], scalars). Sampled through:

- TF-Agents' `ReverbReplayBuffer(max_cycle_length=N).as_dataset(sample_batch_size=64, num_steps=2)`, built
  here exactly as tf_agents 0.19 builds it (without tf_agents): `range(N).interleave` of N
  `TrajectoryDataset`s of `3 * (64 // N)` samples in flight, each mapped per sample (the info broadcast and
  the sequence function), `batch(64, drop_remainder=True)`, with `num_parallel_calls` AUTOTUNE (None) or 3;
- acme's `make_reverb_dataset(batch_size=256, num_parallel_calls=N)`: `range(N).interleave` of N
  `TrajectoryDataset.from_table_signature(max_in_flight_samples_per_worker=512).batch(256)`;
- the same pipeline over sources that do no work (one numpy_function call per batch of
  `3 * (64 // N)` samples returning a prepared array): the rate no source handing its batches over through
  `numpy_function` can pass (ours, on a table of this process, hands them over through a queue instead,
  `replay_tf/sampling/shared_samples.py`), next to dm-reverb's real one; for N = 32 also with sources whose
  threads do not keep their Python state (`replay_tf/sampling/thread_states.py`);
- TF-Agents' DQN tutorial loop's replay part: one step appended and one item created, then one
  `next(iterator)` of the N = 32 dataset (seconds per 1,500 iterations; lower is better).

The same source runs here (`import replay_tf as reverb`) and in the peer venv (`import reverb`, TF 2.15).

The same DQN loop on a uniform buffer of the same steps (1,000 added first), `replay_tf.TFUniformReplayBuffer`
against TF-Agents' own `TFUniformReplayBuffer(batch_size=1)`: one `add_batch` of one step (called from
Python as a `PyDriver`'s observer does, or inside a `tf.function` as the tutorial's `DynamicStepDriver`
does), then one `next(iterator)` of `as_dataset(sample_batch_size=64, num_steps=2,
num_parallel_calls=3).prefetch(3)`; only the add and the `next` are timed. TF-Agents runs on TF 2.15 (peer
venv) and on TF 2.21 (`RL_DATA_TF_AGENTS_PYTHON`, `.ci/make_tf_agents_venv.sh`); the sides alternate over
three rounds, and a row gives the median seconds and the median of the rounds' ratios.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys

from benchmarks import _harness

import anchor_suites_testlib  # noqa: E402  (tests/, on sys.path through _harness)
import peer_testlib  # noqa: E402

NUM_ITEMS = 5000
SHAPES = (1, 3, 12, 32)
UNIFORM_ITERATIONS = 1500
UNIFORM_ROUNDS = 3
UNIFORM_MODES = ("eager", "tf_function")

# The step both workloads write: a small `Trajectory`-like step, as TF-Agents' DQN tutorial collects.
_STEP = r'''
import collections
import time
import numpy as np
import tensorflow as tf

Step = collections.namedtuple('Step', ['step_type', 'observation', 'action', 'policy_info', 'next_step_type',
                                       'reward', 'discount'])
STEP_SPEC = Step(tf.TensorSpec([], tf.int32), tf.TensorSpec([4], tf.float32), tf.TensorSpec([], tf.int64), (),
                 tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))
'''

WORKLOAD = _STEP + r'''
def step(i):
    return Step(np.int32(i % 3), np.full([4], i, np.float32), np.int64(i % 2), (), np.int32((i + 1) % 3),
                np.float32(1.0), np.float32(0.99))

def make_server(num_items):
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([2, *s.shape], s.dtype), STEP_SPEC)
    table = reverb.Table('t', reverb.selectors.Uniform(), reverb.selectors.Fifo(), num_items + 2000,
                         reverb.rate_limiters.MinSize(1), signature=signature)
    server = reverb.Server([table])
    client = reverb.Client(f'localhost:{server.port}')
    writer = client.trajectory_writer(num_keep_alive_refs=2)
    for i in range(num_items + 1):
        add_step(writer, i)
    writer.flush()
    return server, client, writer

def add_step(writer, i):
    """One step as ReverbAddTrajectoryObserver(sequence_length=2) writes it."""
    writer.append(step(i))
    if writer.episode_steps >= 2:
        writer.create_item('t', 1.0, tf.nest.map_structure(lambda c: c[-2:], writer.history))

def trajectory_dataset(address, max_in_flight):
    """One of the TrajectoryDatasets TF-Agents' as_dataset interleaves."""
    shapes = tf.nest.map_structure(lambda s: (2,) + s.shape, STEP_SPEC)
    dtypes = tf.nest.map_structure(lambda s: s.dtype, STEP_SPEC)
    return reverb.TrajectoryDataset(address, 't', dtypes, shapes, max_in_flight_samples_per_worker=max_in_flight,
                                    num_workers_per_iterator=-1, max_samples_per_stream=-1,
                                    rate_limiter_timeout_ms=-1)

def no_work_dataset(unused_address, max_in_flight, keep=True):
    """A source of the same elements that does no work: each batch of `max_in_flight` samples is one
    numpy_function call returning a prepared array, the samples' bytes side by side, split in the graph
    (how a TrajectoryDataset hands a batch of small samples to TensorFlow where it reads them through
    `numpy_function`, keeping the calling thread's Python state where `keep_thread_state` does)."""
    n = max_in_flight
    info = [np.zeros([n], np.uint64), np.zeros([n]), np.zeros([n], np.int64), np.zeros([n]), np.zeros([n], np.int32)]
    data = [np.zeros([n, 2, *s.shape], s.dtype.as_numpy_dtype) for s in tf.nest.flatten(STEP_SPEC)]
    flat = info + data
    packed = np.concatenate([a.reshape(n, -1).view(np.uint8) for a in flat], axis=1)

    def call(_):
        if keep:
            keep_thread_state()
        return packed

    def read(_):
        out = tf.numpy_function(call, [_], tf.uint8, stateful=True)
        out.set_shape(packed.shape)
        parts = tf.split(out, [a[0].nbytes for a in flat], axis=1)
        values = [tf.bitcast(p if a.ndim == 1 else tf.reshape(p, [-1, *a.shape[1:], a.itemsize]), a.dtype)
                  for p, a in zip(parts, flat)]
        return reverb.ReplaySample(reverb.SampleInfo(*values[:5]), tf.nest.pack_sequence_as(STEP_SPEC, values[5:]))

    batches = tf.data.Dataset.from_tensors(np.int64(0)).repeat().map(read)
    samples = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), batches.element_spec)
    flat_specs = tf.nest.flatten(samples)
    # (tf.data's unbatch kernel alone, as TrajectoryDataset splits its batches: no map per batch)
    unbatched = tf.raw_ops.UnbatchDataset(input_dataset=tf.data.experimental.to_variant(batches),
                                          output_types=[s.dtype for s in flat_specs],
                                          output_shapes=[s.shape for s in flat_specs])
    return tf.data.experimental.from_variant(unbatched, samples)

def tf_agents_dataset(address, sample_batch_size, num_cycles, num_parallel_calls, source=trajectory_dataset):
    """tf_agents.ReverbReplayBuffer(max_cycle_length=num_cycles).as_dataset(sample_batch_size, num_steps=2)."""
    cycle_length = min(sample_batch_size, num_cycles)
    per_interleave = sample_batch_size // cycle_length

    def generate(_):
        dataset = source(address, 3 * per_interleave)

        def broadcast_info(info_traj):
            info, traj = info_traj
            first = tf.nest.flatten(traj)[0]
            length = first.shape[0] or tf.shape(first)[0]
            return reverb.ReplaySample(tf.nest.map_structure(lambda t: tf.repeat(t, [length]), info), traj)

        return dataset.map(broadcast_info).map(lambda sample: (sample.data, sample.info))

    if cycle_length == 1:
        dataset = generate(0)
    else:
        dataset = tf.data.Dataset.range(cycle_length).interleave(
            generate, cycle_length=cycle_length, num_parallel_calls=num_parallel_calls or tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_deterministic = False
    return dataset.with_options(options).batch(sample_batch_size, drop_remainder=True)

def acme_dataset(address, batch_size, num_parallel_calls):
    """acme.datasets.make_reverb_dataset(address, batch_size=batch_size, num_parallel_calls=...)."""
    def make(_):
        return reverb.TrajectoryDataset.from_table_signature(
            address, 't', max_in_flight_samples_per_worker=2 * batch_size).batch(batch_size, drop_remainder=True)
    return tf.data.Dataset.range(num_parallel_calls).interleave(
        make, cycle_length=num_parallel_calls, num_parallel_calls=num_parallel_calls, deterministic=False)

def samples_per_s(dataset, batch_size, seconds):
    iterator = iter(dataset)
    for _ in range(20):
        next(iterator)  # (every interleaved iterator started)
    return best_rate(lambda: (next(iterator), batch_size)[1], repeats=3, min_seconds=seconds)

def dqn_loop(address, writer, num_iterations, first_step):
    """Seconds of `num_iterations` (add one step, next(iterator)) on the 64 x 2-step, 32-cycle dataset."""
    iterator = iter(tf_agents_dataset(address, 64, 32, None))
    next(iterator)
    start = time.perf_counter()
    for i in range(num_iterations):
        add_step(writer, first_step + i)
        next(iterator)
    return time.perf_counter() - start

server, client, writer = make_server(NUM_ITEMS)
address = f'localhost:{server.port}'
if KEEPS_THREAD_STATES and 32 in SHAPES:
    # The no-work sources of N = 32 without keeping their threads' Python state; first, before any thread
    # of this process has kept its state for good.
    for calls in (None, 3):
        emit(f'no_work_unkept/32/{calls}', samples_per_s(
            tf_agents_dataset(address, 64, 32, calls, lambda a, m: no_work_dataset(a, m, keep=False)), 64, SECONDS))
for n in SHAPES:
    for calls in (None, 3):
        if calls is not None and n < 3:
            continue
        emit(f'tf_agents/{n}/{calls}', samples_per_s(tf_agents_dataset(address, 64, n, calls), 64, SECONDS))
        if n >= 12:
            emit(f'no_work/{n}/{calls}', samples_per_s(tf_agents_dataset(address, 64, n, calls, no_work_dataset),
                                                        64, SECONDS))
    emit(f'acme/{n}', samples_per_s(acme_dataset(address, 256, n), 256, SECONDS))
emit('dqn', dqn_loop(address, writer, 1500, NUM_ITEMS + 1))
server.stop()
'''

# The DQN loop on a uniform buffer; `RB` is the buffer class (ours, or TF-Agents' in a venv of its own).
UNIFORM_WORKLOAD = _STEP + r'''
def step_batch(i):
    """One collected step as a driver hands it to its observer: a batch of 1."""
    return Step(tf.constant([i % 3], tf.int32), tf.fill([1, 4], float(i)), tf.constant([i % 2], tf.int64), (),
                tf.constant([(i + 1) % 3], tf.int32), tf.constant([1.0]), tf.constant([0.99]))

def uniform_dqn_loop(mode, num_iterations, prefill):
    """Seconds spent in add_batch and in next(iterator) over `num_iterations` iterations."""
    rb = RB(STEP_SPEC, batch_size=1, max_length=100000)
    @tf.function
    def traced_add(items):
        rb.add_batch(items)  # (its op returned in graph mode is no tf.function output)
    for i in range(prefill):
        traced_add(step_batch(i))
    add = rb.add_batch if mode == 'eager' else traced_add
    iterator = iter(rb.as_dataset(sample_batch_size=64, num_steps=2, num_parallel_calls=3).prefetch(3))
    next(iterator)
    add(step_batch(prefill))
    adding = sampling = 0.0
    for i in range(num_iterations):
        items = step_batch(prefill + 1 + i)  # (the environment's step: not timed)
        start = time.perf_counter()
        add(items)
        added = time.perf_counter()
        next(iterator)
        adding += added - start
        sampling += time.perf_counter() - added
    return [adding, sampling]

for mode in MODES:
    emit(mode, uniform_dqn_loop(mode, ITERATIONS, 1000))
'''


def _uniform_prelude(modes, iterations: int) -> str:
    return f"MODES = {tuple(modes)!r}\nITERATIONS = {iterations!r}\n"


def _run_here(code: str) -> dict:
    """Runs `code` (which calls `emit`) in a fresh interpreter of this environment; returns what it emitted."""
    code = ("import json\n_out = {}\nemit = _out.__setitem__\n" + code
            + "\nprint('RESULT ' + json.dumps(_out))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800,
                          cwd=str(pathlib.Path(__file__).resolve().parent.parent))
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark failed:\n{proc.stderr[-4000:]}")
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _tf_agents_current_tf() -> peer_testlib.Peer | None:
    """TF-Agents 0.19 on current TF (`.ci/make_tf_agents_venv.sh`), or None with a note on stderr."""
    python = os.environ.get(anchor_suites_testlib.ENV_VAR)
    if not python or not os.path.exists(python):
        print(f"[bench] no TF-Agents venv on current TF: set {anchor_suites_testlib.ENV_VAR} "
              f"(bash .ci/make_tf_agents_venv.sh)", file=sys.stderr)
        return None
    return peer_testlib.Peer(python)


def uniform_rows(modes=UNIFORM_MODES, iterations: int = UNIFORM_ITERATIONS, rounds: int = UNIFORM_ROUNDS
                 ) -> list[dict]:
    """The DQN loop on replay_tf's and TF-Agents' uniform buffers, the sides alternating over `rounds`."""
    prelude = _uniform_prelude(modes, iterations)
    # TF-Agents is written for Keras 2: from TF 2.16 on it imports only with tf_keras as tf.keras.
    tf_agents_code = ("import importlib.metadata, os\n"
                      "if tuple(map(int, importlib.metadata.version('tensorflow').split('.')[:2])) >= (2, 16):\n"
                      "    os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')\n"
                      "from tf_agents.replay_buffers.tf_uniform_replay_buffer import TFUniformReplayBuffer as RB\n"
                      + prelude + UNIFORM_WORKLOAD)
    sides = {"ours": lambda: _run_here("from replay_tf import TFUniformReplayBuffer as RB\n" + prelude
                                       + UNIFORM_WORKLOAD)}
    for name, peer in (("TF-Agents 0.19 TFUniformReplayBuffer, TF 2.15", _harness.peer()),
                       ("TF-Agents 0.19 TFUniformReplayBuffer, TF 2.21", _tf_agents_current_tf())):
        if peer is not None:
            sides[name] = lambda peer=peer: peer.run(tf_agents_code, timeout_s=1800)
    runs: dict = {name: [] for name in sides}
    for round_index in range(rounds):
        order = list(sides)[round_index % len(sides):] + list(sides)[:round_index % len(sides)]
        for name in order:
            runs[name].append(sides[name]())
    rows = []
    for mode in modes:
        ours = [sum(run[mode]) for run in runs["ours"]]
        for name in [n for n in sides if n != "ours"] or [None]:
            theirs = [sum(run[mode]) for run in runs[name]] if name else []
            how = "from Python, as a PyDriver's observer" if mode == "eager" else "in tf.function, as a driver"
            row = {"workload": f"TF-Agents DQN loop on a uniform buffer: add_batch of 1 step ({how}) + "
                               f"next(iterator) of as_dataset(64, num_steps=2, num_parallel_calls=3), "
                               f"{iterations:,} times (lower is better)",
                   "ours": statistics.median(ours), "peer": statistics.median(theirs) if theirs else None,
                   "peer_name": name or "", "unit": "s",
                   # Seconds in add_batch and in next(iterator), per round.
                   "split_s": {"ours": [run[mode] for run in runs["ours"]],
                               "peer": [run[mode] for run in runs[name]] if name else []}}
            if theirs:
                row["round_ratios"] = [t / o for t, o in zip(theirs, ours)]
                row["ratio"] = statistics.median(row["round_ratios"])
            rows.append(row)
    return rows


def _prelude(shapes, seconds: float, num_items: int) -> str:
    return (_harness.PEER_BEST_RATE + f"SHAPES = {tuple(shapes)!r}\nSECONDS = {seconds!r}\n"
            f"NUM_ITEMS = {num_items!r}\n")


def _run_ours(shapes, seconds: float, num_items: int) -> dict:
    return _run_here("import replay_tf as reverb\n"
                     "from replay_tf.sampling.thread_states import keep as keep_thread_state\nKEEPS_THREAD_STATES = True\n"
                     + _prelude(shapes, seconds, num_items) + WORKLOAD)


def _workload_name(key: str) -> tuple:
    kind, *rest = key.split("/")
    if kind == "dqn":
        return ("TF-Agents DQN loop: add a step + next(iterator) of 64 x 2 steps (32 cycles), 1,500 times "
                "(lower is better)", "s")
    if kind == "tf_agents":
        n, calls = rest
        return (f"TF-Agents as_dataset(64, num_steps=2): {n} interleaved TrajectoryDataset(s) of {64 // int(n)}, "
                f"num_parallel_calls={'AUTOTUNE' if calls == 'None' else calls}", "samples/s")
    if kind in ("no_work", "no_work_unkept"):
        n, calls = rest
        unkept = ", their threads' Python state not kept" if kind == "no_work_unkept" else ""
        return (f"bound: the same pipeline ({n} cycles, num_parallel_calls={'AUTOTUNE' if calls == 'None' else calls})"
                f" over numpy_function sources that do no work, {3 * (64 // int(n))} samples per call{unkept}",
                "samples/s")
    return f"acme make_reverb_dataset(batch_size=256, num_parallel_calls={rest[0]})", "samples/s"


def main(shapes=SHAPES, seconds: float = 1.0, num_items: int = NUM_ITEMS) -> None:
    peer = _harness.peer()
    ours = _run_ours(shapes, seconds, num_items)
    theirs = {}
    if peer is not None:
        theirs = peer.run("import reverb\nkeep_thread_state = lambda: None\nKEEPS_THREAD_STATES = False\n"
                          + _prelude(shapes, seconds, num_items) + WORKLOAD, {}, timeout_s=1800)
    rows = []
    for key, value in ours.items():
        workload, unit = _workload_name(key)
        row = {"workload": workload, "ours": value, "peer": theirs.get(key),
               "peer_name": "dm-reverb 0.14 in-process", "unit": unit}
        if key.startswith("no_work"):  # against dm-reverb's real source: the most a numpy_function source reaches
            row.update(peer=theirs.get("tf_agents/" + key.split("/", 1)[1]),
                       peer_name="dm-reverb 0.14 in-process, real TrajectoryDatasets")
            if key.startswith("no_work/"):
                row["peer_no_work_tf_2_15"] = theirs.get(key)
        if key == "dqn" and value and theirs.get(key):
            row["ratio"] = theirs[key] / value  # (seconds: higher ratio is better, as everywhere)
        rows.append(row)
    _harness.report("tf_agents", rows + uniform_rows())


if __name__ == "__main__":
    sys.exit(main())
