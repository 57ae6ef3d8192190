#!/usr/bin/env bash
# Checks that plain `pip install -e .` resolves quickly on every supported (Python, TensorFlow) cell.
#
# For each cell: a fresh venv under /tmp, `pip install tensorflow==<cell's version>` first (as a user
# who already has TF would), then `pip install -e .` with plain pip under a time limit, then a smoke test
# (imports and a few fast tests). The venv is deleted afterwards. Not part of .ci/run: every cell
# downloads TensorFlow.
#
# Usage: bash .ci/check_install_matrix.sh [CELL ...]
#   CELL is PYTHON:TF, e.g. 3.10:2.16.2 or 3.13:2.21.* (default: every supported cell).
# Environment:
#   INSTALL_TIME_LIMIT  seconds allowed for `pip install -e .` (default 600)
#   PYTHON_<MAJ>_<MIN>  interpreter for a cell (default: ~/.pyenv/versions/<ver>*/bin/python, then pythonX.Y)
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

for cell in "${CELLS[@]}"; do
  py_ver="${cell%%:*}"
  tf_ver="${cell#*:}"
  py="$(find_python "$py_ver")"
  if [ -z "$py" ]; then
    RESULTS+=("$cell: SKIPPED (no Python $py_ver found)")
    status=1
    continue
  fi
  venv="$(mktemp -d "/tmp/rl-data-install-${py_ver}-XXXXXX")"
  echo "=== cell Python $py_ver ($py) + tensorflow==$tf_ver in $venv"
  result=""
  if ! "$py" -m venv "$venv"; then
    result="FAILED (venv)"
  else
    vpy="$venv/bin/python"
    "$vpy" -m pip install -q --upgrade pip
    t0=$(date +%s)
    if ! "$vpy" -m pip install -q "tensorflow==$tf_ver"; then
      result="FAILED (pip install tensorflow==$tf_ver)"
    else
      t1=$(date +%s)
      if ! (cd "$REPO" && timeout "$LIMIT" "$vpy" -m pip install -q -e .); then
        result="FAILED (pip install -e . did not finish within ${LIMIT}s or failed)"
      else
        t2=$(date +%s)
        timing="tf install $((t1 - t0)) s, pip install -e . $((t2 - t1)) s"
        "$vpy" -m pip install -q pytest pytest-timeout
        versions="$("$vpy" -m pip list 2>/dev/null | grep -iE '^(tensorflow|tensorflow-datasets|tensorflow-metadata|numpy|protobuf|keras|ml-dtypes|dm-tree) ' | tr -s ' ' | paste -sd ',' -)"
        echo "installed: $versions"
        if ! "$vpy" -c 'import rlds_tf, replay_tf; rlds_tf.load, replay_tf.Table' ; then
          result="FAILED (import rlds_tf, replay_tf; $timing)"
        elif ! (cd "$REPO" && "$vpy" -m pytest -m "not slow and not peer" -q -p no:randomly "${SMOKE_TESTS[@]}" \
                | tail -n 15); then
          result="FAILED (smoke tests; $timing)"
        else
          result="OK: $timing; $versions"
        fi
      fi
    fi
  fi
  case "$result" in OK*) ;; *) status=1 ;; esac
  RESULTS+=("$cell: $result")
  echo "--- $cell: $result"
  if [ "${KEEP_VENV:-0}" = "1" ]; then echo "kept $venv"; else rm -rf "$venv"; fi
done

echo "=== install matrix"
printf '%s\n' "${RESULTS[@]}"
exit $status
