"""The IPU Model: targets (the machine's figures) and the engine that runs a
compiled graph.Program on them, counting cycles and bytes."""
