"""The command lines answer --help without importing TensorFlow, and the packages import TF only when used.

Each case runs in a fresh interpreter: whether TensorFlow is imported is a property of a process's first
imports, which the test process (TF already loaded) cannot show.
"""
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]

# Importing TensorFlow takes seconds; argument parsing alone takes milliseconds. The bound leaves room for
# a loaded machine while still failing when TF is imported on the way.
_HELP_SECONDS = 2.5


def _run(code: str) -> dict:
    """Runs `code` in a fresh interpreter at the repository root; returns the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=_REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module, argv, usage", [
    ("replay_tf.cli", ["--help"], "usage: replay-tf"),
    ("replay_tf.cli", ["serve", "--help"], "usage: replay-tf serve"),
    ("rlds_tf.cli", ["--help"], "usage: rlds-tf"),
    ("rlds_tf.cli", ["info", "--help"], "usage: rlds-tf info"),
    ("rlds_tf.cli", ["convert", "--help"], "usage: rlds-tf convert"),
])
def test_help_does_not_import_tensorflow(module, argv, usage):
    result = _run(f"""
        import contextlib, io, json, sys, time
        start = time.monotonic()
        from {module} import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main({argv!r})
                code = None
            except SystemExit as e:
                code = e.code
        print(json.dumps({{"code": code, "seconds": time.monotonic() - start, "help": out.getvalue(),
                           "tensorflow": "tensorflow" in sys.modules}}))
    """)
    assert result["code"] == 0
    assert result["help"].startswith(usage), result["help"]
    assert result["tensorflow"] is False
    assert result["seconds"] < _HELP_SECONDS, result["seconds"]


def test_bad_arguments_fail_before_tensorflow():
    result = _run("""
        import contextlib, io, json, sys
        from replay_tf.cli import main
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                main(["serve"])
                code = None
            except SystemExit as e:
                code = e.code
        print(json.dumps({"code": code, "err": err.getvalue(), "tensorflow": "tensorflow" in sys.modules}))
    """)
    assert result["code"] == 2
    assert "the following arguments are required: --config" in result["err"]
    assert result["tensorflow"] is False


@pytest.mark.slow  # imports TensorFlow in a fresh interpreter
@pytest.mark.parametrize("package", ["replay_tf", "rlds_tf"])
def test_public_names_load_on_first_use(package):
    result = _run(f"""
        import json, sys
        import {package} as pkg
        before = "tensorflow" in sys.modules
        listed = sorted(dir(pkg))
        first = pkg.__all__[0]
        value = getattr(pkg, first)
        namespace = {{}}
        exec("from {package} import *", namespace)
        missing = sorted(set(pkg.__all__) - set(namespace))
        try:
            pkg.no_such_name
            unknown = None
        except AttributeError as e:
            unknown = str(e)
        print(json.dumps({{"before": before, "after": "tensorflow" in sys.modules, "missing": missing,
                           "unknown": unknown, "dir_has_all": set(pkg.__all__) <= set(listed),
                           "same": value is namespace[first]}}))
    """)
    assert result["before"] is False
    assert result["after"] is True
    assert result["missing"] == []
    assert result["dir_has_all"] is True
    assert result["same"] is True
    assert result["unknown"] == f"module '{package}' has no attribute 'no_such_name'"


@pytest.mark.slow  # imports TensorFlow in a fresh interpreter
def test_submodule_attribute_and_from_import():
    result = _run("""
        import json, sys
        import replay_tf
        from replay_tf import errors
        errors_alone = "replay_tf.server" not in sys.modules
        table = replay_tf.table.Table
        import replay_tf as reverb
        print(json.dumps({"errors_alone": errors_alone, "table": table is reverb.Table,
                          "server": reverb.Server.__name__, "structured": reverb.structured is reverb.structured_writer}))
    """)
    assert result == {"errors_alone": True, "table": True, "server": "Server", "structured": True}
