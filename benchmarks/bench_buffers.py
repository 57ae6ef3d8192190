"""In-graph replay buffers side by side: replay_tf vs tf-agents 0.19 (peer venv) vs flashbax (JAX venv).

Run: `python -m benchmarks.run buffers`. The flashbax venv comes from `bash .ci/make_jax_venv.sh` (found
at RL_DATA_JAX_PYTHON or ~/.cache/rl-data-jax/bin/python). Workloads: the seed's small spec
(action [3], lidar [5], camera [3,2] float32) and an Atari-like spec (uint8 [84,84,4], int32 action,
float32 reward); batch_size 32, max_length 1000, sample batch 256, num_steps 2, alpha 0.6. Calling modes:
from Python (one call per add / sample, tf-agents wrapped in tf.function as its agents do), inside a
user's tf.function, inside an `as_dataset` pipeline, and a `jit_compile=True` `tf.while_loop` of 100 (and
1,000) adds (against flashbax's jitted `fori_loop` of as many adds; tf-agents' CriticalSection does not
compile with XLA).

On a GPU: `RL_DATA_BENCH_DEVICE=gpu:0 python -m benchmarks.run buffers` builds our buffers with
`device='gpu:0'` and runs flashbax on JAX's GPU backend (a CUDA build of TensorFlow here and of JAX in the
flashbax venv), against flashbax only: TF-Agents' rows and the `as_dataset` pipelines (tf.data runs its
functions on the host) are left out. Those results go to `buffers_<device>.json`, beside the CPU suite's.
"""
from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import textwrap
import time

import numpy as np

from benchmarks import _harness

BATCH, LENGTH, SAMPLE, STEPS = 32, 1000, 256, 2
SMALL_BYTES = (3 + 5 + 6) * 4
ATARI_BYTES = 84 * 84 * 4 + 4 + 4

_COMMON = _harness.PEER_BEST_RATE + f'''
BATCH, LENGTH, SAMPLE, STEPS = {BATCH}, {LENGTH}, {SAMPLE}, {STEPS}
DATASETS = True  # the as_dataset rows (host-side tf.data pipelines)
'''

_TF_SPECS = '''
import numpy as np
import tensorflow as tf
SMALL = (tf.TensorSpec([3], tf.float32, "action"),
         (tf.TensorSpec([5], tf.float32, "lidar"), tf.TensorSpec([3, 2], tf.float32, "camera")))
ATARI = (tf.TensorSpec([84, 84, 4], tf.uint8, "obs"), tf.TensorSpec([], tf.int32, "action"),
         tf.TensorSpec([], tf.float32, "reward"))
def batch_of(spec):
    return tf.nest.map_structure(lambda s: tf.ones([BATCH] + s.shape.as_list(), s.dtype), spec)
def fill(rb, spec, steps=LENGTH):
    items = batch_of(spec)
    for _ in range(steps):
        rb.add_batch(items)
    return items
'''

