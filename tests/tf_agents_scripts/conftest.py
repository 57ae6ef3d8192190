"""The scripts here run in the TF-Agents venv (tests/test_tf_agents_on_current_tf.py starts them); they import
TF-Agents and each other at import time, so the main test run does not collect them (--doctest-modules)."""
collect_ignore_glob = ["*.py"]
