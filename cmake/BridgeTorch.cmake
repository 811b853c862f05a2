# Which LibTorch bridge builds against, and what a LibTorch from PyPI's torch wheel needs besides.
#
# BRIDGE_LIBTORCH=auto (default) takes the torch wheel in <repo>/.venv when scripts/install_deps.sh installed it
# (LibTorch 2.x with CUDA and NCCL), else the system's (Debian's libtorch-dev 1.13, or whatever CMAKE_PREFIX_PATH or
# Torch_DIR names, e.g. another Python's `torch.utils.cmake_prefix_path`). `wheel` and `system` force one.

# bridge_pin_caffe2_dir(<torch-dir>): TorchConfig finds its Caffe2 package by an ordinary search, which prefers the
# system's (Debian's 1.13) over the one beside it; a wheel's Torch must get the wheel's Caffe2. bridgeConfig.cmake
# calls it too.
macro(bridge_pin_caffe2_dir torch_dir)
  if(NOT Caffe2_DIR AND EXISTS "${torch_dir}/../Caffe2/Caffe2Config.cmake")
    get_filename_component(Caffe2_DIR "${torch_dir}/../Caffe2" ABSOLUTE)
  endif()
endmacro()

# bridge_find_torch(): find_package(Torch) for the chosen LibTorch, then the fixes below.
macro(bridge_find_torch)
  # BRIDGE_LIBTORCH in the environment (as scripts/install_deps.sh reads it; `debian` means `system`) sets the default.
  set(bridge_libtorch_default "$ENV{BRIDGE_LIBTORCH}")
  if(bridge_libtorch_default STREQUAL "debian")
    set(bridge_libtorch_default "system")
  elseif(NOT bridge_libtorch_default)
    set(bridge_libtorch_default "auto")
  endif()
  set(BRIDGE_LIBTORCH "${bridge_libtorch_default}"
      CACHE STRING "LibTorch to build against: auto, wheel (<repo>/.venv) or system")
  set_property(CACHE BRIDGE_LIBTORCH PROPERTY STRINGS auto wheel system)
  file(GLOB bridge_wheel_torch_dir "${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/torch/share/cmake/Torch")
  if(BRIDGE_LIBTORCH STREQUAL "wheel" AND NOT bridge_wheel_torch_dir)
    message(FATAL_ERROR "BRIDGE_LIBTORCH=wheel, but ${PROJECT_SOURCE_DIR}/.venv has no torch wheel: run "
                        "scripts/install_deps.sh (without --libtorch=debian), or configure with -DBRIDGE_LIBTORCH=system")
  elseif(NOT BRIDGE_LIBTORCH MATCHES "^(auto|wheel|system)$")
    message(FATAL_ERROR "BRIDGE_LIBTORCH='${BRIDGE_LIBTORCH}' is not one of auto, wheel, system")
  endif()
  if(bridge_wheel_torch_dir AND NOT BRIDGE_LIBTORCH STREQUAL "system")
    list(GET bridge_wheel_torch_dir 0 bridge_wheel_torch_dir)
    bridge_pin_caffe2_dir("${bridge_wheel_torch_dir}")
    # find_package caches Torch_DIR, which tools read back (bench/run_gpt_train_bench.sh picks the matching Python).
    find_package(Torch REQUIRED PATHS "${bridge_wheel_torch_dir}" NO_DEFAULT_PATH)
    set(bridge_libtorch_origin "the torch wheel in .venv")
  else()
    find_package(Torch REQUIRED)
    set(bridge_libtorch_origin "the system")
  endif()
  message(STATUS "bridge: LibTorch ${Torch_VERSION} from ${bridge_libtorch_origin} (${Torch_DIR})")
  bridge_use_wheel_cuda_libraries()
  bridge_libtorch_install_rpath()
endmacro()

