# Run at every build of memfit (cmake -P): writes OUT, a header with the source tree's git commit
# ("unknown" outside git, "-dirty" with uncommitted changes to tracked files) for
# `memfit --version`. configure_file rewrites it only when the text changes, so a build at the
# same commit recompiles nothing.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE MEMFIT_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE not_git ERROR_QUIET)
if(not_git OR NOT MEMFIT_GIT_COMMIT)
  set(MEMFIT_GIT_COMMIT "unknown")
else()
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes ERROR_QUIET)
  if(changes)
    string(APPEND MEMFIT_GIT_COMMIT "-dirty")
  endif()
endif()
configure_file("${SRC}/src/memfit/cli/git_commit.h.in" "${OUT}" @ONLY)
