"""What a compiled XLA program executes, loop trip counts included, read from its HLO text.

XLA's own ``compiled.cost_analysis()`` counts a ``while`` loop's body once, whatever its trip
count (checked in ``tests/test_bench_lm_scan_cost.py``), so it cannot compare a scanned trunk
with an unrolled one. This module walks the optimised HLO module (``compiled.as_text()``) from
its entry computation, multiplying each ``while`` body by its ``known_trip_count`` (a loop
whose trip count is known only at run time counts once per execution, and ``dynamic_loops``
says how many such executions there were), and sums
per executed kernel (a fusion, or an unfused instruction):

* ``dot_flops``: ``2 · |output| · |contracted dims|`` of every ``dot`` (inside fusions too);
* ``elementwise``: output elements of every other arithmetic instruction (a rough count of the
  non-matmul work: adds, multiplies, exps, selects, reduces' inputs, ...);
* ``bytes``: operand plus output bytes of every kernel (what it reads and writes; an in-place
  ``dynamic-update-slice``, alone or at a fusion's root, counts its update twice, not the
  buffer it writes into; an array that a kernel only ``dynamic-slice``s counts its slice);
* ``copy_bytes``: the bytes of ``copy`` kernels (copies XLA inserted, e.g. of a loop-carried
  buffer it could not update in place, or layout changes), and ``ops``: executed kernels by
  kind (a fusion under its name's prefix, e.g. ``pad_add_fusion``; an unfused one by opcode);
* ``top_kinds``: the kinds contributing most to the bytes, element operations and FLOPs.

It is a model of the work, not a profile: a kernel's bytes are what it names, not cache
traffic. Same program text, same numbers, whatever the machine's load.
"""

from __future__ import annotations

import math
import re
from collections import Counter

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
#: instructions that move no data of their own
FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
        "partition-id", "replica-id", "iota"}
#: instructions that are no arithmetic (their elements are not counted as ``elementwise``)
NO_ARITHMETIC = FREE | {"copy", "broadcast", "reshape", "transpose", "slice", "dynamic-slice",
                        "dynamic-update-slice", "concatenate", "pad", "gather", "scatter",
                        "while", "call", "conditional", "fusion", "custom-call", "dot",
                        "convert", "reverse", "rng-bit-generator", "copy-start", "copy-done"}
#: kernel kinds listed per figure in ``top_kinds``
TOP = 12
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
_CALLED = re.compile(
    r"\b(calls|body|condition|to_apply|branch_computations)=\{?([^}\s]+?)\}?(?:,|$)")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string (arrays and tuples of arrays)."""
    return sum(DTYPE_BYTES.get(dt, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dt, dims in _ARRAY.findall(shape))


def shape_elements(shape: str) -> int:
    return sum(math.prod(int(d) for d in dims.split(",") if d) for _, dims in _ARRAY.findall(shape))


def _split_instruction(line: str):
    """``(name, shape, opcode, operands, attributes)`` of one instruction line, or None."""
    m = re.match(r"\s*(?:ROOT )?%(\S+) = ", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        shape, rest = rest[:i + 1], rest[i + 2:]
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    depth, i = 0, op.end() - 1
    for i in range(op.end() - 1, len(rest)):
        depth += rest[i] == "("
        depth -= rest[i] == ")"
        if depth == 0:
            break
    operands = re.findall(r"%([\w.\-]+)", rest[op.end():i])
    return m.group(1), shape, op.group(1), operands, rest[i + 1:]


def parse_module(text: str) -> tuple[dict[str, list], str]:
    """``({computation: [instruction, ...]}, entry name)`` of an HLO module's text."""
    comps, entry, current = {}, None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = comps.setdefault(header.group(1), [])
            entry = header.group(1) if line.startswith("ENTRY") else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            inst = _split_instruction(line)
            if inst:
                current.append(inst)
    return comps, entry


def _called(attrs: str) -> dict[str, list[str]]:
    out = {}
    for key, names in _CALLED.findall(attrs):
        out[key] = [n.lstrip("%") for n in names.split(",")]
    return out


def _trip_count(attrs: str) -> int | None:
    """A ``while``'s trip count, if XLA knows it at compile time."""
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
    return int(m.group(1)) if m else None


def _dot_flops(shape: str, attrs: str, lhs_shape: str) -> int:
    contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
    dims = [int(d) for d in _ARRAY.findall(lhs_shape)[0][1].split(",") if d]
    k = math.prod(dims[int(c)] for c in contract.group(1).split(",") if c) if contract else 1
    return 2 * shape_elements(shape) * k


def _arithmetic(comps, name: str) -> tuple[int, int]:
    """``(dot_flops, elementwise)`` of one execution of a fused computation."""
    shapes = {n: s for n, s, *_ in comps[name]}
    flops = elems = 0
    for n, shape, op, operands, attrs in comps[name]:
        if op == "dot":
            flops += _dot_flops(shape, attrs, shapes[operands[0]])
        elif op == "reduce":
            elems += shape_elements(shapes[operands[0]])
        elif op not in NO_ARITHMETIC:
            elems += shape_elements(shape)
        for sub in _called(attrs).get("calls", []):
            f, e = _arithmetic(comps, sub)
            flops, elems = flops + f, elems + e
    return flops, elems


