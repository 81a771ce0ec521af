"""The fast path of the LM's GRNs: what computes the same function as the readable reference
path, faster or in less memory, each module checked against that path in float64.

* :mod:`.fused_grn`: the per-block trunks' GRNs fused over a tuple of entries with a custom VJP
  (``ModelConfig.grn_impl="fused"``, the default; ``"reference"`` is the readable path).
* :mod:`.buffer_grn`: the scanned trunk's GRNs over its write-once stack buffer, one kernel for
  the n GRNs of a block, reading only the slots written so far.
* :mod:`.buffer_scans`: the scans that keep the backward pass from saving that buffer once per
  block (rebuilding each block's view from the final buffer instead).
"""
