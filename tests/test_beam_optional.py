"""Apache Beam is optional: rlds_tf and its command line work without it, and the Beam paths say how to get it."""
import ast
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from proc_testlib import ROOT

# Makes `import apache_beam` fail as it does where Beam is not installed (also in the Beam venv).
_NO_BEAM = "import sys; sys.modules['apache_beam'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_BEAM + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
                                                       "PATH": "/usr/bin:/bin"})


def test_the_packages_import_without_beam():
    done = _run("""
        import json, sys
        import rlds_tf, rlds_tf.cli, rlds_tf.transformations, rlds_tf.recording, rlds_tf.step_statistics
        print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam' and sys.modules[m])))
    """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("argv", [
    ["convert", "/nonexistent/src", "/nonexistent/dst", "--format", "tfrecord", "--num-workers", "2"],
    ["convert", "/nonexistent/src", "/nonexistent/dst", "--format", "tfrecord", "--runner", "DirectRunner",
     "--temp_location", "/tmp"],
    ["stats", "/nonexistent/src", "--runner", "FlinkRunner", "--parallelism", "4"],
])
def test_beam_options_without_beam_say_how_to_install_it(argv):
    done = _run(f"""
        import sys
        from rlds_tf.cli import main
        sys.exit(main({argv!r}))
    """)
    assert done.returncode == 2, (done.stdout, done.stderr)
    command = argv[0]
    assert (f"rlds-tf {command}: --runner/--num-workers needs Apache Beam, which is not installed here: "
            f"pip install rl-data-tf[beam]") in done.stderr


def test_beam_pipeline_options_need_runner_or_num_workers():
    done = _run("""
        import sys
        from rlds_tf.cli import main
        sys.exit(main(['convert', 'a', 'b', '--format', 'tfrecord', '--temp_location', '/tmp']))
    """)
    assert done.returncode == 2
    assert "unrecognized arguments: --temp_location /tmp" in done.stderr
    assert "only with --runner or --num-workers" in done.stderr


def test_only_rlds_tf_beam_imports_beam_at_module_level():
    offending = []
    for path in sorted(pathlib.Path(ROOT).glob("*_tf/**/*.py")):
        if path.relative_to(ROOT).parts[:2] == ("rlds_tf", "beam"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "apache_beam" or n.startswith("apache_beam.") or n.startswith("rlds_tf.beam")
                   for n in names) and node.col_offset == 0:
                offending.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offending == []
