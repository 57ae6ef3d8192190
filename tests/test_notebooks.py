"""Executes every notebook in notebooks/ with nbclient (a fresh kernel each) and fails on any cell error.

`RL_DATA_TF_NOTEBOOK_TEST=1` tells each notebook's install cell not to pip install: the kernel imports the
checked-out tree (put first on its PYTHONPATH). Notebooks run in a temporary working directory.
"""
import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))
CELL_TIMEOUT_S = 120


def test_there_are_notebooks():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    for expected in ("000_rlds_reverb_patterns.ipynb", "001_reverb_demo.ipynb",
                     "004_tf_agents_replay_buffers.ipynb"):
        assert expected in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    notebook = nbformat.read(path, as_version=4)
    first = notebook.cells[0]
    assert first.cell_type == "code" and "pip install" in first.source, (
        "the first cell must install the package the way a Colab user would")
    monkeypatch.setenv("RL_DATA_TF_NOTEBOOK_TEST", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{os.path.basename(path)} failed:\n{e}")
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors, errors
