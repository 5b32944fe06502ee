# Sourced by the e2e scripts whose ranks run under OpenMPI (titan launch, or mpirun itself):
# `. "$(dirname "$0")/mpi_env.sh"`.
# shellcheck shell=bash
# More ranks than this machine's cores; as root (titan launch passes both flags itself).
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A session directory of this script's own (inside its $work, which every caller makes first):
# two mpirun starting at once under `ctest -j` both create the shared default /tmp/ompi.<host>.<uid>
# and the loser's orte_init fails ("File exists").
mkdir -p "${work:?mpi_env.sh: set work first}/ompi"
export OMPI_MCA_orte_tmpdir_base="$work/ompi"
# Under AddressSanitizer: OpenMPI's own never-freed allocations are not titan's leaks.
export OMPI_MCA_mca_base_component_disable_dlclose=1
LSAN_OPTIONS="suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/openmpi.lsan.supp"
export LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0:print_suppressions=0"
