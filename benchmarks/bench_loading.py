"""Flat-steps loading side by side: `rlds_tf.load_steps(..., batch_size=256)` vs TFDS's nested path
`builder_from_directory(d).as_dataset('train').flat_map(lambda e: e['steps']).batch(256)` in the peer venv
(TF 2.15 + TFDS 4.9.4), on the same directory.

Dataset: 200 Catch-like episodes x 100 steps (20,000 steps), observation [10, 5] float32 ZLIB-encoded, written
by rlds_tf's EpisodeWriter (tfrecord, 50 episodes per shard). Metric: steps/s over full passes, best of 3.
Also reported (ours only, same TF): TFDS's nested path on TF 2.21, to separate the gain of the fast path
from the gain of the newer TF. The dataset is under 250 MiB, so TFDS auto-caches it (see below); the
"no autocache" rows read it as a dataset too big for that cache is read.

Image-heavy rows: the same two comparisons on `benchmarks.robotics_dataset` (64 episodes x 50 steps = 3,200
steps; per step two 128x128 RGB cameras stored as JPEG, a float32 state, a 7-d action and a text
instruction), where most of the time goes to decoding the camera frames. Both sides read with TFDS's
auto-cache off (`ReadConfig(try_autocache=False)`): TFDS caches a dataset under 250 MiB after decoding,
which would serve `load_steps` its decoded frames from memory from the second pass on, while the nested
path caches undecoded steps and decodes them on every pass; a dataset worth loading this way does not fit
that cache. The `bound:` row decodes the same frames, already in memory, with the op TFDS uses
(`tf.io.decode_image` in a graph loop over blocks of 50 frames, blocks in a `map` with AUTOTUNE), as
steps/s (two frames a step), against TFDS's nested path on TF 2.21: no loader that decodes every frame
can beat that ratio by much.

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


def _side_by_side(directory: str, what: str, peer, *, autocache: bool = True) -> tuple[list[dict], float]:
    """Rows for one dataset: load_steps against TFDS's nested path in the peer venv and on this TF.

    Returns the rows and the rate of TFDS's nested path on this TF.
    """
    import tensorflow_datasets as tfds
    import rlds_tf as rlds

    scope: dict = {}
    exec(_COUNT, scope)  # pylint: disable=exec-used
    count_steps = scope["count_steps"]
    read_config = tfds.ReadConfig(try_autocache=autocache)
    ours = _harness.best_rate(count_steps(rlds.load_steps(directory, "train", batch_size=BATCH,
                                                          read_config=read_config)))
    tfds_here = _harness.best_rate(count_steps(
        tfds.builder_from_directory(directory).as_dataset(split="train", read_config=read_config)
        .flat_map(lambda e: e["steps"]).batch(BATCH)))
    theirs = None
    if peer is not None:
        code = (_harness.PEER_BEST_RATE + "import tensorflow_datasets as tfds\n" + _COUNT + """
ds = tfds.builder_from_directory(INPUTS['dir']).as_dataset(
    split='train', read_config=tfds.ReadConfig(try_autocache=INPUTS['autocache'])).flat_map(lambda e: e['steps'])
emit('rate', best_rate(count_steps(ds.batch(%d))))
""" % BATCH)
        theirs = float(peer.run(code, {"dir": directory, "autocache": autocache})["rate"])
    return [
        {"workload": f"{what}, batch {BATCH}: load_steps vs TFDS flat_map (peer)", "ours": ours,
         "peer": theirs, "peer_name": "TFDS 4.9.4 / TF 2.15 flat_map(steps).batch", "unit": "steps/s"},
        {"workload": f"{what}, batch {BATCH}: load_steps vs TFDS flat_map (TF 2.21)", "ours": ours,
         "peer": tfds_here, "peer_name": "TFDS 4.9.10 / TF 2.21 flat_map(steps).batch (same process)",
         "unit": "steps/s"},
    ], tfds_here


def _decode_bound(directory: str) -> float:
    """Steps/s of decoding every camera frame of the dataset alone, the frames already in memory."""
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from benchmarks import robotics_dataset

    cameras = ("image", "wrist_image")
    skip = {"steps": {"observation": {c: tfds.decode.SkipDecoding() for c in cameras}}}
    episodes = tfds.builder_from_directory(directory).as_dataset(
        split="train", decoders=skip, read_config=tfds.ReadConfig(try_autocache=False))
    frames = [frame.numpy() for episode in episodes for step in episode["steps"]
              for frame in (step["observation"][c] for c in cameras)]
    size = robotics_dataset.IMAGE_SIZE

    def decode(batch):
        # A graph loop over the frames of a block, as an episode's frames are decoded; one map call per
        # frame would add tf.data's per-element cost to the decoding.
        return tf.map_fn(lambda f: tf.io.decode_image(f, channels=3), batch,
                         fn_output_signature=tf.TensorSpec((size, size, 3), tf.uint8))
    decoded = (tf.data.Dataset.from_tensor_slices(frames).batch(IMAGE_EPISODE_LENGTH).cache()
               .map(decode, num_parallel_calls=tf.data.AUTOTUNE))
    return _harness.best_rate(lambda: sum(int(block.shape[0]) for block in decoded) / len(cameras))


def main() -> None:
    from benchmarks import robotics_dataset

    directory = tempfile.mkdtemp(prefix="bench-loading-")
    image_directory = tempfile.mkdtemp(prefix="bench-loading-images-")
    try:
        _write(directory)
        robotics_dataset.write(image_directory, num_episodes=IMAGE_EPISODES, episode_length=IMAGE_EPISODE_LENGTH,
                               episodes_per_shard=16)
        peer = _harness.peer()
        flat_rows, _ = _side_by_side(directory, "flat steps", peer)
        uncached_rows, _ = _side_by_side(directory, "flat steps, no autocache", peer, autocache=False)
        image_rows, tfds_images = _side_by_side(image_directory, "image steps, no autocache", peer,
                                                autocache=False)
        bound = {"workload": "bound: decoding the same JPEG frames alone (in memory, blocks of 50)",
                 "ours": _decode_bound(image_directory), "peer": tfds_images,
                 "peer_name": "TFDS 4.9.10 / TF 2.21 flat_map(steps).batch (same process)", "unit": "steps/s"}
        _harness.report("loading", flat_rows + uncached_rows + image_rows + [bound])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(image_directory, ignore_errors=True)


if __name__ == "__main__":
    main()
