"""WriteEpisodes, ReadEpisodes and the Beam CLI paths: duplicates, retries, progress lines, strict JSON, options.

Run in the Beam venv (`.ci/make_beam_venv.sh`); skipped where apache_beam is not importable.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam", reason="apache_beam is not installed: these tests run in the Beam venv "
                                                 "(.ci/make_beam_venv.sh; pip install rl-data-tf[beam])")

import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

import rlds_tf  # noqa: E402
from rlds_dataset_testlib import write_one_step_dataset  # noqa: E402
from rlds_tf.beam import WriteEpisodes  # noqa: E402
from rlds_tf.recording import tfds_writer  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_CONFIG = tfds.rlds.rlds_base.DatasetConfig(
    name="toy", observation_info=tfds.features.Tensor(shape=(2,), dtype=np.float32), action_info=tf.int64,
    reward_info=tf.float64, discount_info=tf.float64)


def _episode(length, seed):
    rng = np.random.default_rng(seed)
    return {"steps": {"observation": rng.normal(size=(length, 2)).astype(np.float32),
                      "action": rng.integers(0, 5, size=length), "reward": rng.normal(size=length),
                      "discount": np.ones(length), "is_first": np.arange(length) == 0,
                      "is_last": np.arange(length) == length - 1, "is_terminal": np.arange(length) == length - 1}}


def _features():
    return tfds.rlds.rlds_base.build_info(_CONFIG, tfds.core.dataset_info.DatasetIdentity(
        name="toy", version=tfds.core.Version("0.0.1"), data_dir="", module_name=""), None).features


def _rewards(directory, split="train"):
    return sorted(_key(e) for e in tfds.as_numpy(rlds_tf.load_stacked(directory, split)))


def _key(episode):
    return tuple(np.asarray(episode["steps"]["observation"], np.float32).ravel().tolist())


@pytest.mark.parametrize("num_shards", [None, 2])
def test_identical_bare_episodes_are_all_written(tmp_path, num_shards):
    a, b = _episode(3, 1), _episode(4, 2)
    destination = str(tmp_path / "out")
    with beam.Pipeline() as p:
        _ = p | beam.Create([a, a, b, a]) | WriteEpisodes(destination, _features(), num_shards,
                                                          max_episodes_per_file=1)
    expected = sorted([_key(a)] * 3 + [_key(b)])
    assert _rewards(destination) == expected
    with open(os.path.join(destination, "dataset_info.json"), encoding="utf-8") as f:
        lengths = [int(n) for n in json.load(f)["splits"][0]["shardLengths"]]
    assert lengths == ([1, 1, 1, 1] if num_shards is None else [2, 2])


def test_repeated_indices_are_named(tmp_path):
    with pytest.raises(Exception, match=r"two \(index, episode\) pairs have index 1"):
        with beam.Pipeline() as p:
            _ = (p | beam.Create([(0, _episode(2, 0)), (1, _episode(2, 1)), (1, _episode(3, 2))])
                 | WriteEpisodes(str(tmp_path / "out"), _features()))


def _finalize(tmp_path):
    from rlds_tf.beam import writing  # noqa: PLC0415
    destination, partial = str(tmp_path / "out"), str(tmp_path / ".out.partial-x")
    os.makedirs(partial)
    for k in range(2):
        with open(os.path.join(partial, f"toy-train.tfrecord-{k:05d}"), "wb") as f:
            f.write(b"x")
    fn = writing._Finalize(writing._config_from(_features(), None), "0.0.1", "tfrecord", partial, destination,
                           ["train"])
    return fn, destination, partial


def test_finalize_run_again_after_the_rename_reports_the_same_counts(tmp_path):
    fn, destination, partial = _finalize(tmp_path)
    shards = [("train", 0, 2, 10), ("train", 1, 1, 5)]
    assert list(fn.process(shards, [("train", 3)])) == [{"train": 3}]
    with open(os.path.join(destination, "dataset_info.json"), encoding="utf-8") as f:
        first = f.read()
    assert list(fn.process(shards, [("train", 3)])) == [{"train": 3}]  # a retried finalize
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no hidden directory made by the retry
    with open(os.path.join(destination, "dataset_info.json"), encoding="utf-8") as f:
        assert f.read() == first


def test_finalize_checks_the_destination_before_writing_metadata(tmp_path):
    fn, destination, partial = _finalize(tmp_path)
    os.makedirs(destination)
    with open(os.path.join(destination, "intruder"), "w") as f:
        f.write("x")
    with pytest.raises(ValueError, match="no longer empty"):
        list(fn.process([("train", 0, 2, 10), ("train", 1, 1, 5)], [("train", 3)]))
    assert "dataset_info.json" not in os.listdir(partial)


def test_finalize_detects_a_lost_last_shard(tmp_path):
    fn, destination, partial = _finalize(tmp_path)
    with pytest.raises(ValueError, match=r"hold 2 episodes; expected 3"):
        list(fn.process([("train", 0, 2, 10)], [("train", 3)]))
    assert not os.path.exists(destination)
    assert "dataset_info.json" not in os.listdir(partial)


_TFRecordWriter = tf.io.TFRecordWriter


class _FailingWriter:
    """A TFRecordWriter that writes its first record, then fails (a worker dying mid-shard)."""

    def __init__(self, path):
        self._writer = _TFRecordWriter(path)
        self._written = 0

    def write(self, record):
        if self._written == 1:
            raise OSError("disk full")
        self._writer.write(record)
        self._written += 1

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()


def test_a_failed_shard_attempt_leaves_the_earlier_shard_whole(tmp_path, monkeypatch):
    from rlds_tf.beam import writing  # noqa: PLC0415
    partial = str(tmp_path / ".out.partial-x")
    fn = writing._WriteShard(partial, "toy", "train", "tfrecord", report_progress=False)
    element = (0, [((0, 0), b"first record"), ((0, 1), b"second record")])
    assert list(fn.process(element)) == [("train", 0, 2, len(b"first record") + len(b"second record"))]
    path = os.path.join(partial, "toy-train.tfrecord-00000")
    with open(path, "rb") as f:
        whole = f.read()
    assert [r.numpy() for r in tf.data.TFRecordDataset(path)] == [b"first record", b"second record"]
    monkeypatch.setattr(writing.tf.io, "TFRecordWriter", _FailingWriter)
    with pytest.raises(OSError, match="disk full"):
        list(fn.process(element))  # a retry of the same shard that dies half way
    with open(path, "rb") as f:
        assert f.read() == whole
    assert os.listdir(partial) == ["toy-train.tfrecord-00000"]  # the failed attempt's file is gone


def test_finalize_removes_the_files_of_dead_attempts(tmp_path):
    fn, destination, partial = _finalize(tmp_path)
    with open(os.path.join(partial, ".attempt-toy-train.tfrecord-00001-0123"), "wb") as f:
        f.write(b"torn")
    assert list(fn.process([("train", 0, 2, 10), ("train", 1, 1, 5)], [("train", 3)])) == [{"train": 3}]
    assert not [n for n in os.listdir(destination) if n.startswith(".")]


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "rlds_tf.cli", *argv], cwd=_REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "2"})


def _strict_json(text):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_beam_stats_json_of_a_one_step_field_is_strict(tmp_path):
    directory = write_one_step_dataset(str(tmp_path / "one_step"))
    output = str(tmp_path / "stats.json")
    done = _cli("stats", directory, "--json", "--runner", "DirectRunner", "--output", output)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {"count": 1, "mean": 1.5, "std": None, "min": 1.5, "max": 1.5}
    assert _strict_json(done.stdout)["train"]["fields"]["reward"] == expected
    with open(output, encoding="utf-8") as f:
        assert _strict_json(f.read())["train"]["fields"]["reward"] == expected


@pytest.mark.parametrize("argv, unknown", [
    (["convert", "SRC", "DST", "--format", "tfrecord", "--num-workers", "2", "--max-episode-per-file", "2"],
     "--max-episode-per-file 2"),
    (["stats", "DIR", "--runner", "DirectRunner", "--flink_master", "localhost:8081", "--jsn"], "--jsn"),
    (["stats", "DIR", "EXTRA", "--num-workers", "2"], "EXTRA"),
])
def test_arguments_beam_would_drop_are_refused(argv, unknown, tmp_path, capsys):
    from rlds_tf import cli  # noqa: PLC0415
    argv = [str(tmp_path / a) if a in ("SRC", "DST", "DIR") else a for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {unknown} (neither rlds-tf {argv[0]} nor any of Beam's PipelineOptions" in err


def test_options_of_other_runners_are_passed_through():
    from rlds_tf.beam import pipelines  # noqa: PLC0415
    assert pipelines.unknown_options(["--flink_master", "localhost:8081", "--parallelism", "8", "--project", "p",
                                      "--region", "us-central1", "--temp_location", "gs://b/tmp",
                                      "--spark_master_url", "spark://h:7077", "--job_name=x"]) == []
