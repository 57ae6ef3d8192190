"""docs/tf_agents.md's install commands, exactly as written, in a new venv; then its example there. Also
what notebook 006's install cell installs.

The commands install TensorFlow, TF-Agents' dependencies and TF-Agents from the package index (pip's cache
serves them again on later runs), so that test takes minutes: it runs only when `RL_DATA_TF_RECIPE_TEST=1`
(`.ci/run` sets it unless it is set to 0) and is marked slow. Under CI (`CI=true`) with the variable unset, it
fails rather than skip, so a CI that stops setting it is noticed.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "tf_agents.md"
ENABLE_ENV = "RL_DATA_TF_RECIPE_TEST"
INSTALL_TIMEOUT_S = 1500


def _slow(test):
    return pytest.mark.slow(pytest.mark.timeout(INSTALL_TIMEOUT_S + 600)(test))


def doc_blocks() -> tuple:
    """The Install section's bash block (with the repository for `/path/to/rl-data-tf`) and the first
    Python block (the example)."""
    text = DOC.read_text(encoding="utf-8")
    install = re.search(r"## Install\n.*?```bash\n(.*?)```", text, re.S).group(1)
    assert "/path/to/rl-data-tf" in install, install
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    return install.replace("/path/to/rl-data-tf", str(REPO_ROOT)), example


def test_the_doc_names_every_module_import_tf_agents_needs():
    # Cheap, always run: the modules TF-Agents 0.19 imports at `import tf_agents` (and CartPole at
    # `suite_gym.load`) that nothing else installs, each in the install commands.
    install, _ = doc_blocks()
    for requirement in ('"gym==0.23.0"', "pygame", "gin-config", "cloudpickle", "tensorflow-probability",
                        "tf-keras"):
        assert requirement in install, f"{requirement} missing from docs/tf_agents.md's install commands"


def _notebook_006_install_cell() -> str:
    notebook = json.loads((REPO_ROOT / "notebooks" / "006_tf_agents_on_current_tf.ipynb").read_text("utf-8"))
    [cell] = [c for c in notebook["cells"] if "".join(c["source"]).startswith("#@title Install TF-Agents")]
    # Its `%pip` lines as calls recorded instead of run.
    return re.sub(r"^(\s*)%pip (.*)$", lambda m: f"{m.group(1)}PIP_CALLS.append({m.group(2)!r})",
                  "".join(cell["source"]), flags=re.M)


@pytest.mark.parametrize("absent, installs", [
    ((), False),
    (("pygame",), True),  # (tf_agents importable: the cell ran nothing and CartPole failed on pygame)
    (("gym",), True),
    (("tf_agents",), True),
])
def test_notebook_006_installs_whatever_is_missing(monkeypatch, absent, installs):
    monkeypatch.delenv("RL_DATA_TF_NOTEBOOK_TEST", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name in absent else importlib.machinery.ModuleSpec(name, None))
    calls: list = []
    exec(compile(_notebook_006_install_cell(), "notebook 006", "exec"), {"PIP_CALLS": calls})  # noqa: S102
    assert len(calls) == (2 if installs else 0), calls
    if installs:
        assert '"gym==0.23.0" pygame' in calls[0] and '--no-deps "tf-agents==0.19.0"' in calls[1], calls


@pytest.fixture(scope="module")
def recipe_venv(tmp_path_factory) -> pathlib.Path:
    enabled = os.environ.get(ENABLE_ENV)
    if enabled != "1":
        if enabled is None and os.environ.get("CI") == "true":
            pytest.fail(f"{ENABLE_ENV} is not set under CI (.ci/run sets it; 0 leaves the test out on purpose)")
        pytest.skip(f"set {ENABLE_ENV}=1 to install docs/tf_agents.md's recipe into a new venv")
    install, _ = doc_blocks()
    venv = tmp_path_factory.mktemp("tf-agents-recipe") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", install], env=env, capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT_S, cwd=venv.parent)
    assert done.returncode == 0, f"the install commands failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return venv


def _run(venv: pathlib.Path, code: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, cwd=cwd)


@_slow
def test_the_example_runs_in_the_recipe_venv(recipe_venv):
    _, example = doc_blocks()
    done = _run(recipe_venv, example, recipe_venv.parent)  # (not the repository: the installed package)
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.splitlines() == ["items: 3", "(8, 2, 4) (8, 2)"], done.stdout


@_slow
def test_cartpole_loads_in_the_recipe_venv(recipe_venv):
    done = _run(recipe_venv, "import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'\n"
                             "from tf_agents.environments import suite_gym\n"
                             "env = suite_gym.load('CartPole-v0')\n"
                             "print(env.reset().observation.shape)", recipe_venv.parent)
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.splitlines()[-1] == "(4,)", done.stdout