# bridge_libtorch_install_rpath(): installed programs load the LibTorch they were linked against where it is: its
# folder, and for a wheel the CUDA runtime's beside it (the programs link libcudart themselves), go on the install
# RPATH. Without it the loader takes Debian's LibTorch 1.13 from /usr/lib first and an installed bridge-pretrain exits
# 127 (libtorch_cuda.so not found). CMAKE_INSTALL_RPATH_USE_LINK_PATH cannot do this: it skips folders inside the
# source tree, where the clone's .venv is. Call before any target is made (targets copy CMAKE_INSTALL_RPATH).
macro(bridge_libtorch_install_rpath)
  get_target_property(bridge_torch_configurations torch IMPORTED_CONFIGURATIONS)
  set(bridge_torch_location "")
  foreach(configuration IN LISTS bridge_torch_configurations)
    get_target_property(bridge_torch_location torch IMPORTED_LOCATION_${configuration})
    if(bridge_torch_location)
      break()
    endif()
  endforeach()
  if(NOT bridge_torch_location)
    get_target_property(bridge_torch_location torch IMPORTED_LOCATION)
  endif()
  get_filename_component(BRIDGE_LIBTORCH_LIBRARY_DIR "${bridge_torch_location}" DIRECTORY)
  if(NOT BRIDGE_LIBTORCH_LIBRARY_DIR IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
    list(APPEND CMAKE_INSTALL_RPATH "${BRIDGE_LIBTORCH_LIBRARY_DIR}")
  endif()
  if(TARGET CUDA::cudart)
    get_target_property(bridge_cudart CUDA::cudart IMPORTED_LOCATION)
    get_filename_component(bridge_cudart_dir "${bridge_cudart}" DIRECTORY)
    if(bridge_cudart_dir MATCHES "/nvidia/")
      list(APPEND CMAKE_INSTALL_RPATH "${bridge_cudart_dir}")
    endif()
  endif()
endmacro()

# bridge_use_system_fmt(<target>): LibTorch 2.x ships its own fmt (12) in its include directory, which comes before
# the system's; Debian's spdlog is built against the system fmt (9) and does not compile against 12. A directory that
# holds only a link to the system fmt, searched first, gives every file that uses <target> the fmt spdlog was built
# with. The LibTorch headers bridge includes never include fmt (only its profiler and c10d's logging do).
function(bridge_use_system_fmt target)
  set(torch_fmt "")
  get_target_property(torch_includes torch INTERFACE_INCLUDE_DIRECTORIES)
  foreach(dir IN LISTS torch_includes)
    if(EXISTS "${dir}/fmt/core.h")
      set(torch_fmt "${dir}/fmt")
    endif()
  endforeach()
  if(NOT torch_fmt)
    return()
  endif()
  find_package(fmt REQUIRED)
  get_target_property(fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  list(GET fmt_includes 0 fmt_include)
  set(shim "${PROJECT_BINARY_DIR}/system_fmt")
  file(MAKE_DIRECTORY "${shim}")
  file(CREATE_LINK "${fmt_include}/fmt" "${shim}/fmt" SYMBOLIC)
  message(STATUS "LibTorch ships fmt (${torch_fmt}); bridge compiles against the system's (${fmt_include}/fmt)")
  target_include_directories(${target} BEFORE PUBLIC $<BUILD_INTERFACE:${shim}>
                                                     $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/bridge/system_fmt>)
  install(DIRECTORY "${shim}/" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/bridge/system_fmt)
endfunction()

# bridge_use_wheel_cuda_libraries(): a LibTorch from PyPI's torch wheel loads the CUDA runtime, cuBLAS, cuDNN and
# NCCL it was built with from the nvidia/*/lib folders beside torch/ (its RPATH says so). The linker must resolve them
# there too, not in a CUDA toolkit elsewhere on the machine (/usr/local/cuda's NCCL lacks symbols LibTorch needs), and
# programs must load the wheel's CUDA runtime, not the toolkit's. Does nothing for other LibTorch builds.
# bridgeConfig.cmake calls it too, for projects that link the installed bridge.
function(bridge_use_wheel_cuda_libraries)
  get_filename_component(site_packages "${Torch_DIR}/../../../.." ABSOLUTE)
  if(NOT IS_DIRECTORY "${site_packages}/nvidia")
    return()
  endif()
  file(GLOB wheel_library_dirs LIST_DIRECTORIES true "${site_packages}/nvidia/*/lib")
  list(JOIN wheel_library_dirs ":" rpath_link)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${rpath_link}")
  file(GLOB wheel_cudart "${site_packages}/nvidia/*/lib/libcudart.so.[0-9]*")
  if(wheel_cudart AND TARGET CUDA::cudart)
    list(GET wheel_cudart 0 wheel_cudart)
    set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${wheel_cudart}")
  endif()
  message(STATUS "LibTorch's CUDA libraries: ${site_packages}/nvidia")
endfunction()
