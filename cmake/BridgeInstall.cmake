# Installs the libraries, their headers and a CMake package, so that a user project can write
#   find_package(bridge REQUIRED)
#   target_link_libraries(app PRIVATE bridge::bridge)
# and then #include <bridge/bridge.h>.
include(CMakePackageConfigHelpers)

get_property(bridge_libraries GLOBAL PROPERTY BRIDGE_LIBRARIES)
install(TARGETS ${bridge_libraries} bridge EXPORT bridgeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# Headers keep their repo-root layout under include/bridge, so the installed tree resolves the same
# "training/callbacks.h" includes that the sources use, and <bridge/bridge.h> names the umbrella.
foreach(folder utils parallel bridge training)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/bridge
          FILES_MATCHING PATTERN "*.h")
endforeach()

set(bridge_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/bridge)
install(EXPORT bridgeTargets NAMESPACE bridge:: DESTINATION ${bridge_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/bridgeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/bridgeConfig.cmake INSTALL_DESTINATION ${bridge_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/bridgeConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/bridgeConfig.cmake ${PROJECT_BINARY_DIR}/bridgeConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/BridgeTorch.cmake
        DESTINATION ${bridge_cmake_dir})

# Say where the installed programs load LibTorch from: it stays where it was at build time (their RPATH points there).
install(CODE "message(STATUS \"bridge: the installed programs and package use LibTorch ${Torch_VERSION} in place, from \"
                             \"${BRIDGE_LIBTORCH_LIBRARY_DIR}: keep it there (it is not copied into the prefix)\")")
