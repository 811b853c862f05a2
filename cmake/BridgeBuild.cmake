# Compiler settings shared by every bridge target: warnings, sanitizers, ccache and the LibTorch precompiled header.
include(GNUInstallDirs)

if(BRIDGE_USE_CCACHE)
  find_program(BRIDGE_CCACHE ccache)
  if(BRIDGE_CCACHE)
    # ccache only reuses objects built against a precompiled header when told the header's defines and timestamps
    # may be trusted; -fpch-preprocess (below) lets it see through the header. BASEDIR and NOHASHDIR make objects
    # reusable across checkouts at different paths (every CI run builds in a fresh clone).
    set(CMAKE_CXX_COMPILER_LAUNCHER
        ${CMAKE_COMMAND} -E env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
        "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" CCACHE_NOHASHDIR=1
        ${BRIDGE_CCACHE})
  endif()
endif()

add_compile_options(-fPIC)

set(BRIDGE_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual)
if(BRIDGE_WERROR)
  list(APPEND BRIDGE_WARNING_FLAGS -Werror)
endif()

if(BRIDGE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(BRIDGE_TSAN)
  if(BRIDGE_SANITIZE)
    message(FATAL_ERROR "BRIDGE_TSAN and BRIDGE_SANITIZE cannot be combined (ThreadSanitizer excludes AddressSanitizer): "
                        "configure a separate build directory for each")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

# The one precompiled header every bridge target reuses: parsing LibTorch's headers costs ~20 s per file, after this
# a file that includes them compiles in a few seconds.
add_library(bridge_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
target_link_libraries(bridge_pch PRIVATE torch)
target_compile_options(bridge_pch PRIVATE ${BRIDGE_WARNING_FLAGS})
set(BRIDGE_PCH_HEADERS <torch/torch.h> <string> <vector> <memory> <functional> <map>)
target_precompile_headers(bridge_pch PRIVATE ${BRIDGE_PCH_HEADERS})
if(BRIDGE_CCACHE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(bridge_pch PRIVATE -fpch-preprocess)
endif()

# Test programs (tests/: the GoogleTest binaries, the workers of multi-process tests) are glue around LibTorch and
# bridge's libraries, where their time goes; in an optimised build they compile at -O1, in about half the time of
# -O3, with a precompiled header of their own (GCC uses one only under the -O it was made with).
set(BRIDGE_TEST_COMPILE_OPTIONS "")
if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo)$")
  set(BRIDGE_TEST_COMPILE_OPTIONS -O1)
  add_library(bridge_test_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
  target_link_libraries(bridge_test_pch PRIVATE torch)
  target_compile_options(bridge_test_pch PRIVATE ${BRIDGE_WARNING_FLAGS} ${BRIDGE_TEST_COMPILE_OPTIONS})
  target_precompile_headers(bridge_test_pch PRIVATE ${BRIDGE_PCH_HEADERS})
  if(BRIDGE_CCACHE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(bridge_test_pch PRIVATE -fpch-preprocess)
  endif()
endif()

# bridge_configure_target(<target> [TEST] [NO_TORCH]): warnings, the repo root as include root, and the shared
# precompiled header; TEST: a test program's (above); NO_TORCH: none, for code that must not see LibTorch.
function(bridge_configure_target target)
  cmake_parse_arguments(ARG "TEST;NO_TORCH" "" "" ${ARGN})
  target_compile_options(${target} PRIVATE ${BRIDGE_WARNING_FLAGS})
  if(ARG_NO_TORCH)
    return()
  endif()
  if(BRIDGE_CCACHE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -fpch-preprocess)
  endif()
  if(ARG_TEST AND TARGET bridge_test_pch)
    target_compile_options(${target} PRIVATE ${BRIDGE_TEST_COMPILE_OPTIONS})
    target_precompile_headers(${target} REUSE_FROM bridge_test_pch)
  else()
    target_precompile_headers(${target} REUSE_FROM bridge_pch)
  endif()
endfunction()

# bridge_add_library(<name> <export-name> [NO_TORCH] [SOURCES ...] [DEPS ...]): one library per source folder. A
# folder whose code is all in headers so far becomes an INTERFACE library. NO_TORCH: compiled without LibTorch's
# precompiled header, for the libraries a program links that must not load LibTorch (bridge-preprocess-data: loading
# it costs 0.45 s and 480 MB before main).
function(bridge_add_library name export_name)
  cmake_parse_arguments(ARG "NO_TORCH" "" "SOURCES;DEPS" ${ARGN})
  if(ARG_SOURCES)
    add_library(${name} ${ARG_SOURCES})
    set(scope PUBLIC)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME bridge_${export_name})
    if(ARG_NO_TORCH)
      bridge_configure_target(${name} NO_TORCH)
    else()
      bridge_configure_target(${name})
    endif()
  else()
    add_library(${name} INTERFACE)
    set(scope INTERFACE)
  endif()
  add_library(bridge::${export_name} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${export_name})
  target_include_directories(${name} ${scope} $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/bridge>)
  target_link_libraries(${name} ${scope} ${ARG_DEPS})
  target_compile_features(${name} ${scope} cxx_std_17)
  if(ARG_NO_TORCH)
    # The standard LibTorch asks of its users (C++20 for 2.x), so that these headers, which the code linking LibTorch
    # includes too, compile under one standard everywhere.
    get_target_property(torch_features torch INTERFACE_COMPILE_FEATURES)
    if(torch_features)
      target_compile_features(${name} ${scope} ${torch_features})
    endif()
  endif()
  set_property(GLOBAL APPEND PROPERTY BRIDGE_LIBRARIES ${name})
endfunction()

