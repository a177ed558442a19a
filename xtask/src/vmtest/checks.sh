# The checks of `cargo xtask vm-test`, the same on the host and inside each VM (run there by
# init.sh). Every step leaves NAME.out (its output) and NAME.rc (its exit status) in $RESULTS;
# xtask/src/vmtest.rs judges them, so this script decides nothing.
# Environment: SCORCH (the binary), WORKLOADS (the test programs), RESULTS, PORT (for
# scorch run's HTTP server), STORE (a scratch store directory), WGET (a wget command), and
# on the host PYTHON and PYTHONHOME (Debian 12's CPython 3.11, which the guests have at
# /usr/bin/python3.11).
set -u
R=$RESULTS
WGET=${WGET:-wget}
step() {
    name=$1
    shift
    "$@" >"$R/$name.out" 2>&1
    echo $? >"$R/$name.rc"
}
uname -r >"$R/uname"

step check "$SCORCH" check

# The known call tree (6:3:1 over leaf_a, leaf_b, leaf_c), recorded for 10 s at 199 Hz. The
# workloads outlive any start-up (a kernel that refuses the unwinder spends minutes under TCG
# verifying it first) and are stopped after the recording.
"$WORKLOADS/calltree" 1 900 &
workload=$!
step record "$SCORCH" record --pid "$workload" --frequency 199 --duration 10s \
    --symbolize local --output "$R/calltree.folded"
kill "$workload" 2>/dev/null
wait "$workload" 2>/dev/null

# The same call tree built without frame pointers: its callers are found only by the BPF
# program's .eh_frame unwinder (--unwind auto, the default), which the verifier of each kernel
# must accept.
"$WORKLOADS/calltree_nofp" 1 900 &
workload=$!
step record-nofp "$SCORCH" record --pid "$workload" --frequency 199 --duration 10s \
    --symbolize local --output "$R/calltree_nofp.folded"
kill "$workload" 2>/dev/null
wait "$workload" 2>/dev/null

# A stripped Go binary (tests/workloads/gotree.go): named from its .gopclntab and unwound by
# its pc tables' stack deltas, which its frameless leaf `spin` needs to keep its caller.
"$WORKLOADS/gotree" 900 &
workload=$!
step record-go "$SCORCH" record --pid "$workload" --frequency 199 --duration 10s \
    --symbolize local --output "$R/gotree.folded"
kill "$workload" 2>/dev/null
wait "$workload" 2>/dev/null

# The Python call tree (tests/workloads/calltree.py) on Debian 12's CPython 3.11 (PYTHON, on
# the host), its frames walked by the BPF program and named from the interpreter's memory.
${PYTHON:-/usr/bin/python3.11} "$WORKLOADS/calltree.py" 900 &
workload=$!
step record-python "$SCORCH" record --pid "$workload" --frequency 199 --duration 10s \
    --symbolize local --output "$R/calltree-py.folded"
kill "$workload" 2>/dev/null
wait "$workload" 2>/dev/null

# Off-CPU time from the sched_switch hook: threads blocked 60/30/10% of the time in
# sleep_in_nanosleep, read_from_pipe and wait_for_mutex.
"$WORKLOADS/blocker" 900 &
workload=$!
step off-cpu "$SCORCH" record --pid "$workload" --off-cpu --off-cpu-mean 1ms --duration 8s \
    --symbolize local --output "$R/off-cpu.folded"
kill "$workload" 2>/dev/null
wait "$workload" 2>/dev/null

# Every map ceiling at its least: each stack map holds one stack, the process map one process
# and the row pools 1 MiB, system-wide beside the call tree without frame pointers and a
# kernel-heavy reader. The recording must end normally and count what the ceilings cost.
"$WORKLOADS/calltree_nofp" 1 900 &
calltree=$!
"$WORKLOADS/readzero" 900 &
readzero=$!
step ceilings "$SCORCH" record --frequency 199 --duration 6s --stack-map-entries 1 \
    --unwind-processes 1 --unwind-pool-mib 1 --output "$R/ceilings.folded"
kill "$calltree" "$readzero" 2>/dev/null
wait "$calltree" "$readzero" 2>/dev/null

# The daemon, system-wide, beside the call tree and a kernel-heavy reader of /dev/zero; then
# /healthz while it runs, and the store queried back after SIGTERM.
"$WORKLOADS/calltree" 1 90 &
calltree=$!
"$WORKLOADS/readzero" 90 &
readzero=$!
rm -rf "$STORE"
"$SCORCH" run --store "$STORE" --window 2s --frequency 99 \
    --http-address "127.0.0.1:$PORT" >"$R/run.out" 2>&1 &
daemon=$!
# Two windows written, however slow the machine (TCG loads and verifies the program slowly).
tries=0
while [ $tries -lt 240 ]; do
    windows=$($WGET -q -O - "http://127.0.0.1:$PORT/metrics" 2>/dev/null |
        sed -n 's/^scorch_windows_written_total \([0-9]*\).*/\1/p')
    [ "${windows:-0}" -ge 2 ] && break
    kill -0 "$daemon" 2>/dev/null || break
    sleep 0.5
    tries=$((tries + 1))
done
step healthz $WGET -q -O - "http://127.0.0.1:$PORT/healthz"
kill -TERM "$daemon" 2>/dev/null
wait "$daemon"
echo $? >"$R/run.rc"
kill "$calltree" "$readzero" 2>/dev/null
wait "$calltree" "$readzero" 2>/dev/null
step query-calltree "$SCORCH" query --store "$STORE" --since 1h \
    --match '{comm="calltree"}' --output "$R/query-calltree.folded"
step query-readzero "$SCORCH" query --store "$STORE" --since 1h \
    --match '{comm="readzero"}' --output "$R/query-readzero.folded"
rm -rf "$STORE"
echo done >"$R/done"
