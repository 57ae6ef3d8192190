"""rlds_tf.beam on the DirectRunner with 2 worker processes, against the single-process tools.

Run in the Beam venv (`.ci/make_beam_venv.sh`); skipped where apache_beam is not importable.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import tree
import pytest

beam = pytest.importorskip("apache_beam", reason="apache_beam is not installed: these tests run in the Beam venv "
                                                 "(.ci/make_beam_venv.sh; pip install rl-data-tf[beam])")

import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

import rlds_tf  # noqa: E402
from rlds_tf import cli  # noqa: E402
from rlds_tf import patterns  # noqa: E402
from rlds_tf import transformations  # noqa: E402
from rlds_tf.beam import DatasetStatistics, PatternMap, ReadEpisodes, WriteEpisodes  # noqa: E402
from rlds_tf.beam import pipelines  # noqa: E402
from rlds_tf.recording import tfds_writer  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_LENGTHS = {"train": [5, 1, 7, 3, 4, 6, 2], "test": [3, 8, 2, 5]}


def _two_workers() -> PipelineOptions:
    return pipelines.pipeline_options("DirectRunner", 2)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tfrecord RLDS dataset: two splits, varying lengths, step and episode metadata, 3 episodes a shard."""
    directory = str(tmp_path_factory.mktemp("source") / "toy")
    config = tfds.rlds.rlds_base.DatasetConfig(
        name="toy", observation_info=tfds.features.Tensor(shape=(3,), dtype=np.float32),
        action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64,
        step_metadata_info={"energy": tfds.features.Tensor(shape=(2, 2), dtype=np.int32)},
        episode_metadata_info={"episode_id": tf.int64})
    rng = np.random.default_rng(7)
    writer = tfds_writer.DatasetWriter(directory, config, split_names=list(_LENGTHS), max_episodes_per_file=3)
    for split, lengths in _LENGTHS.items():
        for k, length in enumerate(lengths):
            steps = {"observation": rng.normal(size=(length, 3)).astype(np.float32),
                     "action": rng.integers(-5, 5, size=length), "reward": rng.normal(size=length),
                     "discount": np.ones(length), "energy": rng.integers(0, 100, (length, 2, 2), dtype=np.int32),
                     "is_first": np.arange(length) == 0, "is_last": np.arange(length) == length - 1,
                     "is_terminal": np.arange(length) == length - 1}
            writer.add_episode({"steps": steps, "episode_id": 100 * len(split) + k}, split=split)
    writer.close()
    return directory


def _files(directory):
    return {path.name: path.read_bytes() for path in sorted(pathlib.Path(directory).iterdir())}


def _episodes(directory, split):
    return list(tfds.as_numpy(rlds_tf.load_stacked(directory, split)))


