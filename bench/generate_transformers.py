"""The Transformers side of bench_generate: AutoModelForCausalLM.generate on the same model folder
(loaded as --dtype, batch 1, greedy, static cache), the same prompt ids and exactly NEW new
tokens. Prints one line: "seconds S ttft T" for the best of the timed runs (generate end to end;
ttft from a max_new_tokens=1 run)."""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--prompt", required=True, help="JSON file holding the prompt ids")
    p.add_argument("--new", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype))
    model.eval()
    with open(a.prompt) as f:
        ids = torch.tensor([json.load(f)], dtype=torch.long)

    def run(new):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=new, min_new_tokens=new,
                                 cache_implementation="static", pad_token_id=0)
        assert out.shape[1] == ids.shape[1] + new
        return time.perf_counter() - start

    run(2)  # warm-up
    ttft = min(run(1) for _ in range(2))
    seconds = min(run(a.new) for _ in range(a.runs))
    print(f"seconds {seconds:.6f} ttft {ttft:.6f}", flush=True)


if __name__ == "__main__":
    main()
