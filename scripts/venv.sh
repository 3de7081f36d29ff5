# Sourced by scripts/demo.sh and .ci/run: install wb into the repository's own virtual
# environment `.venv` and set PY to its python. The system python3 is never asked to install
# packages, so this works where PEP 668 forbids it (Debian 12, Ubuntu 24.04) and everywhere else.
# Usage: wb_install_venv [EXTRAS]   (EXTRAS e.g. "[dev]"; run from the repository root)

_wb_apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    return 1
  fi
  echo "installing: $*"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

_wb_make_venv() {
  # A venv without a working pip (python3-venv missing: ensurepip is absent) is no venv.
  [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1 && return 0
  rm -rf .venv
  echo "creating the virtual environment .venv (python3 -m venv)"
  python3 -m venv .venv >/dev/null 2>&1 && return 0
  rm -rf .venv
  # Debian and Ubuntu ship `venv` without ensurepip; it comes with python3-venv (and python3.X-venv).
  local minor
  minor="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  _wb_apt_install python3-venv "python${minor}-venv" || _wb_apt_install python3-venv || return 1
  python3 -m venv .venv || { rm -rf .venv; return 1; }
}

wb_install_venv() {
  local extras="${1:-}"
  if ! command -v python3 >/dev/null 2>&1; then
    echo "error: python3 (>= 3.11) is not on PATH; install it first (e.g. apt-get install python3)" >&2
    return 1
  fi
  if _wb_make_venv; then
    PY=.venv/bin/python
  else
    # No venv possible here (no apt-get to add python3-venv): install directly, where pip allows it.
    echo "warning: cannot create .venv (python3 -m venv failed; on Debian or Ubuntu, install python3-venv as root);" \
      "installing with python3 -m pip instead" >&2
    PY=python3
  fi
  # One line before each step that takes a while, so a first run (~10 s) is never silent.
  echo "installing wb${extras} and its dependencies (pip install -e .${extras}) with $PY"
  "$PY" -m pip install -q --disable-pip-version-check -e ".${extras}"
  echo "compiling wb's bytecode (python -m compileall courier protocol)"
  # An editable install leaves wb's bytecode to the first import, which PYTHONDONTWRITEBYTECODE=1
  # forbids: every wb would compile its own sources again (25-35 ms a start). Compile them once,
  # as a regular `pip install` does (docs/benchmarks.md#bytecode).
  "$PY" -m compileall -q courier protocol >/dev/null ||
    echo "warning: could not write wb's bytecode here; each wb start compiles its sources" >&2
}
