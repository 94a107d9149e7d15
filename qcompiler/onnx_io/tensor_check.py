"""One check for every TensorProto a model holds, wherever it is, before any of its data is used.

Where tensors hide in a ModelProto: graph initializers and sparse initializers (values and indices), node
attributes of type TENSOR, TENSORS, SPARSE_TENSOR and SPARSE_TENSORS (Constant's `value` and `sparse_value`, but
any op may carry them), the bodies of If/Loop/Scan (GRAPH and GRAPHS attributes, at any depth), model-local
functions (their nodes and default attributes) and training info (initialization and algorithm graphs). The
importer calls `check_tensor` for initializers and `scan_attributes` for each node of the graphs it imports, and
`scan_model_extras` for the parts it keeps verbatim (functions, training info).

What is checked, from the header fields only (no weight is decoded, nothing is allocated from a dimension):
- the element type is a known one (UNDEFINED and unknown numbers are refused), no dimension is negative;
- raw data holds exactly prod(dims) elements (sub-byte types packed: ceil(n * bits / 8) bytes; strings have no
  raw data); with no raw data, the one typed field of the element type holds prod(dims) entries (two per element
  for complex types, packed pairs or quads for 4- and 2-bit types) and no other typed field is set;
- external data: resolved against the model's folder only (real path inside the real folder, never the working
  directory or a temporary folder); a location that is absolute, escapes the folder, holds a NUL byte, or names a
  folder, device, FIFO or socket is refused, and offset/length must lie inside the file and match the shape.
  Initializers keep a lazy reference (`ExternalRef`); every other tensor gets its bytes inlined into raw_data at
  import, so no external location is ever written out again or reaches onnxruntime (which would resolve it
  against whatever folder its session file is in).

Python ints throughout: a dimension of 2^62 cannot overflow a size.
"""
from __future__ import annotations

import contextvars
import functools
import math
import os
import stat
from typing import Callable, Optional

import onnx

from qcompiler.errors import InvalidModelError, ModelLoadError
from qcompiler.ir.tensor import ExternalRef, read_external_bytes
from qcompiler.shorten import short_text

TP = onnx.TensorProto
AT = onnx.AttributeProto
EXTERNAL = TP.EXTERNAL
STRING = TP.STRING

# TensorProto typed-data field numbers
_FLOAT, _INT32, _STRINGS, _INT64, _DOUBLE, _UINT64 = 4, 5, 6, 7, 10, 11
_TYPED = {_FLOAT: "float_data", _INT32: "int32_data", _STRINGS: "string_data", _INT64: "int64_data",
          _DOUBLE: "double_data", _UINT64: "uint64_data"}
_SEGMENT, _RAW = 3, 9

# element type -> (bits per element in raw_data (0: no raw data), typed field, typed entries = ceil(n * num / den))
_SPEC_BY_NAME = {
    "FLOAT": (32, _FLOAT, 1, 1), "UINT8": (8, _INT32, 1, 1), "INT8": (8, _INT32, 1, 1),
    "UINT16": (16, _INT32, 1, 1), "INT16": (16, _INT32, 1, 1), "INT32": (32, _INT32, 1, 1),
    "INT64": (64, _INT64, 1, 1), "STRING": (0, _STRINGS, 1, 1), "BOOL": (8, _INT32, 1, 1),
    "FLOAT16": (16, _INT32, 1, 1), "DOUBLE": (64, _DOUBLE, 1, 1), "UINT32": (32, _UINT64, 1, 1),
    "UINT64": (64, _UINT64, 1, 1), "COMPLEX64": (64, _FLOAT, 2, 1), "COMPLEX128": (128, _DOUBLE, 2, 1),
    "BFLOAT16": (16, _INT32, 1, 1), "FLOAT8E4M3FN": (8, _INT32, 1, 1), "FLOAT8E4M3FNUZ": (8, _INT32, 1, 1),
    "FLOAT8E5M2": (8, _INT32, 1, 1), "FLOAT8E5M2FNUZ": (8, _INT32, 1, 1), "UINT4": (4, _INT32, 1, 2),
    "INT4": (4, _INT32, 1, 2), "FLOAT4E2M1": (4, _INT32, 1, 2), "FLOAT8E8M0": (8, _INT32, 1, 1),
    "UINT2": (2, _INT32, 1, 4), "INT2": (2, _INT32, 1, 4), "FLOAT6E2M3": (6, _INT32, 1, 1),
    "FLOAT6E3M2": (6, _INT32, 1, 1),
}
# NOTE: only the types this onnx knows: numpy_helper could not decode any other, so it is refused at import
SPEC = {v: _SPEC_BY_NAME[k] for k, v in TP.DataType.items() if k in _SPEC_BY_NAME}

