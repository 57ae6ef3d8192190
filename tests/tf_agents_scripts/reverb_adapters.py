"""TF-Agents 0.19's Reverb adapters on current TF, with replay_tf registered as `reverb`.

Run by tests/test_tf_agents_on_current_tf.py in the TF-Agents venv (`.ci/make_tf_agents_venv.sh`) with the
repository root on PYTHONPATH:

    python reverb_adapters.py --tables tables.json --report report.json [--address HOST:PORT] [--rlds]

Without `--address` the tables of `tables.json` are built with Reverb's API (`reverb.Table`, ...) in an
in-process `reverb.Server`; with it, the script talks to a server already serving them (`replay-tf serve
--config tables.json`). Each check writes with TF-Agents' observers (or `rlds_to_reverb`), reads back with
TF-Agents' `ReverbReplayBuffer`, and compares with values computed by hand from what was written. Each
check's outcome goes into the JSON report (`{name: {"ok": bool, "error": str}}`); one failing check does not
stop the others. `--rlds` adds the checks of `rlds_checks.py` (rlds 0.1.8 itself against rlds_tf).
With RL_DATA_CHECKS_ON_DM_REVERB=1 (in the peer venv) the checks that need no rl-data-tf run on dm-reverb
itself, on a recording given with `--recording`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import tempfile
import traceback

# RL_DATA_CHECKS_ON_DM_REVERB=1: run the checks on dm-reverb itself (the peer venv: TF 2.15), which shows
# that their hand-computed expectations are the anchors' behaviour.
ON_DM_REVERB = os.environ.get("RL_DATA_CHECKS_ON_DM_REVERB") == "1"
if not ON_DM_REVERB:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import replay_tf

    replay_tf.register_as_reverb()  # before TF-Agents (or rlds) first touches `reverb`

import numpy as np  # noqa: E402
import reverb  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils  # noqa: E402
from tf_agents.specs import tensor_spec  # noqa: E402
from tf_agents.trajectories import trajectory  # noqa: E402

import recorded_episodes  # noqa: E402  (beside this script)

FIRST, MID, LAST = 0, 1, 2

# The trajectories the checks write: observation [episode, t], action 10 * episode + t, reward t.
DATA_SPEC = trajectory.Trajectory(
    step_type=tf.TensorSpec([], tf.int32, "step_type"), observation=tf.TensorSpec([2], tf.float32),
    action=tf.TensorSpec([], tf.int64), policy_info=(), next_step_type=tf.TensorSpec([], tf.int32, "step_type"),
    reward=tf.TensorSpec([], tf.float32), discount=tf.TensorSpec([], tf.float32))


def episode(e: int, n: int) -> list:
    """The `n` trajectories a driver gives for episode `e` of n - 1 transitions: FIRST, MID..., then the
    boundary (step_type LAST -> FIRST); the transition into the last step has discount 0."""
    trajectories = []
    for t in range(n):
        step_type = FIRST if t == 0 else LAST if t == n - 1 else MID
        next_step_type = FIRST if t == n - 1 else LAST if t == n - 2 else MID
        trajectories.append(trajectory.Trajectory(
            step_type=np.int32(step_type), observation=np.array([e, t], np.float32), action=np.int64(10 * e + t),
            policy_info=(), next_step_type=np.int32(next_step_type), reward=np.float32(t),
            discount=np.float32(0.0 if t == n - 2 else 1.0)))
    return trajectories


# What ReverbAddTrajectoryObserver(pad_end_of_episodes=True) pads with: a boundary step of zeros.
PADDING = trajectory.Trajectory(
    step_type=np.int32(LAST), observation=np.zeros([2], np.float32), action=np.int64(0), policy_info=(),
    next_step_type=np.int32(FIRST), reward=np.float32(0), discount=np.float32(0))


def key(steps) -> str:
    """A hashable, exact rendering of a sequence of trajectories (or of one stacked trajectory)."""
    if isinstance(steps, list):
        steps = tf.nest.map_structure(lambda *xs: np.stack(xs), *steps)
    return json.dumps([np.asarray(x).tolist() for x in tf.nest.flatten(steps)])


def row(nest, i: int):
    return tf.nest.map_structure(lambda x: x[i].numpy(), nest)


def collect_rows(dataset, batches: int, expected: set, probability=None) -> set:
    """Reads `batches` batches; every row must be one of `expected` (keys), with `probability` if given."""
    seen = set()
    for data, info in dataset.take(batches):
        for i in range(int(tf.nest.flatten(data)[0].shape[0])):
            k = key(row(data, i))
            assert k in expected, f"sampled {k} is none of the items written: {sorted(expected)}"
            if probability is not None:
                np.testing.assert_allclose(info.probability[i].numpy(), probability, rtol=1e-6)
            seen.add(k)
    return seen


class Context:
    """The server (in-process, or remote at `address`) and the clients the checks use."""

    def __init__(self, tables_path: str, address: str | None):
        with open(tables_path, encoding="utf-8") as f:
            self.config = json.load(f)
        self.server = None
        if address is None:
            self.server = reverb.Server([self._table(entry) for entry in self.config["tables"]])
            address = f"localhost:{self.server.port}"
        self.address = address
        self.client = reverb.Client(address)

    def _table(self, entry: dict):
        """A `reverb.Table` for one entry of tables.json, built the way a TF-Agents program builds it."""
        def selector(value):
            if isinstance(value, dict):
                return reverb.selectors.Prioritized(**value["prioritized"])
            return {"uniform": reverb.selectors.Uniform, "fifo": reverb.selectors.Fifo}[value]()
        signature = None
        if entry.get("signature") == "RLDS_TRAJECTORY":
            signature = tensor_spec.add_outer_dim(recorded_episodes.trajectory_spec())
        return reverb.Table(entry["name"], sampler=selector(entry["sampler"]), remover=selector(entry["remover"]),
                            max_size=entry["max_size"], max_times_sampled=entry.get("max_times_sampled", 0),
                            rate_limiter=reverb.rate_limiters.MinSize(entry["rate_limiter"]["min_size"]),
                            signature=signature)

    def replay_buffer(self, table: str, sequence_length, data_spec=DATA_SPEC, **kwargs):
        where = {"local_server": self.server} if self.server else {"server_address": self.address}
        return reverb_replay_buffer.ReverbReplayBuffer(data_spec, table, sequence_length=sequence_length,
                                                       **where, **kwargs)


# --- checks ------------------------------------------------------------------------------------------

def check_add_trajectory_observer_stride(ctx: Context):
    """sequence_length 3, stride 2: items at 3, 5, ... cached steps; an episode's rest is dropped."""
    observer = reverb_utils.ReverbAddTrajectoryObserver(ctx.client, "stride", sequence_length=3, stride_length=2)
    e0, e1 = episode(0, 6), episode(1, 4)
    for t in e0 + e1:
        observer(t)
    observer.close()
    expected = {key(e0[0:3]), key(e0[2:5]), key(e1[0:3])}
    buffer = ctx.replay_buffer("stride", sequence_length=3)
    assert buffer.num_frames() == 3, buffer.num_frames()

    dataset = buffer.as_dataset(sample_batch_size=4, num_steps=3, num_parallel_calls=2)
    data_spec, info_spec = dataset.element_spec
    assert data_spec.observation.shape.as_list() == [4, 3, 2], data_spec
    assert data_spec.action.dtype == tf.int64 and data_spec.step_type.dtype == tf.int32, data_spec
    assert info_spec.key.shape.as_list() == [4, 3] and info_spec.key.dtype == tf.uint64, info_spec
    assert info_spec.probability.shape.as_list() == [4, 3], info_spec
    seen = collect_rows(dataset, 20, expected, probability=1 / 3)
    assert seen == expected, f"items never sampled: {sorted(expected - seen)}"

    # num_steps 1 < sequence_length 3: TF-Agents cuts each item into 3 one-step rows.
    steps = {key([s]) for s in e0[0:5] + e1[0:3]}
    dataset = buffer.as_dataset(sample_batch_size=2, num_steps=1, num_parallel_calls=1)
    assert dataset.element_spec[0].observation.shape.as_list() == [2, 1, 2], dataset.element_spec
    seen = collect_rows(dataset, 100, steps)
    assert seen == steps, f"steps never sampled: {sorted(steps - seen)}"

    # No batch: one item, [sequence_length, ...].
    data, info = next(iter(buffer.as_dataset()))
    assert data.observation.shape.as_list() == [3, 2] and info.key.shape.as_list() == [3], (data, info)
    assert key(tf.nest.map_structure(lambda x: x.numpy(), data)) in expected
    for method, args in (("get_next", ()), ("add_batch", (e0[0],)), ("gather_all", ())):
        try:
            getattr(buffer, method)(*args)
        except NotImplementedError:
            pass
        else:
            raise AssertionError(f"ReverbReplayBuffer.{method} did not raise NotImplementedError")


