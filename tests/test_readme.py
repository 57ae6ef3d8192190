"""The README's quick starts run as pasted (paths and the port swapped for the test's own)."""
import pathlib
import re
import socket
import subprocess
import sys

import pytest

_README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(section: str) -> list[str]:
    text = _README.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def _run(code: str, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_quick_start_rlds_prints_the_shapes_it_promises(tmp_path):
    (code,) = _python_blocks("Quick start: RLDS")
    assert "/tmp/catch_rlds" in code
    done = _run(code.replace("/tmp/catch_rlds", str(tmp_path / "catch")), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["(32,", "10,", "5)", "(2,)"]


@pytest.mark.slow
def test_quick_start_buffer_samples_windows_of_two_steps(tmp_path):
    (code,) = _python_blocks("Quick start: an in-graph buffer in a TF-Agents-style loop")
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.strip().splitlines()
    assert first == "(32, 2, 4) (32, 2)"
    assert abs(float(second)) < 1.0  # the mean of standard normal observations


@pytest.mark.slow
def test_quick_start_server_learner_reads_what_the_actor_writes(tmp_path):
    learner, actor = _python_blocks("Quick start: a replay server, an actor and a learner in two processes")
    port = str(_free_port())
    learner, actor = (code.replace("8000", port) for code in (learner, actor))
    server = subprocess.Popen([sys.executable, "-c", learner], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        done = None
        for _ in range(60):  # the learner's server needs a few seconds to import TF and bind
            done = _run(actor, tmp_path)
            if done.returncode == 0:
                break
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == "1000 items written"
        out, err = server.communicate(timeout=300)
        assert server.returncode == 0, err[-3000:]
        assert out.split("\n")[:2] == ["(32, 2, 4) (32,)", "1000"]
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
