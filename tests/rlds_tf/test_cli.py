"""`rlds-tf info` and `rlds-tf convert` on a small recorded Catch dataset.

Expected returns and lengths are summed while recording (in the test), independently of the reader.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import rlds_tf as rlds
from dataset_testlib import assert_nested_equal
from rlds_tf import cli
from rlds_tf.recording import Catch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_EPISODES = 5


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tfrecord Catch dataset (5 episodes, 2 per shard) and the returns/lengths seen while recording."""
    directory = str(tmp_path_factory.mktemp("catch"))
    rng = np.random.default_rng(3)
    returns, lengths = [], []
    with rlds.EnvLogger(Catch(rows=6, seed=2), data_directory=directory, max_episodes_per_file=2,
                        step_fn=lambda timestep, action, env: {"hit": np.float32(timestep.reward or 0.0)},
                        episode_fn=lambda timestep, action, env: (
                            {"score": np.float64(timestep.reward)} if timestep.last() else None)) as env:
        for _ in range(NUM_EPISODES):
            timestep, total, steps = env.reset(), 0.0, 1
            while not timestep.last():
                timestep = env.step(int(rng.integers(3)))
                total += timestep.reward
                steps += 1
            returns.append(total)
            lengths.append(steps)
    return directory, np.array(returns), np.array(lengths)


def test_summary_counts_fields_and_statistics(recorded):
    directory, returns, lengths = recorded
    summary = cli.dataset_summary(directory)
    assert summary["file_format"] == "tfrecord"
    assert summary["step_fields"] == {
        "action": "int64[]", "discount": "float64[]", "hit": "float32[]", "is_first": "bool[]",
        "is_last": "bool[]", "is_terminal": "bool[]", "observation": "float32[6, 5]", "reward": "float64[]"}
    assert summary["episode_fields"] == {"score": "float64[]"}
    train = summary["splits"]["train"]
    assert (train["episodes"], train["steps"], train["episodes_in_metadata"]) == (
        NUM_EPISODES, int(lengths.sum()), NUM_EPISODES)
    np.testing.assert_allclose(train["_returns"], returns)
    np.testing.assert_array_equal(train["_lengths"], lengths)
    assert train["returns"]["mean"] == pytest.approx(returns.mean())
    assert train["returns"]["std"] == pytest.approx(returns.std())
    assert (train["returns"]["min"], train["returns"]["max"]) == (returns.min(), returns.max())
    assert train["lengths"]["mean"] == pytest.approx(lengths.mean())


def test_summary_max_episodes(recorded):
    directory, returns, lengths = recorded
    train = cli.dataset_summary(directory, split="train", max_episodes=2)["splits"]["train"]
    assert train["episodes"] == 2 and train["steps"] == int(lengths[:2].sum())
    np.testing.assert_allclose(train["_returns"], returns[:2])


def test_info_text_and_json(recorded, capsys):
    directory, returns, lengths = recorded
    assert cli.main(["info", directory]) == 0
    out = capsys.readouterr().out
    assert f"split train: {NUM_EPISODES} episodes, {int(lengths.sum())} steps" in out
    assert "observation" in out and "float32[6, 5]" in out and "score" in out
    assert cli.main(["info", directory, "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["splits"]["train"]["returns"]["max"] == returns.max()
    assert not any(key.startswith("_") for key in parsed["splits"]["train"])


@pytest.mark.parametrize("args, code, message", [
    (["info", "/nonexistent/dataset/dir"], 1, "does not exist"),
    (["info", "no_such_tfds_dataset_name"], 1, "neither an existing dataset directory"),
    (["info", "SPLIT", "--split", "test"], 1, "unknown split 'test'"),
    (["info", "SPLIT", "--max-episodes", "0"], 2, "--max-episodes"),
])
def test_info_errors(recorded, capsys, args, code, message):
    args = [recorded[0] if a == "SPLIT" else a for a in args]
    assert cli.main(args) == code
    assert message in capsys.readouterr().err


def test_info_plot(recorded, tmp_path, capsys):
    png = tmp_path / "returns.png"
    code = cli.main(["info", recorded[0], "--plot", str(png)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert code == 2 and "needs matplotlib" in capsys.readouterr().err
        assert not png.exists()
        return
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _episodes(directory):
    return [e for e in rlds.load_stacked(directory, "train").as_numpy_iterator()]


def test_convert_round_trip_through_array_record(recorded, tmp_path, capsys):
    pytest.importorskip("array_record")
    directory = recorded[0]
    as_array_record = str(tmp_path / "array_record")
    back = str(tmp_path / "tfrecord")
    assert cli.main(["convert", directory, as_array_record, "--format", "array_record",
                     "--max-episodes-per-file", "3"]) == 0
    assert f"train: {NUM_EPISODES} episodes" in capsys.readouterr().out
    assert sorted(f for f in os.listdir(as_array_record) if "array_record" in f) == [
        "rlds_dataset-train.array_record-00000", "rlds_dataset-train.array_record-00001"]
    assert cli.dataset_summary(as_array_record)["file_format"] == "array_record"
    assert cli.main(["convert", as_array_record, back, "--format", "tfrecord"]) == 0
    original = _episodes(directory)
    assert len(original) == NUM_EPISODES
    assert_nested_equal(_episodes(as_array_record), original)
    assert_nested_equal(_episodes(back), original)


def test_convert_refuses_a_non_empty_destination(recorded, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    assert cli.main(["convert", recorded[0], str(tmp_path), "--format", "tfrecord"]) == 1
    assert "is not empty" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_module_help_runs_without_tensorflow_work():
    result = subprocess.run([sys.executable, "-m", "rlds_tf.cli", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    assert "rlds-tf info DIR_OR_NAME" in result.stdout and "convert" in result.stdout
