"""titan train's measured communication per step against titan plan's (both by group and
collective). usage: comm_compare.py PLAN_JSON TRAIN_LOG [--table]

Reads the plan's `collectives_per_step` (titan plan --json) and the train log's lines after
"communication per step on rank 0" (train/comm_report.h), sums the plan's rows per (group,
collective) and prints one line per pair: measured calls and bytes, planned, and whether they agree.
Exits 1 when any pair differs (or one side lacks it), 2 when the log has no report."""
import json
import re
import sys

plan_path, log_path = sys.argv[1], sys.argv[2]
with open(plan_path) as f:
    plan = json.load(f)
planned = {}
for row in plan["collectives_per_step"]:
    key = (row["group"], row["collective"])
    calls, size = planned.get(key, (0, 0))
    planned[key] = (calls + row["calls"], size + row["bytes"])

measured = {}
found = False
line_re = re.compile(r"^\s+(\S+)\s+(\S+)\s+([0-9.e+]+) calls\s+([0-9.e+]+) bytes")
with open(log_path) as f:
    lines = f.read().splitlines()
for i, line in enumerate(lines):
    if line.startswith("communication per step on rank 0"):
        found = True
        for row in lines[i + 1:]:
            m = line_re.match(row)
            if not m:
                break
            measured[(m.group(1), m.group(2))] = (float(m.group(3)), float(m.group(4)))
if not found:
    print(f"{log_path}: no 'communication per step' report")
    sys.exit(2)

bad = 0
print(f"  {'group':<13} {'collective':<15} {'calls':>9} {'planned':>9} {'bytes':>14} {'planned':>14}")
for key in sorted(set(planned) | set(measured)):
    mc, mb = measured.get(key, (0, 0))
    pc, pb = planned.get(key, (0, 0))
    ok = mc == pc and mb == pb
    bad += 0 if ok else 1
    print(f"  {key[0]:<13} {key[1]:<15} {mc:>9g} {pc:>9} {mb:>14.0f} {pb:>14}  "
          f"{'equal' if ok else 'DIFFERENT'}")
sys.exit(1 if bad else 0)
