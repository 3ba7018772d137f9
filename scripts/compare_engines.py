"""Two engines, one answer: a method's decisions in the HF loop and in vLLM, forward by forward.

    python scripts/compare_engines.py method=teal benchmark=gsm8k 'subset=[200,201]' \
        batch_size=8 generation.max_new_tokens=48

Generates the selected problems once with the HF loop, runs those tokens through both engines
(teacher forcing) and prints one JSON line (one per batch size: `'batch_size=[1,8]'` runs
each on the same engine): forwards, decisions (kept sets, keep-mask entries),
how many differ and how many of those are not near-ties, the logits' largest |Δ| and KL
(`bwprune.vllm.running.compare`; docs/vllm.md, "Equal to the HF host").
"""

import json
import sys
from pathlib import Path

from bwprune.vllm.running.compare import main

if __name__ == "__main__":
    conf = Path(__file__).resolve().parent.parent / "conf"
    for line in main(conf, sys.argv[1:]):
        print(json.dumps(line), flush=True)