# The same workload code runs for tf-agents (peer) and replay_tf (here): `RB` differs.
_TF_WORKLOADS = '''
def run_workloads(RB, results, prioritized=None):
    rb = RB(SMALL, batch_size=BATCH, max_length=LENGTH)
    items = fill(rb, SMALL, 50)
    results["add_small"] = best_rate(lambda: (rb.add_batch(items), BATCH)[1])
    fill(rb, SMALL)
    if DATASETS:
        ds = iter(rb.as_dataset(sample_batch_size=SAMPLE).prefetch(4))
        results["as_dataset_256_small"] = best_rate(lambda: (next(ds), SAMPLE)[1])
        ds = iter(rb.as_dataset().batch(SAMPLE).prefetch(4))
        results["as_dataset_unbatched_small"] = best_rate(lambda: (next(ds), SAMPLE)[1], repeats=2)
        ds = iter(rb.as_dataset(num_parallel_calls=tf.data.AUTOTUNE).batch(SAMPLE).prefetch(tf.data.AUTOTUNE))
        results["as_dataset_unbatched_autotune_small"] = best_rate(lambda: (next(ds), SAMPLE)[1], repeats=2)
        del ds
    results["get_next_small"] = best_rate(lambda: (rb.get_next(SAMPLE, STEPS), SAMPLE)[1])
    del rb
    rb = RB(ATARI, batch_size=BATCH, max_length=LENGTH)
    items = fill(rb, ATARI)
    results["add_atari"] = best_rate(lambda: (rb.add_batch(items), BATCH)[1])
    results["get_next_atari"] = best_rate(lambda: (rb.get_next(SAMPLE, STEPS)[0][0].shape, SAMPLE)[1])
    del rb
    if prioritized is not None:
        rb = prioritized(ATARI, batch_size=BATCH, max_length=LENGTH, alpha=0.6)
        items = fill(rb, ATARI)
        results["add_atari_prioritized"] = best_rate(lambda: (rb.add_batch(items), BATCH)[1])
        results["get_next_atari_prioritized"] = best_rate(
            lambda: (rb.get_next(SAMPLE, STEPS)[0][0].shape, SAMPLE)[1])
        _, info = rb.get_next(SAMPLE, STEPS)
        priorities = tf.random.uniform([SAMPLE], 0.1, 2.0)
        results["update_priorities"] = best_rate(lambda: (rb.update_priorities(info.ids, priorities), SAMPLE)[1])
        del rb


def run_traced_workloads(RB, results, prioritized=None, jit_loop=True, bounds=False):
    """The buffer called as TF-Agents-style code calls it: inside tf.function, in tf.data pipelines, and
    (jit_loop) a compiled collect loop of many adds. `RB` is the plain class (no wrapper). `bounds`: also
    the same as_dataset pipeline over a map function that does no work."""
    rb = RB(SMALL, batch_size=BATCH, max_length=LENGTH)
    items = fill(rb, SMALL)
    if DATASETS:
        ds = iter(rb.as_dataset(sample_batch_size=SAMPLE, num_steps=STEPS,
                                num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
        results["as_dataset_256x2_autotune_small"] = best_rate(lambda: (next(ds), SAMPLE)[1])
        del ds
    if bounds and DATASETS:  # each map call returns a prepared sample of the same structure
        prepared = tf.nest.map_structure(lambda t: tf.constant(t.numpy()), rb.get_next(SAMPLE, STEPS))
        ds = iter(tf.data.Dataset.counter().map(lambda _: tf.nest.map_structure(tf.identity, prepared),
                                                num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
        results["as_dataset_256x2_autotune_small_no_work"] = best_rate(lambda: (next(ds), SAMPLE)[1])
        del ds
        # The unbatched as_dataset's chunked draws, unbatched with no per-element check against the live
        # buffer (each element then reflects its chunk's snapshot): what the check is measured against.
        draw = rb._get_next_fn_for_dataset(128, None)
        for key, calls in (("as_dataset_unbatched_small_chunks_alone", None),
                           ("as_dataset_unbatched_autotune_small_chunks_alone", tf.data.AUTOTUNE)):
            ds = iter(tf.data.Dataset.counter().map(draw, num_parallel_calls=calls).unbatch().batch(SAMPLE)
                      .prefetch(tf.data.AUTOTUNE))
            results[key] = best_rate(lambda: (next(ds), SAMPLE)[1], repeats=2)
            del ds
    if jit_loop:
        def collect_loop(adds):  # a tf.while_loop of `adds` add_batch calls, as flashbax's fori_loop
            @tf.function(jit_compile=True, autograph=False)
            def collect(items):
                def body(i):
                    with tf.control_dependencies([rb.add_batch(items)]):
                        return (i + 1,)
                tf.while_loop(lambda i: i < adds, body, (tf.constant(0),))
                return rb.num_frames()
            collect(items)
            return collect
        for adds in (1, 100, 1000):
            collect = collect_loop(adds)
            results[f"jit_collect_{adds}_small"] = best_rate(
                lambda: (collect(items).numpy(), adds * BATCH)[1])
        if bounds:  # TensorFlow's cost of calling a compiled function, expressed per 100 adds of a call
            @tf.function(jit_compile=True, autograph=False)
            def empty_call(items):
                return rb.num_frames()
            empty_call(items)
            results["jit_empty_call_small"] = best_rate(lambda: (empty_call(items).numpy(), 100 * BATCH)[1])
    del rb
    rb = RB(ATARI, batch_size=BATCH, max_length=LENGTH)
    items = fill(rb, ATARI)

    @tf.function
    def add(items):
        rb.add_batch(items)
    add(items)
    results["tf_function_add_atari"] = best_rate(lambda: (add(items), BATCH)[1])

    @tf.function
    def sample():
        return rb.get_next(SAMPLE, STEPS)
    sample()
    results["tf_function_get_next_atari"] = best_rate(lambda: (sample()[0][0].shape, SAMPLE)[1])
    if bounds:  # the bytes alone: the add's scatters and the sample's gathers, on the buffer's own storage
        storage = rb.variables()[:len(tf.nest.flatten(ATARI))]  # (one [BATCH * LENGTH, ...] variable per leaf)
        rows = tf.range(BATCH, 2 * BATCH, dtype=tf.int64)
        windows = tf.constant(np.random.default_rng(0).integers(0, BATCH * LENGTH, SAMPLE * STEPS), tf.int64)

        @tf.function
        def scatters(items):
            for variable, value in zip(storage, tf.nest.flatten(items)):
                variable.scatter_update(tf.IndexedSlices(value, rows))
        scatters(items)
        results["tf_function_scatters_atari"] = best_rate(lambda: (scatters(items), BATCH)[1])

        @tf.function
        def gathers():
            return [tf.reshape(v.sparse_read(windows), [SAMPLE, STEPS] + v.shape.as_list()[1:]) for v in storage]
        gathers()
        results["tf_function_gathers_atari"] = best_rate(lambda: (gathers()[0].shape, SAMPLE)[1])
        del storage
    del rb
    if prioritized is not None:
        rb = prioritized(ATARI, batch_size=BATCH, max_length=LENGTH, alpha=0.6)
        fill(rb, ATARI)

        @tf.function
        def sample_prioritized():
            return rb.get_next(SAMPLE, STEPS)
        sample_prioritized()
        results["tf_function_get_next_atari_prioritized"] = best_rate(
            lambda: (sample_prioritized()[0][0].shape, SAMPLE)[1])
        del rb
'''

