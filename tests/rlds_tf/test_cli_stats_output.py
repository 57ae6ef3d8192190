"""`rlds-tf stats --output PATH` in one process, and `--data-dir` refused on the Beam path (before Beam loads)."""
import json

import pytest

from rlds_dataset_testlib import record_catch
from rlds_tf import cli


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return record_catch(str(tmp_path_factory.mktemp("catch")), leave_lock=False)


def test_stats_output_writes_the_printed_figures(recorded, tmp_path, capsys):
    output = tmp_path / "stats.json"
    assert cli.main(["stats", recorded, "--json", "--output", str(output)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(output.read_text())
    assert written == printed == cli.dataset_statistics(recorded)
    assert written["train"]["episodes"] == 3


@pytest.mark.parametrize("argv", [
    ["stats", "DIR", "--num-workers", "2", "--data-dir", "/data"],
    ["convert", "SRC", "DST", "--format", "tfrecord", "--runner", "DirectRunner", "--data-dir", "/data"],
])
def test_data_dir_is_refused_on_the_beam_path(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "--data-dir is not taken with --runner/--num-workers" in capsys.readouterr().err
