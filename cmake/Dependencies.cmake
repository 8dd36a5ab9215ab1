# Third-party packages, all from Debian (scripts/install-deps.sh installs them).
find_package(MPI REQUIRED COMPONENTS C)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(ZLIB REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)
# model.onnx: the ONNX project's own parser and checker (libonnx-dev), over protobuf.
find_package(Protobuf REQUIRED)
find_package(ONNX CONFIG REQUIRED)

# Debian's dnnl-config.cmake drags in OpenCL; the CPU library needs none of it, so find the
# library and header directly.
find_path(DNNL_INCLUDE_DIR dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
if(EXISTS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
  file(STRINGS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _v REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" dnnl_VERSION "${_v}")
endif()
add_library(dptrain_dnnl INTERFACE)
target_include_directories(dptrain_dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
target_link_libraries(dptrain_dnnl INTERFACE ${DNNL_LIBRARY})
add_library(dptrain::dnnl ALIAS dptrain_dnnl)

# mpi.h from C++ without the deprecated C++ bindings.
add_library(dptrain_mpi INTERFACE)
target_link_libraries(dptrain_mpi INTERFACE MPI::MPI_C)
target_compile_definitions(dptrain_mpi INTERFACE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
add_library(dptrain::mpi ALIAS dptrain_mpi)

if(DPTRAIN_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(DPTRAIN_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
