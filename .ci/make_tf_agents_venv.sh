#!/usr/bin/env bash
# Builds (once, then reuses) the anchor-suite venv: current TensorFlow with TF-Agents 0.19 and rlds 0.1.8
# installed beside it, so the unit tests those wheels ship (rlds/**/*_test.py,
# tf_agents/replay_buffers/*_test.py) can run against rl-data-tf (tests/test_anchor_suites.py).
# rl-data-tf itself is not installed here: the tests put the repository root on PYTHONPATH.
# usage: .ci/make_tf_agents_venv.sh [DIR]   (default ~/.cache/rl-data-tf-agents); prints DIR/bin/python.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-${RL_DATA_TF_AGENTS_VENV:-$HOME/.cache/rl-data-tf-agents}}"
py="${TF_AGENTS_PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 "$HOME/.pyenv/versions/3.11.7/bin/python3" python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py="$cand"; break
    fi
  done
fi
[ -n "$py" ] || { echo "make_tf_agents_venv: need a Python 3.11 interpreter (set TF_AGENTS_PYTHON)" >&2; exit 1; }
# tf_agents needs TF_USE_LEGACY_KERAS=1 (it is written for Keras 2, i.e. tf_keras) to import at all.
# `import rlds` needs a `reverb` module (rlds imports it at import time; the tests register replay_tf as
# `reverb`), so the check only finds rlds's files.
check='import os, importlib.util; os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow, tf_keras, tensorflow_probability, tf_agents.replay_buffers, gym, mock
import portpicker, pytest, pytest_timeout, tree, dm_env, tensorflow_datasets, grpc, cramjam
import ipykernel, nbclient, nbformat, matplotlib
assert importlib.util.find_spec("rlds") is not None, "rlds is not installed"
import numpy; assert tuple(map(int, numpy.__version__.split(".")[:2])) < (2, 3), numpy.__version__'
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "$dir/bin/python"; exit 0
fi
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
"$py" -m venv "$dir" >&2
pip=("$dir/bin/python" -m pip install -q --disable-pip-version-check)

# rl-data-tf's own runtime requirements, read from setup.py so the two never drift apart.
read_reqs='import ast, sys
for node in ast.walk(ast.parse(open(sys.argv[1], encoding="utf-8").read())):
    if isinstance(node, ast.keyword) and node.arg == "install_requires":
        print("\n".join(ast.literal_eval(node.value)))'
mapfile -t project_reqs < <("$dir/bin/python" -c "$read_reqs" "$here/setup.py")
[ "${#project_reqs[@]}" -gt 0 ] || { echo "make_tf_agents_venv: no install_requires in $here/setup.py" >&2; exit 1; }
"${pip[@]}" "tensorflow==${TF_AGENTS_VENV_TF:-2.21.*}" "${project_reqs[@]}" >&2
tf_minor=$("$dir/bin/python" -c 'import tensorflow as tf; print(".".join(tf.__version__.split(".")[:2]))' 2>/dev/null)
# TF-Agents' and its tests' own dependencies, at versions that work on current TF (Keras 2 via tf-keras of
# TF's minor version; tensorflow-probability 0.24+ for TF >= 2.16).
# numpy<2.3: TF-Agents' reverb_utils_test turns 1x1 samples into ints with int(), an error from NumPy 2.3 on
# (deprecated since 1.25); TF accepts numpy>=1.26. ipykernel, nbclient, nbformat and matplotlib run
# notebooks/006_tf_agents_on_current_tf.ipynb here (tests/test_tf_agents_training.py).
"${pip[@]}" "tf-keras~=${tf_minor}.0" "tensorflow-probability[tf]>=0.24" gin-config cloudpickle absl-py wrapt \
  pillow mock portpicker "gym==0.23.0" pygame tensorboard dm-tree "pytest>=7" pytest-timeout "numpy<2.3" \
  ipykernel nbclient nbformat matplotlib >&2
# --no-deps: tf-agents 0.19 pins tensorflow-probability~=0.23 and typing-extensions==4.5.0, and rlds 0.1.8
# pulls dm-reverb; those pins target TF 2.15 and would downgrade or break the TF installed above. Their
# wheels carry the unit tests the anchor-suite CI test runs, and their code runs on current TF as is.
"${pip[@]}" --no-deps "tf-agents==0.19.0" "rlds==0.1.8" >&2
"$dir/bin/python" -c "$check" >&2
echo "$dir/bin/python"