def _kernel_bytes(comps, shapes, shape, op, operands, attrs) -> int:
    """Operand plus output bytes of one kernel; an in-place dynamic-update-slice (alone or at a
    fusion's root) counts twice its update instead of the buffer."""
    if op == "dynamic-update-slice":
        return 2 * shape_bytes(shapes[operands[1]])
    if op == "fusion":
        fused = comps[_called(attrs)["calls"][0]]
        root = fused[-1]
        if root[2] == "dynamic-update-slice":
            inner = {n: s for n, s, *_ in fused}
            update = shape_bytes(inner[root[3][1]])
            buffer = shape_bytes(shape)
            reads = sum(shape_bytes(shapes[o]) for o in operands) - buffer
            return max(reads, 0) + 2 * update
        sliced = _sliced_parameters(fused)
        return shape_bytes(shape) + sum(sliced.get(i, shape_bytes(shapes[o]))
                                        for i, o in enumerate(operands) if o in shapes)
    if op == "dynamic-slice":
        return 2 * shape_bytes(shape)
    return shape_bytes(shape) + sum(shape_bytes(shapes[o]) for o in operands if o in shapes)


def _sliced_parameters(fused: list) -> dict[int, int]:
    """``{parameter index: bytes read}`` for a fused computation's parameters that only
    ``dynamic-slice``s read (a scan body's per-iteration slice of a stacked array): the bytes
    of their slices, not of the whole array. XLA names fusion parameters ``param_<index>``."""
    users: dict[str, list] = {}
    for n, shape, op, operands, _ in fused:
        for i, o in enumerate(operands):
            users.setdefault(o, []).append((op, i, shape))
    out = {}
    for n, _, op, _, _ in fused:
        m = re.match(r"param_(\d+)", n)
        uses = users.get(n, [])
        if op == "parameter" and m and uses and all(u == "dynamic-slice" and i == 0
                                                    for u, i, _ in uses):
            out[int(m.group(1))] = sum(shape_bytes(s) for *_, s in uses)
    return out


def source(kind: str, attrs: str) -> str:
    """A kernel's kind and where it came from: the last three parts of its ``op_name``
    metadata (e.g. ``closed_call/jvp()/mul``: a multiply of a linearised, i.e. recomputed,
    forward pass; ``transpose(...)``: of a backward pass), ``L`` if it runs in a loop."""
    m = re.search(r'op_name="([^"]*)"', attrs)
    name = re.sub(r"jit\([^)]*\)/", "", m.group(1)) if m else "?"
    return f"{kind} | {'L' if 'while' in name else '-'} | " + "/".join(name.split("/")[-3:])


def executed(text: str, label=None, top: int = TOP) -> dict:
    """The executed work of a compiled program (see the module docstring); ``top_kinds`` groups
    kernels by ``label(kind, attributes)`` if given (e.g. :func:`source`) and keeps the ``top``
    groups of each figure."""
    comps, entry = parse_module(text)
    totals = {"dot_flops": 0, "elementwise": 0, "bytes": 0, "copy_bytes": 0,
              "dus_bytes": 0, "dynamic_slice_bytes": 0, "dynamic_loops": 0}
    ops: Counter = Counter()
    by_kind = {"bytes": Counter(), "elementwise": Counter(), "dot_flops": Counter()}

    def walk(name: str, times: int) -> None:
        shapes = {n: s for n, s, *_ in comps[name]}
        for n, shape, op, operands, attrs in comps[name]:
            called = _called(attrs)
            if op == "while":
                trips = _trip_count(attrs)
                ops["while"] += times
                if trips is None:  # known only at run time: counted once, a lower bound
                    totals["dynamic_loops"] += times
                    trips = 1
                walk(called["body"][0], times * trips)
                continue
            if op in ("call", "conditional"):
                branches = called.get("to_apply") or called.get("branch_computations") or []
                for sub in branches[:1]:  # a conditional runs one branch
                    walk(sub, times)
                continue
            if op in FREE:
                continue
            kind = n.split(".")[0] if op == "fusion" else op
            ops[kind] += times
            nbytes = _kernel_bytes(comps, shapes, shape, op, operands, attrs)
            totals["bytes"] += times * nbytes
            if op == "copy":
                totals["copy_bytes"] += times * nbytes
            if op == "dynamic-update-slice" or (op == "fusion" and "dynamic-update-slice" in n):
                totals["dus_bytes"] += times * nbytes
            if op == "dynamic-slice" or (op == "fusion" and "dynamic-slice" in n):
                totals["dynamic_slice_bytes"] += times * nbytes
            if op == "fusion":
                f, e = _arithmetic(comps, called["calls"][0])
            elif op == "dot":
                f, e = _dot_flops(shape, attrs, shapes[operands[0]]), 0
            elif op == "reduce":
                f, e = 0, shape_elements(shapes[operands[0]])
            else:
                f, e = 0, (0 if op in NO_ARITHMETIC else shape_elements(shape))
            totals["dot_flops"] += times * f
            totals["elementwise"] += times * e
            group = kind if label is None else label(kind, attrs)
            for key, value in (("bytes", nbytes), ("elementwise", e), ("dot_flops", f)):
                by_kind[key][group] += times * value

    walk(entry, 1)
    static = Counter(op for insts in comps.values() for _, _, op, _, _ in insts)
    return {**totals, "ops": dict(ops.most_common()),
            "top_kinds": {key: dict(c.most_common(top)) for key, c in by_kind.items()},
            "static": {"instructions": sum(static.values()), "computations": len(comps),
                       "while": static["while"], "fusion": static["fusion"],
                       "dynamic-update-slice": static["dynamic-update-slice"],
                       "copy": static["copy"], "dot": static["dot"]}}
