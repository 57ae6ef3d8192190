#!/usr/bin/env bash
# Builds (once, then reuses) a separate venv with JAX + flashbax, the fastest in-graph buffer peer on CPU.
# Used only by benchmarks/bench_buffers.py for side-by-side figures; never by tests or the package.
# usage: .ci/make_jax_venv.sh [DIR]   (default ~/.cache/rl-data-jax); prints DIR/bin/python.
set -euo pipefail
dir="${1:-${RL_DATA_JAX_VENV:-$HOME/.cache/rl-data-jax}}"
py="${JAX_VENV_PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3.11 "$HOME/.pyenv/versions/3.11.7/bin/python3" python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py="$cand"; break
    fi
  done
fi
[ -n "$py" ] || { echo "make_jax_venv: need a Python 3.11 interpreter (set JAX_VENV_PYTHON)" >&2; exit 1; }
check='import jax, flashbax'
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "$dir/bin/python"; exit 0
fi
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
"$py" -m venv "$dir" >&2
"$dir/bin/pip" install -q --disable-pip-version-check jax flashbax >&2
"$dir/bin/python" -c "$check" >&2
echo "$dir/bin/python"
