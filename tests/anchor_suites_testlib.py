"""Runs the unit tests that the rlds 0.1.8 and tf-agents 0.19 wheels ship, against rl-data-tf.

The anchors' test files are copied at run time from the anchor-suite venv (`.ci/make_tf_agents_venv.sh`:
current TF, tf-agents 0.19 and rlds 0.1.8 installed with `--no-deps`) into a temporary directory; only
their import statements are rewritten, the way a user ports code (`from rlds import X` becomes
`from rlds_tf import X`, `from tf_agents.replay_buffers import tf_uniform_replay_buffer` becomes
`import replay_tf as tf_uniform_replay_buffer`). TF-Agents' own Reverb integration (`reverb_replay_buffer`,
`reverb_utils`, `rlds_to_reverb`) stays TF-Agents' code and runs on replay_tf through
`replay_tf.register_as_reverb()`, done by a `conftest.py` beside the copies. pytest runs them in that venv
with the repository root on PYTHONPATH and reports each test's outcome through a JUnit XML file.

Point `RL_DATA_TF_AGENTS_PYTHON` at the venv's interpreter (the script prints it). Without it the tests
skip with that instruction, except under CI (`CI=true`), where a missing venv is an error.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import textwrap
import xml.etree.ElementTree as ElementTree
from typing import Callable, Optional

import pytest

ENV_VAR = "RL_DATA_TF_AGENTS_PYTHON"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

# Modules of `tf_agents.replay_buffers` whose classes replay_tf provides under the same names (README,
# "Name map"): `from tf_agents.replay_buffers import <module>` becomes `import replay_tf as <module>`.
REPLAY_TF_BUFFER_MODULES = frozenset({
    "episodic_replay_buffer",
    "py_hashed_replay_buffer",
    "py_uniform_replay_buffer",
    "replay_buffer",
    "tf_uniform_replay_buffer",
})

# Helper modules shipped beside the anchors' tests: copied with them, imported as local modules.
LOCAL_HELPERS = {"rlds": ("rlds/transformations/transformations_testlib.py",), "tf_agents": ()}

# The conftest.py written beside the copies: absl flags parsed as under absltest's main (tf.test.TestCase
# reads them); at the end, the files that `reverb`, `rlds` and our packages were loaded from (so the harness
# can check which code ran); for TF-Agents' suites, replay_tf registered as `reverb` before any test
# imports it.
MODULES_REPORT = "modules.json"
REPORTED_MODULES = ("reverb", "rlds", "rlds_tf", "replay_tf")
_CONFTEST = f'''
import json
import os
import sys
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
from absl import flags
flags.FLAGS.mark_as_parsed()


def pytest_sessionfinish(session):
    files = {{name: getattr(sys.modules.get(name), "__file__", None) for name in {REPORTED_MODULES!r}}}
    with open({MODULES_REPORT!r}, "w") as f:
        json.dump(files, f)
'''
_CONFTEST_REVERB = '''
import replay_tf
replay_tf.register_as_reverb()
'''


@dataclasses.dataclass(frozen=True)
class Suite:
    """One test file of an anchor wheel.

    Attributes:
      path: the file, relative to the venv's site-packages (`tf_agents/replay_buffers/table_test.py`).
    """
    path: str

    @property
    def package(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def file_name(self) -> str:
        return pathlib.PurePosixPath(self.path).name

    @property
    def module_name(self) -> str:
        return pathlib.PurePosixPath(self.path).stem


@dataclasses.dataclass
class SuiteResult:
    """Per-test outcomes of one suite: test id (`file::Class::test`) -> 'passed', 'failed', 'error' or
    'skipped', with the failure message of each test that did not pass; `module_files`: the file each of
    `REPORTED_MODULES` was loaded from in the run (None: not imported)."""
    outcomes: dict[str, str]
    messages: dict[str, str]
    stdout_tail: str
    returncode: int
    module_files: dict[str, Optional[str]]


def anchor_python_or_skip() -> str:
    """The anchor-suite venv's interpreter; skips without it (fails under CI)."""
    python = os.environ.get(ENV_VAR)
    if python and os.path.exists(python):
        return python
    reason = (f"no anchor-suite venv: set {ENV_VAR} to the interpreter printed by "
              f"`bash .ci/make_tf_agents_venv.sh` (got {python!r})")
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must provide the anchor-suite venv: {reason}")
    pytest.skip(reason)


