"""The anchors' own unit tests (rlds 0.1.8, tf-agents 0.19 replay buffers) run against rl-data-tf.

Each shipped test file is one case: its tests run in the anchor-suite venv after only their imports are
changed (see `anchor_suites_testlib`), and the case fails on any failing test that `EXCLUDED` does not
list with its reason. The per-suite pass counts are printed (`anchor suite <file>: P/T passed, ...`).
"""
from __future__ import annotations

import subprocess
import textwrap

import pytest

import anchor_suites_testlib as lib

RLDS_SUITES = [
    "rlds/rlds_types_test.py",
    "rlds/tfds/config_generator_test.py",
    "rlds/transformations/alignment_test.py",
    "rlds/transformations/batched_helpers_test.py",
    "rlds/transformations/dataset_concat_test.py",
    "rlds/transformations/dataset_stats_test.py",
    "rlds/transformations/dataset_truncate_test.py",
    "rlds/transformations/flexible_batch_test.py",
    "rlds/transformations/nested_ops_test.py",
    "rlds/transformations/pattern_test.py",
    "rlds/transformations/shape_ops_test.py",
]
TF_AGENTS_SUITES = [
    "tf_agents/replay_buffers/episodic_replay_buffer_driver_test.py",
    "tf_agents/replay_buffers/episodic_replay_buffer_test.py",
    "tf_agents/replay_buffers/py_replay_buffers_test.py",
    "tf_agents/replay_buffers/replay_buffer_test.py",
    "tf_agents/replay_buffers/reverb_replay_buffer_test.py",
    "tf_agents/replay_buffers/reverb_utils_test.py",
    "tf_agents/replay_buffers/rlds_to_reverb_test.py",
    "tf_agents/replay_buffers/tf_uniform_replay_buffer_test.py",
]
# Shipped test files that are not run, with the reason.
NOT_RUN = {
    "tf_agents/replay_buffers/table_test.py":
        "tests tf_agents.replay_buffers.table, the tf.Variable storage class inside TFUniformReplayBuffer: an "
        "implementation module with no counterpart in replay_tf (whose ring storage is "
        "replay_tf/buffers/_ring.py); the buffer's own suite covers the behaviour users see",
    "tf_agents/replay_buffers/episodic_table_test.py":
        "tests tf_agents.replay_buffers.episodic_table, the storage class inside EpisodicReplayBuffer: an "
        "implementation module with no counterpart in replay_tf; the buffer's own suites cover it",
}

# Failing anchor tests that are known, by test id (`file::Class::test`), each with its cause. Grouped by
# cause; a test that passes again is reported by its case ("excluded but passing now") for removal.
EXCLUDED: dict[str, str] = {
    # --- documented differences ---
    **{f"py_replay_buffers_test.py::PyUniformReplayBufferTest::testEmptyBuffer{kind}{hashing}":
       "sampling an empty PyUniformReplayBuffer / PyHashedReplayBuffer raises ValueError (documented in "
       "replay_tf/buffers/py_uniform.py); TF-Agents returns uninitialized np.empty arrays"
       for kind in ("", "BatchSize", "NumSteps") for hashing in ("WithHashing", "WithoutHashing")},
}

# The child pytest's limits: one test, and one package's whole run.
PER_TEST_TIMEOUT_S = 300
RUN_TIMEOUT_S = 1500

_results: dict[str, dict[str, lib.SuiteResult] | Exception] = {}


def _results_for(package: str, python: str, tmp_path_factory) -> dict[str, lib.SuiteResult]:
    """Runs every suite of `package` once (in one process) and caches the outcomes for the cases; a run
    that failed as a whole fails every case of the package without running again."""
    if package not in _results:
        suites = [lib.Suite(p) for p in RLDS_SUITES + TF_AGENTS_SUITES if p.startswith(f"{package}/")]
        try:
            _results[package] = lib.run(python, suites, tmp_path_factory.mktemp(f"anchor-{package}"),
                                        per_test_timeout_s=PER_TEST_TIMEOUT_S, timeout_s=RUN_TIMEOUT_S)
        except (RuntimeError, subprocess.SubprocessError) as e:
            _results[package] = e
    outcome = _results[package]
    if isinstance(outcome, Exception):
        pytest.fail(f"the {package} anchor suites did not run: {outcome}")
    return outcome


@pytest.fixture(scope="module")
def anchor_python():
    return lib.anchor_python_or_skip()


