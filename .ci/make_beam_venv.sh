#!/usr/bin/env bash
# Builds (once, then reuses) the venv rlds_tf.beam runs in: the system's packages (TensorFlow, TFDS,
# array_record, pytest) seen through --system-site-packages, with Apache Beam installed on top. Beam pins
# its own protobuf and pyarrow, which shadow the system's inside this venv only, so the main suite's
# environment never carries Beam. rl-data-tf is not installed here: callers put the checkout on PYTHONPATH.
# usage: .ci/make_beam_venv.sh [DIR]   (default ~/.cache/rl-data-beam); prints DIR/bin/python.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-${RL_DATA_BEAM_VENV:-$HOME/.cache/rl-data-beam}}"
py="${BEAM_VENV_PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 "$HOME/.pyenv/versions/3.11.7/bin/python3" python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py="$cand"; break
    fi
  done
fi
[ -n "$py" ] || { echo "make_beam_venv: need a Python 3.11 interpreter (set BEAM_VENV_PYTHON)" >&2; exit 1; }
# Our generated *_pb2.py modules (protobuf 4.25 gencode) and TFDS must import beside Beam's protobuf, with
# warnings as errors.
check='import warnings; warnings.simplefilter("error")
import apache_beam, tensorflow, tensorflow_datasets, array_record, pytest, pytest_timeout
import rlds_tf.patterns.patterns_pb2, replay_tf.wire.schema_pb2, replay_tf.wire.reverb_service_pb2
import replay_tf.wire.checkpoint_pb2, replay_tf.server_executable.reverb_config_pb2, rlds_tf.beam
assert apache_beam.__version__.startswith("2.77."), apache_beam.__version__'
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "$dir/bin/python"; exit 0
fi
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
"$py" -m venv --system-site-packages "$dir" >&2
"$dir/bin/python" -m pip install -q --disable-pip-version-check "apache-beam==2.77.*" >&2
"$dir/bin/python" -c "$check" >&2
echo "$dir/bin/python"
