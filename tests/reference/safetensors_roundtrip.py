"""Reference side of tests/unit/test_safetensors_python.cpp, using the real `safetensors` package.

  check DIR   load the files titan.cpp wrote into DIR and compare every value
  write DIR   write files with safetensors / huggingface_hub for titan.cpp to read

Tensor values follow one formula on both sides: v[i] = (i * 37 % 101 - 50) / 8 + offset, in fp32,
rounded to the stored dtype by torch (round to nearest even).
"""
import json
import math
import os
import sys

import numpy as np
import torch
from huggingface_hub import save_torch_state_dict
from safetensors import safe_open
from safetensors.numpy import load_file as np_load_file
from safetensors.torch import load_file as torch_load_file
from safetensors.torch import save_file as torch_save_file

SPECIAL = [0.0, -0.0, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 65520.0, 1e-7, -2.5, math.inf, math.nan]


def values(shape, offset=0.0):
    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.int64)
    v = ((i * 37 % 101 - 50).astype(np.float32) / np.float32(8)) + np.float32(offset)
    return v.reshape(shape)


def expect_equal(name, got, want):
    got = torch.as_tensor(got)
    want = torch.as_tensor(want)
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        sys.exit(f"{name}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
    if got.dtype.is_floating_point:
        same = torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(
            torch.nan_to_num(got).view(torch.int16 if got.element_size() == 2 else torch.int32),
            torch.nan_to_num(want).view(torch.int16 if want.element_size() == 2 else torch.int32))
    else:
        same = torch.equal(got, want)
    if not same:
        sys.exit(f"{name}: values differ\n got {got.flatten()[:8]}\nwant {want.flatten()[:8]}")


def check(d):
    # One file per stored dtype: numpy for F32/F16/I32/I64, torch for BF16 (numpy has none).
    f32 = np_load_file(os.path.join(d, "f32.safetensors"))
    expect_equal("f32/w", torch.from_numpy(f32["w"]), torch.from_numpy(values([5, 7])))
    expect_equal("f32/scalar", torch.from_numpy(f32["scalar"]), torch.from_numpy(values([], 1.0)))
    expect_equal("f32/empty", torch.from_numpy(f32["empty"]), torch.zeros(0, 4))
    expect_equal("f32/i32", torch.from_numpy(f32["i32"]), torch.arange(-3, 3, dtype=torch.int32).reshape(2, 3))
    expect_equal("f32/i64", torch.from_numpy(f32["i64"]), torch.tensor([10, -(2**40)], dtype=torch.int64))
    with safe_open(os.path.join(d, "f32.safetensors"), framework="pt") as f:
        if f.metadata() != {"format": "pt"}:
            sys.exit(f"f32.safetensors: metadata {f.metadata()}")
    special = torch.tensor(SPECIAL, dtype=torch.float32)
    bf16 = torch_load_file(os.path.join(d, "bf16.safetensors"))
    expect_equal("bf16/w", bf16["w"], torch.from_numpy(values([5, 7])).to(torch.bfloat16))
    expect_equal("bf16/special", bf16["special"], special.to(torch.bfloat16))
    expect_equal("bf16/i64", bf16["i64"], torch.tensor([10, -(2**40)], dtype=torch.int64))
    f16 = np_load_file(os.path.join(d, "f16.safetensors"))
    expect_equal("f16/w", torch.from_numpy(f16["w"]), torch.from_numpy(values([5, 7]).astype(np.float16)))
    expect_equal("f16/special", torch.from_numpy(f16["special"]), special.to(torch.float16))
    # The sharded folder, read the way transformers does: index -> shards.
    sharded = os.path.join(d, "sharded")
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        index = json.load(f)
    if list(index["weight_map"]) != sorted(index["weight_map"]):
        sys.exit("index: weight_map is not sorted")
    total = 0
    loaded = {}
    for shard in sorted(set(index["weight_map"].values())):
        for name, t in torch_load_file(os.path.join(sharded, shard)).items():
            if index["weight_map"][name] != shard:
                sys.exit(f"index: {name} is in {shard}, index says {index['weight_map'][name]}")
            loaded[name] = t
            total += t.numel() * t.element_size()
    if total != index["metadata"]["total_size"]:
        sys.exit(f"index: total_size {index['metadata']['total_size']} != {total}")
    if len(set(index["weight_map"].values())) < 2:
        sys.exit("sharded: expected several shards")
    for layer in range(4):
        name = f"model.layers.{layer}.mlp.up_proj.weight"
        expect_equal(name, loaded[name], torch.from_numpy(values([32, 16], layer)).to(torch.bfloat16))
    print("ok")


def write(d):
    special = torch.tensor(SPECIAL, dtype=torch.float32)
    tensors = {
        "w_bf16": torch.from_numpy(values([5, 7])).to(torch.bfloat16),
        "w_f16": torch.from_numpy(values([3, 4])).to(torch.float16),
        "w_f32": torch.from_numpy(values([2, 3, 4], 0.5)),
        "special_bf16": special.to(torch.bfloat16),
        "ids": torch.tensor([7, -(2**40), 3], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
    }
    torch_save_file(tensors, os.path.join(d, "py_single.safetensors"), metadata={"format": "pt", "who": "python"})
    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.from_numpy(values([32, 16], i)).to(torch.bfloat16)
             for i in range(4)}
    os.makedirs(os.path.join(d, "py_sharded"))
    save_torch_state_dict(state, os.path.join(d, "py_sharded"), max_shard_size=2500)
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        sys.exit(__doc__)
    {"check": check, "write": write}[sys.argv[1]](sys.argv[2])
