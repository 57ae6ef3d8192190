"""Shared pytest configuration: makes the `*_testlib` helpers importable and exposes the peer fixture."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# Shared helpers that assert: pytest rewrites their asserts too (must happen before their first import).
pytest.register_assert_rewrite("dataset_testlib", "reverb_testlib")

import peer_testlib  # noqa: E402  (needs the path above)


def pytest_collection_modifyitems(config, items):
    """Every `peer` test is also `slow`: each starts the peer venv's interpreter, which imports TF 2.15 and
    the anchors. `-m "not slow"` is then the quick in-process suite."""
    del config
    for item in items:
        if item.get_closest_marker("peer") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def peer():
    """A `peer_testlib.Peer` that runs snippets in the peer venv; skips (or fails under CI) without one."""
    return peer_testlib.get_peer_or_skip()
