"""usage: equal_to_single.py WORK [--adapter] REF FIRST_STEP RUN...

Each RUN's losses and grad norms (WORK/RUN.jsonl) from FIRST_STEP on within 1e-5 relative of the
reference run REF's (one process's, or a layout already checked against it), and its export
(WORK/RUN/hf/model.safetensors; with --adapter, a LoRA run's WORK/RUN/adapter/
adapter_model.safetensors) the same tensors and shapes as REF's; the largest difference of the
exports is printed, not bounded (a trained export's elements may differ by AdamW's update of a
nearly cancelling sum; the byte-equal exports are compared with cmp by the callers). Shared by
the tensor- and expert-parallel e2e tests and LoRA's under them."""
import json
import sys

from safetensors.torch import load_file

arguments = sys.argv[1:]
work = arguments.pop(0)
adapter = arguments[0] == "--adapter"
if adapter:
    arguments.pop(0)
export = "adapter/adapter_model.safetensors" if adapter else "hf/model.safetensors"
reference, first, names = arguments[0], int(arguments[1]), arguments[2:]


def records(name):
    return {r["step"]: r for r in map(json.loads, open(f"{work}/{name}.jsonl")) if "loss" in r}


single = records(reference)
assert sorted(single) in (list(range(1, 3)), list(range(1, 11))), sorted(single)
ref = load_file(f"{work}/{reference}/{export}")
for name in names:
    run = records(name)
    assert sorted(run) == [s for s in sorted(single) if s >= first], f"{name}: steps {sorted(run)}"
    worst_step = 0.0
    for step, r in run.items():
        for key in ("loss", "grad_norm"):
            rel = abs(r[key] - single[step][key]) / abs(single[step][key])
            worst_step = max(worst_step, rel)
            assert rel <= 1e-5, f"{name} step {step} {key}: {r[key]} vs {single[step][key]} ({rel:.2e})"
    got = load_file(f"{work}/{name}/{export}")
    assert got.keys() == ref.keys(), f"{name}: the exported tensors differ"
    for k in ref:
        assert got[k].shape == ref[k].shape, f"{name}: {k} {tuple(got[k].shape)} vs {tuple(ref[k].shape)}"
    worst = max((got[k].float() - ref[k].float()).abs().max().item() for k in ref)
    print(f"{name}: {len(run)} losses and grad norms within {worst_step:.1e} relative of one "
          f"process; {'adapter' if adapter else 'export'} within {worst:.1e}")
