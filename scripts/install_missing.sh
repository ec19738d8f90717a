# Sourced by setup.sh, setup_bench.sh and test.sh. `install_missing WHO WHY PACKAGE...` installs
# the Debian packages of the list that are not installed yet (apt-get, through sudo where not
# root) and says which: "WHO: installing clang-19 WHY". Returns apt-get's status.
install_missing() {
  local who="$1" why="$2" p sudo=""
  shift 2
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "$who: installing ${missing[*]}${why:+ $why}"
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
