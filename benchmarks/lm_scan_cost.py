"""Why the scanned DCA trunk's step costs more: the executed work of each compiled program.

Claim measured: the warm train step of full DCA with ``layer_loop="scan"`` costs about 2.2×
vanilla's, against 1.3× unrolled (``paper/06_performance.md``). This script attributes the
difference without timing anything (the numbers do not depend on the machine's load): for each
variant it compiles the loss-and-gradient function (``train``: ``dca_theory.lm.steps``' NLL
gradient, no optimiser update) and the loss alone (``forward``) and records

* the executed work, loop trip counts included (:mod:`hlo_executed`): matmul FLOPs, other
  element operations, bytes read and written per kernel, bytes of XLA's ``copy`` kernels,
  of in-place buffer updates and of dynamic slices, and kernels run by kind;
* XLA's own ``cost_analysis()`` (FLOPs, bytes accessed: a ``while`` body counted once, so it
  understates any scan) and ``memory_analysis()`` (temporary, argument, output bytes);
* the program's size (instructions, while loops, fusions) and the compile time (indicative);
* with ``--sources``, the kernels doing most work grouped by where they came from (their
  ``op_name``: the forward scan, the recomputed forward ``jvp(...)``, the backward pass
  ``transpose(...)``), which attributes the bytes to the GRNs, the buffer and the blocks.

Variants: the model kinds ``vanilla``, ``dca``, ``2-dca`` unrolled and scanned, and controlled
changes of the scanned full DCA trunk (:mod:`dca_theory.lm.layer_scan`), one at a time:
``-g<N>`` splits the blocks into N scanned groups (``DCA_SCAN_GROUPS``; N = depth reads no
zero padding), ``-fusedgrn`` runs the fused GRN path in the scan body (``SCAN_GRN_IMPL =
None``), ``-autodiff`` replaces the hand-written backward pass (``write_once_scan``: one
recomputed forward pass per block) by ``lax.scan``'s own autodiff (which saves every
iteration's buffer); ``2-dca-scan-fusedgrn`` is the same GRN switch for k-DCA.

Usage::

    python benchmarks/lm_scan_cost.py --depths 12 --json benchmarks/results/lm_scan_cost_d12.json
    python benchmarks/lm_scan_cost.py --depths 24 --variants vanilla vanilla-scan dca-scan
    python benchmarks/lm_scan_cost.py --depths 24 --variants dca dca-scan --modes train --sources
    python benchmarks/lm_scan_cost.py --smoke        # tiny sizes, seconds (the test's run)

Width 256, heads 4, MLP 1024, sequence 128, batch 4, vocabulary 8192, float32, dropout 0 by
default. Runtime on the 2-core CPU at load 9-14: 10 minutes for every default variant at depth
12, 14 minutes for the depth-24 set of ``paper/06_performance.md`` §6.11 (the unrolled DCA's
compilations dominate); ``--smoke`` about 20 s of CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import equinox as eqx
import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hlo_executed import executed, source  # noqa: E402
from lm_bench_common import (  # noqa: E402
    apply_preset,
    check_positive,
    emit,
    machine,
    model_config,
    save_partial,
)

from dca_theory.lab.steptime import synthetic_batch  # noqa: E402
from dca_theory.lm import layer_scan  # noqa: E402
from dca_theory.lm.layer_stack import to_training_layout  # noqa: E402
from dca_theory.lm.model import build_model  # noqa: E402
from dca_theory.lm.steps import make_grad_fn, weighted_nll  # noqa: E402

#: variant -> (benchmark model variant, layer_loop, changes to layer_scan for the scan)
BASE = {"vanilla": ("vanilla", "unroll", {}), "vanilla-scan": ("vanilla", "scan", {}),
        "dca": ("dca", "unroll", {}), "dca-scan": ("dca", "scan", {}),
        "2-dca": ("2-dca", "unroll", {}), "2-dca-scan": ("2-dca", "scan", {}),
        "dca-scan-fusedgrn": ("dca", "scan", {"SCAN_GRN_IMPL": None}),
        "dca-scan-autodiff": ("dca", "scan", {"write_once_scan": "autodiff"}),
        "2-dca-scan-fusedgrn": ("2-dca", "scan", {"SCAN_GRN_IMPL": None})}
DEFAULT_VARIANTS = [*BASE, "dca-scan-g1", "dca-scan-g4", "dca-scan-gdepth"]
MODES = ("train", "forward")
#: kernel groups kept per figure with ``--sources`` (enough to account for nearly all bytes)
SOURCES_TOP = 80
SMOKE = {"depths": [3], "width": 64, "seq": 8, "batch": 1, "vocab": 64,
         "variants": ["vanilla", "dca-scan-g1"]}
#: figures of each record that the table prints, with their column titles
COLUMNS = (("dot_flops", "matmul GF", 1e9), ("elementwise", "elem G", 1e9),
           ("bytes", "bytes GB", 1e9), ("copy_bytes", "copy MB", 1e6),
           ("dus_bytes", "DUS MB", 1e6), ("temp_bytes", "temp MB", 1e6),
           ("compile_s", "compile s", 1.0))


def variant_spec(name: str, depth: int) -> tuple[str, str, dict]:
    """``(model variant, layer_loop, layer_scan changes)`` of a variant name (``-g<N>`` or
    ``-gdepth`` after ``dca-scan``: N groups); one-line ``SystemExit`` for an unknown one."""
    if name in BASE:
        return BASE[name]
    prefix, _, groups = name.rpartition("-g")
    if prefix == "dca-scan" and (groups == "depth" or groups.isdigit() and int(groups) >= 1):
        return "dca", "scan", {"DCA_SCAN_GROUPS": depth if groups == "depth" else int(groups)}
    raise SystemExit(f"error: unknown variant {name!r}; valid: {', '.join(BASE)}, "
                     f"dca-scan-g<N> (N >= 1) or dca-scan-gdepth")


def autodiff_write_once_scan(step, buffer, group, extras):
    """``write_once_scan`` without its hand-written backward pass: ``lax.scan``'s autodiff."""
    return layer_scan.scan_blocks(step, buffer, group, extras)


