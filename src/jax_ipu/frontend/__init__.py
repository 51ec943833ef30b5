"""What runs on JAX's side of the plugin, in the user's process: the
lowering rules JAX needs for the `ipu` platform (jax_rules), host
callbacks (callbacks), and the user libraries built on them: infeed and
outfeed queues (feeds, public as jax_ipu.feeds) and pipeline parallelism
over IPUs (pipelining, public as jax_ipu.pipeline)."""
