#!/usr/bin/env bash
# Builds (once, then reuses) the peer venv: the last releases of the stack rl-data-tf replaces, pinned to
# versions that install and import together on Python 3.11: TF 2.15.1, dm-reverb 0.14.0, rlds 0.1.8,
# tf-agents 0.19.0, envlogger 1.2, TFDS 4.9.4. Used only by differential/interop tests and benchmarks.
# usage: .ci/make_peer_venv.sh [DIR]   (default ~/.cache/rl-data-peers); prints DIR/bin/python.
set -euo pipefail
dir="${1:-${RL_DATA_PEER_VENV:-$HOME/.cache/rl-data-peers}}"
py="${PEER_PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 "$HOME/.pyenv/versions/3.11.7/bin/python3" python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py="$cand"; break
    fi
  done
fi
[ -n "$py" ] || { echo "make_peer_venv: need a Python 3.11 interpreter (set PEER_PYTHON)" >&2; exit 1; }
check='import reverb, rlds, tf_agents, envlogger, tensorflow_datasets, dm_env, tree'
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "$dir/bin/python"; exit 0
fi
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
"$py" -m venv "$dir" >&2
"$dir/bin/pip" install -q --disable-pip-version-check \
  "tensorflow==2.15.1" "dm-reverb==0.14.0" "rlds==0.1.8" "tf-agents==0.19.0" \
  "tensorflow-probability==0.23.0" "tensorflow-datasets==4.9.4" "tensorflow-metadata==1.15.0" \
  "envlogger==1.2" "protobuf==4.25.9" "dm-tree" "dm-env" "numpy<2" "gym==0.23.0" >&2
"$dir/bin/python" -c "$check" >&2
echo "$dir/bin/python"
