"""The notebooks in notebooks/: they run, they are stored executed, and their install cell does what it says.

`test_notebook_runs` executes each notebook with nbclient in a fresh kernel (slow: one kernel each), through
`notebooks/refresh_outputs.py`'s `execute_notebook`, the function that produces the stored outputs:
`RL_DATA_TF_NOTEBOOK_TEST=1` tells the install cell not to pip install, and the kernel imports the
checked-out tree (first on its PYTHONPATH) in a temporary working directory. It clears the stored outputs
first, so it never relies on them. The cheap tests check the stored files: executed top to bottom without
errors, with the outputs a reader expects, and without run-specific noise.
"""
import glob
import importlib.util
import os
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
transformer = pytest.importorskip("IPython.core.inputtransformer2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS_DIR = os.path.join(REPO, "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NOTEBOOKS_DIR, "*.ipynb")))
IDS = [os.path.basename(p) for p in NOTEBOOKS]


def _load_refresh_outputs():
    spec = importlib.util.spec_from_file_location("refresh_outputs", os.path.join(NOTEBOOKS_DIR,
                                                                                   "refresh_outputs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


refresh_outputs = _load_refresh_outputs()


def _code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _output_texts(cell):
    for output in cell.outputs:
        if output.output_type == "stream":
            yield output.text
        elif output.output_type in ("execute_result", "display_data"):
            yield output.data.get("text/plain", "")


def test_there_are_notebooks():
    for expected in ("000_rlds_reverb_patterns.ipynb", "001_reverb_demo.ipynb",
                     "004_tf_agents_replay_buffers.ipynb", "005_end_to_end_dqn_catch.ipynb",
                     "006_tf_agents_on_current_tf.ipynb"):
        assert expected in IDS
    assert refresh_outputs.notebook_paths() == NOTEBOOKS


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs(path, tmp_path):
    missing = refresh_outputs.missing_module(path)
    if missing is not None:  # run by the test that has an environment with it (006: test_tf_agents_training.py)
        pytest.skip(f"{os.path.basename(path)} needs {missing}, which this environment cannot import")
    notebook = nbformat.read(path, as_version=4)
    try:
        refresh_outputs.execute_notebook(notebook, str(tmp_path))
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{os.path.basename(path)} failed:\n{e}")
    errors = [output for cell in _code_cells(notebook) for output in cell.outputs
              if output.output_type == "error"]
    assert not errors, errors
    # Every cell ran, in order, in this run (the stored execution counts were cleared first).
    assert [cell.execution_count for cell in _code_cells(notebook)] == list(
        range(1, len(_code_cells(notebook)) + 1))


# ---- The stored notebooks (cheap) ----

@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_stored_notebook_is_executed(path):
    """Stored with the outputs of one top-to-bottom run: refresh with `python notebooks/refresh_outputs.py`."""
    notebook = nbformat.read(path, as_version=4)
    cells = _code_cells(notebook)
    hint = f"{os.path.basename(path)} is stored unexecuted or stale: run python notebooks/refresh_outputs.py"
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1)), hint
    for cell in cells[1:]:  # the install cell prints nothing under the tests
        assert not [o for o in cell.outputs if o.output_type == "error"], (hint, cell.source)
        texts = "".join(_output_texts(cell))
        if re.search(r"^print\(", cell.source, re.MULTILINE):  # a top-level print always prints
            assert any(o.output_type == "stream" and o.name == "stdout" for o in cell.outputs), (hint, cell.source)
        if "plt.show()" in cell.source:
            assert any("image/png" in o.get("data", {}) for o in cell.outputs), (hint, cell.source)
        assert "Traceback" not in texts, (hint, texts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_stored_outputs_hold_nothing_run_specific(path):
    notebook = nbformat.read(path, as_version=4)
    assert set(notebook.metadata) <= {"colab", "kernelspec", "language_info"}, notebook.metadata
    assert notebook.metadata.get("language_info", {}) in ({}, {"name": "python"}), notebook.metadata
    for cell in _code_cells(notebook):
        assert "execution" not in cell.metadata, cell.metadata
        for text in _output_texts(cell):
            assert not re.search(r" at 0x[0-9a-fA-F]+", text), f"a memory address in the output of:\n{cell.source}"
            assert not re.search(r"/tmp/|/var/folders/|\\Temp\\", text), (
                f"a temporary path in the output of:\n{cell.source}")
            assert not [line for line in text.splitlines() if refresh_outputs._CPP_LOG_LINE.match(line)], text


def test_strip_volatile_removes_timings_kernel_details_and_cpp_logs():
    notebook = nbformat.v4.new_notebook(metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python", "version": "3.11.2", "mimetype": "text/x-python"},
        "widgets": {"state": {}}})
    cell = nbformat.v4.new_code_cell("print('hi')", execution_count=1, metadata={
        "execution": {"iopub.execute_input": "2026-01-01T00:00:00.000Z"}, "tags": ["keep"]})
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text=(
            "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
            "I0000 00:00:1795733442.889401   14327 cudart_stub.cc:31] Could not find cuda drivers.\n")),
        nbformat.v4.new_output("stream", name="stderr", text=(
            "E1126 22:49:43.123456  140 cuda_platform.cc:52] failed call to cuInit\na real warning\n")),
        nbformat.v4.new_output("stream", name="stdout", text="I0000 00:00:1.1 1 a.cc:1] printed by the user\n"),
    ]
    notebook.cells = [cell]
    refresh_outputs.strip_volatile(notebook)
    assert dict(notebook.metadata) == {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}}
    assert dict(cell.metadata) == {"tags": ["keep"]}
    assert [(o.name, o.text) for o in cell.outputs] == [
        ("stderr", "a real warning\n"), ("stdout", "I0000 00:00:1.1 1 a.cc:1] printed by the user\n")]
    nbformat.validate(notebook)


