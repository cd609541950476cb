#!/usr/bin/env bash
# The figures of a many-core machine in one run, against a deadline: the
# bench at 16, 8 and 4 ranks (private buffers), the examples at 4, 8 and 16
# ranks (with and without the NumPy hook), and the bench with one CPU-bound
# process beside every two ranks (README, Performance: "4, 8 and 16 ranks
# on 16 cores").  Each step's output lands in $OUT/steps.tgz as it goes, a
# summary in $OUT/sweep.log; a step is cut at the deadline, and once less
# than 20 s remain the rest are skipped.
#
#   [STEPS="b16 alloc8 ..."] bash tools/sweep.sh [BUDGET_SECONDS]
#
# STEPS (default: all, in this order): info, huge (remount /dev/shm with
# huge=within_size where allowed, and say what pool memory gets), b16, b8,
# ex8, b4, load8, b16b, ex16, load16, alloc4, alloc8, alloc16 (the examples
# under CXLMPI_ALLOC=1).
#
# PY (default python3) must import cxlmpi, mpi4py and numpy, and mpiexec
# be on PATH -- except where .whl/ holds the mpich and mpi4py wheels (a
# machine with nothing installed and no network): they are installed under
# /tmp/mp first.  Either way the run stops unless a 2-rank job reports
# MPICH on 2 ranks (an mpi4py that loads another MPI runs every rank alone).
set -u
BUDGET=${1:-480}
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --prefix /tmp/mp .whl/*.whl || exit 1
  export PYTHONPATH=$(echo /tmp/mp/lib/python3*/site-packages):$PWD PATH=/tmp/mp/bin:$PATH
  export MPI4PY_LIBMPI=/tmp/mp/lib/libmpi.so.12 MPIEXEC=/tmp/mp/bin/mpiexec
else
  export PYTHONPATH=$PWD:${PYTHONPATH:-}
fi
export HYDRA_LAUNCHER=fork
LOG=$OUT/sweep.log
S=/tmp/steps; mkdir -p $S
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# step NAME MAXSECS cmd...: run it, killed after MAXSECS or at the deadline
step() {
  local name=$1 max=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then echo "## $name: skipped ($l s left)" | tee -a "$LOG"; return; fi
  [ "$max" -gt $((l - 5)) ] && max=$((l - 5))
  echo "## $name (t=$(( $(date +%s) - T0 )) s): $*" | tee -a "$LOG"
  local s; s=$(date +%s)
  timeout -k 5 "$max" "$@" > "$S/$name.txt" 2>&1; local rc=$?
  grep -v "^WARNING\|^#\s*$\|^=\|^$" "$S/$name.txt" | tail -80 >> "$LOG"
  tar czf "$OUT/steps.tgz" -C "$S" .
  echo "## $name rc=$rc in $(( $(date +%s) - s )) s" | tee -a "$LOG"
  rm -f /dev/shm/mpich_shm_* 2>/dev/null
}
BUSY=""
busy() { local i; for i in $(seq "$1"); do $PY -c "while True: pass" & BUSY="$BUSY $!"; done; }
unbusy() { kill $BUSY 2>/dev/null; wait $BUSY 2>/dev/null; BUSY=""; }

{ nproc; lscpu | grep -i "model name\|numa\|socket\|thread"; df -h /dev/shm; uname -r; } >> "$LOG" 2>&1
mpiexec -n 2 $PY -c "from mpi4py import MPI; import cxlmpi; c=MPI.COMM_WORLD; print(c.rank, c.size, MPI.Get_library_version().split(chr(10))[0])" 2>&1 | tee -a "$LOG" | grep -q "1 2 MPICH" || { echo "## wrong MPI: stop" | tee -a "$LOG"; exit 1; }
B="-m cxlmpi.bench --sizes 64K,1M,16M --rounds 3"
C="tools/compare.py --repeat 3"
examples() {  # examples N PROGRAMS...: each under compare.py on N ranks
  local n=$1 p; shift
  for p in "$@"; do
    case $p in
      train) $PY $C -n "$n" examples/train_allreduce.py -- --steps 150 ;;
      *) $PY $C -n "$n" "examples/$p.py" ;;
    esac
  done
}
export -f examples; export C PY   # (for the steps' `bash -c`)
ALL="jacobi_solver kmeans pagerank train"
for s in ${STEPS:-info b16 b8 ex8 b4 load8 b16b ex16 load16 alloc4 alloc8 alloc16}; do
  case $s in
    info) step info 30 mpiexec -n 2 $PY -m cxlmpi --info ;;
    huge) step huge 30 bash -c "mount -o remount,huge=within_size /dev/shm; grep shm /proc/mounts; mpiexec -n 2 $PY -m cxlmpi --info | grep -i huge" ;;
    b16) step b16 90 mpiexec -n 16 $PY $B --ops Bcast,Allgather,Gather,Allreduce ;;
    b8) step b8 60 mpiexec -n 8 $PY $B --ops Bcast,Allgather,Gather,Allreduce,Reduce_scatter_block,Alltoall ;;
    ex8) step ex8 130 bash -c "examples 8 $ALL" ;;
    b4) step b4 45 mpiexec -n 4 $PY $B --ops Bcast,Allgather,Gather,Allreduce,Reduce_scatter_block,Alltoall ;;
    load8) busy 4; step load8 40 mpiexec -n 8 $PY $B --ops Allreduce,Bcast,Allgather; unbusy ;;
    b16b) step b16b 120 mpiexec -n 16 $PY $B --ops Reduce_scatter_block,Alltoall,Scatter,Reduce ;;
    ex16) step ex16 80 bash -c "examples 16 train kmeans" ;;
    load16) busy 8; step load16 40 mpiexec -n 16 $PY $B --ops Allreduce,Bcast,Allgather; unbusy ;;
    alloc4|alloc8|alloc16)
      step "$s" 130 env CXLMPI_ALLOC=1 bash -c "examples ${s#alloc} $ALL" ;;
    *) echo "## $s: no such step" | tee -a "$LOG" ;;
  esac
done
echo "## done at t=$(( $(date +%s) - T0 )) s" | tee -a "$LOG"
