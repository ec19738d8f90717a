// What `memfit --version` prints: which memfit this is (its version and the git commit it was
// built from), what built it and what it runs on (the compiler, oneDNN's and Highway's
// versions) and what this CPU gets (the kernels' dispatch target under MEMFIT_MAX_ISA), the
// lines a bug report needs.
#pragma once

#include <string>

namespace memfit::cli {

// Several lines, the first "memfit 0.9.0 (commit 1a2b3c4d5e6f)"; no trailing newline.
std::string version_text();

}  // namespace memfit::cli
