"""`rlds-tf convert` on Beam (2 DirectRunner workers) copies an image dataset's records byte for byte.

Run in the Beam venv (`.ci/make_beam_venv.sh`); skipped where apache_beam is not importable.
"""
import pathlib

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam", reason="apache_beam is not installed: these tests run in the Beam venv "
                                                 "(.ci/make_beam_venv.sh; pip install rl-data-tf[beam])")

import tensorflow_datasets as tfds  # noqa: E402

import rlds_tf  # noqa: E402
from benchmarks import robotics_dataset  # noqa: E402
from rlds_tf import cli  # noqa: E402
from rlds_tf.beam import pipelines  # noqa: E402
from stored_records_testlib import stored_records  # noqa: E402

NUM_EPISODES, EPISODE_LENGTH = 5, 3


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("robotics") / "src")
    return robotics_dataset.write(directory, num_episodes=NUM_EPISODES, episode_length=EPISODE_LENGTH,
                                  episodes_per_shard=2)


def _files(directory):
    return {path.name: path.read_bytes() for path in sorted(pathlib.Path(directory).iterdir())}


@pytest.mark.parametrize("file_format", ["array_record", "tfrecord"])
def test_beam_convert_copies_the_records_of_an_image_dataset(source, tmp_path, file_format):
    got = str(tmp_path / "beam")
    counts = pipelines.convert(source, got, file_format, options=pipelines.pipeline_options("DirectRunner", 2),
                               max_episodes_per_file=3, report_progress=False)
    assert counts == {"train": NUM_EPISODES}
    source_records, _ = stored_records(source)
    records, lengths = stored_records(got)
    assert lengths == {"train": [3, 2]}
    assert records["train"] == source_records["train"]  # byte for byte, in order: the JPEGs untouched
    expected = str(tmp_path / "single")
    cli.convert(source, expected, file_format, max_episodes_per_file=3)
    assert _files(got) == _files(expected)
    steps = [list(tfds.as_numpy(rlds_tf.load_steps(d, "train"))) for d in (got, source)]
    assert len(steps[0]) == len(steps[1]) == NUM_EPISODES * EPISODE_LENGTH
    for a, b in zip(*steps):
        for key in ("image", "wrist_image"):
            np.testing.assert_array_equal(a[rlds_tf.OBSERVATION][key], b[rlds_tf.OBSERVATION][key])
