"""TriSP: tri-signal structured pruning (paper B, arXiv 2607.22587), built on FLAP.

`calibrate` (Eq. 1–3), `scores` (Eq. 4–6 and AL-AM allocation), `prune` (physical removal, bias
compensation, save/reload), `lora` (LoRA recovery), `method` (the `PruningMethod`).
"""

from baselines.trisp.method import TriSP
from baselines.trisp.prune import load_pruned, save_pruned

__all__ = ["TriSP", "load_pruned", "save_pruned"]
