"""bwprune: training-free pruning of LLMs during batched generation.

Importing the package registers the OmegaConf resolvers the configs use (`bwprune_data_dir`).
"""

from bwprune.config import register_resolvers

register_resolvers()

__version__ = "0.1.0"