def check_add_trajectory_observer_pad_end_of_episodes(ctx: Context):
    """pad_end_of_episodes: a short episode is padded with zero boundary steps up to sequence_length."""
    observer = reverb_utils.ReverbAddTrajectoryObserver(ctx.client, "pad", sequence_length=3, stride_length=1,
                                                        pad_end_of_episodes=True)
    e0, e1 = episode(0, 2), episode(1, 4)
    for t in e0 + e1:
        observer(t)
    observer.flush()
    expected = {key(e0 + [PADDING]), key(e1[0:3]), key(e1[1:4])}
    buffer = ctx.replay_buffer("pad", sequence_length=3)
    assert buffer.num_frames() == 3, buffer.num_frames()
    seen = collect_rows(buffer.as_dataset(sample_batch_size=3, num_parallel_calls=3), 20, expected,
                        probability=1 / 3)
    assert seen == expected, f"items never sampled: {sorted(expected - seen)}"
    observer.close()


def check_trajectory_sequence_observer(ctx: Context):
    """ReverbTrajectorySequenceObserver: windows run across episode boundaries."""
    observer = reverb_utils.ReverbTrajectorySequenceObserver(ctx.client, "sequence", sequence_length=3,
                                                             stride_length=3)
    e0, e1 = episode(0, 4), episode(1, 3)
    for t in e0 + e1:
        observer(t)
    observer.close()
    expected = {key(e0[0:3]), key([e0[3], e1[0], e1[1]])}
    buffer = ctx.replay_buffer("sequence", sequence_length=3)
    assert buffer.num_frames() == 2, buffer.num_frames()
    seen = collect_rows(buffer.as_dataset(sample_batch_size=2, num_steps=3), 20, expected, probability=1 / 2)
    assert seen == expected, f"items never sampled: {sorted(expected - seen)}"


