# SPDX-License-Identifier: Apache-2.0
# Source this before `mpirun` on a small shared machine (a laptop, a CI runner, a container):
# Open MPI settings that make oversubscribed local runs work and stay fast. Not needed on a
# cluster node with one core per rank. Each setting is explained in docs/launching.md.
if [ "$(id -u)" = 0 ]; then
  # Open MPI refuses to start as root without these (containers and CI run as root).
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1       # more ranks than cores is allowed
export OMPI_MCA_hwloc_base_binding_policy=none   # never pin ranks to one core each
export OMPI_MCA_mpi_yield_when_idle=1            # waiting ranks yield instead of busy-polling
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # CMA fails in containers without ptrace
# Single-host runs: keep Open MPI's traffic on loopback unless the caller chose interfaces.
if [ -z "${DPTRAIN_MULTI_HOST:-}" ]; then
  export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-lo}
  export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
fi