_PEER_CODE = _COMMON + _TF_SPECS + _TF_WORKLOADS + '''
from tf_agents.replay_buffers.tf_uniform_replay_buffer import TFUniformReplayBuffer
tf.get_logger().setLevel("ERROR")

class Compiled:
    """tf-agents at its fastest: add_batch and get_next wrapped in tf.function (as its agents do)."""
    def __init__(self, *args, **kwargs):
        self.rb = TFUniformReplayBuffer(*args, **kwargs)
        def add(items):
            self.rb.add_batch(items)
        self.add_batch = tf.function(add)
        self.get_next = tf.function(self.rb.get_next)
        self.as_dataset = self.rb.as_dataset

results = {}
run_workloads(Compiled, results)
run_traced_workloads(TFUniformReplayBuffer, results, jit_loop=False)  # its CriticalSection is not XLA
for k, v in results.items():
    emit(k, v)
'''

_FLASHBAX_CODE = _COMMON + '''
import json, jax, jax.numpy as jnp, flashbax as fbx
results = {}
def items(spec):
    return {k: jnp.ones((BATCH, 1) + shape, dtype) for k, (shape, dtype) in spec.items()}
SMALL = {"action": ((3,), jnp.float32), "lidar": ((5,), jnp.float32), "camera": ((3, 2), jnp.float32)}
ATARI = {"obs": ((84, 84, 4), jnp.uint8), "action": ((), jnp.int32), "reward": ((), jnp.float32)}
def run(name, spec, make):
    buf = make(add_batch_size=BATCH, sample_batch_size=SAMPLE, sample_sequence_length=STEPS, period=1,
               min_length_time_axis=STEPS, max_length_time_axis=LENGTH)
    batch = items(spec)
    state = buf.init(jax.tree_util.tree_map(lambda x: x[0, 0], batch))
    add = jax.jit(buf.add, donate_argnums=0)
    sample = jax.jit(buf.sample)
    for _ in range(LENGTH):
        state = add(state, batch)
    jax.block_until_ready(state)
    box = [state]
    def do_add():
        box[0] = add(box[0], batch)
        jax.block_until_ready(box[0].current_index)
        return BATCH
    results["add_" + name] = best_rate(do_add)
    key = [jax.random.PRNGKey(0)]
    def do_sample():
        key[0], k = jax.random.split(key[0])
        jax.block_until_ready(sample(box[0], k).experience)
        return SAMPLE
    results["get_next_" + name] = best_rate(do_sample)
    return buf, box
buf, box = run("small", SMALL, fbx.make_trajectory_buffer)
batch = items(SMALL)
for adds in (1, 100, 1000):
    collect = jax.jit(lambda state, batch, adds=adds: jax.lax.fori_loop(0, adds, lambda _, s: buf.add(s, batch),
                                                                       state), donate_argnums=0)
    box[0] = collect(box[0], batch)
    def do_collect():
        box[0] = collect(box[0], batch)
        jax.block_until_ready(box[0].current_index)
        return adds * BATCH
    results[f"jit_collect_{adds}_small"] = best_rate(do_collect)
run("atari", ATARI, fbx.make_trajectory_buffer)
buf, box = run("atari_prioritized", ATARI,
               lambda **kw: fbx.make_prioritised_trajectory_buffer(priority_exponent=0.6, device=DEVICE, **kw))
s = jax.jit(buf.sample)(box[0], jax.random.PRNGKey(1))
set_p = jax.jit(buf.set_priorities, donate_argnums=0)
priorities = jnp.linspace(0.1, 2.0, SAMPLE)
def do_update():
    box[0] = set_p(box[0], s.indices, priorities)
    jax.block_until_ready(box[0].sum_tree_state)
    return SAMPLE
results["update_priorities"] = best_rate(do_update)
print("RESULTS" + json.dumps(results))
'''


