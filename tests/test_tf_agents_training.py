"""TF-Agents 0.19's training loop on current TF, with replay_tf as its Reverb: the agents learn CartPole.

`tf_agents_scripts/train_cartpole.py` runs in the TF-Agents venv (`.ci/make_tf_agents_venv.sh`: current TF,
tf-keras, TF-Agents 0.19 installed with `--no-deps`, gym 0.23; the repository on PYTHONPATH) after
`replay_tf.register_as_reverb()`: TF-Agents' own `tf_agents.train` `Actor`s collect through
`ReverbAddTrajectoryObserver` into tables of a `reverb.Server`, a `Learner` (`PPOLearner`) trains from
`ReverbReplayBuffer.as_dataset`, and `triggers.ReverbCheckpointTrigger` checkpoints the server. DQN runs
against an in-process server and against a `replay-tf serve` process on a loopback port; PPO (two FIFO
tables sampled once, cleared after every iteration) against an in-process server.

Learning is the assertion: with the seeds fixed, the greedy policy's average return on fixed evaluation
episodes starts near CartPole's floor (the untrained network pushes one way, ~10 steps) and, after training,
is far above it and above a random policy's (~22). Sampling order inside the server is not seeded, so the
thresholds leave room for run-to-run variation.

`test_notebook_006_runs` executes `notebooks/006_tf_agents_on_current_tf.ipynb` with nbclient in the same
venv (the main environment has no tf_agents, so `test_notebooks.py` skips it there).

Point `RL_DATA_TF_AGENTS_PYTHON` at the venv's interpreter; without it the tests skip, except under CI
(`CI=true`), where a missing venv is an error.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

import anchor_suites_testlib

REPO_ROOT = anchor_suites_testlib.REPO_ROOT
SCRIPT = pathlib.Path(__file__).resolve().parent / "tf_agents_scripts" / "train_cartpole.py"
NOTEBOOK = REPO_ROOT / "notebooks" / "006_tf_agents_on_current_tf.ipynb"
SCRIPT_TIMEOUT_S = 400
SERVE_START_TIMEOUT_S = anchor_suites_testlib.SERVE_START_TIMEOUT_S
EXIT_GRACE_S = 60
# Collect/train steps of DQN (one environment step, one batch of 64 per step) and collect/train iterations
# of PPO (500 environment steps, 4 epochs of minibatches of 64 per iteration): enough to lift the greedy
# return far above its start on CartPole with margin for the unseeded sampling order.
DQN_ITERATIONS = 1500
PPO_ITERATIONS = 5
# The untrained greedy policy's return (deterministic: fixed seeds for the network and the evaluation).
UNTRAINED_RETURN_AT_MOST = 15.0
# The trained greedy policy must beat the untrained one by this much (a random policy gets ~22).
LEARNED_GAIN_AT_LEAST = 30.0


def _load_script_module():
    """The training script as a module (its module level only defines names), for `TABLES_CONFIG`."""
    spec = importlib.util.spec_from_file_location("train_cartpole", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_cartpole = _load_script_module()


def _train(python: str, work_dir: pathlib.Path, agent: str, iterations: int, *,
           server_address: str | None = None) -> dict:
    """Runs the training script in the venv; returns its JSON result."""
    out = work_dir / "result.json"
    cmd = [python, str(SCRIPT), "--agent", agent, "--iterations", str(iterations),
           "--root-dir", str(work_dir / "root"), "--out", str(out)]
    if server_address is not None:
        cmd += ["--server-address", server_address]
    log = work_dir / f"{agent}.log"
    with open(log, "wb") as log_file:
        # (PYTHONFAULTHANDLER: a process that hangs is sent SIGABRT first, which prints every thread's stack)
        env = dict(anchor_suites_testlib.venv_env(), PYTHONFAULTHANDLER="1")
        proc = subprocess.Popen(cmd, cwd=work_dir, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + SCRIPT_TIMEOUT_S
        exit_deadline = None
        while (returncode := proc.poll()) is None:
            # The result is written just before the script returns: a process still there `EXIT_GRACE_S`
            # later trained and then failed to exit (e.g. blocked in garbage collection at interpreter
            # shutdown), as a user's training job would.
            if exit_deadline is None and out.exists():
                exit_deadline = time.monotonic() + EXIT_GRACE_S
            if time.monotonic() > min(deadline, exit_deadline or deadline):
                proc.send_signal(signal.SIGABRT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                state = "wrote its result but did not exit" if exit_deadline else "did not finish"
                pytest.fail(f"training {agent} in the TF-Agents venv {state} (its threads' stacks at the end):\n"
                            f"{log.read_text(errors='replace')[-12000:]}")
            time.sleep(1)
    if returncode != 0 or not out.exists():
        pytest.fail(f"training {agent} in the TF-Agents venv failed (exit {returncode}):\n"
                    f"{log.read_text(errors='replace')[-6000:]}")
    return json.loads(out.read_text())


def _assert_learned(result: dict):
    curve = ", ".join(f"step {step}: {value:.1f}" for step, value in result["curve"])
    description = f"return before training {result['return_before']:.1f}; during training {curve}"
    assert result["reverb_file"] == str(REPO_ROOT / "replay_tf" / "__init__.py"), result["reverb_file"]
    assert result["return_before"] <= UNTRAINED_RETURN_AT_MOST, description
    # DQN's greedy return oscillates while it learns: the better of the last two evaluations counts.
    learned = max(value for _, value in result["curve"][-2:])
    assert learned >= result["return_before"] + LEARNED_GAIN_AT_LEAST, description


@pytest.fixture(scope="module")
def tf_agents_python():
    return anchor_suites_testlib.anchor_python_or_skip()


@pytest.mark.slow
@pytest.mark.timeout(SCRIPT_TIMEOUT_S + 60)
def test_dqn_learns_cartpole_with_an_in_process_server(tf_agents_python, tmp_path):
    result = _train(tf_agents_python, tmp_path, "dqn", DQN_ITERATIONS)
    _assert_learned(result)
    assert result["train_steps"] == DQN_ITERATIONS
    # Every collected step after an episode's first closes one 2-step item (stride 1): at least one item
    # per training iteration reached the table.
    assert result["inserts"][train_cartpole.DQN_TABLE] >= DQN_ITERATIONS
    # ReverbCheckpointTrigger called Client.checkpoint() on the server's DefaultCheckpointer.
    assert result["checkpoints"], "ReverbCheckpointTrigger wrote no checkpoint"


@pytest.mark.slow
@pytest.mark.timeout(SCRIPT_TIMEOUT_S + 60)
def test_ppo_learns_cartpole_with_an_in_process_server(tf_agents_python, tmp_path):
    result = _train(tf_agents_python, tmp_path, "ppo", PPO_ITERATIONS)
    _assert_learned(result)
    assert len(result["curve"]) == PPO_ITERATIONS
    # PPOLearner ran one pass of minibatches per epoch over each 500-step sequence it sampled: no
    # iteration went without data (a FIFO table sampled once, then cleared).
    steps = [step for step, _ in result["curve"]]
    assert steps[0] > 0 and all(b - a == steps[0] for a, b in zip(steps, steps[1:])), steps
    assert result["checkpoints"], "ReverbCheckpointTrigger wrote no checkpoint"


@pytest.mark.slow
@pytest.mark.timeout(SCRIPT_TIMEOUT_S + SERVE_START_TIMEOUT_S + 120)
def test_dqn_learns_cartpole_with_a_replay_tf_serve_process(tf_agents_python, tmp_path):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps(train_cartpole.TABLES_CONFIG["dqn"]))
    checkpoint_dir = tmp_path / "checkpoints"
    serve = anchor_suites_testlib.ServeProcess(config, tmp_path / "serve.log", checkpoint_dir=checkpoint_dir)
    try:
        result = _train(tf_agents_python, tmp_path, "dqn", DQN_ITERATIONS, server_address=serve.address)
        # Written by ReverbCheckpointTrigger over gRPC (the server's own exit checkpoint comes after stop).
        checkpoints = sorted(os.listdir(checkpoint_dir)) if checkpoint_dir.is_dir() else []
    finally:
        returncode = serve.stop()
    _assert_learned(result)
    assert result["train_steps"] == DQN_ITERATIONS
    assert result["inserts"][train_cartpole.DQN_TABLE] >= DQN_ITERATIONS
    assert checkpoints, "ReverbCheckpointTrigger wrote no checkpoint into the serve process's --checkpoint-dir"
    assert returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]


def test_serve_config_builds_the_tables_the_in_process_server_has():
    """The tables `replay-tf serve` gets from `TABLES_CONFIG` equal those the script builds in-process."""
    import replay_tf as reverb
    from replay_tf import cli

    for agent in ("dqn", "ppo"):
        config = train_cartpole.TABLES_CONFIG[agent]
        from_config = [table.info for table in cli.build_tables(config)]
        built = [table.info for table in train_cartpole._tables(reverb, agent)]
        assert from_config == built, agent


_EXECUTE_NOTEBOOK = """
import sys
import nbclient
import nbformat
sys.path.insert(0, sys.argv[1])
import refresh_outputs
notebook = nbformat.read(sys.argv[2], as_version=4)
try:
    refresh_outputs.execute_notebook(notebook, sys.argv[3])
