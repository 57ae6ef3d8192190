"""Flat-steps loading side by side: `rlds_tf.load_steps(..., batch_size=256)` vs TFDS's nested path
`builder_from_directory(d).as_dataset('train').flat_map(lambda e: e['steps']).batch(256)` in the peer venv
(TF 2.15 + TFDS 4.9.4), on the same directory.

Dataset: 200 Catch-like episodes x 100 steps (20,000 steps), observation [10, 5] float32 ZLIB-encoded, written
by rlds_tf's EpisodeWriter (tfrecord, 50 episodes per shard). Metric: steps/s over full passes, best of 3.
Also reported (ours only, same TF): TFDS's nested path on TF 2.21, to separate the gain of the fast path
from the gain of the newer TF.

Image-heavy rows: the same two comparisons on `benchmarks.robotics_dataset` (64 episodes x 50 steps = 3,200
steps; per step two 128x128 RGB cameras stored as JPEG, a float32 state, a 7-d action and a text
instruction), where most of the time goes to decoding the camera frames.

Run: `python -m benchmarks.run loading`.
"""
from __future__ import annotations

import shutil
import tempfile

import numpy as np

from benchmarks import _harness

NUM_EPISODES, EPISODE_LENGTH, BATCH = 200, 100, 256
IMAGE_EPISODES, IMAGE_EPISODE_LENGTH = 64, 50

_COUNT = """
def count_steps(ds):
    return lambda: sum(int(b['reward'].shape[0]) for b in ds)
"""


def _write(directory: str) -> None:
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from rlds_tf.tfds import EpisodeWriter

    config = tfds.rlds.rlds_base.DatasetConfig(
        name="catch_like",
        observation_info=tfds.features.Tensor(shape=(10, 5), dtype=tf.float32,
                                              encoding=tfds.features.Encoding.ZLIB),
        action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64)
    rng = np.random.default_rng(0)
    t = np.arange(EPISODE_LENGTH)
    with EpisodeWriter(directory, config, max_episodes_per_file=50) as writer:
        for _ in range(NUM_EPISODES):
            writer.add_episode({"steps": {
                "observation": (rng.random((EPISODE_LENGTH, 10, 5)) < 0.1).astype(np.float32),
                "action": rng.integers(0, 3, EPISODE_LENGTH), "reward": rng.random(EPISODE_LENGTH),
                "discount": np.ones(EPISODE_LENGTH), "is_first": t == 0, "is_last": t == EPISODE_LENGTH - 1,
                "is_terminal": t == EPISODE_LENGTH - 1}})


def _side_by_side(directory: str, what: str, peer) -> list[dict]:
    """Rows for one dataset: load_steps against TFDS's nested path in the peer venv and on this TF."""
    import tensorflow_datasets as tfds
    import rlds_tf as rlds

    scope: dict = {}
    exec(_COUNT, scope)  # pylint: disable=exec-used
    count_steps = scope["count_steps"]
    ours = _harness.best_rate(count_steps(rlds.load_steps(directory, "train", batch_size=BATCH)))
    tfds_here = _harness.best_rate(count_steps(
        tfds.builder_from_directory(directory).as_dataset(split="train")
        .flat_map(lambda e: e["steps"]).batch(BATCH)))
    theirs = None
    if peer is not None:
        code = (_harness.PEER_BEST_RATE + "import tensorflow_datasets as tfds\n" + _COUNT + """
ds = tfds.builder_from_directory(INPUTS['dir']).as_dataset(split='train').flat_map(lambda e: e['steps'])
emit('rate', best_rate(count_steps(ds.batch(%d))))
""" % BATCH)
        theirs = float(peer.run(code, {"dir": directory})["rate"])
    return [
        {"workload": f"{what}, batch {BATCH}: load_steps vs TFDS flat_map (peer)", "ours": ours,
         "peer": theirs, "peer_name": "TFDS 4.9.4 / TF 2.15 flat_map(steps).batch", "unit": "steps/s"},
        {"workload": f"{what}, batch {BATCH}: load_steps vs TFDS flat_map (TF 2.21)", "ours": ours,
         "peer": tfds_here, "peer_name": "TFDS 4.9.10 / TF 2.21 flat_map(steps).batch (same process)",
         "unit": "steps/s"},
    ]


def main() -> None:
    from benchmarks import robotics_dataset

    directory = tempfile.mkdtemp(prefix="bench-loading-")
    image_directory = tempfile.mkdtemp(prefix="bench-loading-images-")
    try:
        _write(directory)
        robotics_dataset.write(image_directory, num_episodes=IMAGE_EPISODES, episode_length=IMAGE_EPISODE_LENGTH,
                               episodes_per_shard=16)
        peer = _harness.peer()
        _harness.report("loading", _side_by_side(directory, "flat steps", peer)
                        + _side_by_side(image_directory, "image steps", peer))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(image_directory, ignore_errors=True)


if __name__ == "__main__":
    main()