def test_kernel_environment_puts_the_checkout_first_and_skips_the_install():
    env = refresh_outputs.kernel_environment({"PYTHONPATH": "/elsewhere", "HOME": "/home/x"})
    assert env["PYTHONPATH"].split(os.pathsep) == [REPO, "/elsewhere"]
    assert env["RL_DATA_TF_NOTEBOOK_TEST"] == "1" and env["HOME"] == "/home/x"
    assert refresh_outputs.kernel_environment({})["PYTHONPATH"] == REPO


# ---- The install cell, run without a kernel: IPython's own transform, `%pip` recorded ----

_FIND_SPEC = importlib.util.find_spec


class _RecordingShell:
    """Stands in for `get_ipython()`: records line magics with their `{name}` fields expanded."""

    def __init__(self, namespace):
        self.namespace = namespace
        self.magics = []

    def run_line_magic(self, name, line):
        self.magics.append((name, line.format_map(self.namespace)))


def _run_install_cell(path, monkeypatch, cwd, *, notebook_test, package_importable):
    source = nbformat.read(path, as_version=4).cells[0].source
    code = transformer.TransformerManager().transform_cell(source)
    if notebook_test:
        monkeypatch.setenv("RL_DATA_TF_NOTEBOOK_TEST", "1")
    else:
        monkeypatch.delenv("RL_DATA_TF_NOTEBOOK_TEST", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: (_FIND_SPEC(name, *args) if package_importable or name != "replay_tf"
                                             else None))
    monkeypatch.chdir(cwd)
    namespace = {}
    shell = _RecordingShell(namespace)
    namespace["get_ipython"] = lambda: shell
    exec(compile(code, f"{os.path.basename(path)}[0]", "exec"), namespace)  # noqa: S102  (our own notebook)
    return shell.magics


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_install_cell_installs_the_clone_it_sits_in(path, monkeypatch):
    assert nbformat.read(path, as_version=4).cells[0].cell_type == "code"
    magics = _run_install_cell(path, monkeypatch, NOTEBOOKS_DIR, notebook_test=False, package_importable=False)
    assert magics == [("pip", f'install -q "{REPO}" matplotlib')]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_install_cell_installs_nothing_under_the_tests_or_when_importable(path, monkeypatch, tmp_path):
    assert _run_install_cell(path, monkeypatch, tmp_path, notebook_test=True, package_importable=False) == []
    assert _run_install_cell(path, monkeypatch, tmp_path, notebook_test=False, package_importable=True) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_install_cell_outside_a_clone_asks_for_the_source(path, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"set RL_DATA_TF_SOURCE to the path of a clone or to \"git\+"):
        _run_install_cell(path, monkeypatch, tmp_path, notebook_test=False, package_importable=False)
