"""rl-data-tf demo: record episodes of the built-in Catch environment as an RLDS dataset, load them back.

Runs on embedded defaults (a temporary directory, no external service) in a few seconds:
  python demo.py
"""
import shutil
import tempfile

import numpy as np

import rlds_tf as rlds
from rlds_tf.recording import Catch


def main(num_episodes: int = 20) -> None:
    data_directory = tempfile.mkdtemp(prefix="rl-data-tf-demo-")
    try:
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
    finally:
        shutil.rmtree(data_directory, ignore_errors=True)


if __name__ == "__main__":
    main()