def site_packages(python: str, package: str) -> pathlib.Path:
    """The site-packages directory holding `package` in the venv of `python` (without importing it: rlds
    imports `reverb` at import time)."""
    code = (f"import importlib.util, os; spec = importlib.util.find_spec({package!r}); "
            f"print(os.path.dirname(list(spec.submodule_search_locations)[0]))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return pathlib.Path(out.stdout.strip())


def shipped_suites(python: str, package: str) -> list[str]:
    """Every `*_test.py` the installed `package` ships, relative to site-packages."""
    root = site_packages(python, package)
    return sorted(str(p.relative_to(root).as_posix()) for p in (root / package).rglob("*_test.py"))


# --- import rewriting --------------------------------------------------------------------------------

def _alias(name: str, asname: Optional[str]) -> str:
    return f"{name} as {asname}" if asname else name


def _rlds_rule(node: ast.stmt) -> Optional[list[str]]:
    """rlds -> rlds_tf; reverb -> replay_tf; the anchor's test helpers -> the local copies."""
    helpers = {pathlib.PurePosixPath(p).stem for p in LOCAL_HELPERS["rlds"]}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
            node.module == "rlds" or node.module.startswith("rlds.")):
        local = [a for a in node.names if a.name in helpers]
        rest = [a for a in node.names if a.name not in helpers]
        lines = [f"import {_alias(a.name, a.asname)}" for a in local]
        if rest:
            module = "rlds_tf" + node.module[len("rlds"):]
            lines.append(f"from {module} import {', '.join(_alias(a.name, a.asname) for a in rest)}")
        return lines
    if isinstance(node, ast.Import) and any(a.name in ("rlds", "reverb") for a in node.names):
        ours = {"rlds": "rlds_tf", "reverb": "replay_tf"}
        return [f"import {ours[a.name]} as {a.asname or a.name}" if a.name in ours
                else f"import {_alias(a.name, a.asname)}" for a in node.names]
    return None


def _tf_agents_rule(node: ast.stmt) -> Optional[list[str]]:
    """TF-Agents' buffer modules -> replay_tf; rlds -> rlds_tf. `reverb` and TF-Agents' Reverb integration
    are left as they are: the conftest registers replay_tf as `reverb`."""
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "tf_agents.replay_buffers":
        ours = [a for a in node.names if a.name in REPLAY_TF_BUFFER_MODULES]
        if not ours:
            return None
        rest = [a for a in node.names if a.name not in REPLAY_TF_BUFFER_MODULES]
        lines = [f"import replay_tf as {a.asname or a.name}" for a in ours]
        if rest:
            lines.append(f"from tf_agents.replay_buffers import {', '.join(_alias(a.name, a.asname) for a in rest)}")
        return lines
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith(
            "tf_agents.replay_buffers.") and node.module.rsplit(".", 1)[1] in REPLAY_TF_BUFFER_MODULES:
        return [f"from replay_tf import {', '.join(_alias(a.name, a.asname) for a in node.names)}"]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
            node.module == "rlds" or node.module.startswith("rlds.")):
        return _rlds_rule(node)
    return None


RULES: dict[str, Callable[[ast.stmt], Optional[list[str]]]] = {"rlds": _rlds_rule, "tf_agents": _tf_agents_rule}


def rewrite_imports(source: str, rule: Callable[[ast.stmt], Optional[list[str]]]) -> str:
    """Rewrites the import statements of `source` by `rule`; every other line is kept byte for byte.

    `rule(node)` returns the replacement statements (one per line) or None to keep the statement. A
    statement that shares its lines with other code (`import a; x = 1`) cannot be rewritten alone and
    raises ValueError.
    """
    lines = source.splitlines(keepends=True)
    replacements = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        new = rule(node)
        if new is None:
            continue
        first, last = node.lineno - 1, node.end_lineno - 1
        code = "".join(lines[first:last + 1])
        prefix = lines[first][:node.col_offset]
        suffix = lines[last].encode()[node.end_col_offset:].decode().strip()
        if prefix.strip() or (suffix and not suffix.startswith("#")):
            raise ValueError(f"import at line {node.lineno} shares its line with other code: {code!r}")
        replacements.append((first, last, "".join(f"{prefix}{stmt}\n" for stmt in new)))
    for first, last, text in sorted(replacements, reverse=True):
        lines[first:last + 1] = [text]
    return "".join(lines)


# --- running -----------------------------------------------------------------------------------------

def prepare(python: str, suites: list[Suite], work_dir: pathlib.Path) -> pathlib.Path:
    """Copies `suites` (one package's) and their helpers into `work_dir/<package>` with rewritten imports,
    plus a conftest.py and a pytest.ini of their own (the repository's settings are not the anchors')."""
    packages = {s.package for s in suites}
    if len(packages) != 1:
        raise ValueError(f"suites must come from one package, got {sorted(packages)}")
    package = packages.pop()
    root = site_packages(python, package)
    target = work_dir / package
    target.mkdir(parents=True, exist_ok=True)
    for path in [s.path for s in suites] + list(LOCAL_HELPERS[package]):
        source = (root / path).read_text(encoding="utf-8")
        (target / pathlib.PurePosixPath(path).name).write_text(rewrite_imports(source, RULES[package]),
                                                               encoding="utf-8")
    conftest = _CONFTEST + (_CONFTEST_REVERB if package == "tf_agents" else "")
    (target / "conftest.py").write_text(textwrap.dedent(conftest), encoding="utf-8")
    (target / "pytest.ini").write_text(
        "[pytest]\naddopts = -p no:cacheprovider\njunit_family = xunit1\n", encoding="utf-8")
    return target