@contextlib.contextmanager
def scan_settings(changes: dict):
    """Set :mod:`dca_theory.lm.layer_scan`'s module settings while a program is traced."""
    saved = {k: getattr(layer_scan, k) for k in changes}
    try:
        for k, v in changes.items():
            setattr(layer_scan, k, autodiff_write_once_scan if v == "autodiff" else v)
        yield
    finally:
        for k, v in saved.items():
            setattr(layer_scan, k, v)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[12])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192, help="the project's BPE vocabulary size")
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--sources", action="store_true",
                   help="also record the kernels doing most work by their op_name (top_sources)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a dry run in seconds")
    p.add_argument("--json", default=None, help="also write the record to this file")
    args = p.parse_args(argv)
    apply_preset(args, args.smoke, SMOKE)
    for name in ("width", "seq", "batch", "vocab"):
        check_positive(name, getattr(args, name))
    for d in args.depths:
        check_positive("depths", d)
    if args.width % 64:
        raise SystemExit(f"error: --width must be a multiple of 64 (head width), got {args.width}")
    for v in args.variants:
        variant_spec(v, max(args.depths))
    return args


def program(variant: str, depth: int, mode: str, args):
    """``(function, arguments)`` of one variant's loss-and-gradient or loss, in the layout its
    trunk trains in."""
    model_variant, loop, _ = variant_spec(variant, depth)
    cfg = model_config(model_variant, width=args.width, depth=depth, seq=args.seq,
                       vocab=args.vocab).replace(layer_loop=loop)
    model = to_training_layout(build_model(cfg, key=jax.random.PRNGKey(0)))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    batch = synthetic_batch(args.batch, args.seq, args.vocab)
    dtype = jax.numpy.float32
    if mode == "train":
        grad_fn = make_grad_fn(static, dtype)
        return (lambda p, b: grad_fn(p, b, None)), (params, batch)
    return (lambda p, b: weighted_nll(p, static, b, None, dtype)), (params, batch)


