# Installs the bridge build tree into a scratch prefix, starts each installed program as a user would (from the
# prefix, with nothing on LD_LIBRARY_PATH), then configures, builds and runs tests/package against it.
# Invoked by CTest: cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DCXX_COMPILER=... -DTORCH_LIBRARY=...
#                   -P run_package_test.cmake
file(REMOVE_RECURSE ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package test: '${ARGN}' failed with ${result}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)

# The installed programs start, and load the LibTorch they were built against (not Debian's 1.13 in /usr/lib, which
# the loader finds first without an install RPATH: exit 127, libtorch_cuda.so not found).
set(ENV{LD_LIBRARY_PATH} "")
foreach(program bridge-pretrain bridge-export bridge-checkpoint bridge-preprocess-data)
  set(path ${WORK_DIR}/prefix/bin/${program})
  execute_process(COMMAND ${path} --help RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package test: the installed ${path} --help exited ${result}:\n${output}")
  endif()
  if(program STREQUAL "bridge-preprocess-data")
    continue()  # links no LibTorch
  endif()
  execute_process(COMMAND ldd ${path} OUTPUT_VARIABLE libraries)
  string(REGEX MATCH "libtorch\\.so[.0-9]* => ([^ ]+)" torch_line "${libraries}")
  get_filename_component(loaded "${CMAKE_MATCH_1}" REALPATH)
  get_filename_component(expected "${TORCH_LIBRARY}" REALPATH)
  if(NOT loaded STREQUAL expected)
    message(FATAL_ERROR "package test: the installed ${program} loads '${torch_line}', not the LibTorch it was built "
                        "against (${expected}):\n${libraries}")
  endif()
endforeach()

set(launcher)
find_program(CCACHE ccache)
if(CCACHE)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${launcher})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
