"""TF-Agents 0.19 and rlds 0.1.8 themselves on current TF, with replay_tf as their Reverb.

The scripts in `tests/tf_agents_scripts/` run in the TF-Agents venv (`.ci/make_tf_agents_venv.sh`: current
TF, tf-keras, TF-Agents 0.19 and rlds 0.1.8 installed with `--no-deps`; the repository on PYTHONPATH) after
`replay_tf.register_as_reverb()`. One venv process per server kind runs every check and writes a JSON
report; each check is one test case here:
  - `in_process`: the tables of `tables.json` built with Reverb's API in a `reverb.Server` of the script;
  - `serve`: a `replay-tf serve --config` process on a loopback port (gRPC), the script its client.
Checks (expected values computed by hand from what was written; see the scripts' docstrings):
TF-Agents' `ReverbReplayBuffer` (`as_dataset` with `sample_batch_size`, `num_steps`, `num_parallel_calls`,
`single_deterministic_pass`; `num_frames`; `update_priorities` eager and in `tf.function`; `get_next`,
`add_batch` and `gather_all` raising as TF-Agents' do), `ReverbAddTrajectoryObserver` (`stride_length`,
`pad_end_of_episodes`), `ReverbAddEpisodeObserver` into a FIFO table sampled once (PPO's use),
`ReverbTrajectorySequenceObserver`, and `rlds_to_reverb.push_rlds_to_reverb` on a recording made by
`rlds_tf.EnvLogger`, with rlds 0.1.8 as its `rlds` and with rlds_tf registered as `rlds`. In the
`in_process` run, rlds 0.1.8 (importing replay_tf as its `reverb`) is also compared with rlds_tf
transformation by transformation (`rlds_checks.py`), and the example of docs/tf_agents.md runs.

The adapter checks (all but the rlds_tf one) also run on dm-reverb 0.14, TF-Agents 0.19 and rlds 0.1.8 in
the peer venv (TF 2.15), on a recording made here: their expected values are the anchors' behaviour.

Point `RL_DATA_TF_AGENTS_PYTHON` at the venv's interpreter (and `RL_DATA_PEER_PYTHON` at the peer's);
without it the tests skip, except under CI (`CI=true`), where a missing venv is an error.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess

import pytest

import anchor_suites_testlib
import peer_testlib

SCRIPTS = pathlib.Path(__file__).resolve().parent / "tf_agents_scripts"
REPO_ROOT = anchor_suites_testlib.REPO_ROOT

ADAPTER_CHECKS = [
    "add_trajectory_observer_stride",
    "add_trajectory_observer_pad_end_of_episodes",
    "trajectory_sequence_observer",
    "add_episode_observer_queue",
    "update_priorities",
    "rlds_to_reverb_with_rlds",
    "rlds_to_reverb_with_rlds_tf",
]
RLDS_CHECKS = [
    "rlds_imports_on_replay_tf",
    "rlds_episode_length_and_final_step",
    "rlds_sum_and_map",
    "rlds_batch_and_alignment",
    "rlds_concat_and_truncate",
    "rlds_mean_and_std",
    "rlds_pattern_map_from_transform",
]
SERVER_KINDS = ("in_process", "serve")
SCRIPT_TIMEOUT_S = 400
SERVE_START_TIMEOUT_S = anchor_suites_testlib.SERVE_START_TIMEOUT_S

_reports: dict[str, dict] = {}


def serve_config(work_dir: pathlib.Path) -> pathlib.Path:
    """tables.json as a `replay-tf serve` config: the shared signature written into the tables naming it."""
    config = json.loads((SCRIPTS / "tables.json").read_text())
    signature = config.pop("RLDS_TRAJECTORY")
    for table in config["tables"]:
        if table.get("signature") == "RLDS_TRAJECTORY":
            table["signature"] = signature
    path = work_dir / "serve.json"
    path.write_text(json.dumps(config))
    return path


def run_checks(python: str, kind: str, work_dir: pathlib.Path) -> dict:
    """Runs every check against a server of `kind` in one venv process; returns the JSON report."""
    report = work_dir / f"report-{kind}.json"
    cmd = [python, str(SCRIPTS / "reverb_adapters.py"), "--tables", str(SCRIPTS / "tables.json"),
           "--report", str(report)]
    serve = None
    if kind == "serve":
        serve = anchor_suites_testlib.ServeProcess(serve_config(work_dir), work_dir / "serve.log")
        cmd += ["--address", serve.address]
    else:
        cmd += ["--rlds"]
    try:
        proc = subprocess.run(cmd, cwd=work_dir, env=anchor_suites_testlib.venv_env(SCRIPTS), capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT_S)
    finally:
        if serve is not None:
            serve.stop()
    if proc.returncode != 0 or not report.exists():
        raise RuntimeError(f"the checks' script failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-6000:]}")
    return json.loads(report.read_text())


def _report(kind: str, python: str, tmp_path_factory) -> dict:
    if kind not in _reports:
        _reports[kind] = run_checks(python, kind, tmp_path_factory.mktemp(f"tf-agents-{kind}"))
    return _reports[kind]


@pytest.fixture(scope="module")
def tf_agents_python():
    return anchor_suites_testlib.anchor_python_or_skip()


def _assert_check(report: dict, name: str):
    assert name in report, f"check {name} did not run; the report has {sorted(report)}"
    assert report[name]["ok"], f"check {name} failed in the TF-Agents venv:\n{report[name]['error']}"


@pytest.mark.slow
@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S + SERVE_START_TIMEOUT_S)
@pytest.mark.parametrize("name", ADAPTER_CHECKS)
@pytest.mark.parametrize("kind", SERVER_KINDS)
def test_tf_agents_reverb_adapters(kind, name, tf_agents_python, tmp_path_factory):
    _assert_check(_report(kind, tf_agents_python, tmp_path_factory), name)


@pytest.mark.slow
@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S)
@pytest.mark.parametrize("name", RLDS_CHECKS)
def test_rlds_0_1_8_on_replay_tf_matches_rlds_tf(name, tf_agents_python, tmp_path_factory):
    _assert_check(_report("in_process", tf_agents_python, tmp_path_factory), name)


@pytest.mark.slow
@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S)
def test_docs_example_runs(tf_agents_python, tmp_path_factory):
    _assert_check(_report("in_process", tf_agents_python, tmp_path_factory), "docs_example")


@pytest.mark.slow
@pytest.mark.parametrize("kind, expected", [("in_process", ADAPTER_CHECKS + RLDS_CHECKS + ["docs_example"]),
                                            ("serve", ADAPTER_CHECKS)])
def test_every_check_is_listed(kind, expected, tf_agents_python, tmp_path_factory):
    assert sorted(_report(kind, tf_agents_python, tmp_path_factory)) == sorted(expected)


# The same checks on dm-reverb 0.14, TF-Agents 0.19 and rlds 0.1.8 in the peer venv (TF 2.15): the values
# they expect are the anchors' behaviour. The peer has no rl-data-tf, so the recording is made here.
PEER_CHECKS = [name for name in ADAPTER_CHECKS if name != "rlds_to_reverb_with_rlds_tf"]
_peer_report: dict = {}


def _recorded_episodes_module():
    spec = importlib.util.spec_from_file_location("recorded_episodes", SCRIPTS / "recorded_episodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_checks_on_dm_reverb(python: str, work_dir: pathlib.Path) -> dict:
    recording = work_dir / "recording"
    recording.mkdir()
    _recorded_episodes_module().record(str(recording))
    report = work_dir / "report-dm-reverb.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "TF_USE_LEGACY_KERAS")}
    env.update(PYTHONPATH=str(SCRIPTS), RL_DATA_CHECKS_ON_DM_REVERB="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([python, str(SCRIPTS / "reverb_adapters.py"), "--tables", str(SCRIPTS / "tables.json"),
                           "--report", str(report), "--recording", str(recording)],
                          cwd=work_dir, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    if proc.returncode != 0 or not report.exists():
        raise RuntimeError(f"the checks' script failed on dm-reverb (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-6000:]}")
    return json.loads(report.read_text())


@pytest.mark.peer
@pytest.mark.slow
@pytest.mark.timeout(2 * SCRIPT_TIMEOUT_S)
@pytest.mark.parametrize("name", PEER_CHECKS)
def test_checks_hold_on_dm_reverb(name, tmp_path_factory):
    peer = peer_testlib.get_peer_or_skip()
    if not _peer_report:
        _peer_report.update(run_checks_on_dm_reverb(peer.python, tmp_path_factory.mktemp("dm-reverb")))
    assert sorted(_peer_report) == sorted(PEER_CHECKS)
    _assert_check(_peer_report, name)


def test_serve_config_inlines_the_shared_signature(tmp_path):
    config = json.loads(serve_config(tmp_path).read_text())
    shared = json.loads((SCRIPTS / "tables.json").read_text())["RLDS_TRAJECTORY"]
    with_signature = {t["name"]: t["signature"] for t in config["tables"] if "signature" in t}
    assert with_signature == {"rlds_via_rlds": shared, "rlds_via_rlds_tf": shared}
    assert "RLDS_TRAJECTORY" not in config
