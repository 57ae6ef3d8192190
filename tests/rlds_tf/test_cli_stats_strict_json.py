"""`rlds-tf stats --json` prints strict JSON: undefined figures (std of one step) are null, never NaN."""
import json

import pytest

from rlds_dataset_testlib import write_one_step_dataset
from rlds_tf import cli


def _strict(text):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_stats_json_of_a_one_step_field_is_strict(tmp_path, capsys):
    directory = write_one_step_dataset(str(tmp_path / "one_step"))
    assert cli.main(["stats", directory, "--json"]) == 0
    reward = _strict(capsys.readouterr().out)["train"]["fields"]["reward"]
    assert reward == {"count": 1, "mean": 1.5, "std": None, "min": 1.5, "max": 1.5}


def test_stats_text_of_a_one_step_field_says_nan(tmp_path, capsys):
    directory = write_one_step_dataset(str(tmp_path / "one_step"))
    assert cli.main(["stats", directory]) == 0
    reward = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("reward"))
    assert reward.split() == ["reward", "count", "1", "mean", "1.5", "std", "nan", "min", "1.5", "max", "1.5"]


def test_strict_helper_refuses_nan():
    with pytest.raises(ValueError, match="NaN"):
        _strict('{"std": NaN}')
