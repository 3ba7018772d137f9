"""bwprune: training-free pruning of LLMs during batched generation.

Importing the package pulls in neither Hydra nor OmegaConf, so the model, method and speed code
runs where only torch and transformers are installed (the GPU check). Entry points that compose
configs call `bwprune.config.register_resolvers()` first.
"""

__version__ = "0.1.0"