def _assert_same_episodes(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        tf.nest.map_structure(np.testing.assert_array_equal, x, y)


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "rlds_tf.cli", *argv], cwd=_REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_convert_on_two_workers_writes_the_single_process_bytes(source, tmp_path, file_format):
    expected = str(tmp_path / "single")
    cli.convert(source, expected, file_format, max_episodes_per_file=2)
    got = str(tmp_path / "beam")
    if file_format == "tfrecord":  # through the command line, with its progress lines
        done = _cli("convert", source, got, "--format", file_format, "--num-workers", "2",
                    "--max-episodes-per-file", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == f"wrote {got} (tfrecord): test: 4 episodes, train: 7 episodes"
        # (the workers' lines may share the launcher's stderr with log lines, so they are searched for)
        # The source holds 3 episodes a shard; DST 2 a shard. One line per shard, with its ordinal.
        for split, read_counts, written_counts in (("train", [3, 3, 1], [2, 2, 2, 1]), ("test", [3, 1], [2, 2])):
            for k, n in enumerate(read_counts):
                line = (f"read toy-{split}.tfrecord-{k:05d}: {n} episode{'s' if n > 1 else ''} (shard {k + 1} "
                        f"of {len(read_counts)} of split '{split}')")
                assert done.stderr.count(line) == 1, (line, done.stderr[-3000:])
            for k, n in enumerate(written_counts):
                line = f"wrote toy-{split}.tfrecord-{k:05d}: {n} episode{'s' if n > 1 else ''}"
                # (a log line of another process may follow it on the same line: only the word must end)
                found = re.findall(re.escape(line) + r"(?![a-z])", done.stderr)
                assert len(found) == 1, (line, done.stderr[-3000:])
    else:
        counts = pipelines.convert(source, got, file_format, options=_two_workers(), max_episodes_per_file=2,
                                   report_progress=False)
        assert counts == {split: len(lengths) for split, lengths in _LENGTHS.items()}
    assert _files(got) == _files(expected)  # every shard and metadata file, byte for byte
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no hidden directory left
    for split in _LENGTHS:
        _assert_same_episodes(_episodes(got, split), _episodes(source, split))
        # TFDS's own reader of the directory, nested steps and all.
        builder = tfds.builder_from_directory(got)
        assert builder.info.splits[split].num_examples == len(_LENGTHS[split])
        if file_format == "tfrecord":
            nested = [e["steps"] for e in tfds.as_numpy(builder.as_dataset(split=split))]
            assert [len(list(s)) for s in nested] == _LENGTHS[split]


def test_read_then_write_with_num_shards_keeps_order_and_counts(source, tmp_path):
    read = ReadEpisodes(source, with_index=True)
    destination = str(tmp_path / "out")
    with beam.Pipeline() as p:
        _ = p | read | WriteEpisodes(destination, read.features, num_shards=3, name="toy")
    with open(os.path.join(destination, "dataset_info.json"), encoding="utf-8") as f:
        info = json.load(f)
    assert {s["name"]: [int(n) for n in s["shardLengths"]] for s in info["splits"]} == {
        "train": [3, 2, 2], "test": [2, 1, 1]}
    for split in _LENGTHS:
        _assert_same_episodes(_episodes(destination, split), _episodes(source, split))


def test_read_episodes_of_an_array_record_dataset(source, tmp_path):
    converted = str(tmp_path / "array_record")
    cli.convert(source, converted, "array_record", max_episodes_per_file=3)
    output = str(tmp_path / "episodes.npy")
    with beam.Pipeline() as p:
        _ = (p | ReadEpisodes(converted, "train", with_index=True) | beam.combiners.ToList()
             | beam.Map(lambda pairs: np.save(output, np.array(sorted(pairs, key=lambda kv: kv[0]) + [None],
                                                               dtype=object)[:-1], allow_pickle=True)))
    got = list(np.load(output, allow_pickle=True))
    assert [int(index) for index, _ in got] == list(range(len(_LENGTHS["train"])))
    _assert_same_episodes([episode for _, episode in got], _episodes(source, "train"))


def test_unindexed_episodes_are_written_in_a_deterministic_order(source, tmp_path):
    episodes = _episodes(source, "train")
    written = []
    for attempt in range(2):
        destination = str(tmp_path / f"out{attempt}")
        with beam.Pipeline() as p:
            _ = (p | beam.Create(episodes) | beam.Map(lambda e: e)
                 | WriteEpisodes(destination, tfds.builder_from_directory(source).info))
        written.append(_files(destination))
        got = _episodes(destination, "train")
        assert sorted(int(e["episode_id"]) for e in got) == sorted(int(e["episode_id"]) for e in episodes)
    assert written[0] == written[1]


def test_stats_on_two_workers_equal_numpy_mean_and_std_and_one_process(source):
    done = _cli("stats", source, "--json", "--num-workers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    single = cli.dataset_statistics(source)
    assert sorted(got) == sorted(single) == sorted(_LENGTHS)
    for split, lengths in _LENGTHS.items():
        assert got[split]["episodes"] == single[split]["episodes"] == len(lengths)
        steps = [e["steps"] for e in _episodes(source, split)]
        fields = got[split]["fields"]
        assert sorted(fields) == sorted(["action", "discount", "energy", "is_first", "is_last", "is_terminal",
                                         "observation", "reward"])
        for field, figures in fields.items():
            values = np.concatenate([s[field] for s in steps]).astype(np.float64)
            assert figures["count"] == sum(lengths)
            np.testing.assert_allclose(figures["mean"], values.mean(axis=0), rtol=1e-12)
            np.testing.assert_allclose(figures["std"], values.std(axis=0, ddof=1), rtol=1e-12)
            np.testing.assert_array_equal(figures["min"], values.min(axis=0))
            np.testing.assert_array_equal(figures["max"], values.max(axis=0))
            for key in ("mean", "std"):
                np.testing.assert_allclose(single[split]["fields"][field][key], figures[key], rtol=1e-12)
    mean, std = transformations.mean_and_std(
        rlds_tf.load(source, "train"), lambda s: ({"observation": s["observation"]}, {"observation": True}))
    observation = got["train"]["fields"]["observation"]
    # mean_and_std sums float32 fields in float32.
    np.testing.assert_allclose(observation["mean"], mean["observation"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(observation["std"], std["observation"], rtol=1e-6)


def test_dataset_statistics_combine_fn_in_a_pipeline(source, tmp_path):
    output = str(tmp_path / "stats.npz")
    with beam.Pipeline() as p:
        _ = (p | ReadEpisodes(source, "test") | beam.CombineGlobally(DatasetStatistics())
             | beam.Map(lambda summary: np.savez(output, **{f"{field}|{k}": v for field, s in summary.items()
                                                          for k, v in s.items()})))
    steps = [e["steps"] for e in _episodes(source, "test")]
    with np.load(output) as got:
        for field in ("observation", "energy", "is_last"):
            values = np.concatenate([s[field] for s in steps])
            as_float = values.astype(np.float64)
            np.testing.assert_allclose(got[f"{field}|mean"], as_float.mean(axis=0), rtol=1e-12)
            np.testing.assert_allclose(got[f"{field}|std"], as_float.std(axis=0, ddof=1), rtol=1e-12)
            assert got[f"{field}|min"].dtype == values.dtype
            np.testing.assert_array_equal(got[f"{field}|max"], values.max(axis=0))


def test_pipeline_options_pass_further_options_unchanged():
    options = pipelines.pipeline_options("DirectRunner", 2, ["--job_name=rlds-x", "--parallelism", "4"])
    known = options.get_all_options()
    assert (known["runner"], known["direct_num_workers"], known["direct_running_mode"], known["job_name"]) == (
        "DirectRunner", 2, "multi_processing", "rlds-x")
    assert options.get_all_options(retain_unknown_options=True)["parallelism"] == 4
    assert pipelines.pipeline_options("DataflowRunner", 3).get_all_options()["num_workers"] == 3


_KILLED_CONVERT = """
import os, sys
import apache_beam as beam
from rlds_tf.beam import ReadEpisodes, WriteEpisodes, pipelines
source, destination = sys.argv[1:3]
read = ReadEpisodes(source, with_index=True)
write = WriteEpisodes(destination, read.info, max_episodes_per_file=1, version=str(read.info.version))
os.makedirs(write.partial_directory)
print(write.partial_directory, flush=True)
with beam.Pipeline(options=pipelines.pipeline_options("DirectRunner", 2)) as p:
    _ = p | read | write
"""

# Loaded by every process of the pipeline (its directory leads PYTHONPATH): the worker putting shard 3 in place
# stalls there, its file written under a temporary name, mid-pipeline.
_STALL_SHARD_3 = """
import os, time
_replace = os.replace
def _stalling_replace(src, dst, *args, **kwargs):
    if os.path.basename(os.fspath(dst)) == "toy-train.tfrecord-00003":
        time.sleep(3600)
    return _replace(src, dst, *args, **kwargs)
os.replace = _stalling_replace
"""


def _worker_pids(launcher: int) -> list:
    """The DirectRunner's worker processes: the launcher's children running Beam's SDK worker."""
    found = []
    for child in subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split():
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"sdk_worker" in f.read():
                    found.append(int(child))
        except FileNotFoundError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["everything", "one worker"])
def test_a_pipeline_killed_mid_write_leaves_no_valid_looking_output(source, tmp_path, killed):
    destination = str(tmp_path / "out")
    stall = tmp_path / "stall"
    stall.mkdir()
    (stall / "sitecustomize.py").write_text(_STALL_SHARD_3)
    process = subprocess.Popen([sys.executable, "-c", _KILLED_CONVERT, source, destination], cwd=_REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": f"{stall}{os.pathsep}{_REPO}",
                                    "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        partial = process.stdout.readline().strip()
        shards = lambda: [n for n in os.listdir(partial) if not n.startswith(".")]  # noqa: E731
        deadline = time.monotonic() + 120
        while len(shards()) < 3 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert len(shards()) >= 3, "the pipeline wrote no shards while one worker was stalled"
        if killed == "one worker":
            workers = _worker_pids(process.pid)
            assert len(workers) == 2, workers
            os.kill(workers[0], signal.SIGKILL)
            try:  # (the DirectRunner's launcher may fail, or wait for the worker forever)
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            assert not os.path.exists(destination)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and its worker processes
        process.wait(timeout=60)
        process.stdout.close()
    assert not os.path.exists(destination)
    assert "dataset_info.json" not in os.listdir(partial)
    with pytest.raises(FileNotFoundError):
        rlds_tf.load(destination, "train")
    with pytest.raises(ValueError, match="not a TFDS dataset directory"):
        rlds_tf.load(partial, "train")


def _canonical(item):
    return tuple((path, np.asarray(v).tobytes()) for path, v in
                 sorted(tree.flatten_with_path(item)))


def test_pattern_map_equals_pattern_map_per_episode(source, tmp_path):
    def transform(ref):
        pattern = {"obs": ref["observation"][-2:], "a": ref["action"][-1], "meta": ref["energy"][-1]}
        return [patterns.create_config(pattern, table="t"),
                patterns.create_config(pattern, table="t", conditions=[patterns.Condition.is_end_episode()])]
    output = str(tmp_path / "items.npy")
    with beam.Pipeline() as p:
        _ = (p | ReadEpisodes(source, "test") | PatternMap(transform) | beam.combiners.ToList()
             | beam.Map(lambda items: np.save(output, np.array(items + [None], dtype=object)[:-1],
                                              allow_pickle=True)))
    got = list(np.load(output, allow_pickle=True))
    episodes = rlds_tf.load(source, "test")
    configs = transform(patterns.create_reference_step(transformations.step_spec(episodes)))
    expected = list(tfds.as_numpy(episodes.flat_map(
        lambda e: transformations.pattern_map(tf.data.Dataset.from_tensors(e), configs))))
    # Every test episode has >= 2 steps: (length - 1) pairs each, and one more when it ends.
    assert len(expected) == sum(n - 1 for n in _LENGTHS["test"]) + len(_LENGTHS["test"])
    assert sorted(map(_canonical, got)) == sorted(map(_canonical, expected))
