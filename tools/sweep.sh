#!/usr/bin/env bash
# The figures of a many-core machine in one run, against a deadline: the
# bench at 16, 8 and 4 ranks (private buffers), the examples at 8 and 16
# ranks, and the bench with one CPU-bound process beside every two ranks
# (README, Performance: "4, 8 and 16 ranks on 16 cores").  Each step's
# output lands in $OUT/steps.tgz as it goes, a summary in $OUT/sweep.log;
# a step that no longer fits in BUDGET seconds is skipped.
#
#   bash tools/sweep.sh [BUDGET_SECONDS]
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
# step NAME NEED MAXSECS cmd...: run when NEED seconds remain, kill after MAXSECS
step() {
  local name=$1 need=$2 max=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt "$need" ]; then echo "## $name: skipped ($l s left)" | tee -a "$LOG"; return; fi
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
step info 400 30 mpiexec -n 2 $PY -m cxlmpi --info
step b16 400 90 mpiexec -n 16 $PY $B --ops Bcast,Allgather,Gather,Allreduce
step b8 300 60 mpiexec -n 8 $PY $B --ops Bcast,Allgather,Gather,Allreduce,Reduce_scatter_block,Alltoall
C="tools/compare.py --repeat 3"
step ex8 240 130 bash -c "$PY $C -n 8 examples/train_allreduce.py -- --steps 150; $PY $C -n 8 examples/jacobi_solver.py; $PY $C -n 8 examples/kmeans.py; $PY $C -n 8 examples/pagerank.py"
step b4 120 45 mpiexec -n 4 $PY $B --ops Bcast,Allgather,Gather,Allreduce,Reduce_scatter_block,Alltoall
busy 4
step load8 80 40 mpiexec -n 8 $PY $B --ops Allreduce,Bcast,Allgather
unbusy
step b16b 70 60 mpiexec -n 16 $PY $B --ops Reduce_scatter_block,Alltoall,Scatter,Reduce
step ex16 60 80 bash -c "$PY $C -n 16 examples/train_allreduce.py -- --steps 150; $PY $C -n 16 examples/kmeans.py"
busy 8
step load16 40 40 mpiexec -n 16 $PY $B --ops Allreduce,Bcast,Allgather
unbusy
echo "## done at t=$(( $(date +%s) - T0 )) s" | tee -a "$LOG"
