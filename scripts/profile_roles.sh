#!/usr/bin/env bash
# Runs ON the GPU machine: Nsight Compute over bench/profile_roles.py (the roles of
# bench_peer_quack.py, ours and QuACK's where it is installed: scripts/peer_install.sh), a few
# metrics per kernel, printed as one table (kernel, NVTX range, metrics). Arguments go to
# profile_roles.py, e.g.
#   bash scripts/profile_roles.sh --shapes gpt-oss-20b --routing balanced,skewed --roles up_wgrad
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/profile_out}
mkdir -p "$OUT"
[ -f /tmp/peersite/env.sh ] && source /tmp/peersite/env.sh
export PYTHONPATH=$PWD/python:$PWD/bench:${PYTHONPATH:-}
METRICS=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,\
launch__grid_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,\
smsp__inst_executed.sum,sm__inst_issued.avg.pct_of_peak_sustained_active
ncu --profile-from-start off --metrics "$METRICS" -o "$OUT/roles" -f \
  python3 bench/profile_roles.py "$@" > "$OUT/ncu_stdout.txt" 2>&1 || {
  tail -30 "$OUT/ncu_stdout.txt"; exit 1; }
grep '^profiled:' "$OUT/ncu_stdout.txt"
ncu -i "$OUT/roles.ncu-rep" --csv --page raw --metrics "$METRICS" > "$OUT/roles.csv"
python3 - "$OUT/roles.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, rows = rows[0], rows[2:]  # second row: units
col = {h: i for i, h in enumerate(head)}
keys = [("time_us", "gpu__time_duration.sum", 1e-3),
        ("gmma%", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active", 1),
        ("act_avg", "sm__cycles_active.avg", 1), ("act_max", "sm__cycles_active.max", 1),
        ("act_min", "sm__cycles_active.min", 1),
        ("dram%", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1),
        ("l2hit%", "lts__t_sector_hit_rate.pct", 1), ("grid", "launch__grid_size", 1),
        ("regs", "launch__registers_per_thread", 1),
        ("smem", "launch__shared_mem_per_block_dynamic", 1),
        ("Minst", "smsp__inst_executed.sum", 1e-6),
        ("issue%", "sm__inst_issued.avg.pct_of_peak_sustained_active", 1)]
print("kernel (in profiled order) | " + " | ".join(k for k, _, _ in keys))
for r in rows:
    name = r[col["Kernel Name"]][:70] if "Kernel Name" in col else "?"
    vals = []
    for _, m, s in keys:
        try:
            v = float(r[col[m]].replace(",", "")) * s
            vals.append(f"{v:.1f}")
        except (KeyError, ValueError):
            vals.append("-")
    print(f"{name} | " + " | ".join(vals))
PY
