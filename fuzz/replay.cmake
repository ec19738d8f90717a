# The seed corpus replayed by the ordinary build (gcc, the sanitizer build, every CI machine):
# each harness of fuzz/sources.cmake as <name>_replay, fuzz/replay_main.cpp in libFuzzer's place,
# linked against a library of the main build's own objects of MEMFIT_FUZZ_SOURCES and nothing
# else. A source the fuzz build needs but does not list fails this link at once (it failed only
# the fuzz stage, the last of CI, before), and no source is compiled twice: the objects are
# memfit_lib's (the one CLI file among them, cli/config_file.cpp, is compiled here).
include(${CMAKE_CURRENT_LIST_DIR}/sources.cmake)
set(memfit_replay_objects "")
set(memfit_replay_cli "")
foreach(src ${MEMFIT_FUZZ_SOURCES})
  if(src MATCHES "^src/memfit/cli/")
    list(APPEND memfit_replay_cli ${src})
  else()
    string(REPLACE "." "\\." escaped "${src}")
    list(APPEND memfit_replay_objects "/${escaped}\\.o")
  endif()
endforeach()
list(JOIN memfit_replay_objects "|" memfit_replay_regex)
add_library(memfit_parsers STATIC
            "$<FILTER:$<TARGET_OBJECTS:memfit_lib>,INCLUDE,${memfit_replay_regex}>"
            ${memfit_replay_cli})
target_include_directories(memfit_parsers PUBLIC src ${CMAKE_SOURCE_DIR})
target_link_libraries(memfit_parsers PUBLIC OpenMP::OpenMP_CXX fmt::fmt
                      nlohmann_json::nlohmann_json tomlplusplus::tomlplusplus CLI11::CLI11
                      ICU::uc ICU::i18n PkgConfig::HWY DNNL::dnnl)
foreach(name ${MEMFIT_FUZZERS})
  add_executable(${name}_replay fuzz/${name}_fuzz.cpp fuzz/replay_main.cpp)
  target_link_libraries(${name}_replay PRIVATE memfit_parsers)
  add_test(NAME FuzzCorpus.${name}
           COMMAND ${name}_replay ${CMAKE_SOURCE_DIR}/fuzz/corpus/${name})
  set_tests_properties(FuzzCorpus.${name} PROPERTIES LABELS fuzz)
endforeach()
