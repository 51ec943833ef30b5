"""What a kernel is, in one record: a codelet class (graph.codelets*)
declares each of its fields with what it holds, and everything that has
to know a kernel's fields reads them here: the serializer's schema
(graph.serialize), the engine's readers and tensor lists, which kernels
may run side by side on the host (model/fast/lanes.py), which outputs may
hold a stand-in for their array (model/fast/fusion.py).

    @codelet
    class MatMulPartials:
        lhs: View = reads(through_views=True)
        rhs: View = reads(through_views=True)
        out: Tensor = writes(stand_in="the partials summed over the chunks")

A field is one of:
- reads(spec): views (or whole tensors, or immediates) the vertices read;
- writes(spec): tensors the vertices write;
- attribute(spec): what says how (an op's name, an axis, a body program).

`spec` says what the value is, in the serializer's words: "view",
"tensor", "operand" (a view, or an immediate held in vertex state: a
numpy scalar or 0-d array), "registered" (a (register, tensor) pair of an
element-wise chain), "int", "str", "bool", "array", "dtype", "instruction",
"dimensions" (gather or scatter dimension numbers), "any" (plain data);
"?x": x or None, "*x": a tuple of x.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View

_ROLE = "jax_ipu.role"


@dataclasses.dataclass(frozen=True)
class FieldRecord:
    """One declared field of a kernel."""
    name: str
    role: str                      # "reads" | "writes" | "attribute"
    spec: str
    # reads: the executors read it only through view readers, so that the
    # engine may hand them a view of a lazy Copy's source instead.
    through_views: bool = False
    # writes: what a fast executor may leave in the output's slot instead
    # of its array, for readers that take it (None: always an array).
    stand_in: str | None = None
    # attribute: the values it may take (a string field), else ().
    choices: tuple = ()

    def items(self, value) -> list:
        """The field's value as a flat list of its elements (a tuple
        unpacked, None dropped, a registered pair as its tensor)."""
        if value is None:
            return []
        spec = self.spec.lstrip("?")
        values = [x for x in value if x is not None] if spec.startswith("*") else [value]
        return [x[1] for x in values] if spec.lstrip("*") == "registered" else values


def reads(spec: str = "view", *, through_views: bool = False, default=dataclasses.MISSING):
    """A field of views (tensors, immediates) the kernel's vertices read."""
    return _field(FieldRecord("", "reads", spec, through_views=through_views), default)


def writes(spec: str = "tensor", *, stand_in: str | None = None):
    """A field of tensors the kernel's vertices write."""
    return _field(FieldRecord("", "writes", spec, stand_in=stand_in), dataclasses.MISSING)


def attribute(spec: str, *, choices=(), default=dataclasses.MISSING):
    """A field that says how the kernel computes (not data it reads)."""
    return _field(FieldRecord("", "attribute", spec, choices=tuple(choices)), default)


def _field(record: FieldRecord, default):
    return dataclasses.field(default=default, metadata={_ROLE: record})


@dataclasses.dataclass(frozen=True)
class Record:
    """A kernel class and its declared fields."""
    kind: type
    fields: tuple[FieldRecord, ...]
    # The kernel reads and writes only the tensors it names (a collective
    # also waits for the other replicas): it may run on any host thread.
    pure: bool

    @property
    def name(self) -> str:
        return self.kind.__name__

    def of_role(self, role: str) -> tuple[FieldRecord, ...]:
        return tuple(f for f in self.fields if f.role == role)

    @property
    def reads_through_views(self) -> bool:
        """Whether every field it reads is read through view readers."""
        return all(f.through_views for f in self.of_role("reads"))

    def views(self, kernel) -> list[View]:
        """The views the kernel reads (immediates and whole tensors left out)."""
        return [v for f in self.of_role("reads") for v in f.items(getattr(kernel, f.name)) if isinstance(v, View)]

    def read_tensors(self, kernel, without: str | None = None) -> list[Tensor]:
        """The tensors the kernel reads, once per mention (but through its
        field `without`)."""
        found = []
        for f in self.of_role("reads"):
            if f.name == without:
                continue
            for v in f.items(getattr(kernel, f.name)):
                if isinstance(v, View):
                    found.extend(v.tensors)
                elif isinstance(v, Tensor):
                    found.append(v)
        return found

    def written(self, kernel, without: str | None = None) -> list[Tensor]:
        """The tensors the kernel writes, once per mention (but through its
        field `without`)."""
        return [t for f in self.of_role("writes") if f.name != without for t in f.items(getattr(kernel, f.name))]

    def tensors(self, kernel, without: str | None = None) -> list[Tensor]:
        """Every tensor the kernel names (but through its field `without`):
        those it reads, then those it writes."""
        return self.read_tensors(kernel, without) + self.written(kernel, without)

    def schema(self) -> dict[str, str]:
        """{field: spec}, the serializer's entry for the kernel."""
        return {f.name: f.spec for f in self.fields}


# Every kernel class's record, by class.
RECORDS: dict[type, Record] = {}


def codelet(cls=None, *, pure: bool = True) -> Callable:
    """Makes a class a kernel: a dataclass (compared by identity) whose
    every field is declared with reads, writes or attribute, recorded in
    RECORDS. `pure=False` for a kernel that needs more than its own
    tensors (the other replicas of a collective)."""
    def make(cls):
        cls = dataclasses.dataclass(eq=False)(cls)
        fields = []
        for f in dataclasses.fields(cls):
            declared = f.metadata.get(_ROLE)
            if declared is None:
                raise TypeError(f"{cls.__name__}.{f.name}: a kernel's field says what it holds "
                                "(reads, writes or attribute, graph/records.py)")
            fields.append(dataclasses.replace(declared, name=f.name))
        if cls in RECORDS or any(r.name == cls.__name__ for r in RECORDS.values()):
            raise TypeError(f"two kernels named {cls.__name__}")
        RECORDS[cls] = Record(cls, tuple(fields), pure)
        return cls
    return make if cls is None else make(cls)


def record_of(kernel) -> Record:
    """The record of a kernel (or of a kernel class)."""
    return RECORDS[kernel if isinstance(kernel, type) else type(kernel)]


def is_immediate(x) -> bool:
    """An operand held in vertex state: a numpy scalar or array."""
    return isinstance(x, (np.ndarray, np.generic))


def tensor_ids(obj, found: list) -> list:
    """Ids of the tensors `obj` (a step, kernel, view, or a tuple, list or
    dict of them) refers to, once per mention; a kernel's as its record
    names them."""
    record = RECORDS.get(type(obj))
    if record is not None:
        found.extend(t.id for t in record.tensors(obj))
    elif isinstance(obj, Tensor):
        found.append(obj.id)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            tensor_ids(getattr(obj, field.name), found)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            tensor_ids(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            tensor_ids(item, found)
    return found