def check_add_episode_observer_queue(ctx: Context):
    """PPO's use: whole episodes into a FIFO table sampled once each, read in order by a deterministic pass."""
    observer = reverb_utils.ReverbAddEpisodeObserver(ctx.client, ["episodes"], max_sequence_length=10)
    e0, e1 = episode(0, 4), episode(1, 3)
    for t in e0 + e1:
        observer(t)
    observer.flush()
    buffer = ctx.replay_buffer("episodes", sequence_length=None, rate_limiter_timeout_ms=1000)
    assert buffer.num_frames() == 2, buffer.num_frames()
    items = [tf.nest.map_structure(lambda x: x.numpy(), data)
             for data, _ in buffer.as_dataset(single_deterministic_pass=True)]
    assert [key(item) for item in items] == [key(e0), key(e1)], items
    assert buffer.num_frames() == 0, buffer.num_frames()
    observer.close()


def check_update_priorities(ctx: Context):
    """ReverbReplayBuffer.update_priorities (TFClient op, eager and in tf.function) steers sampling."""
    observer = reverb_utils.ReverbAddTrajectoryObserver(ctx.client, "prioritized", sequence_length=1)
    items = episode(0, 4)  # sequence_length 1: one item per step, the boundary step's included
    for t in items:
        observer(t)
    observer.close()
    buffer = ctx.replay_buffer("prioritized", sequence_length=1)
    assert buffer.num_frames() == 4, buffer.num_frames()
    expected = [key([t]) for t in items]
    keys = {}
    for data, info in buffer.as_dataset(sample_batch_size=4, num_parallel_calls=2).take(50):
        for i in range(4):
            keys[key(row(data, i))] = int(info.key[i, 0].numpy())
        if len(keys) == 4:
            break
    assert sorted(keys) == sorted(expected), keys
    ordered = tf.constant([keys[k] for k in expected], tf.uint64)

    def only_sampled(index):
        seen = collect_rows(buffer.as_dataset(sample_batch_size=4, num_parallel_calls=1), 5, {expected[index]},
                            probability=1.0)
        assert seen == {expected[index]}, seen

    buffer.update_priorities(ordered, tf.constant([0.0, 0.0, 2.0, 0.0], tf.float64))
    only_sampled(2)
    tf.function(buffer.update_priorities)(ordered, tf.constant([3.0, 0.0, 0.0, 0.0], tf.float64))
    only_sampled(0)
    sample = next(ctx.client.sample("prioritized", num_samples=1))
    assert sample[0].info.priority == 3.0 and sample[0].info.key == keys[expected[0]], sample[0].info


# --- rlds_to_reverb ----------------------------------------------------------------------------------

