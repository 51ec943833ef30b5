"""The Python objects behind the PJRT handles: client, device, buffer,
executable. The compiled module `_capi` is the C API table over them."""