def _device() -> str | None:
    """The TF device the buffers run on when `RL_DATA_BENCH_DEVICE` names one (None: the host CPU)."""
    return os.environ.get("RL_DATA_BENCH_DEVICE") or None


def _jax_platform(device: str | None) -> str:
    """flashbax's platform for a TF device name: "gpu" for `gpu:N`, else "cpu"."""
    return "gpu" if device and device.lower().lstrip("/").replace("device:", "").startswith("gpu") else "cpu"


def _flashbax(device: str | None = None) -> dict | None:
    python = os.environ.get("RL_DATA_JAX_PYTHON", str(pathlib.Path.home() / ".cache/rl-data-jax/bin/python"))
    if not os.path.exists(python):
        print(f"[bench] no JAX venv at {python}: run `bash .ci/make_jax_venv.sh`", file=sys.stderr)
        return None
    platform = _jax_platform(device)
    env = dict(os.environ, JAX_PLATFORMS="cuda" if platform == "gpu" else "cpu")
    env.pop("PYTHONPATH", None)
    code = f"DEVICE = {platform!r}\n" + textwrap.dedent(_FLASHBAX_CODE)
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=1200)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULTS"):
            return json.loads(line[len("RESULTS"):])
    print(f"[bench] flashbax run failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def _tf_agents() -> dict | None:
    peer = _harness.peer()
    if peer is None:
        return None
    try:
        return peer.run(_PEER_CODE, timeout_s=1200)
    except Exception as e:  # a benchmark reports what it could measure
        print(f"[bench] tf-agents run failed: {e}", file=sys.stderr)
        return None


def _copy_bandwidth() -> float:
    """Bytes/s of a large memcpy (numpy), the ceiling for sampling."""
    src = np.ones(256 * 1024 * 1024, np.uint8)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, src.nbytes / (time.perf_counter() - start))
    return best


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _ours(device: str | None = None) -> tuple[dict, dict]:
    import functools

    import tensorflow as tf

    import replay_tf
    from replay_tf import specs

    namespace: dict = {}
    exec(_COMMON + _TF_SPECS + _TF_WORKLOADS, namespace)
    results: dict = {}
    uniform, prioritized = replay_tf.UniformReplayBuffer, replay_tf.PrioritizedReplayBuffer
    if device is not None:
        kind = tf.DeviceSpec.from_string(device).device_type or "CPU"
        if not tf.config.list_logical_devices(kind.upper()):
            raise SystemExit(f"RL_DATA_BENCH_DEVICE={device!r}: TensorFlow sees no {kind.upper()} device here "
                             f"(it sees {[d.name for d in tf.config.list_logical_devices()]})")
        uniform = functools.partial(uniform, device=device)
        prioritized = functools.partial(prioritized, device=device)
        namespace["DATASETS"] = False
    with tf.device(device or "/cpu:0"):
        namespace["run_workloads"](uniform, results, prioritized)
        namespace["run_traced_workloads"](uniform, results, prioritized, bounds=device is None)
    if device is not None:
        return results, {}
    # Memory: RSS growth of building and filling an Atari buffer vs capacity x bytes per item.
    before = _rss_bytes()
    rb = replay_tf.UniformReplayBuffer(namespace["ATARI"], batch_size=BATCH, max_length=LENGTH)
    namespace["fill"](rb, namespace["ATARI"])
    grown = _rss_bytes() - before
    payload = BATCH * LENGTH * specs.nbytes(namespace["ATARI"])
    variables = sum(int(np.prod(v.shape)) * v.dtype.size for v in rb.variables())
    memory = {"payload_bytes": payload, "variable_bytes": variables, "rss_growth_bytes": grown}
    del rb, tf
    return results, memory


