"""jax_ipu.feeds, the public path of the infeed and outfeed queues
(defined in jax_ipu.frontend.feeds)."""
from jax_ipu.frontend.feeds import DEFAULT_TIMEOUT, FeedError, FeedTimeout, InfeedQueue, OutfeedQueue, infeed, outfeed

__all__ = ["DEFAULT_TIMEOUT", "FeedError", "FeedTimeout", "InfeedQueue", "OutfeedQueue", "infeed", "outfeed"]
