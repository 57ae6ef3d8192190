"""Executes the notebooks in this folder and stores them with their outputs.

Usage (from anywhere; a few minutes per notebook on a small machine):

    python notebooks/refresh_outputs.py                    # every notebooks/*.ipynb
    python notebooks/refresh_outputs.py notebooks/004_*.ipynb

The kernel runs the interpreter that runs this script (jupyter_client starts the `python3` kernel spec's
`python` as `sys.executable`), so a notebook that needs another environment is refreshed with that
environment's Python, which needs nbclient, nbformat, ipykernel and matplotlib. 006 needs TF-Agents: run it
with the venv `.ci/make_tf_agents_venv.sh` builds (it has those four):

    ~/.cache/rl-data-tf-agents/bin/python notebooks/refresh_outputs.py notebooks/006_*.ipynb

Each notebook runs top to bottom in a fresh kernel exactly as `tests/test_notebooks.py` runs it (both call
`execute_notebook`): `RL_DATA_TF_NOTEBOOK_TEST=1` so the install cell installs nothing, the repository root
first on `PYTHONPATH`, a temporary working directory, and matplotlib's inline backend, which draws each figure
once as an embedded PNG without a display. A failing cell aborts the refresh and leaves the file untouched.

What is stored is what a reader would see, minus what changes from machine to machine or run to run without
meaning: execution timings, the kernel's language details (Python version), and the C++ log lines TensorFlow
prints at start-up (timestamps, process ids, whether CUDA drivers are present). So a re-run gives a diff only
where the results themselves changed.
"""
import argparse
import glob
import importlib.util
import os
import re
import sys
import tempfile
from typing import Dict, List, Optional

import nbclient
import nbformat

NOTEBOOKS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(NOTEBOOKS_DIR)
CELL_TIMEOUT_S = 300
KERNEL_NAME = "python3"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"

# An absl/TF C++ log line ("I0000 00:00:1795733442.889401   14327 cudart_stub.cc:31] Could not find ..."),
# or absl's notice that such lines go to stderr.
_CPP_LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\] .*"
                           r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR)$")
# Notebooks that need a module beyond rl-data-tf's environment: file name -> module. Without it importable
# here they are left out of the default run (and `tests/test_notebooks.py` skips running them).
REQUIRED_MODULES = {"006_tf_agents_on_current_tf.ipynb": "tf_agents"}
# Notebook-level metadata worth keeping; everything else is written by the kernel or the executing client.
_KEPT_NOTEBOOK_METADATA = ("colab", "kernelspec")


def notebook_paths() -> List[str]:
    """Every notebook of this folder, sorted by name (the number prefix orders them)."""
    return sorted(glob.glob(os.path.join(NOTEBOOKS_DIR, "*.ipynb")))


def missing_module(path: str) -> Optional[str]:
    """The module the notebook at `path` needs (`REQUIRED_MODULES`) that this interpreter, and so the kernel
    it starts, cannot import; None when there is none."""
    module = REQUIRED_MODULES.get(os.path.basename(path))
    return module if module is not None and importlib.util.find_spec(module) is None else None


def kernel_environment(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment a notebook kernel runs with: `base` (default `os.environ`) plus the test settings."""
    env = dict(os.environ if base is None else base)
    env["RL_DATA_TF_NOTEBOOK_TEST"] = "1"  # the install cell installs nothing
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = INLINE_BACKEND
    return env


def execute_notebook(notebook: nbformat.NotebookNode, working_directory: str, *,
                     cell_timeout_s: int = CELL_TIMEOUT_S) -> nbformat.NotebookNode:
    """Clears `notebook`'s outputs and runs it in place in a fresh kernel started in `working_directory`.

    Raises:
      nbclient.exceptions.CellExecutionError: a cell raised; its outputs up to the error are in `notebook`.
    """
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    client = nbclient.NotebookClient(notebook, timeout=cell_timeout_s, kernel_name=KERNEL_NAME,
                                     record_timing=False,
                                     resources={"metadata": {"path": working_directory}})
    client.execute(env=kernel_environment(), cwd=working_directory)
    return notebook


def _without_cpp_log_lines(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True)
                   if not _CPP_LOG_LINE.match(line.rstrip("\n")))


def strip_volatile(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Removes, in place, what differs between runs without meaning (see the module docstring)."""
    metadata = {key: notebook.metadata[key] for key in _KEPT_NOTEBOOK_METADATA if key in notebook.metadata}
    metadata["language_info"] = {"name": notebook.metadata.get("language_info", {}).get("name", "python")}
    notebook.metadata = nbformat.from_dict(metadata)
    for cell in notebook.cells:
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        outputs = []
        for output in cell.outputs:
            if output.output_type == "stream" and output.name == "stderr":
                output.text = _without_cpp_log_lines(output.text)
                if not output.text:
                    continue
            outputs.append(output)
        cell.outputs = outputs
    return notebook


def refresh(path: str) -> None:
    """Executes the notebook at `path` and writes it back with its outputs."""
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="rl-data-tf-notebook-") as working_directory:
        execute_notebook(notebook, working_directory)
    strip_volatile(notebook)
    nbformat.validate(notebook)
    nbformat.write(notebook, path)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files (default: every notebooks/*.ipynb)")
    args = parser.parse_args(argv)
    paths = args.notebooks or notebook_paths()
    for path in paths:
        if not path.endswith(".ipynb") or not os.path.isfile(path):
            parser.error(f"notebook {path!r} is not an existing .ipynb file: pass paths like notebooks/004_*.ipynb")
    runnable = [path for path in paths if missing_module(path) is None]
    for path in paths:
        if path not in runnable:
            message = (f"{os.path.relpath(path, REPO)} needs {missing_module(path)}, which {sys.executable} cannot "
                       f"import: run this script with a Python that has it (see this script's docstring)")
            if args.notebooks:
                parser.error(message)
            print(f"skipping {message}", file=sys.stderr)
    paths = runnable
    for path in paths:
        print(f"executing {os.path.relpath(path, REPO)} ...", flush=True)
        try:
            refresh(path)
        except nbclient.exceptions.CellExecutionError as e:
            print(f"{os.path.relpath(path, REPO)} failed, file left unchanged:\n{e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