def measure(variant: str, depth: int, mode: str, args) -> dict:
    """The executed work, XLA's cost and memory analyses and the compile time of one program."""
    fn, fn_args = program(variant, depth, mode, args)
    with scan_settings(variant_spec(variant, depth)[2]):
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*fn_args).compile()
        compile_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    mem = compiled.memory_analysis()
    text = compiled.as_text()
    work = executed(text)
    if args.sources:
        work["top_sources"] = executed(text, label=source, top=SOURCES_TOP)["top_kinds"]
    return {**{k: v for k, v in work.items()}, "compile_s": compile_s,
            "xla_flops_body_once": float(cost.get("flops", 0.0)),
            "xla_bytes_body_once": float(cost.get("bytes accessed", 0.0)),
            "temp_bytes": mem.temp_size_in_bytes, "argument_bytes": mem.argument_size_in_bytes,
            "output_bytes": mem.output_size_in_bytes}


def main(argv=None) -> dict:
    args = parse_args(argv)
    record = {"benchmark": "lm_scan_cost", "config": vars(args).copy(),
              "machine_before": machine(), "results": {}}
    for depth in args.depths:
        for mode in args.modes:
            by_variant = record["results"].setdefault(str(depth), {}).setdefault(mode, {})
            for variant in args.variants:
                by_variant[variant] = res = measure(variant, depth, mode, args)
                print(f"  depth {depth} {mode:7s} {variant:22s} " + " ".join(
                    f"{title} {res[key] / scale:.3g}" for key, title, scale in COLUMNS),
                    flush=True)
                save_partial(record, args.json)
    record["machine_after"] = machine()
    print_table(record)
    return emit(record, args.json)


#: the reference GRN's kernels in a scanned DCA program, by fusion kind: the gated product
#: ``relu(b + w·h) ⊙ h``, its ReLU mask, the slice's cotangent padded back to the buffer, the
#: slices of the buffer (a ``ynn_fusion`` named ``reduce_sum`` is the reduction over the stack)
GRN_KINDS = ("maximum_multiply", "multiply_select", "pad_add", "slice_", "bitcast_select",
             "wrapped_slice")


def attribution(top_bytes: dict) -> dict[str, float]:
    """Bytes of a ``--sources`` record (``top_sources["bytes"]``) by where they are spent:
    outside the loops; the in-loop buffer updates, slices and copies; and, in the loops, the
    GRN's kernels and the others (attention, MLP, LayerNorms) of the forward pass, of the
    recomputed forward pass (``jvp(...)`` in the backward loop) and of the VJP
    (``transpose(...)``). Meant for the scanned DCA's hand-written backward pass."""
    out: dict[str, float] = {}
    for key, nbytes in top_bytes.items():
        kind, loop, name = key.split(" | ")
        if loop == "-":
            where = "outside loops"
        elif "dynamic-update-slice" in kind or "dynamic-slice" in kind or kind == "copy" \
                or name.startswith("while/body/") or "body/dynamic" in name:
            where = "loop: buffer updates, slices, copies"
        else:
            phase = ("VJP" if "transpose(" in name
                     else "recomputed forward" if "jvp(" in name else "forward")
            grn = kind.startswith(GRN_KINDS) or (kind == "ynn_fusion"
                                                 and name.endswith("reduce_sum"))
            where = f"loop, {phase}: " + ("GRN" if grn else "other")
        out[where] = out.get(where, 0.0) + nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def print_table(record: dict) -> None:
    """One table per depth and mode; ratios to vanilla (unrolled) where it was run."""
    print(f"\nload {record['machine_before']['loadavg_1_5_15'][0]:.1f} -> "
          f"{record['machine_after']['loadavg_1_5_15'][0]:.1f}")
    for depth, by_mode in record["results"].items():
        for mode, by_variant in by_mode.items():
            base = by_variant.get("vanilla")
            print(f"\ndepth {depth}, {mode}" + (" (÷ vanilla in brackets)" if base else ""))
            print(f"{'variant':22s}" + "".join(f"{title:>18s}" for _, title, _ in COLUMNS))
            for variant, res in by_variant.items():
                cells = []
                for key, _, scale in COLUMNS:
                    ratio = f" ({res[key] / base[key]:.2f})" if base and base[key] else ""
                    cells.append(f"{res[key] / scale:.3g}{ratio}".rjust(18))
                print(f"{variant:22s}" + "".join(cells))
            for variant, res in by_variant.items():
                if "top_sources" in res:
                    print(f"  {variant}: bytes by where [GB] " + ", ".join(
                        f"{k} {v / 1e9:.2f}"
                        for k, v in attribution(res["top_sources"]["bytes"]).items()))


if __name__ == "__main__":
    main()