_prod = math.prod

# A sparse tensor is made dense by onnxruntime when the session is built: its dense size is a header field
DENSE_LIMIT = 1 << 32

# AttributeProto payload field numbers -> the attribute type they belong to
_A_T, _A_G, _A_TENSORS, _A_GRAPHS, _A_SPARSE, _A_SPARSES, _A_TYPE = 5, 6, 10, 11, 22, 23, 20
_PAYLOAD_TYPE = {_A_T: AT.TENSOR, _A_G: AT.GRAPH, _A_TENSORS: AT.TENSORS, _A_GRAPHS: AT.GRAPHS,
                 _A_SPARSE: AT.SPARSE_TENSOR, _A_SPARSES: AT.SPARSE_TENSORS}
_ATTR_TYPES = frozenset(v for k, v in AT.AttributeType.items() if k != "UNDEFINED")
_GRAPH, _GRAPHS = AT.GRAPH, AT.GRAPHS
_FIELD_KEY = {AT.DESCRIPTOR.fields_by_number[k]: k for k in (_A_TYPE, *_PAYLOAD_TYPE)}
_TYPE_FD = AT.DESCRIPTOR.fields_by_number[_A_TYPE]
_NAME_FD = AT.DESCRIPTOR.fields_by_number[1]
# (value field, type) of a plain attribute: name, one value of a scalar or list type, its type, nothing else
_PLAIN = frozenset((AT.DESCRIPTOR.fields_by_number[k], t) for k, t in
                   ((2, AT.FLOAT), (3, AT.INT), (4, AT.STRING), (7, AT.FLOATS), (8, AT.INTS), (9, AT.STRINGS)))


# real paths of the external-data files resolved while a model is imported (see `collect_external_files`)
_FILES: contextvars.ContextVar = contextvars.ContextVar("qcompiler_external_files", default=None)


class collect_external_files:
    """`with collect_external_files() as files:` gathers the real path of every external-data file resolved
    inside the block (so writers can refuse to overwrite any file an input reads)."""

    def __enter__(self) -> set:
        self.files: set = set()
        self._token = _FILES.set(self.files)
        return self.files

    def __exit__(self, *exc) -> None:
        _FILES.reset(self._token)


short = short_text   # names from the model in messages (qcompiler/shorten.py)


def not_utf8(what: str, value) -> InvalidModelError:
    """The error for a string field that is not valid UTF-8 (upb hands such a field back as bytes, which every
    later reader and the exporter would trip over)."""
    return InvalidModelError(f"{what} '{short(value)}' is not valid UTF-8 text; refused")


def check_text(value, what: Callable[[], str]) -> None:
    """Refuse a string field of the model that is not valid UTF-8 (`what()` names it, called on failure only)."""
    if value.__class__ is not str:
        raise not_utf8(what(), value)


def dtype_name(dt: int) -> str:
    try:
        return TP.DataType.Name(dt)
    except ValueError:
        return str(dt)


def _shape_text(dims) -> str:
    text = str(list(dims))
    return text if len(text) <= 80 else text[:77] + "..."


