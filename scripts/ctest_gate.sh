# Sourced by test.sh. `gated_ctest BUILD_DIR [ctest args...]` runs CTest with --no-tests=error
# (a label or filter that matches nothing fails instead of passing), then fails if a test
# skipped that tests/expected_skips.txt does not allow on this machine in this stage, naming it
# and its reason. It adds to the run's totals; `print_totals` prints them as CI's closing line.
# A skip is a pass to CTest: without this gate a test that stopped running (a package missing,
# MPI not found, a crash turned into a skip) left CI green.
total_passed=0 total_failed=0 total_skipped=0

cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "

# skip_allowed NAME: whether an entry of tests/expected_skips.txt allows NAME to skip here.
skip_allowed() {
  local name="$1" line pattern rest when cond
  while IFS= read -r line; do
    [[ -z "${line// }" || "$line" == \#* ]] && continue
    # Fields are separated by " | " (a pattern's own alternation has no spaces around its '|').
    pattern="${line%% | *}" rest="${line#* | }"
    when="${rest%% | *}"
    [[ "$name" =~ ^($pattern)$ ]] || continue
    IFS=',' read -ra conds <<<"${when// /}"
    for cond in "${conds[@]}"; do
      case "$cond" in
        always) return 0 ;;
        lacks:*) [[ "$cpu_flags" != *" ${cond#lacks:} "* ]] && return 0 ;;
        has:*) [[ "$cpu_flags" == *" ${cond#has:} "* ]] && return 0 ;;
        capped) [[ -n "${MEMFIT_MAX_ISA:-}" || "$name" == avx2:* || "$name" == scalar:* ]] &&
                  return 0 ;;
        *) echo "test: tests/expected_skips.txt: unknown condition '$cond' in: $line" >&2
           return 1 ;;
      esac
    done
  done < tests/expected_skips.txt
  return 1
}

gated_ctest() {
  local dir="$1" log
  shift
  log="$(mktemp)"
  ctest --test-dir "$dir" --no-tests=error --output-on-failure "$@" | tee "$log"
  local total failed skipped=() unexpected=() name
  total=$(sed -nE 's/.*tests failed out of ([0-9]+).*/\1/p' "$log" | tail -1)
  failed=$(sed -nE 's/.* ([0-9]+) tests? failed out of.*/\1/p' "$log" | tail -1)
  mapfile -t skipped < <(sed -nE 's/^[[:space:]]*[0-9]+ - (.*) \((Skipped|Disabled)\)$/\1/p' "$log")
  rm -f "$log"
  for name in "${skipped[@]}"; do skip_allowed "$name" || unexpected+=("$name"); done
  total_skipped=$((total_skipped + ${#skipped[@]}))
  total_failed=$((total_failed + ${failed:-0}))
  total_passed=$((total_passed + ${total:-0} - ${failed:-0} - ${#skipped[@]}))
  if ((${#unexpected[@]})); then
    echo "test: ${#unexpected[@]} test(s) skipped that should run on this machine" \
         "(tests/expected_skips.txt lists the skips allowed, and when):"
    for name in "${unexpected[@]}"; do
      # Its reason, from a rerun of it alone (CTest keeps no output of a test that skipped).
      local why
      why=$( (ctest --test-dir "$dir" -V -R "^$(printf '%s' "$name" | sed 's/[][\.*^$()+?{}|]/\\&/g')\$" \
               2>&1 || true) | grep -A1 ': Skipped$' | sed -n 2p | sed -E 's/^[0-9]+: //')
      echo "  $name: $why"
    done
    print_totals
    return 1
  fi
}

print_totals() {
  echo "test: $total_passed passed, $total_failed failed, $total_skipped skipped"
}