def _device_main(device: str) -> None:
    """The buffer rows on `device`, against flashbax on the same kind of device."""
    ours, _ = _ours(device)
    fbx = _flashbax(device) or {}
    rows = []
    for workload, key, unit in [
            ("add_batch small spec", "add_small", "frames/s"),
            ("add_batch Atari", "add_atari", "frames/s"),
            ("get_next(256, num_steps=2) small spec", "get_next_small", "samples/s"),
            ("get_next(256, num_steps=2) Atari", "get_next_atari", "samples/s"),
            ("prioritized(0.6) get_next(256, 2) Atari", "get_next_atari_prioritized", "samples/s"),
            ("prioritized add_batch Atari (vs flashbax PER add)", "add_atari_prioritized", "frames/s"),
            ("update_priorities, 256 ids per call", "update_priorities", "updates/s"),
            ("jit_compile'd tf.while_loop of 100 add_batch small spec", "jit_collect_100_small", "frames/s"),
            ("jit_compile'd tf.while_loop of 1,000 add_batch small spec", "jit_collect_1000_small", "frames/s"),
    ]:
        rows.append({"workload": f"[{device}] {workload}", "ours": ours.get(key), "peer": fbx.get(key),
                     "peer_name": f"flashbax ({_jax_platform(device)})", "unit": unit})
    for workload, key, peer_key in [
            ("add_batch in tf.function (1 add/call) Atari", "tf_function_add_atari", "add_atari"),
            ("get_next(256, 2) in tf.function Atari", "tf_function_get_next_atari", "get_next_atari"),
            ("prioritized get_next(256, 2) in tf.function Atari", "tf_function_get_next_atari_prioritized",
             "get_next_atari_prioritized"),
    ]:
        rows.append({"workload": f"[{device}] {workload}", "ours": ours.get(key), "peer": fbx.get(peer_key),
                     "peer_name": f"flashbax ({_jax_platform(device)})", "unit": "frames/s" if "add" in key
                     else "samples/s"})
    _harness.report("buffers_" + "".join(c for c in device.lower() if c.isalnum()), rows)


def _marginal_rate(results: dict) -> float | None:
    """Frames/s of the adds alone inside a compiled loop: the 1,000-add call's time less the 1-add call's
    (what calling the program costs), over the 999 adds between them."""
    one, many = results.get("jit_collect_1_small"), results.get("jit_collect_1000_small")
    if not one or not many:
        return None
    extra = 1000 * BATCH / many - BATCH / one
    return 999 * BATCH / extra if extra > 0 else None


