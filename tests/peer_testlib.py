"""Runs code in the peer venv (TF 2.15 + dm-reverb 0.14 + rlds 0.1.8 + tf-agents 0.19 + envlogger 1.2).

The peer venv is never a runtime dependency; it gives differential tests their independent expectations
and interop tests their counterpart. Point `RL_DATA_PEER_PYTHON` at its interpreter (`.ci/make_peer_venv.sh`
prints it). Without it, peer tests skip with that instruction, except under CI (`CI=true`), where a missing
peer is an error: CI always provides one.

A snippet runs as a script with these globals:
  INPUTS   dict of the inputs given (numpy arrays and JSON values)
  emit(name, value)  records an output: JSON-able values go to JSON, everything else through np.asarray.
  emit_tree(name, nest)  records every leaf of a nest of arrays under `name/<path>`.
`Peer.run(...)` returns the dict of outputs. Nothing is pickled.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import textwrap
from typing import Any, Mapping

import numpy as np
import pytest

ENV_VAR = "RL_DATA_PEER_PYTHON"

_PRELUDE = r'''
import json as _json, os as _os, sys as _sys
import numpy as np
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_io_dir = _sys.argv[1]
INPUTS = {}
if _os.path.exists(_os.path.join(_io_dir, "in.json")):
    with open(_os.path.join(_io_dir, "in.json")) as _f:
        INPUTS.update(_json.load(_f))
if _os.path.exists(_os.path.join(_io_dir, "in.npz")):
    with np.load(_os.path.join(_io_dir, "in.npz"), allow_pickle=False) as _z:
        INPUTS.update({k: _z[k] for k in _z.files})
_json_out, _np_out = {}, {}
def emit(name, value):
    try:
        _json.dumps(value)
        _json_out[name] = value
    except TypeError:
        _np_out[name] = np.asarray(value)
def _path_str(path):
    return "/".join(str(p) for p in path)
def emit_tree(name, nest):
    import tree as _tree
    for path, leaf in _tree.flatten_with_path(nest):
        _np_out[name + ("/" + _path_str(path) if path else "")] = np.asarray(leaf)
def _save():
    with open(_os.path.join(_io_dir, "out.json"), "w") as _f:
        _json.dump(_json_out, _f)
    np.savez(_os.path.join(_io_dir, "out.npz"), **_np_out)
'''


class PeerError(RuntimeError):
    """The snippet failed in the peer venv."""


class Peer:
    """Handle on the peer interpreter."""

    def __init__(self, python: str):
        self.python = python

    def run(self, code: str, inputs: Mapping[str, Any] | None = None, *, timeout_s: float = 600,
            cwd: str | None = None) -> dict[str, Any]:
        """Runs `code` in the peer venv and returns what it emitted.

        Args:
          code: Python source; dedented. Uses `INPUTS`, `emit` and `emit_tree` (see module docstring).
          inputs: numpy arrays (sent as .npz) and JSON values (sent as .json).
          timeout_s: wall-clock limit for the subprocess.
          cwd: working directory for the subprocess.

        Returns:
          name -> value for every `emit`; arrays as numpy, the rest as decoded JSON.
        """
        with tempfile.TemporaryDirectory(prefix="peer-") as io_dir:
            json_in, np_in = {}, {}
            for key, value in (inputs or {}).items():
                if isinstance(value, np.ndarray):
                    np_in[key] = value
                else:
                    json_in[key] = value
            if json_in:
                pathlib.Path(io_dir, "in.json").write_text(json.dumps(json_in))
            if np_in:
                np.savez(os.path.join(io_dir, "in.npz"), **np_in)
            script = pathlib.Path(io_dir, "snippet.py")
            script.write_text(_PRELUDE + "\n" + textwrap.dedent(code) + "\n_save()\n")
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)  # never let our packages leak into the peer process
            env["TF_CPP_MIN_LOG_LEVEL"] = "2"
            proc = subprocess.run([self.python, str(script), io_dir], capture_output=True, text=True,
                                  timeout=timeout_s, env=env, cwd=cwd or io_dir)
            if proc.returncode != 0:
                raise PeerError(f"peer snippet failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
            out: dict[str, Any] = json.loads(pathlib.Path(io_dir, "out.json").read_text())
            with np.load(os.path.join(io_dir, "out.npz"), allow_pickle=False) as z:
                out.update({k: z[k] for k in z.files})
            return out

    def popen(self, code: str, *args: str, **kwargs) -> subprocess.Popen:
        """Starts `code` (no prelude) as a long-running peer process, e.g. a dm-reverb server."""
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        return subprocess.Popen([self.python, "-c", textwrap.dedent(code), *args], env=env, **kwargs)


def peer_python() -> str | None:
    """The peer interpreter from the environment, if it exists."""
    python = os.environ.get(ENV_VAR)
    if python and os.path.exists(python):
        return python
    return None


def get_peer_or_skip() -> Peer:
    python = peer_python()
    if python is None:
        reason = (f"no peer venv: set {ENV_VAR} to the interpreter printed by `bash .ci/make_peer_venv.sh` "
                  f"(got {os.environ.get(ENV_VAR)!r})")
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must provide the peer venv: {reason}")
        pytest.skip(reason)
    return Peer(python)