@contextlib.contextmanager
def _rlds_to_reverb_with(rlds_module):
    """TF-Agents' rlds_to_reverb module as imported while `sys.modules['rlds']` is `rlds_module`.

    A fresh copy of the module, itself in `sys.modules` while the block runs (AutoGraph looks functions'
    modules up there); both entries are restored afterwards.
    """
    name = "tf_agents.replay_buffers.rlds_to_reverb"
    saved = {key: sys.modules.get(key) for key in ("rlds", name)}
    sys.modules["rlds"] = rlds_module
    try:
        spec = importlib.util.find_spec(name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        assert module.rlds is rlds_module, module.rlds
        yield module
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def _check_rlds_to_reverb(ctx: Context, rlds_module, table: str, episodes_dataset):
    with _rlds_to_reverb_with(rlds_module) as rlds_to_reverb:
        spec = rlds_to_reverb.create_trajectory_data_spec(episodes_dataset)
        observer = reverb_utils.ReverbAddTrajectoryObserver(ctx.client, table, sequence_length=2,
                                                            stride_length=1)
        pushed = rlds_to_reverb.push_rlds_to_reverb(episodes_dataset, observer)
        observer.close()
    expected_trajectories = recorded_episodes.expected_trajectories()
    assert pushed == len(expected_trajectories), pushed
    # Windows of 2 within each episode of trajectories (the observer restarts after each boundary).
    e0, e1 = expected_trajectories[:4], expected_trajectories[4:]
    expected = [key(e0[0:2]), key(e0[1:3]), key(e0[2:4]), key(e1[0:2]), key(e1[1:3])]
    buffer = ctx.replay_buffer(table, sequence_length=2, data_spec=spec, rate_limiter_timeout_ms=1000)
    assert buffer.num_frames() == 5, buffer.num_frames()
    items = [key(tf.nest.map_structure(lambda x: x.numpy(), data))
             for data, _ in buffer.as_dataset(single_deterministic_pass=True)]
    assert items == expected, f"got {items}, expected {expected}"


def check_rlds_to_reverb_with_rlds(ctx: Context, data_dir: str):
    """rlds_to_reverb with rlds 0.1.8 as its `rlds` (imported on replay_tf), on our recording read by TFDS."""
    import rlds
    import tensorflow_datasets as tfds
    if not ON_DM_REVERB:
        assert rlds.transformations.pattern.reverb is replay_tf
    episodes_dataset = tfds.builder_from_directory(data_dir).as_dataset(split="train")
    _check_rlds_to_reverb(ctx, rlds, "rlds_via_rlds", episodes_dataset)


def check_rlds_to_reverb_with_rlds_tf(ctx: Context, data_dir: str):
    """rlds_to_reverb with rlds_tf registered as its `rlds`, on our recording loaded by rlds_tf."""
    import rlds_tf
    _check_rlds_to_reverb(ctx, rlds_tf, "rlds_via_rlds_tf", rlds_tf.load(data_dir, split="train"))


def check_docs_example(ctx: Context):
    """The example of docs/tf_agents.md (its first Python block) runs and prints what its comments say."""
    import io
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "tf_agents.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/tf_agents.md", "exec"), {"__name__": "docs_example"})  # noqa: S102
    assert out.getvalue().splitlines() == ["items: 3", "(8, 2, 4) (8, 2)"], out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--address", default=None)
    parser.add_argument("--rlds", action="store_true", help="also compare rlds 0.1.8 with rlds_tf")
    parser.add_argument("--only", nargs="*", default=None, help="run only these checks")
    parser.add_argument("--recording", default=None,
                        help="a recording of recorded_episodes.record (default: made here with rlds_tf)")
    args = parser.parse_args()
    ctx = Context(args.tables, args.address)
    data_dir = args.recording
    if data_dir is None:
        data_dir = tempfile.mkdtemp(prefix="recorded-")
        recorded_episodes.record(data_dir)
    checks = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}
    if ON_DM_REVERB:  # no rlds_tf or replay_tf there
        checks = {name: fn for name, fn in checks.items() if name not in ("rlds_to_reverb_with_rlds_tf",
                                                                            "docs_example")}
    calls = {name: (lambda fn=fn: fn(ctx, data_dir)) if "rlds" in name else (lambda fn=fn: fn(ctx))
             for name, fn in checks.items()}
    if args.address is not None and "docs_example" in calls:
        del calls["docs_example"]  # the example starts its own in-process server
    if args.rlds:
        import rlds_checks
        calls.update({name: (lambda fn=fn: fn(data_dir)) for name, fn in rlds_checks.CHECKS.items()})
    report = {}
    for name, call in calls.items():
        if args.only and name not in args.only:
            continue
        try:
            call()
            report[name] = {"ok": True, "error": ""}
        except Exception:  # noqa: BLE001  (every failure goes into the report)
            report[name] = {"ok": False, "error": traceback.format_exc()[-4000:]}
        print(f"CHECK {name}: {'ok' if report[name]['ok'] else 'FAILED'}", flush=True)
    with open(args.report, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    if ctx.server is not None:
        ctx.server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