def run(python: str, suites: list[Suite], work_dir: pathlib.Path, *, per_test_timeout_s: int,
        timeout_s: int) -> dict[str, SuiteResult]:
    """Runs `suites` (one package's) in one pytest process of the venv; returns each suite's outcomes."""
    target = prepare(python, suites, work_dir)
    junit = target / "junit.xml"
    # --tb=native: pytest's own traceback formatting re-parses each frame's source with ast.parse, which
    # CPython 3.11 can fail ("AST constructor recursion depth mismatch") on a deep failure, ending the run.
    cmd = [python, "-m", "pytest", "-q", "-rN", "--tb=native", f"--junitxml={junit}",
           f"--timeout={per_test_timeout_s}", "-p", "no:randomly", *[s.file_name for s in suites]]
    proc = subprocess.run(cmd, cwd=target, env=venv_env(), capture_output=True, text=True, timeout=timeout_s)
    tail = (proc.stdout + proc.stderr)[-6000:]
    if not junit.exists():
        raise RuntimeError(f"pytest in the anchor-suite venv wrote no report (exit {proc.returncode}):\n{tail}")
    by_file = parse_junit(junit)
    report = target / MODULES_REPORT
    module_files = json.loads(report.read_text()) if report.exists() else {}
    return {s.path: SuiteResult(*by_file.get(s.file_name, ({}, {})), stdout_tail=tail,
                                returncode=proc.returncode, module_files=module_files) for s in suites}


def parse_junit(path: pathlib.Path) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """file name -> (test id -> outcome, test id -> first line of its message) from a pytest xunit1 report.

    A test whose call failed is 'failed'; one that errored in setup or teardown only is 'error'.
    """
    results: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    for case in ElementTree.parse(path).iter("testcase"):
        file_name = pathlib.PurePosixPath(case.get("file", "")).name
        class_name = case.get("classname", "").rsplit(".", 1)[-1]
        test_id = f"{file_name}::{class_name}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            child = case.find(tag)
            if child is not None:
                outcome, message = name, (child.get("message") or child.text or "").strip()
                break
        outcomes, messages = results.setdefault(file_name, ({}, {}))
        outcomes[test_id] = outcome
        if message:
            messages[test_id] = message.splitlines()[0][:300]
    return results


def summary_line(suite: Suite, result: SuiteResult, excluded: set[str]) -> str:
    """`anchor suite <path>: P/T passed, F failing (E of them excluded), S skipped`."""
    counts = {k: 0 for k in ("passed", "failed", "error", "skipped")}
    for outcome in result.outcomes.values():
        counts[outcome] += 1
    not_passed = [t for t, o in result.outcomes.items() if o in ("failed", "error")]
    excluded_now = len([t for t in not_passed if t in excluded])
    total = len(result.outcomes)
    return (f"anchor suite {suite.path}: {counts['passed']}/{total} passed, {len(not_passed)} failing "
            f"({excluded_now} of them excluded), {counts['skipped']} skipped")



# --- running scripts in that venv, and a `replay-tf serve` process beside them ---

SERVE_START_TIMEOUT_S = 120


def venv_env(*extra_paths: pathlib.Path) -> dict:
    """The environment of a script run in the TF-Agents venv: the repository (and `extra_paths`) importable,
    Keras 2 for TF-Agents, no GPU, no pytest options of this run."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *map(str, extra_paths)]), TF_USE_LEGACY_KERAS="1",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="")
    return env


class ServeProcess:
    """`python -m replay_tf.cli serve` (this environment's Python) on a free loopback port, checkpointing into
    `checkpoint_dir` when given; `address` once it serves."""

    def __init__(self, config: pathlib.Path, log: pathlib.Path, *, checkpoint_dir: Optional[pathlib.Path] = None):
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        args = ["--checkpoint-dir", str(checkpoint_dir)] if checkpoint_dir is not None else []
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "replay_tf.cli", "serve", "--config", str(config), "--host", "localhost",
             *args, "--stats-interval", "3600"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        prefix = "replay-tf: serving tables "
        try:
            line = self._lines.get(timeout=SERVE_START_TIMEOUT_S) or ""
        except queue.Empty:
            line = ""
        if not line.startswith(prefix):
            self.stop()
            raise RuntimeError(f"replay-tf serve did not start (got {line!r}):\n{log.read_text()[-3000:]}")
        self.address = line.rsplit(" on ", 1)[1].split()[0]

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def stop(self) -> int:
        """Stops the server (SIGTERM, then SIGKILL after a minute); returns its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode
