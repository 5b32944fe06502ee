"""Transformers' logits processors on given logits, for titan's sampling test.

usage: python generate_warpers.py REQUEST RESPONSE
    REQUEST: {"cases": [{"logits": [...], "context": [ids], "repetition_penalty", "temperature",
    "top_k", "top_p", "min_p"}]}. Each case runs HF's RepetitionPenaltyLogitsProcessor, then
    the warpers in generate()'s order (temperature, top-k, top-p, min-p) on fp32 logits; RESPONSE
    holds {"logits": [[...]]} with removed tokens as null.
"""
import json
import math
import sys

import torch
from transformers.generation.logits_process import (MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)


def main():
    with open(sys.argv[1]) as f:
        request = json.load(f)
    out = []
    for case in request["cases"]:
        scores = torch.tensor([case["logits"]], dtype=torch.float32)
        ids = torch.tensor([case["context"]], dtype=torch.long)
        processors = [RepetitionPenaltyLogitsProcessor(case["repetition_penalty"]),
                      TemperatureLogitsWarper(case["temperature"])]
        if case["top_k"] > 0:
            processors.append(TopKLogitsWarper(case["top_k"]))
        if case["top_p"] < 1.0:
            processors.append(TopPLogitsWarper(case["top_p"]))
        if case["min_p"] > 0.0:
            processors.append(MinPLogitsWarper(case["min_p"]))
        for p in processors:
            scores = p(ids, scores)
        out.append([None if math.isinf(x) else x for x in scores[0].tolist()])
    with open(sys.argv[2], "w") as f:
        json.dump({"logits": out}, f)


if __name__ == "__main__":
    main()
