"""Import a script of ``benchmarks/`` as a module (the folder is not a package), for its tests;
the tiny arguments of each script's default end-to-end test (tests/test_user_benchmarks.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


# benchmark script -> tiny argv (a record is written to --json and read back); flags, not the
# scripts' --smoke/--quick presets, which are bigger (their tests are the slow repetitions)
_LM = ["--seq", "4", "--batch", "1", "--vocab", "16"]
_W8, _W64 = ["--width", "8", *_LM], ["--width", "64", *_LM]  # 64: a script's head width
BENCH_TINY: dict[str, list[str]] = {
    "gpu_lm": ["bench", "--smoke", "--repeats", "1", "--chunk", "1"],
    "gpu_perf": ["--depths", "1", *_W64, "--variants", "vanilla", "--rounds", "1", "--chunk", "1",
                 "--warmup", "0", "--peak-n", "8", "--peak-reps", "1", "--decode-tokens", "2",
                 "--decode-rounds", "1", "--compute-dtype", "float32"],
    "lm_compile": ["--depths", "1", *_W64, "--variants", "vanilla", "--layer-loop", "unroll",
                   "--steps", "1", "--step-depth", "1"],
    "lm_evidence_throughput": ["--widths", "8", "--arms", "vanilla", "--steps", "2",
                               "--eval-batches", "1"],
    "lm_memory": ["--depths", "1", *_W8, "--variants", "vanilla"],
    "lm_profile": ["--depth", "1", "--width", "8", "--batch", "1", "--passes", "1",
                   "--variants", "vanilla", "--top", "3"],
    "lm_step_time": ["--depths", "1", *_W64, "--repeats", "1", "--warmup", "1",
                     "--variants", "vanilla"],
    "toy_flops": ["--steps", "2", "--dim", "16", "--widths", "1", "--pad", "1", "--batch", "4",
                  "--seeds", "1"],
    "vs_pytorch": ["--depth", "1", "--k", "1", *_W64, "--repeats", "1", "--warmup", "1",
                   "--no-torch"],
}
BENCH_ELSEWHERE = {
    "lm_decode": "tests/test_bench_lm_decode.py::test_quick_dry_run_writes_every_figure",
    "lm_scan_cost": "tests/test_bench_lm_scan_cost.py::"
                    "test_smoke_run_records_the_work_of_every_program",
    "gpu_lm_evidence_2": "tests/test_bench_gpu_lm_evidence_2.py::"
                         "test_dry_run_trains_the_matched_vanilla",
    "gpu_lm_evidence": "tests/test_bench_gpu_lm_evidence.py::test_dry_run_of_one_arm_at_one_width",
}
LIBRARIES = {"lm_bench_common", "hlo_executed"}  # shared code of the scripts, not a command


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, with the folder on ``sys.path`` for the scripts'
    shared ``lm_bench_common``."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
