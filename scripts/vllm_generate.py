"""Sample kernels for exported task prompts with vLLM's offline `LLM.generate`; write JSONL.

    kernelsynth prompts export --out prompts.jsonl
    python scripts/vllm_generate.py --model Qwen/Qwen2.5-Coder-7B-Instruct \
        --prompts prompts.jsonl --out samples.jsonl --n 8 --temperature 0.8
    kernelsynth generate --generator import --samples samples.jsonl

Each output line is one response: task_id, the templated prompt, response, model, sample index,
the sampling parameters and the token counts (what `--generator import` reads).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (the RFT group)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    args = ap.parse_args()

    from vllm import LLM, SamplingParams

    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    llm = LLM(model=args.model, tensor_parallel_size=args.tensor_parallel_size, seed=args.seed)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template(r["messages"], tokenize=False,
                                             add_generation_prompt=True) for r in rows]
    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    outputs = llm.generate(prompts, params)
    with args.out.open("w", encoding="utf-8") as fh:
        for row, result in zip(rows, outputs, strict=True):
            for j, completion in enumerate(result.outputs):
                fh.write(json.dumps({
                    "task_id": row["task_id"], "backend": row.get("backend"),
                    "prompt": result.prompt, "response": completion.text, "model": args.model,
                    "sample": j, "temperature": args.temperature, "top_p": args.top_p,
                    "max_tokens": args.max_tokens, "seed": args.seed,
                    "prompt_tokens": len(result.prompt_token_ids or []),
                    "completion_tokens": len(completion.token_ids),
                    "finish_reason": completion.finish_reason}) + "\n")


if __name__ == "__main__":
    main()
