"""`rlds-tf stats` in one process: count, mean, std, min, max of every numeric step field, against numpy."""
import json
import re

import numpy as np
import pytest
import tensorflow_datasets as tfds

import rlds_tf as rlds
from rlds_dataset_testlib import record_catch
from rlds_tf import cli
from rlds_tf import step_statistics


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return record_catch(str(tmp_path_factory.mktemp("catch")), leave_lock=False)


def test_stats_json_equals_numpy(recorded, capsys):
    assert cli.main(["stats", recorded, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    steps = [e["steps"] for e in tfds.as_numpy(rlds.load_stacked(recorded, "train"))]
    assert got["train"]["episodes"] == len(steps) == 3
    assert sorted(got["train"]["fields"]) == ["action", "discount", "is_first", "is_last", "is_terminal",
                                              "observation", "reward"]
    for field, figures in got["train"]["fields"].items():
        values = np.concatenate([s[field] for s in steps])
        assert figures["count"] == values.shape[0]
        np.testing.assert_allclose(figures["mean"], values.astype(np.float64).mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(figures["std"], values.astype(np.float64).std(axis=0, ddof=1), rtol=1e-12)
        np.testing.assert_array_equal(figures["min"], values.min(axis=0))
        np.testing.assert_array_equal(figures["max"], values.max(axis=0))


def test_stats_text(recorded, capsys):
    assert cli.main(["stats", recorded]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "split train: 3 episodes"
    reward = next(line for line in lines if line.strip().startswith("reward"))
    assert reward.split()[1:3] == ["count", str(sum(len(s["reward"]) for s in tfds.as_numpy(
        rlds.load_stacked(recorded, "train").map(lambda e: e["steps"]))))]
    # observation float32[4, 5]: 20 elements, printed as ranges over the elements
    observation = next(line for line in lines if line.strip().startswith("observation"))
    assert re.search(r"  mean \S+\.\.\S+  std \S+\.\.\S+  min 0\.\.\S+  max \S+\.\.1$", observation), observation


def test_stats_unknown_split(recorded, capsys):
    assert cli.main(["stats", recorded, "--split", "nope"]) == 1
    assert "unknown split 'nope'; the dataset has splits ['train']" in capsys.readouterr().err


@pytest.mark.parametrize("parts", [[[1.0], [2.0, 7.0, -1.0]], [[3.0, 3.0], [5.0]], [[4.0, 1.0], []]])
def test_merged_summaries_equal_one_pass(parts):
    merged = step_statistics.StepStatistics()
    for part in parts:
        merged.merge(step_statistics.StepStatistics().add_episode({"steps": {"x": np.array(part)}}))
    values = np.concatenate([np.array(p) for p in parts])
    got = merged.result()["x"]
    assert got["count"] == values.size
    np.testing.assert_allclose(got["mean"], values.mean(), rtol=1e-15)
    np.testing.assert_allclose(got["std"], values.std(ddof=1), rtol=1e-14)
    assert (got["min"], got["max"]) == (values.min(), values.max())
