"""Exceptions users see. Each says what went wrong, where, and what to do.

The PJRT boundary turns them into PJRT errors with the code below, so JAX
raises them as JaxRuntimeError("<CODE>: <message>") instead of aborting.
"""


class IpuError(Exception):
    """Base class of every jax-ipu error."""

    pjrt_code = "INTERNAL"


class IpuCompileError(IpuError):
    """The program cannot be compiled for the IPU (unsupported op or dtype,
    malformed input). Raised at compile time, naming the op and its source
    line."""

    pjrt_code = "INVALID_ARGUMENT"

    @classmethod
    def for_op(cls, op, problem: str, advice: str) -> "IpuCompileError":
        """`op` is a jax_ipu.ir.Op: the message names it and its location."""
        name = op.name if "." in op.name else f"stablehlo.{op.name}"  # chlo.*, sdy.* keep their dialect
        return cls(f"{name} at {op.loc}: {problem}. {advice}")


class IpuUnimplementedError(IpuCompileError):
    """An op, attribute or dtype the IPU compiler does not support yet."""

    pjrt_code = "UNIMPLEMENTED"


class IpuInternalCompilerError(IpuCompileError):
    """A jax-ipu bug met while compiling: the message names the op."""

    pjrt_code = "INTERNAL"


class IpuOutOfMemoryError(IpuCompileError):
    """The compiled program does not fit in the tiles' SRAM."""

    pjrt_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, report=None, program=None):
        super().__init__(message)
        self.report = report        # the graph.memory.MemoryReport
        self.program = program      # the graph.Program that does not fit, for its profile


class IpuRuntimeError(IpuError):
    """Raised while a program runs on the device (or the IPU Model)."""

    pjrt_code = "INTERNAL"


class IpuReplicaFailed(IpuRuntimeError):
    """Raised in one run of a launch over several IPUs because another run
    of it failed (its error says more)."""


class IpuInvalidArgument(IpuError):
    """Bad input at the API: a dtype the IPU does not hold, a wrong shape."""

    pjrt_code = "INVALID_ARGUMENT"


class IpuResourceExhausted(IpuError):
    """A transfer or allocation that does not fit: the device's memory (a
    device_put beyond what is free) or the host's (MemoryError)."""

    pjrt_code = "RESOURCE_EXHAUSTED"


class IpuRunCancelled(IpuRuntimeError):
    """A run stopped at a loop iteration because the user interrupted the
    program (Ctrl-C)."""

    pjrt_code = "CANCELLED"
