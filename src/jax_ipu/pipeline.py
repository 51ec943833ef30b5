"""jax_ipu.pipeline, the public path of pipeline parallelism over IPUs
(GPipe and 1F1B; defined in jax_ipu.frontend.pipelining)."""
from jax_ipu.frontend.pipelining import (
                                         bubble_fraction,
                                         gpipe,
                                         microbatches,
                                         one_f_one_b,
                                         stack_stages,
                                         stash_slots,
                                         ticks,
                                         ticks_1f1b,
)

__all__ = ["bubble_fraction", "gpipe", "microbatches", "one_f_one_b", "stack_stages", "stash_slots", "ticks",
           "ticks_1f1b"]
