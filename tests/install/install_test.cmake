cmake_minimum_required(VERSION 3.25)
# cmake -P script behind the "install:" tests (tests/install/CMakeLists.txt):
#   MODE=install: cmake --install BUILD_DIR into WORK/prefix, check that only the consumer's
#     files are there, then configure, build and run consumer/ against it (CMAKE_PREFIX_PATH).
#   MODE=subdirectory: configure parent/, which add_subdirectory()s SOURCE_DIR.
# Other variables: GENERATOR, CXX_COMPILER, C_COMPILER, LAUNCHER (may be empty), LIBDIR,
# EXPECT_GPU (ON when the build has the GPU library).

# Runs a command; stops the test with its output when it fails.
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${what} failed (${status}):\n${ARGN}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Every installed file must be one a consumer needs (cmake/install.cmake's list), and the
# package's own files must be there.
function(check_installed_files prefix)
  file(GLOB_RECURSE installed RELATIVE ${prefix} ${prefix}/*)
  set(allowed "^include/hils/[a-z_]+\\.hpp$" "^include/hils/analysis/(oracle|hard_cases)\\.hpp$"
      "^include/hils/gpu/[a-z_]+\\.(hpp|h)$" "^${LIBDIR}/libhils_(reference|oracle|gpu)\\.a$"
      "^${LIBDIR}/libhils_gpu_c\\.so$" "^${LIBDIR}/cmake/hils/hils[A-Za-z-]*\\.cmake$"
      "^bin/hils$" "^share/hils/plots/plot_study\\.py$")
  foreach(file IN LISTS installed)
    set(known OFF)
    foreach(pattern IN LISTS allowed)
      if(file MATCHES "${pattern}")
        set(known ON)
      endif()
    endforeach()
    if(NOT known)
      message(FATAL_ERROR "installed but not for a consumer: ${file}")
    endif()
  endforeach()
  set(needed include/hils/hils.hpp include/hils/analysis/oracle.hpp include/hils/analysis/hard_cases.hpp
      ${LIBDIR}/libhils_reference.a ${LIBDIR}/libhils_oracle.a ${LIBDIR}/cmake/hils/hilsConfig.cmake
      ${LIBDIR}/cmake/hils/hilsConfigVersion.cmake ${LIBDIR}/cmake/hils/hilsTargets.cmake)
  if(EXPECT_GPU)
    list(APPEND needed include/hils/gpu/c_api.h ${LIBDIR}/libhils_gpu_c.so ${LIBDIR}/libhils_gpu.a)
  endif()
  foreach(file IN LISTS needed)
    if(NOT file IN_LIST installed)
      message(FATAL_ERROR "not installed: ${file}")
    endif()
  endforeach()
  list(LENGTH installed count)
  message(STATUS "${count} files installed, each one a consumer needs")
endfunction()

# The user's configure arguments: our generator and compilers (and ccache, when we use it).
function(user_configure_arguments out)
  set(arguments -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
  if(C_COMPILER)
    list(APPEND arguments -DCMAKE_C_COMPILER=${C_COMPILER})
  endif()
  if(LAUNCHER)
    list(APPEND arguments -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER} -DCMAKE_C_COMPILER_LAUNCHER=${LAUNCHER})
  endif()
  set(${out} ${arguments} PARENT_SCOPE)
endfunction()

# Runs a consumer program; it must exit 0 and print `expected`.
function(run_consumer program expected)
  run_step("${program}" ${program})
  message(STATUS "${step_output}")
  if(NOT step_output MATCHES "${expected}")
    message(FATAL_ERROR "${program} did not print '${expected}'")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
user_configure_arguments(configure)
if(MODE STREQUAL "install")
  run_step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK}/prefix)
  check_installed_files(${WORK}/prefix)
  run_step("configuring the consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer
           -B ${WORK}/build ${configure} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK}/prefix)
  # The package must come from the fresh prefix, not from anywhere else on the machine.
  file(STRINGS ${WORK}/build/CMakeCache.txt hils_dir REGEX "^hils_DIR:")
  if(NOT hils_dir STREQUAL "hils_DIR:PATH=${WORK}/prefix/${LIBDIR}/cmake/hils")
    message(FATAL_ERROR "the consumer found hils elsewhere: ${hils_dir}")
  endif()
  run_step("building the consumer" ${CMAKE_COMMAND} --build ${WORK}/build)
  run_consumer(${WORK}/build/judge_kernel
               "the oracle passes the float reference \\(also on 12 hard cases\\) and fails the moved output")
  if(EXPECT_GPU)
    run_consumer(${WORK}/build/gpu_c_names "= exact mean landmark_key taylor")
    run_consumer(${WORK}/build/gpu_workspace "workspace_bytes = 53485568")
  elseif(EXISTS ${WORK}/build/gpu_c_names)
    message(FATAL_ERROR "hils::gpu_c was installed by a build without the GPU library")
  endif()
elseif(MODE STREQUAL "subdirectory")
  run_step("configuring a parent project with add_subdirectory(hils-sim)" ${CMAKE_COMMAND}
           -S ${SOURCE_DIR}/tests/install/parent -B ${WORK}/build ${configure}
           -DHILS_SOURCE_DIR=${SOURCE_DIR})
  message(STATUS "${step_output}")
else()
  message(FATAL_ERROR "MODE: expected install or subdirectory, got '${MODE}'")
endif()
file(REMOVE_RECURSE ${WORK})