@pytest.mark.peer
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
@pytest.mark.parametrize("path", RLDS_SUITES + TF_AGENTS_SUITES)
def test_anchor_suite(path, anchor_python, tmp_path_factory, capsys):
    suite = lib.Suite(path)
    result = _results_for(suite.package, anchor_python, tmp_path_factory)[path]
    excluded = {t for t in EXCLUDED if t.startswith(f"{suite.file_name}::")}
    failing = {t: result.messages.get(t, "") for t, o in result.outcomes.items() if o in ("failed", "error")}
    with capsys.disabled():
        print(f"\n{lib.summary_line(suite, result, excluded)}")
        now_passing = sorted(t for t in excluded if result.outcomes.get(t) == "passed")
        if now_passing:
            print(f"  excluded but passing now (remove from EXCLUDED): {', '.join(now_passing)}")
    assert result.outcomes, f"no test of {path} ran (pytest exit {result.returncode}):\n{result.stdout_tail}"
    # The code under test is the repository's: `reverb` is replay_tf, and rlds's suites never load rlds.
    ours = {name: str(lib.REPO_ROOT / name / "__init__.py") for name in ("replay_tf", "rlds_tf")}
    files = result.module_files
    assert files.get("reverb") in (None, ours["replay_tf"]), files
    assert any(files.get(name) == file for name, file in ours.items()), files
    if suite.package == "rlds":
        assert files.get("rlds") is None, files
    unknown = sorted(t for t in excluded if t not in result.outcomes)
    assert not unknown, f"EXCLUDED names tests that {path} does not have: {unknown}"
    unexpected = {t: m for t, m in failing.items() if t not in excluded}
    assert not unexpected, "anchor tests failing that EXCLUDED does not list:\n" + "\n".join(
        f"  {t}: {m}" for t, m in sorted(unexpected.items()))


@pytest.mark.peer
@pytest.mark.slow
@pytest.mark.parametrize("package, prefix", [("rlds", "rlds/"), ("tf_agents", "tf_agents/replay_buffers/")])
def test_every_shipped_suite_is_run_or_listed(package, prefix, anchor_python):
    shipped = {p for p in lib.shipped_suites(anchor_python, package) if p.startswith(prefix)}
    listed = {p for p in RLDS_SUITES + TF_AGENTS_SUITES + list(NOT_RUN) if p.startswith(prefix)}
    assert shipped == listed


# --- the import rewriting itself (no venv needed) -------------------------------------------------------

@pytest.mark.parametrize("package, source, expected", [
    ("rlds",
     "from rlds import rlds_types\nfrom rlds.transformations import alignment\n",
     "from rlds_tf import rlds_types\nfrom rlds_tf.transformations import alignment\n"),
    ("rlds",
     "from rlds.transformations import transformations_testlib\nimport reverb\nimport rlds\n",
     "import transformations_testlib\nimport replay_tf as reverb\nimport rlds_tf as rlds\n"),
    ("rlds",
     "import tensorflow as tf  # keep\nx = 'from rlds import y'\n",
     "import tensorflow as tf  # keep\nx = 'from rlds import y'\n"),
    ("tf_agents",
     "from tf_agents.replay_buffers import tf_uniform_replay_buffer  # pylint: x\n"
     "from tf_agents.replay_buffers import reverb_utils\nimport reverb\n",
     "import replay_tf as tf_uniform_replay_buffer\n"
     "from tf_agents.replay_buffers import reverb_utils\nimport reverb\n"),
    ("tf_agents",
     "def f():\n  from tf_agents.replay_buffers.py_uniform_replay_buffer import PyUniformReplayBuffer\n  return 1\n",
     "def f():\n  from replay_tf import PyUniformReplayBuffer\n  return 1\n"),
    ("tf_agents",
     "from tf_agents.replay_buffers import (\n    episodic_replay_buffer,\n    table)\nfrom rlds import rlds_types\n",
     "import replay_tf as episodic_replay_buffer\nfrom tf_agents.replay_buffers import table\n"
     "from rlds_tf import rlds_types\n"),
])
def test_rewrite_imports(package, source, expected):
    assert lib.rewrite_imports(source, lib.RULES[package]) == expected


def test_rewrite_refuses_an_import_sharing_its_line():
    with pytest.raises(ValueError, match="line 1 shares its line"):
        lib.rewrite_imports("import reverb; x = 1\n", lib.RULES["rlds"])


def test_parse_junit_outcomes(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase classname="a_test.ATest" name="test_ok" file="a_test.py"/>
          <testcase classname="a_test.ATest" name="test_bad" file="a_test.py">
            <failure message="AssertionError: 1 != 2">trace</failure></testcase>
          <testcase classname="a_test.ATest" name="test_setup" file="a_test.py">
            <error message="failed on setup">trace</error></testcase>
          <testcase classname="b_test.BTest" name="test_skip" file="b_test.py">
            <skipped message="no GPU"/></testcase>
        </testsuite></testsuites>"""))
    assert lib.parse_junit(report) == {
        "a_test.py": ({"a_test.py::ATest::test_ok": "passed", "a_test.py::ATest::test_bad": "failed",
                       "a_test.py::ATest::test_setup": "error"},
                      {"a_test.py::ATest::test_bad": "AssertionError: 1 != 2",
                       "a_test.py::ATest::test_setup": "failed on setup"}),
        "b_test.py": ({"b_test.py::BTest::test_skip": "skipped"}, {"b_test.py::BTest::test_skip": "no GPU"}),
    }
