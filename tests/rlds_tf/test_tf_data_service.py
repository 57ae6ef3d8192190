"""RLDS pipelines (load + transformations + pattern_map) on tf.data service: a dispatcher and two workers on
localhost yield exactly the elements (as a multiset) that local execution yields.

`distributed_epoch` (dynamic sharding) hands the dataset's file splits to the workers as they ask, so each
element comes out once; TFDS asserts each split's episode count, which a worker's share never meets, so that
mode reads with `tfds.ReadConfig(assert_cardinality=False)`. `parallel_epochs` has every worker run the
whole pipeline, so each element comes out once per worker.
"""
import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import rlds_tf as rlds
from rlds_tf.recording import Catch

NUM_EPISODES = 6


@pytest.fixture(scope="module")
def catch_directory(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("catch"))
    rng = np.random.default_rng(5)
    with rlds.EnvLogger(Catch(rows=5, seed=3), data_directory=directory, max_episodes_per_file=2) as env:
        for _ in range(NUM_EPISODES):
            timestep = env.reset()
            while not timestep.last():
                timestep = env.step(int(rng.integers(3)))
    return directory


@pytest.fixture(scope="module")
def service():
    """A dispatcher and two workers on localhost (ports picked by the OS)."""
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0, protocol="grpc"))
    dispatcher_address = dispatcher.target.split("://")[1]
    workers = [tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher_address, port=0,
                                                  heartbeat_interval_ms=100))
        for _ in range(2)]
    try:
        yield dispatcher
    finally:
        for worker in workers:
            worker._stop()
        dispatcher._stop()


def _transition(step):
    return {
        "observation": step[rlds.OBSERVATION][-2],
        "action": step[rlds.ACTION][-2],
        "reward": step[rlds.REWARD][-2],
        "next_observation": step[rlds.OBSERVATION][-1],
    }


def _pipeline(directory, read_config=None):
    """load -> transformations (reward scaling on nested steps, truncation) -> pattern -> flat records."""
    episodes = rlds.load(directory, split="train", read_config=read_config)
    episodes = rlds.transformations.map_nested_steps(
        episodes, lambda step: {**step, rlds.REWARD: step[rlds.REWARD] * 10.0})
    episodes = episodes.map(lambda episode: {
        **episode, rlds.STEPS: rlds.transformations.truncate_after_condition(
            episode[rlds.STEPS], truncate_condition=lambda step: step[rlds.IS_LAST])})
    transitions = rlds.transformations.pattern_map_from_transform(episodes, _transition,
                                                                  respect_episode_boundaries=True)
    return transitions.map(lambda t: (t["action"], t["reward"], tf.io.serialize_tensor(t["observation"]),
                                      tf.io.serialize_tensor(t["next_observation"])))


def _multiset(dataset):
    return collections.Counter(tuple(x.item() if hasattr(x, "item") else x for x in element)
                               for element in dataset.as_numpy_iterator())


@pytest.mark.parametrize("name, processing_mode, read_config, copies", [
    ("dynamic", "distributed_epoch", tfds.ReadConfig(assert_cardinality=False), 1),
    ("parallel", "parallel_epochs", None, 2),
])
def test_distributed_pipeline_yields_the_local_multiset(catch_directory, service, name, processing_mode,
                                                        read_config, copies):
    local = _multiset(_pipeline(catch_directory))
    assert sum(local.values()) == NUM_EPISODES * 4  # 5 steps per episode: 4 transitions
    distributed = _pipeline(catch_directory, read_config).apply(tf.data.experimental.service.distribute(
        processing_mode=processing_mode, service=service.target, job_name=f"rlds-{name}"))
    got = _multiset(distributed)
    expected = collections.Counter({key: count * copies for key, count in local.items()})
    assert got == expected


def test_rewards_went_through_the_transformation(catch_directory):
    rewards = {reward for _, reward, _, _ in _multiset(_pipeline(catch_directory))}
    assert rewards <= {-10.0, 0.0, 10.0} and rewards & {-10.0, 10.0}
