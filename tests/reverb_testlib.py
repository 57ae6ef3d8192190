"""Runs the same Reverb-API scenario code against dm-reverb (peer venv) and against `replay_tf`.

A scenario is Python source using only Reverb's public API through the names `reverb`, `tf`, `np` and
`emit(name, value)` (JSON-able values). `run_scenarios` runs a dict of them in ONE peer process (TF starts
once) and `run_local` runs them here with `import replay_tf as reverb`; an exception ends a scenario and is
emitted as `error` = "ExceptionType: message". Compare the two dicts key by key.
"""
from __future__ import annotations

import json
import textwrap
import threading
from typing import Any, Dict

import numpy as np
import pytest

_PEER_RUNNER = r'''
import reverb, tensorflow as tf
import numpy as np
for _name, _code in INPUTS["scenarios"].items():
    def _emit(key, value, _name=_name):
        emit(_name + "." + key, value)
    try:
        exec(_code, {"reverb": reverb, "tf": tf, "np": np, "emit": _emit})
    except Exception as _e:
        _emit("error", type(_e).__name__ + ": " + str(_e))
'''


def _dedent(scenarios: Dict[str, str]) -> Dict[str, str]:
    return {name: textwrap.dedent(code) for name, code in scenarios.items()}


def run_peer(peer, scenarios: Dict[str, str]) -> Dict[str, Any]:
    """Every scenario run by dm-reverb in one peer process: `{'<scenario>.<key>': value}`."""
    return peer.run(_PEER_RUNNER, {"scenarios": _dedent(scenarios)}, timeout_s=300)


def run_local(scenarios: Dict[str, str], timeout_s: float = 60) -> Dict[str, Any]:
    """Every scenario run by replay_tf here (each in a thread with a timeout, so a deadlock fails)."""
    import tensorflow as tf

    import replay_tf as reverb

    out: Dict[str, Any] = {}
    for name, code in _dedent(scenarios).items():
        def emit(key, value, _name=name):
            out[f"{_name}.{key}"] = json.loads(json.dumps(value))  # as the peer's values come back

        def body(code=code, emit=emit):
            try:
                exec(code, {"reverb": reverb, "tf": tf, "np": np, "emit": emit})
            except Exception as e:  # noqa: BLE001  (recorded, compared with the peer's)
                emit("error", f"{type(e).__name__}: {e}")

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            out[f"{name}.error"] = f"TIMEOUT after {timeout_s}s (deadlock?)"
    return out


def scenario_results(results: Dict[str, Any], name: str) -> Dict[str, Any]:
    prefix = name + "."
    return {k[len(prefix):]: v for k, v in results.items() if k.startswith(prefix)}


def differential_tests(scenarios: Dict[str, str]):
    """The fixtures and the test that compare `scenarios` as run by dm-reverb (peer venv) and by replay_tf.

    Use at a test module's top level:
      peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)
    Each scenario runs once per side for the whole module; `test_matches_reverb` is parametrized by scenario.
    """
    @pytest.fixture(scope="module", name="peer_results")
    def peer_results_fixture(peer):
        return run_peer(peer, scenarios)

    @pytest.fixture(scope="module", name="local_results")
    def local_results_fixture():
        return run_local(scenarios)

    @pytest.mark.peer
    @pytest.mark.parametrize("scenario", sorted(scenarios))
    def test_matches_reverb(scenario, peer_results, local_results):
        assert scenario_results(local_results, scenario) == scenario_results(peer_results, scenario)

    return peer_results_fixture, local_results_fixture, test_matches_reverb


def error_of_call_released_by_stop(server, call) -> Exception:
    """Runs `call()` in a thread until it blocks, stops `server`, and returns the `ReverbError` the call then
    raised; fails if the call still blocks 10 s after the stop, or returned."""
    import replay_tf as reverb

    errors = []

    def run():
        try:
            call()
        except reverb.ReverbError as e:
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(0.2)
    server.stop()
    thread.join(10)
    assert not thread.is_alive(), "the call still blocks 10 s after the server stopped"
    assert errors, "the call returned instead of raising once the server stopped"
    return errors[0]
