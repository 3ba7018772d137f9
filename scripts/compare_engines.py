"""Two engines, one answer: a method's decisions in the HF loop and in vLLM, forward by forward.

    python scripts/compare_engines.py method=teal benchmark=gsm8k 'subset=[200,201]' \
        batch_size=8 generation.max_new_tokens=48
    python scripts/compare_engines.py --tensor-parallel 2 method=ours ...   # vLLM: 1 vs 2 workers

Generates the selected problems once with the HF loop, runs those tokens through both engines
(teacher forcing) and prints one JSON line (one per batch size: `'batch_size=[1,8]'` runs
each on the same engine): forwards, decisions (kept sets, keep-mask entries),
how many differ and how many of those are not near-ties, the logits' largest |Δ| and KL
(`bwprune.vllm.running.compare`; docs/vllm.md, "Equal to the HF host"). With
`--tensor-parallel N` the same tokens go through vLLM's one worker and through N workers instead,
and the line compares those two.
"""

import json
import sys
from pathlib import Path

from bwprune.vllm.running.compare import main

FLAG = "--tensor-parallel"

if __name__ == "__main__":
    conf = Path(__file__).resolve().parent.parent / "conf"
    args, size = sys.argv[1:], 1
    if FLAG in args:
        at = args.index(FLAG)
        if at + 1 == len(args) or not args[at + 1].isdigit() or int(args[at + 1]) < 2:
            sys.exit(f"error: {FLAG} needs a worker count of 2 or more, e.g. {FLAG} 2")
        size, args = int(args[at + 1]), args[:at] + args[at + 2 :]
    for line in main(conf, args, size):
        print(json.dumps(line), flush=True)
