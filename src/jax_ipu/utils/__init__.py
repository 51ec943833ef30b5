"""Small helpers of the bottom layer that hold no IPU logic: pausing the
garbage collector around large builds (gc_pause), reading protobuf wire
format without generated code (protowire)."""
