"""rl-data-tf demo: record, load, pattern, replay, all on current TensorFlow and without compiled ops.

1. Records episodes of the built-in Catch environment as an RLDS dataset (EnvLogger-compatible recorder).
2. Loads them back as RLDS (nested steps datasets) and through the fast stacked/flat paths.
3. Turns them into transitions with a Reverb pattern compiled to plain tf.data (`pattern_map_from_transform`).
4. Streams the same steps into an in-process Reverb-compatible replay server with the structured writer
   (the same pattern, run online) and samples it through `TrajectoryDataset`.
5. Feeds the transitions to an in-graph `PrioritizedReplayBuffer` and samples it inside `tf.function`.

Runs on embedded defaults (a new temporary directory, an in-process server on localhost), and keeps the
recorded dataset for `rlds-tf info`:
  python demo.py [--keep DIR]
"""
import argparse
import pathlib
import tempfile

import numpy as np
import tensorflow as tf
import tree

import replay_tf as reverb
import rlds_tf as rlds
from rlds_tf.recording import Catch


def transition(step):
    """A Reverb pattern: (o_t, a_t, r_t, o_t+1) from the last two steps of the reference step."""
    return {"observation": step[rlds.OBSERVATION][-2], "action": step[rlds.ACTION][-2],
            "reward": step[rlds.REWARD][-2], "next_observation": step[rlds.OBSERVATION][-1]}


def replay(episodes: tf.data.Dataset) -> None:
    """Steps 3-5 of the module docstring."""
    step_spec = rlds.transformations.step_spec(episodes)
    transitions = rlds.transformations.pattern_map_from_transform(episodes, transition)
    num_transitions = sum(1 for _ in transitions)
    print(f"pattern_map_from_transform(transition): {num_transitions} transitions, "
          f"observation {transitions.element_spec['observation'].shape}")

    config = reverb.structured_writer.create_config(
        reverb.structured_writer.pattern_from_transform(step_spec, transition), table="transitions")
    signature = reverb.structured_writer.infer_signature([config], step_spec)
    server = reverb.Server([reverb.Table(
        "transitions", sampler=reverb.selectors.Prioritized(priority_exponent=0.6),
        remover=reverb.selectors.Fifo(), max_size=10_000, rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=signature)])
    try:
        address = f"localhost:{server.port}"
        client = reverb.Client(address)
        with client.structured_writer([config]) as writer:
            for episode in episodes:
                for step in episode[rlds.STEPS].as_numpy_iterator():
                    writer.append(step)
                writer.end_episode()
        info = client.server_info()["transitions"]
        print(f"replay server at {address}: table 'transitions' holds {info.current_size} items "
              f"(same as the dataset: {info.current_size == num_transitions})")
        dataset = reverb.TrajectoryDataset.from_table_signature(
            address, "transitions", max_in_flight_samples_per_worker=64).batch(32)
        sample = next(iter(dataset))
        print(f"TrajectoryDataset batch: keys {sample.info.key.dtype.name}{sample.info.key.shape.as_list()}, "
              f"observation {sample.data['observation'].shape.as_list()}, "
              f"mean probability {float(tf.reduce_mean(sample.info.probability)):.4f}")
    finally:
        server.stop()

    buffer = reverb.PrioritizedReplayBuffer(transitions.element_spec, batch_size=1, max_length=1000, alpha=0.6)

    @tf.function
    def add(item):
        buffer.add_batch(tree.map_structure(lambda x: x[tf.newaxis], item))

    for item in transitions:
        add(item)
    data, info = tf.function(lambda: buffer.get_next(sample_batch_size=8))()
    print(f"in-graph PrioritizedReplayBuffer: {int(buffer.num_frames())} frames; sampled ids "
          f"{info.ids.numpy().tolist()}")


def main(data_directory: str, num_episodes: int = 20) -> None:
    rng = np.random.default_rng(0)
    # Record: every completed episode is on disk (and listed) when the step that ended it returns.
    with rlds.EnvLogger(Catch(seed=1), data_directory=data_directory, max_episodes_per_file=8,
                        step_fn=lambda timestep, action, env: {"paddle_hit": timestep.reward == 1.0},
                        episode_fn=lambda timestep, action, env: (
                            {"score": np.float64(timestep.reward)} if timestep.last() else None)) as env:
        for _ in range(num_episodes):
            timestep = env.reset()
            while not timestep.last():
                timestep = env.step(int(rng.integers(3)))
    print(f"recorded {num_episodes} Catch episodes into {data_directory}")

    # Load: episodes whose steps are a nested tf.data.Dataset, exactly as TFDS/rlds give them.
    episodes = rlds.load(data_directory, split="train")
    print(f"valid RLDS dataset: {rlds.is_valid_rlds_dataset(episodes)}")
    step_spec = episodes.element_spec[rlds.STEPS].element_spec
    print("step fields: " + ", ".join(f"{k} {v.dtype.name}{list(v.shape)}" for k, v in sorted(step_spec.items())))
    first = next(iter(episodes))
    print(f"first episode: {int(first[rlds.STEPS].cardinality())} steps, score {float(first['score']):+.0f}")

    # Fast paths: stacked [T, ...] steps per episode, and one flat (batched) steps dataset.
    lengths = [int(e[rlds.STEPS][rlds.REWARD].shape[0]) for e in rlds.load_stacked(data_directory, "train")]
    rewards = np.concatenate([b[rlds.REWARD].numpy() for b in rlds.load_steps(data_directory, "train",
                                                                               batch_size=64)])
    wins = int(sum(float(e["score"]) > 0 for e in episodes))
    print(f"{len(lengths)} episodes, {sum(lengths)} steps; total reward {rewards.sum():+.0f}; "
          f"caught {wins}/{len(lengths)}")
    terminal = [bool(s[rlds.IS_TERMINAL]) for s in first[rlds.STEPS].as_numpy_iterator()]
    print(f"is_terminal per step of episode 0: {''.join('T' if x else '.' for x in terminal)}")
    replay(episodes)
    print(f"the dataset stays in {data_directory}; look at it with:  rlds-tf info {data_directory}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="record into DIR (an empty or new directory) "
                        "instead of a new temporary directory")
    return parser.parse_args()


if __name__ == "__main__":
    args = _parse_args()
    if args.keep:
        directory = pathlib.Path(args.keep)
        if directory.exists() and any(directory.iterdir()):
            raise SystemExit(f"--keep {directory}: expected an empty or new directory, got one with files in it")
        directory.mkdir(parents=True, exist_ok=True)
        main(str(directory))
    else:
        main(tempfile.mkdtemp(prefix="rl-data-tf-demo-"))