def main() -> None:
    device = _device()
    if device is not None:
        _device_main(device)
        return
    ours, memory = _ours()
    peer = _tf_agents() or {}
    fbx = _flashbax() or {}
    bandwidth = _copy_bandwidth()
    rows = []

    def row(workload, key, unit, against, name):
        rows.append({"workload": workload, "ours": ours.get(key), "peer": against.get(key), "peer_name": name,
                     "unit": unit})

    row("add_batch small spec", "add_small", "frames/s", fbx, "flashbax")
    row("add_batch small spec", "add_small", "frames/s", peer, "tf-agents")
    row("add_batch Atari", "add_atari", "frames/s", fbx, "flashbax")
    row("add_batch Atari", "add_atari", "frames/s", peer, "tf-agents")
    row("get_next(256, num_steps=2) small spec", "get_next_small", "samples/s", fbx, "flashbax")
    row("get_next(256, num_steps=2) small spec", "get_next_small", "samples/s", peer, "tf-agents")
    row("get_next(256, num_steps=2) Atari", "get_next_atari", "samples/s", fbx, "flashbax")
    row("get_next(256, num_steps=2) Atari", "get_next_atari", "samples/s", peer, "tf-agents")
    row("prioritized(0.6) get_next(256, 2) Atari", "get_next_atari_prioritized", "samples/s", fbx,
        "flashbax")
    row("prioritized add_batch Atari (vs flashbax PER add)", "add_atari_prioritized", "frames/s",
        {"add_atari_prioritized": fbx.get("add_atari_prioritized")}, "flashbax")
    row("update_priorities, 256 ids per call", "update_priorities", "updates/s", fbx, "flashbax")
    row("as_dataset(sample_batch_size=256) small spec", "as_dataset_256_small", "samples/s", peer,
        "tf-agents")
    # Inside TF programs, as TF-Agents-style code calls the buffer (both sides traced the same way).
    row("as_dataset(256, num_steps=2, AUTOTUNE) small spec", "as_dataset_256x2_autotune_small", "samples/s",
        peer, "tf-agents")
    row("bound: the same pipeline over a map function that does no work (returns a prepared sample)",
        "as_dataset_256x2_autotune_small_no_work", "samples/s",
        {"as_dataset_256x2_autotune_small_no_work": peer.get("as_dataset_256x2_autotune_small")},
        "tf-agents (real)")
    row("add_batch in tf.function (1 add/call) Atari", "tf_function_add_atari", "frames/s", peer, "tf-agents")
    row("bound: the add's scatters alone in a tf.function (one per leaf, 32 rows)", "tf_function_scatters_atari",
        "frames/s", {"tf_function_scatters_atari": peer.get("tf_function_add_atari")}, "tf-agents add (real)")
    row("get_next(256, 2) in tf.function Atari", "tf_function_get_next_atari", "samples/s", peer, "tf-agents")
    row("bound: the sample's gathers alone in a tf.function (one per leaf, 512 rows)", "tf_function_gathers_atari",
        "samples/s", {"tf_function_gathers_atari": peer.get("tf_function_get_next_atari")},
        "tf-agents get_next (real)")
    row("jit_compile'd tf.while_loop of 100 add_batch small spec", "jit_collect_100_small", "frames/s", fbx,
        "flashbax fori_loop")
    row("same, 1,000 add_batch per call", "jit_collect_1000_small", "frames/s", fbx, "flashbax fori_loop")
    rows.append({"workload": "the loop's adds alone: (1,000-add call - 1-add call) / 999 adds",
                 "ours": _marginal_rate(ours), "peer": _marginal_rate(fbx), "peer_name": "flashbax fori_loop",
                 "unit": "frames/s"})
    row("bound: a jit_compile'd tf.function that adds nothing (returns num_frames), per 100 adds",
        "jit_empty_call_small", "frames/s", {"jit_empty_call_small": fbx.get("jit_collect_100_small")},
        "flashbax fori_loop of 100 (real)")
    row("prioritized get_next(256, 2) in tf.function Atari", "tf_function_get_next_atari_prioritized",
        "samples/s", {"tf_function_get_next_atari_prioritized": fbx.get("get_next_atari_prioritized")},
        "flashbax")
    # The prioritized sample gathers the same windows as the uniform one, plus its draw.
    row("bound: the same gather with a uniform draw (uniform get_next(256, 2) in tf.function) Atari",
        "tf_function_get_next_atari", "samples/s",
        {"tf_function_get_next_atari": fbx.get("get_next_atari_prioritized")}, "flashbax prioritized (real)")
    row("as_dataset().batch(256) small spec", "as_dataset_unbatched_small", "samples/s", peer, "tf-agents")
    row("bound: its chunked draws alone, unbatched, no per-element check against the live buffer",
        "as_dataset_unbatched_small_chunks_alone", "samples/s",
        {"as_dataset_unbatched_small_chunks_alone": peer.get("as_dataset_unbatched_small")}, "tf-agents (real)")
    row("as_dataset(num_parallel_calls=AUTOTUNE).batch(256) small spec", "as_dataset_unbatched_autotune_small",
        "samples/s", peer, "tf-agents")
    row("bound: its chunked draws alone (AUTOTUNE), no per-element check against the live buffer",
        "as_dataset_unbatched_autotune_small_chunks_alone", "samples/s",
        {"as_dataset_unbatched_autotune_small_chunks_alone": peer.get("as_dataset_unbatched_autotune_small")},
        "tf-agents (real)")
    two_frames = STEPS * ATARI_BYTES
    rows.append({"workload": "get_next Atari sampled bytes (GB/s)",
                 "ours": ours.get("get_next_atari", 0) * two_frames / 1e9,
                 "peer": bandwidth / 1e9, "peer_name": "numpy memcpy", "unit": "GB/s"})
    rows.append({"workload": "Atari buffer memory overhead vs capacity*item (%)",
                 "ours": 100.0 * (memory["rss_growth_bytes"] / memory["payload_bytes"] - 1),
                 "peer": None, "peer_name": "", "unit": "%"})
    _harness.report("buffers", rows)
    print(f"memory: payload {memory['payload_bytes'] / 2**20:.1f} MiB, variables "
          f"{memory['variable_bytes'] / 2**20:.1f} MiB "
          f"({100.0 * (memory['variable_bytes'] / memory['payload_bytes'] - 1):.4f}% over), RSS growth "
          f"{memory['rss_growth_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
