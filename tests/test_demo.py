"""The README's demo command runs and leaves a dataset that `rlds-tf info` reads."""
import pathlib
import subprocess
import sys

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_keeps_its_dataset_and_says_how_to_look_at_it(tmp_path):
    directory = tmp_path / "catch"
    done = subprocess.run([sys.executable, str(_REPO / "demo.py"), "--keep", str(directory)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recorded 20 Catch episodes" in done.stdout
    assert f"rlds-tf info {directory}" in done.stdout
    info = subprocess.run([sys.executable, "-m", "rlds_tf.cli", "info", str(directory)], capture_output=True,
                          text=True, timeout=300)
    assert info.returncode == 0, info.stderr[-3000:]
    assert "split train: 20 episodes, 200 steps" in info.stdout


@pytest.mark.slow
def test_demo_refuses_a_keep_directory_with_files(tmp_path):
    (tmp_path / "other.txt").write_text("not a dataset")
    done = subprocess.run([sys.executable, str(_REPO / "demo.py"), "--keep", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "expected an empty or new directory" in done.stderr
    assert (tmp_path / "other.txt").read_text() == "not a dataset"
