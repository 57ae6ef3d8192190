#!/usr/bin/env bash
# Checks that plain `pip install -e .` resolves quickly on every supported (Python, TensorFlow) cell.
#
# For each cell, twice: with the pip the interpreter's venv comes with (Python 3.10's is pip 23.0.1, whose
# resolver cannot backjump: a conflict found late makes it backtrack for minutes) and with pip upgraded.
# Each run: a fresh venv under /tmp, `pip install tensorflow==<cell's version>` first (as a user who
# already has TF would), then `pip install -e .` under a time limit, then a smoke test (imports and a few
# fast tests). The venv is deleted afterwards. Not part of .ci/run: every cell downloads TensorFlow.
#
# Usage: bash .ci/check_install_matrix.sh [CELL ...]
#   CELL is PYTHON:TF, e.g. 3.10:2.16.2 or 3.13:2.21.* (default: every supported cell).
# Environment:
#   INSTALL_TIME_LIMIT  seconds allowed for `pip install -e .` (default 600)
#   PYTHON_<MAJ>_<MIN>  interpreter for a cell (default: ~/.pyenv/versions/<ver>*/bin/python, then pythonX.Y)
#   PIP_MODES           which pips to try, of "bundled upgraded" (default: both)
#   KEEP_VENV=1         keep the venvs (their paths are printed)
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIMIT="${INSTALL_TIME_LIMIT:-600}"
CELLS=("$@")
if [ ${#CELLS[@]} -eq 0 ]; then
  CELLS=("3.10:2.16.2" "3.11:2.21.*" "3.12:2.21.*" "3.13:2.21.*")
fi

find_python() {  # $1 = "3.10"
  local var="PYTHON_${1/./_}"
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  local cand
  for cand in "$HOME"/.pyenv/versions/"$1".*/bin/python; do
    if [ -x "$cand" ]; then echo "$cand"; return; fi
  done
  command -v "python$1" || true
}

SMOKE_TESTS=(tests/rlds_tf/test_rlds_types.py tests/replay_tf/core/test_selectors.py)
declare -a RESULTS=()
status=0

run_cell() {  # $1 = cell, $2 = interpreter, $3 = pip mode (bundled or upgraded); sets RESULT
  local cell="$1" py="$2" mode="$3" py_ver="${1%%:*}" tf_ver="${1#*:}"
  local venv vpy t0 t1 t2 timing versions pip_version
  venv="$(mktemp -d "/tmp/rl-data-install-${py_ver}-${mode}-XXXXXX")"
  echo "=== cell Python $py_ver ($py) + tensorflow==$tf_ver, $mode pip, in $venv"
  RESULT=""
  if ! "$py" -m venv "$venv"; then
    RESULT="FAILED (venv)"
  else
    vpy="$venv/bin/python"
    if [ "$mode" = "upgraded" ]; then
      "$vpy" -m pip install -q --upgrade pip
    fi
    pip_version="$("$vpy" -m pip --version | cut -d' ' -f2)"
    t0=$(date +%s)
    if ! "$vpy" -m pip install -q "tensorflow==$tf_ver"; then
      RESULT="FAILED (pip $pip_version: pip install tensorflow==$tf_ver)"
    else
      t1=$(date +%s)
      if ! (cd "$REPO" && timeout "$LIMIT" "$vpy" -m pip install -q -e .); then
        RESULT="FAILED (pip $pip_version: pip install -e . did not finish within ${LIMIT}s or failed)"
      else
        t2=$(date +%s)
        timing="pip $pip_version: tf install $((t1 - t0)) s, pip install -e . $((t2 - t1)) s"
        "$vpy" -m pip install -q pytest pytest-timeout
        versions="$("$vpy" -m pip list 2>/dev/null | grep -iE '^(tensorflow|tensorflow-datasets|tensorflow-metadata|numpy|protobuf|keras|ml-dtypes|dm-tree|etils) ' | tr -s ' ' | paste -sd ',' -)"
        echo "installed: $versions"
        if ! "$vpy" -c 'import rlds_tf, replay_tf; rlds_tf.load, replay_tf.Table' ; then
          RESULT="FAILED (import rlds_tf, replay_tf; $timing)"
        elif ! (cd "$REPO" && "$vpy" -m pytest -m "not slow and not peer" -q -p no:randomly "${SMOKE_TESTS[@]}" \
                | tail -n 15); then
          RESULT="FAILED (smoke tests; $timing)"
        else
          RESULT="OK: $timing; $versions"
        fi
      fi
    fi
  fi
  if [ "${KEEP_VENV:-0}" = "1" ]; then echo "kept $venv"; else rm -rf "$venv"; fi
}

read -r -a MODES <<< "${PIP_MODES:-bundled upgraded}"
for cell in "${CELLS[@]}"; do
  py_ver="${cell%%:*}"
  py="$(find_python "$py_ver")"
  if [ -z "$py" ]; then
    RESULTS+=("$cell: SKIPPED (no Python $py_ver found)")
    status=1
    continue
  fi
  for mode in "${MODES[@]}"; do
    run_cell "$cell" "$py" "$mode"
    case "$RESULT" in OK*) ;; *) status=1 ;; esac
    RESULTS+=("$cell ($mode pip): $RESULT")
    echo "--- $cell ($mode pip): $RESULT"
  done
done

echo "=== install matrix"
printf '%s\n' "${RESULTS[@]}"
exit $status
