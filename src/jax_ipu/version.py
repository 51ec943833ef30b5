"""The plugin's version: one place, read by packaging and the PJRT client."""
__version__ = "0.1.0"
