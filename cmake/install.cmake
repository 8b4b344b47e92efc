# install() rules (README "Using the library from your CMake project"): what a C++ user needs to
# call the library from their own project, and nothing else.
#   lib/libhils_reference.a, lib/libhils_oracle.a   hils::reference, hils::oracle
#   include/hils/*.hpp, include/hils/analysis/oracle.hpp, hard_cases.hpp   their public headers (file sets)
#   with CUDA: lib/libhils_gpu.a (hils::gpu), lib/libhils_gpu_c.so (hils::gpu_c, the C API),
#              include/hils/gpu/*
#   with HILS_BUILD_EXPERIMENTS: bin/hils and share/hils/plots/plot_study.py (for `hils plot`)
#   lib/cmake/hils/: hilsConfig.cmake, its version file and the exported targets
# Not installed: tests, benchmarks, the studies' library (hils_analysis), the I/O library
# (hils_experiments), private headers (src/*.hpp), the Python module (pip install . does that).
include(CMakePackageConfigHelpers)
set(HILS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/hils CACHE STRING
    "Where the CMake package hils (hilsConfig.cmake) is installed, relative to the prefix")

install(TARGETS hils_reference hils_oracle EXPORT hilsTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET hils_gpu)
  install(TARGETS hils_gpu_c EXPORT hilsTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  # hils::gpu needs the CUDA toolkit (cudart) in the user's project: its own export file, read
  # by hilsConfig.cmake only where CUDAToolkit is found, so that a CPU-only user is not refused.
  install(TARGETS hils_gpu EXPORT hilsGpuTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/gpu/include/hils/gpu
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hils)
  install(EXPORT hilsGpuTargets NAMESPACE hils:: DESTINATION ${HILS_INSTALL_CMAKEDIR})
endif()
if(TARGET hils)
  install(TARGETS hils RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/analysis/plots/plot_study.py
          DESTINATION ${CMAKE_INSTALL_DATADIR}/hils/plots)
endif()

install(EXPORT hilsTargets NAMESPACE hils:: DESTINATION ${HILS_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/hilsConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/hilsConfig.cmake
                              INSTALL_DESTINATION ${HILS_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/hilsConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/hilsConfig.cmake ${PROJECT_BINARY_DIR}/hilsConfigVersion.cmake
        DESTINATION ${HILS_INSTALL_CMAKEDIR})
