"""The executed work of each compiled LM program: unrolled vs scanned trunk, and the scan's knobs.

Counts, without timing anything (the numbers do not depend on the machine's load), what the
scanned trunk (``layer_loop="scan"``: :mod:`dca_theory.lm.scanned`, run by
:mod:`dca_theory.lm.driver`) executes against the per-block trunk. For each variant it compiles
the loss-and-gradient function (``train``: ``dca_theory.lm.steps``' NLL gradient, no optimiser
update) and the loss alone (``forward``) and records

* the executed work, loop trip counts included (:mod:`hlo_executed`): matmul FLOPs, other
  element operations, bytes read and written per kernel, bytes of XLA's ``copy`` kernels,
  of in-place buffer updates and of dynamic slices, and kernels run by kind;
* XLA's own ``cost_analysis()`` (FLOPs, bytes accessed: a ``while`` body counted once, so it
  understates any scan) and ``memory_analysis()`` (temporary, argument, output bytes);
* the program's size (instructions, while loops, fusions) and the compile time (indicative);
* with ``--sources``, the kernels doing most work grouped by where they came from (their
  ``op_name``).

Variants: the model kinds ``vanilla``, ``dca``, ``2-dca`` on the per-block trunk (plain names)
and scanned (``-scan``), and the scanned full DCA with one knob of the design changed while the
program is traced (:func:`scan_settings`, restored afterwards):

* ``dca-scan-rebuild``: ``DCAMixer.reads_written_only = False``, so the backward pass recomputes
  each block's reads on the final buffer with the later slots zeroed (a rebuilt copy per
  block) rather than on the final buffer itself;
* ``dca-scan-writeonce``: ``DCAMixer.block_reads_state = True``, so the driver runs
  :func:`~dca_theory.lm.fast.buffer_scans.write_once_scan` (the backward pass recomputes each whole
  step, blocks included) instead of the shadow scan (which recomputes only the mixer steps);
* ``dca-scan-refgrn`` (and ``2-dca-scan-refgrn``): the mixer's GRNs through the combiner
  classes' own ``__call__`` on the masked buffer (autodiff of the broadcast formula) instead of
  the buffer GRN kernels of :mod:`dca_theory.lm.fast.buffer_grn`.

A loop whose trip count is only known at run time (the scanned GRNs visit the slots written so
far: a loop of ``t + 1`` iterations in block t) is counted once per execution, a lower bound;
``dynamic_loops`` says how many such loops ran.

Usage::

    python benchmarks/lm_scan_cost.py --depths 24 \\
        --json benchmarks/results/lm_scan_cost_w256_d24_driver.json
    python benchmarks/lm_scan_cost.py --depths 12 --variants vanilla dca-scan dca-scan-rebuild
    python benchmarks/lm_scan_cost.py --depths 24 --variants dca-scan --modes train --sources
    python benchmarks/lm_scan_cost.py --smoke        # tiny sizes, seconds (the test's run)

Width 256, heads 4, MLP 1024, sequence 128, batch 4, vocabulary 8192, float32, dropout 0 by
default. Runtime on the 2-core CPU at load 7: 9 minutes for the default variants at depth 24, of
which the unrolled DCA's compilation takes 4; ``--smoke`` about 20 s of CPU.
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
from dca_theory.lm.model import build_model  # noqa: E402
from dca_theory.lm.steps import make_grad_fn, weighted_nll  # noqa: E402
from dca_theory.lm.zoo import dca as zoo_dca  # noqa: E402


def reference_grns(grns, buffer):
    """:func:`~dca_theory.lm.fast.buffer_grn.buffer_grns` through each combiner's own
    ``__call__``."""
    return tuple(g(buffer) for g in grns)


def reference_grns_through(grns, buffer, count):
    """:func:`~dca_theory.lm.fast.buffer_grn.buffer_grns_through` through each combiner's own
    ``__call__`` on the buffer with the slots from ``count`` on zeroed."""
    slot = jax.numpy.arange(buffer.shape[0]).reshape((-1,) + (1,) * (buffer.ndim - 1))
    masked = jax.numpy.where(slot < count, buffer, 0)
    return reference_grns(grns, masked), buffer


#: the knobs a variant may change while its program is traced: name -> (owner, attribute)
SETTINGS = {"reads_written_only": (zoo_dca.DCAMixer, "reads_written_only"),
            "block_reads_state": (zoo_dca.DCAMixer, "block_reads_state"),
            "buffer_grns": (zoo_dca, "buffer_grns"),
            "buffer_grns_through": (zoo_dca, "buffer_grns_through")}
REFERENCE = {"buffer_grns": reference_grns, "buffer_grns_through": reference_grns_through}
#: variant -> (benchmark model variant, layer_loop, SETTINGS changed while tracing)
BASE = {"vanilla": ("vanilla", "unroll", {}), "vanilla-scan": ("vanilla", "scan", {}),
        "dca": ("dca", "unroll", {}), "dca-scan": ("dca", "scan", {}),
        "2-dca": ("2-dca", "unroll", {}), "2-dca-scan": ("2-dca", "scan", {}),
        "dca-scan-rebuild": ("dca", "scan", {"reads_written_only": False}),
        "dca-scan-writeonce": ("dca", "scan", {"block_reads_state": True}),
        "dca-scan-refgrn": ("dca", "scan", REFERENCE),
        "2-dca-scan-refgrn": ("2-dca", "scan", REFERENCE)}
DEFAULT_VARIANTS = ["vanilla", "vanilla-scan", "dca", "dca-scan", "2-dca", "2-dca-scan",
                    "dca-scan-rebuild", "dca-scan-writeonce", "dca-scan-refgrn",
                    "2-dca-scan-refgrn"]
MODES = ("train", "forward")
#: kernel groups kept per figure with ``--sources`` (enough to account for nearly all bytes)
SOURCES_TOP = 80
SMOKE = {"depths": [2], "width": 64, "seq": 8, "batch": 1, "vocab": 64,
         "variants": ["dca-scan", "dca-scan-rebuild", "dca-scan-writeonce"]}
#: figures of each record that the table prints, with their column titles
COLUMNS = (("dot_flops", "matmul GF", 1e9), ("elementwise", "elem G", 1e9),
           ("bytes", "bytes GB", 1e9), ("copy_bytes", "copy MB", 1e6),
           ("dus_bytes", "DUS MB", 1e6), ("temp_bytes", "temp MB", 1e6),
           ("compile_s", "compile s", 1.0))


def variant_spec(name: str) -> tuple[str, str, dict]:
    """``(model variant, layer_loop, SETTINGS changes)`` of a variant name; one-line
    ``SystemExit`` for an unknown one."""
    if name in BASE:
        return BASE[name]
    raise SystemExit(f"error: unknown variant {name!r}; valid: {', '.join(BASE)}")


_ABSENT = object()


@contextlib.contextmanager
def scan_settings(changes: dict):
    """Set the :data:`SETTINGS` named in ``changes`` while a program is traced, and restore
    them afterwards (an attribute a class only inherited is removed again)."""
    saved = []
    try:
        for name, value in changes.items():
            owner, attr = SETTINGS[name]
            saved.append((owner, attr, vars(owner).get(attr, _ABSENT)))
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, value in reversed(saved):
            if value is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)


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
        variant_spec(v)
    return args


def program(variant: str, depth: int, mode: str, args):
    """``(function, arguments)`` of one variant's loss-and-gradient or loss."""
    model_variant, loop, _ = variant_spec(variant)
    cfg = model_config(model_variant, width=args.width, depth=depth, seq=args.seq,
                       vocab=args.vocab).replace(layer_loop=loop)
    model = build_model(cfg, key=jax.random.PRNGKey(0))
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
    with scan_settings(variant_spec(variant)[2]):
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


#: kernel groups printed per variant with ``--sources`` (the record keeps SOURCES_TOP)
SOURCES_PRINTED = 6


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
                    top = list(res["top_sources"]["bytes"].items())[:SOURCES_PRINTED]
                    print(f"  {variant}: most bytes [GB] (kernel | loop | op_name): " + ", ".join(
                        f"{k} {v / 1e9:.3g}" for k, v in top))


if __name__ == "__main__":
    main()
