"""The Poplar-shaped Program the compiler emits and the engine runs: tensors
with tile mappings, compute sets of vertices, copies (exchange), control
programs and host streams. It is the contract between compiler and machine."""
from jax_ipu.graph.compute import ComputeSet, Vertex
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.program import Program
from jax_ipu.graph.programs import (
    Call,
    Copy,
    DeviceToHost,
    Execute,
    HostToDevice,
    If,
    Repeat,
    RepeatWhileTrue,
    Sequence,
    Switch,
)
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import Concat, View

__all__ = ["Call", "ComputeSet", "Concat", "Copy", "DeviceToHost", "Execute", "HostToDevice", "If",
           "Program", "Repeat", "RepeatWhileTrue", "Sequence", "Switch", "Tensor", "TileMapping",
           "Vertex", "View"]