def check_tensor(p: TP, where: Callable[[], str], base_dir: Optional[str],
                 stubs: bool = False) -> tuple:
    """Check one TensorProto; return (data_type, dims tuple, ExternalRef or None).

    `where()` names the tensor for a message (called only on failure). `stubs`: a tensor with no data at all is
    accepted (the version converter's graph-only copies, whose data the caller puts back).
    """
    dt = p.data_type
    spec = SPEC.get(dt)
    if spec is None:
        raise InvalidModelError(f"{where()}: element type {dt} ({'UNDEFINED' if dt == 0 else 'unknown'}) is not "
                                f"a tensor data type; refused")
    dims = tuple(p.dims[:])   # NOTE: a slice of a upb container is a C copy; tuple() of it iterates at C speed
    if dims:
        if min(dims) < 0:
            raise InvalidModelError(f"{where()}: negative dimension in shape {_shape_text(dims)}; refused")
        n = _prod(dims)
    else:
        n = 1
    bits = spec[0]
    if p.data_location == EXTERNAL:
        if not bits:
            raise InvalidModelError(f"{where()}: a STRING tensor cannot use external data; refused")
        return dt, dims, resolve_external(p, where, base_dir, (n * bits + 7) // 8, dims)
    # NOTE: the length alone: reading raw_data copies its bytes once (~20 ms for 200 MB), which is the price
    # of checking every weight's size at import; typed fields are read only for tensors without raw data
    raw = len(p.raw_data)
    if raw:
        if not bits:
            raise InvalidModelError(f"{where()}: a STRING tensor holds raw data; refused")
        need = (n * bits + 7) // 8
        if raw != need:
            raise InvalidModelError(f"{where()}: raw data holds {raw} bytes but shape {_shape_text(dims)} of "
                                    f"{dtype_name(dt)} needs {need}; refused")
        return dt, dims, None
    _check_typed(p, where, dt, dims, n, spec, stubs)
    return dt, dims, None


def _check_typed(p, where, dt, dims, n, spec, stubs) -> None:
    _, field, num, den = spec
    need = (n * num + den - 1) // den
    have = 0
    for fd, val in p.ListFields():
        k = fd.number
        if k == _SEGMENT:
            raise InvalidModelError(f"{where()}: tensor segments are not supported; refused")
        if k in _TYPED:
            if k != field:
                raise InvalidModelError(f"{where()}: a {dtype_name(dt)} tensor holds {_TYPED[k]} "
                                        f"(expected {_TYPED[field]} or raw data); refused")
            have = len(val)
    if have != need and not (stubs and have == 0):
        raise InvalidModelError(f"{where()}: {_TYPED[field]} holds {have} entries but shape {_shape_text(dims)} "
                                f"of {dtype_name(dt)} needs {need}; refused")


def resolve_external(p: TP, where: Callable[[], str], base_dir: Optional[str], need: int,
                     dims: tuple = ()) -> ExternalRef:
    """Check a tensor's external-data entry against the model's folder; the checked reference to its bytes."""
    if base_dir is None:
        raise ModelLoadError(f"{where()}: uses external data but the model has no folder to read it from "
                             f"(load the model from its file); refused")
    info = {}
    for e in p.external_data:
        key = e.key
        if key in info:
            raise ModelLoadError(f"{where()}: external data key '{short(key)}' is given twice; refused")
        info[key] = e.value
    loc = info.get("location", "")
    if not loc:
        raise ModelLoadError(f"{where()}: external data has no location; refused")
    shown = short(loc)
    if not isinstance(loc, str):   # upb hands back bytes for a string field that is not valid UTF-8
        raise ModelLoadError(f"{where()}: external data location '{shown}' is not valid UTF-8; refused")
    if "\x00" in loc:
        raise ModelLoadError(f"{where()}: external data location '{shown}' holds a NUL byte; refused")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")):
        raise ModelLoadError(f"{where()}: external data location '{shown}' is absolute; refused")
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, loc))
    if path != base and os.path.commonpath([base, path]) != base:
        raise ModelLoadError(f"{where()}: external data location '{shown}' points outside the model's folder; "
                             f"refused")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{where()}: external data file '{shown}' not found") from None
    except OSError as e:
        raise ModelLoadError(f"{where()}: external data file '{shown}' cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise ModelLoadError(f"{where()}: external data location '{shown}' is {kind}, not a data file; refused")
    size = st.st_size
    try:
        offset = int(info.get("offset") or 0)
        length = int(info["length"]) if info.get("length") else size - offset
    except ValueError:
        raise ModelLoadError(f"{where()}: external data offset/length is not an integer; refused") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelLoadError(f"{where()}: external data range [{offset}, {offset + length}) exceeds '{shown}' "
                             f"({size} bytes); refused")
    if length != need:
        raise ModelLoadError(f"{where()}: external data length {length} does not match shape "
                             f"{_shape_text(dims)} of {dtype_name(p.data_type)} ({need} bytes); refused")
    files = _FILES.get()
    if files is not None:
        files.add(path)
    return ExternalRef(path, offset, length, loc)


def inline_external(p: TP, ref: ExternalRef) -> None:
    """Read a checked external tensor's bytes into its raw_data; it no longer names any file."""
    raw = read_external_bytes(ref, p.name)
    del p.external_data[:]
    p.ClearField("data_location")
    p.raw_data = raw


def check_sparse(sp: onnx.SparseTensorProto, where: Callable[[], str], base_dir: Optional[str],
                 inline: bool = False) -> bool:
    """Check a sparse tensor (values, indices, dense shape); True when it uses external data (inlined when
    `inline`)."""
    dims = tuple(sp.dims)
    if dims and min(dims) < 0:
        raise InvalidModelError(f"{where()}: negative dimension in sparse shape {_shape_text(dims)}; refused")
    vdt, vdims, vref = check_tensor(sp.values, lambda: f"{where()} values", base_dir)
    idt, idims, iref = check_tensor(sp.indices, lambda: f"{where()} indices", base_dir)
    if len(vdims) != 1:
        raise InvalidModelError(f"{where()}: values must be 1-D, got shape {_shape_text(vdims)}; refused")
    if idt != TP.INT64:
        raise InvalidModelError(f"{where()}: indices must be INT64, got {dtype_name(idt)}; refused")
    nnz = vdims[0]
    if idims not in ((nnz,), (nnz, len(dims))):
        raise InvalidModelError(f"{where()}: indices of shape {_shape_text(idims)} do not fit {nnz} values in a "
                                f"tensor of rank {len(dims)}; refused")
    bits = SPEC[vdt][0] or 64
    dense = (math.prod(dims) * bits + 7) // 8
    if dense > DENSE_LIMIT:
        raise InvalidModelError(f"{where()}: dense shape {_shape_text(dims)} of {dtype_name(vdt)} is {dense} "
                                f"bytes, over the {DENSE_LIMIT}-byte limit (onnxruntime makes it dense); refused")
    if inline:
        if vref is not None:
            inline_external(sp.values, vref)
        if iref is not None:
            inline_external(sp.indices, iref)
    return vref is not None or iref is not None


@functools.lru_cache(maxsize=None)
def default_schema(op_type: str, opset: Optional[int]):
    """The default domain's OpSchema of `op_type` at `opset`, or None when onnx does not define it (onnxruntime
    names an unknown op when a session is made). One lookup per (op, opset) for every import check."""
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except Exception:  # noqa: BLE001 - an op or version onnx does not define
        return None


@functools.lru_cache(maxsize=None)
def schema_attribute_types(op_type: str, opset: Optional[int]) -> Optional[dict]:
    """`{attribute name: AttributeProto type}` the schema of `op_type` at `opset` declares, or None."""
    schema = default_schema(op_type, opset)
    return None if schema is None else {name: int(a.type) for name, a in schema.attributes.items()}


def _wrong_type(a_name: str, t: int, expected: Optional[dict], where: Callable[[], str]) -> None:
    want = expected.get(a_name) if expected else None
    if want is not None and want != t and want != AT.UNDEFINED:
        raise InvalidModelError(f"attribute '{short(a_name)}' of {where()} is {AT.AttributeType.Name(t)}, but the "
                                f"op defines it as {AT.AttributeType.Name(want)}; refused")


def scan_attributes(attributes, where: Callable[[], str], base_dir: Optional[str], inline: bool = False,
                    recurse: bool = False, stubs: bool = False, expected: Optional[dict] = None) -> tuple:
    """Check every tensor held by a node's AttributeProtos; return (holds a graph, uses external data).

    An attribute must hold only the payload its type names (a tensor in an INT attribute would be written out
    again unchecked), and the type the op's schema declares when `expected` gives it (see
    `schema_attribute_types`: an `epsilon` of type INTS made fold-batchnorm fail on float(list));
    `recurse`: also check the graphs it holds (the importer imports those as bodies instead).
    With `inline`, external tensors get their bytes in raw_data (call it on a copy of the caller's proto).
    """
    has_graph = external = False
    for a in attributes:
        # NOTE: one ListFields() per attribute: reading `type` and six payload fields one by one costs several
        # times more on upb messages (bench_ir has ~24k attributes). Fields come in number order, so a plain
        # attribute is exactly [name, value, type] with a matching value field: checked without a loop.
        fields = a.ListFields()
        if len(fields) == 3:
            f2 = fields[2]
            if f2[0] is _TYPE_FD and fields[0][0] is _NAME_FD and (fields[1][0], f2[1]) in _PLAIN and \
                    fields[0][1].__class__ is str:
                if expected:
                    _wrong_type(fields[0][1], f2[1], expected, where)
                continue
        t = 0
        payload = None
        for text in (a.name, a.ref_attr_name, a.doc_string):   # the exporter writes these back as they are
            if text.__class__ is not str:
                raise not_utf8(f"attribute of {where()}: a name or doc string", text)
        for fd, val in fields:
            k = _FIELD_KEY.get(fd)
            if k is None:
                continue
            if k == _A_TYPE:
                t = val
            elif payload is not None:
                raise InvalidModelError(f"attribute '{short(a.name)}' of {where()} holds more than one kind "
                                        f"of value; refused")
            else:
                payload = (k, val)
        if t not in _ATTR_TYPES:
            raise InvalidModelError(f"attribute '{short(a.name)}' of {where()} has "
                                    f"{'no type' if t == 0 else f'unknown type {t}'}; refused")
        if expected:
            _wrong_type(a.name, t, expected, where)
        if t == _GRAPH or t == _GRAPHS:
            has_graph = True
        if payload is None:
            continue
        k, val = payload
        if _PAYLOAD_TYPE[k] != t:
            raise InvalidModelError(f"attribute '{short(a.name)}' of {where()} has type "
                                    f"{AT.AttributeType.Name(t)} but holds a "
                                    f"{AT.AttributeType.Name(_PAYLOAD_TYPE[k]).lower()}; refused")
        name = a.name

        def here(x, i=None, name=name):
            tname = x.values.name if isinstance(x, onnx.SparseTensorProto) else x.name
            return (f"tensor{f' {short(tname)!r}' if tname else ''} in attribute '{short(name)}'"
                    f"{'' if i is None else f'[{i}]'} of {where()}")
        if k == _A_T:
            ref = check_tensor(val, lambda: here(val), base_dir, stubs)[2]
            if ref is not None:
                external = True
                if inline:
                    inline_external(val, ref)
        elif k == _A_TENSORS:
            for i, x in enumerate(val):
                ref = check_tensor(x, lambda i=i, x=x: here(x, i), base_dir, stubs)[2]
                if ref is not None:
                    external = True
                    if inline:
                        inline_external(x, ref)
        elif k == _A_SPARSE:
            external |= check_sparse(val, lambda: here(val), base_dir, inline)
        elif k == _A_SPARSES:
            for i, x in enumerate(val):
                external |= check_sparse(x, lambda i=i, x=x: here(x, i), base_dir, inline)
        elif recurse:
            graphs = [val] if k == _A_G else list(val)
            for gp in graphs:
                external |= scan_graph(gp, lambda gp=gp: f"graph '{short(gp.name)}' in attribute "
                                                         f"'{short(name)}' of {where()}", base_dir, inline)
    return has_graph, external


def scan_graph(gp: onnx.GraphProto, where: Callable[[], str], base_dir: Optional[str], inline: bool = False) -> bool:
    """Check every tensor of a graph kept verbatim (initializers, sparse initializers, node attributes, bodies at
    any depth); True when one uses external data (all inlined when `inline`)."""
    external = False
    for t in gp.initializer:
        ref = check_tensor(t, lambda t=t: f"initializer '{short(t.name)}' of {where()}", base_dir)[2]
        if ref is not None:
            external = True
            if inline:
                inline_external(t, ref)
    for sp in gp.sparse_initializer:
        external |= check_sparse(sp, lambda sp=sp: f"sparse initializer '{short(sp.values.name)}' of {where()}",
                                 base_dir, inline)
    for n in gp.node:
        if len(n.attribute):
            external |= scan_attributes(n.attribute, lambda n=n: f"node '{short(n.name)}' ({short(n.op_type)}) in "
                                                                 f"{where()}", base_dir, inline, recurse=True)[1]
    return external


def _scan_function(f: onnx.FunctionProto, base_dir, inline: bool) -> bool:
    def where():
        return f"model-local function '{short(f.name)}'"
    external = False
    for n in f.node:
        if len(n.attribute):
            external |= scan_attributes(n.attribute, lambda n=n: f"node '{short(n.name)}' ({short(n.op_type)}) in "
                                                                 f"{where()}", base_dir, inline, recurse=True)[1]
    if len(f.attribute_proto):
        external |= scan_attributes(f.attribute_proto, lambda: f"default attributes of {where()}", base_dir, inline,
                                    recurse=True)[1]
    return external


def _scan_training(ti: onnx.TrainingInfoProto, i: int, base_dir, inline: bool) -> bool:
    external = False
    if ti.HasField("initialization"):
        external |= scan_graph(ti.initialization, lambda: f"training info {i} initialization graph", base_dir, inline)
    if ti.HasField("algorithm"):
        external |= scan_graph(ti.algorithm, lambda: f"training info {i} algorithm graph", base_dir, inline)
    return external


def scan_model_extras(functions: list, training_info: list, base_dir: Optional[str]) -> tuple:
    """Check the tensors of the model-local functions and training info (kept verbatim); return both lists with
    every external tensor inlined, in copies (the caller's protos are never changed)."""
    functions = list(functions)
    for i, f in enumerate(functions):
        if _scan_function(f, base_dir, False):
            f2 = onnx.FunctionProto()
            f2.CopyFrom(f)
            _scan_function(f2, base_dir, True)
            functions[i] = f2
    check_function_recursion(functions)
    training_info = list(training_info)
    for i, ti in enumerate(training_info):
        if _scan_training(ti, i, base_dir, False):
            t2 = onnx.TrainingInfoProto()
            t2.CopyFrom(ti)
            _scan_training(t2, i, base_dir, True)
            training_info[i] = t2
    return functions, training_info


def _calls(nodes, out: set) -> None:
    """(domain, op_type, overload) of every node in `nodes` and in the graphs their attributes hold."""
    for n in nodes:
        out.add((n.domain, n.op_type, getattr(n, "overload", "")))
        for a in n.attribute:
            if a.type == AT.GRAPH:
                _calls(a.g.node, out)
            elif a.type == AT.GRAPHS:
                for g in a.graphs:
                    _calls(g.node, out)


def check_function_recursion(functions: list) -> None:
    """Refuse a model-local function that calls itself, directly or through other local functions (onnxruntime
    may crash or never return while inlining it)."""
    if not functions:
        return
    keys = {}
    for f in functions:
        keys.setdefault((f.domain, f.name, getattr(f, "overload", "")), []).append(f)
    callees = {}
    for key, fs in keys.items():
        called: set = set()
        for f in fs:
            _calls(f.node, called)
        callees[key] = [c for c in called if c in keys]
    state: dict = {}   # key -> 1 on the current path, 2 done
    for root in callees:
        if root in state:
            continue
        path = [root]
        stack = [iter(callees[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            s = state.get(nxt)
            if s == 1:
                cycle = path[path.index(nxt):] + [nxt]
                chain = " -> ".join(short(k[1], 40) for k in cycle)
                raise InvalidModelError(f"model-local function '{short(nxt[1])}' calls itself ({short(chain, 200)}); "
                                        f"recursive functions are refused")
            if s is None:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(callees[nxt]))


__all__ = ["check_text", "not_utf8", "check_tensor", "check_sparse", "collect_external_files", "scan_attributes", "scan_graph",
           "scan_model_extras",
           "check_function_recursion", "resolve_external", "inline_external", "short", "SPEC", "DENSE_LIMIT"]
