# libFuzzer harnesses (MEMFIT_FUZZ=ON, clang, a build directory of their own: scripts/fuzz.sh).
# They link a library of only the sources that parse outside bytes and what those need, so a
# fuzz build compiles a small part of memfit (no kernels, no model). Adding a harness for a new
# parser (docs/testing.md, "Adding a harness"):
#   1. fuzz/<name>_fuzz.cpp defining LLVMFuzzerTestOneInput (fuzz/safetensors_fuzz.cpp is the
#      pattern: write the bytes where the parser reads them, call it, catch memfit::Error only);
#   2. seed inputs in fuzz/corpus/<name>/ (a few small valid files and near misses);
#   3. <name> in MEMFIT_FUZZERS (fuzz/sources.cmake), adding the parser's .cpp to
#      MEMFIT_FUZZ_SOURCES there if it is not there yet (the main build's replay of the corpus,
#      fuzz/replay.cmake, fails to link where a source is missing). scripts/fuzz.sh runs every
#      fuzz/*_fuzz.cpp.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "MEMFIT_FUZZ needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++-19 (scripts/fuzz.sh does)")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/sources.cmake)
add_library(memfit_fuzz_lib STATIC ${MEMFIT_FUZZ_SOURCES})
target_include_directories(memfit_fuzz_lib PUBLIC src ${CMAKE_SOURCE_DIR})
target_link_libraries(memfit_fuzz_lib PUBLIC OpenMP::OpenMP_CXX fmt::fmt
                      nlohmann_json::nlohmann_json tomlplusplus::tomlplusplus CLI11::CLI11
                      ICU::uc ICU::i18n PkgConfig::HWY DNNL::dnnl)

# memfit_add_fuzzer(name): the harness fuzz/<name>_fuzz.cpp as the executable <name>_fuzz.
function(memfit_add_fuzzer name)
  add_executable(${name}_fuzz fuzz/${name}_fuzz.cpp)
  target_compile_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
  target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
  target_link_libraries(${name}_fuzz PRIVATE memfit_fuzz_lib)
endfunction()

foreach(name ${MEMFIT_FUZZERS})
  memfit_add_fuzzer(${name})
endforeach()