finally:
    nbformat.write(notebook, sys.argv[4])
"""


@pytest.mark.slow
@pytest.mark.timeout(SCRIPT_TIMEOUT_S + 60)
def test_notebook_006_runs(tf_agents_python, tmp_path):
    """006 runs top to bottom in a kernel of the TF-Agents venv, as `refresh_outputs.py` runs it, and its DQN
    learns (the printed learning curve rises far above its start)."""
    nbformat = pytest.importorskip("nbformat")
    executed = tmp_path / "executed.ipynb"
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    proc = subprocess.run(
        [tf_agents_python, "-c", _EXECUTE_NOTEBOOK, str(REPO_ROOT / "notebooks"), str(NOTEBOOK), str(work_dir),
         str(executed)], cwd=tmp_path, env=anchor_suites_testlib.venv_env(), capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    assert proc.returncode == 0 and executed.exists(), (proc.stdout + proc.stderr)[-6000:]
    notebook = nbformat.read(executed, as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    assert not [o for cell in cells for o in cell.outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for cell in cells for o in cell.outputs if o.output_type == "stream")
    assert "reverb is replay_tf: True" in text, text
    curve = [float(v) for v in re.findall(r"^train step \d+: average return ([\d.]+)$", text, re.MULTILINE)]
    # The first evaluation is the untrained policy's (step 0), deterministic under the notebook's seed.
    assert len(curve) >= 3 and curve[0] <= UNTRAINED_RETURN_AT_MOST, text
    assert max(curve[-2:]) >= curve[0] + LEARNED_GAIN_AT_LEAST, text
    checkpoints = re.search(r"^Reverb checkpoints on disk after the trigger ran: (\d+)$", text, re.MULTILINE)
    assert checkpoints and int(checkpoints.group(1)) >= 1, text
    assert any("image/png" in o.get("data", {}) for cell in cells for o in cell.outputs), "no learning-curve plot"


def test_refresh_outputs_leaves_out_a_notebook_whose_module_is_missing(monkeypatch, capsys):
    """`refresh_outputs.py` without paths skips a notebook this interpreter cannot run, and refuses it by
    name with the fix (run with a Python that has the module)."""
    pytest.importorskip("nbclient")
    spec = importlib.util.spec_from_file_location("refresh_outputs", REPO_ROOT / "notebooks" / "refresh_outputs.py")
    refresh_outputs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(refresh_outputs)
    name = "no_such_module_for_the_refresh_test"
    monkeypatch.setattr(refresh_outputs, "REQUIRED_MODULES", {NOTEBOOK.name: name})
    assert refresh_outputs.missing_module(str(NOTEBOOK)) == name
    assert refresh_outputs.missing_module(str(REPO_ROOT / "notebooks" / "001_reverb_demo.ipynb")) is None
    refreshed = []
    monkeypatch.setattr(refresh_outputs, "refresh", refreshed.append)
    assert refresh_outputs.main([]) == 0
    assert str(NOTEBOOK) not in refreshed and len(refreshed) == len(refresh_outputs.notebook_paths()) - 1
    assert f"skipping notebooks/{NOTEBOOK.name} needs {name}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        refresh_outputs.main([str(NOTEBOOK)])
    assert raised.value.code == 2
    assert "run this script with a Python that has it" in capsys.readouterr().err


def test_notebook_006_tf_agents_install_cell(monkeypatch):
    """006's second cell installs TF-Agents 0.19 the way that works on current TF (its dependencies at
    versions for the installed TensorFlow, then tf-agents without its TF-2.15-era pins), and nothing when
    tf_agents is importable or under the notebook tests."""
    nbformat = pytest.importorskip("nbformat")
    transformer = pytest.importorskip("IPython.core.inputtransformer2")
    source = nbformat.read(NOTEBOOK, as_version=4).cells[2].source
    code = compile(transformer.TransformerManager().transform_cell(source), "006[2]", "exec")

    class RecordingShell:
        def __init__(self, namespace):
            self.namespace, self.magics = namespace, []

        def run_line_magic(self, name, line):
            self.magics.append((name, line.format_map(self.namespace)))

    def run(*, notebook_test, importable):
        # Each module the cell checks is importable or missing as the case says, whatever this environment
        # holds; any other lookup is the real one.
        find_spec = importlib.util.find_spec
        checked = {"tf_agents", "tf_keras", "tensorflow_probability", "gin", "cloudpickle", "gym", "pygame"}
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
            find_spec(name, *a) if name not in checked else (object() if importable else None)))
        if notebook_test:
            monkeypatch.setenv("RL_DATA_TF_NOTEBOOK_TEST", "1")
        else:
            monkeypatch.delenv("RL_DATA_TF_NOTEBOOK_TEST", raising=False)
        namespace = {}
        shell = RecordingShell(namespace)
        namespace["get_ipython"] = lambda: shell
        exec(code, namespace)  # noqa: S102  (our own notebook)
        return shell.magics

    tf_minor = ".".join(importlib.metadata.version("tensorflow").split(".")[:2])
    assert run(notebook_test=False, importable=False) == [
        ("pip", f'install -q "tf-keras~={tf_minor}.0" "tensorflow-probability[tf]" gin-config cloudpickle '
                f'"gym==0.23.0" pygame tensorboard'),
        ("pip", 'install -q --no-deps "tf-agents==0.19.0"')]
    assert run(notebook_test=True, importable=False) == []
    assert run(notebook_test=False, importable=True) == []
