r"""The trunk's blocks run through ``lax.scan`` (``ModelConfig.layer_loop="scan"``).

**Why.** The unrolled trunk (``layer_loop="unroll"``) traces every block, so XLA compiles one
copy of the block per layer and compile time grows with depth (at depth 24, width 256 on the
2-core CPU: minutes for DCA, ``paper/06_performance.md`` §6.10). A ``lax.scan`` compiles its
body once, whatever the number of iterations.

**Parameter layout.** The blocks come either as the trunk's tuple, one module per block (the
saved layout: checkpoints, retrofit, analysis and decode read it), which the forward pass then
stacks (one leading ``layer`` axis per leaf; the blocks a scan covers must have one structure),
or already stacked as a :class:`~dca_theory.lm.layer_stack.BlockStack` (the training layout,
:func:`~dca_theory.lm.layer_stack.to_training_layout`), which the scans slice. Only the second
keeps the program's size independent of the depth.

**What each kind scans** (same function, values and gradients as the unrolled trunk; dropout
keys are ``split_or_none(key, n_layers)``, one per block, as there):

* ``vanilla``: every block; the carry is the residual stream ``h``.
* the GRN kinds (``grn_v1|v2|v3``, whole stack; ``grn_window`` is refused): as full DCA below,
  block t's GRN reading the buffer's first slots (its ``b`` zero-padded) and its branch
  writing slot ``t + 1``; the final GRN reads the whole buffer.
* full DCA (``k is None`` or ``k + 1 >= n_layers``, where k-DCA is full DCA): the stack grows,
  so it lives in a preallocated ``(n_layers + 1)``-slot buffer whose slot ``t + 1`` block t
  writes in place (``lax.dynamic_update_index_in_dim``). Slots not yet written hold zeros, and a
  GRN-v3 whose ``b`` is zero-padded to more entries than its block sees gives those entries the
  coefficient 0 under every gate of :mod:`dca_theory.gates` (``b + gate(w·0) = 0 + gate(0) = 0``
  for the bias-outside gates, ``relu(0 + w·0) = 0`` for ``bias_inside``), and in any case
  multiplies them by the zero entry: they add nothing to the value, and their cotangents land
  on slots that a later write overwrites (whose cotangent the update drops). The blocks are
  split into :data:`DCA_SCAN_GROUPS` groups of consecutive blocks, one scan each, every
  group's GRNs padded to the group's largest stack only: padding to the whole depth doubles
  the GRNs' reads, while a fixed number of groups keeps the number of compiled bodies
  constant as the depth grows.
* k-DCA (``k + 1 < n_layers``): one scan over every block, the fixed-size stack
  ``[x, middle, last k]`` as the carry, started as ``[x, 0, …, 0]`` and shifting by one entry
  per block while the oldest of the last k is added into the middle (adding zeros until block
  ``k + 1``, where the middle becomes the first output exactly). Block ``t <= k`` has produced
  only ``t`` outputs, which sit in the carry's last ``t`` slots: its GRN rows are placed there
  (:func:`~dca_theory.lm.layer_stack.scan_slots`), and the zero slots in between get
  coefficient 0 as above. One body for the whole trunk (two, for a buffer of the first
  ``k + 1`` blocks and then the fixed stack, compiled in about twice the time).

**GRN path.** The scan bodies and the final GRN run the reference GRNs
(:data:`SCAN_GRN_IMPL`): they read the buffer as one array, so a body's size does not grow
with its stack. The fused path (``SCAN_GRN_IMPL = None``: ``cfg.grn_impl``) computes each
entry's terms separately, so a body's program grows with the stack it reads, and its
compilation took longer in our measurements (``paper/06_performance.md`` §6.10); it is kept,
and tested, as the option.

**Cost.** ``lax.scan``'s autodiff saves what each iteration's backward pass reads, per
iteration: for full DCA that would be the buffer it read, so the training activations would
grow like depth². Full DCA's scans therefore have a hand-written backward pass
(:func:`write_once_scan`: one buffer, each block recomputed once); k-DCA's carry (``k + 2``
entries per block) and vanilla's are saved as they are. ``collect=True`` (per-layer states)
runs the unrolled loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory.lm.blocks import PreLNBlock
from dca_theory.lm.fast_path import combine_stack, middle_add
from dca_theory.lm.layer_stack import BlockStack, padded_block, placed_block, scan_slots
from dca_theory.residual import ResidualStack

#: full DCA: the number of consecutive block groups, one scan (compiled body) each
DCA_SCAN_GROUPS = 2
#: the GRN path of the scanned DCA trunk, its final GRN included (None: ``cfg.grn_impl``)
SCAN_GRN_IMPL: str | None = "reference"


def block_group(blocks, start: int, stop: int, size: int | None = None, *,
                slots: Sequence[tuple[int, ...]] | None = None):
    """``(arrays, static, size)`` of blocks ``start, …, stop - 1`` for :func:`scan_blocks`,
    every GRN to read ``size`` entries (``None``: as stored), or, given ``slots`` (one per
    block of the group), to read its own entries from those slots
    (:func:`~dca_theory.lm.layer_stack.scan_slots`). ``blocks`` is a trunk's tuple of blocks
    (stacked here: one concatenation per array leaf, GRNs resized or placed before) or its
    :class:`BlockStack` (sliced, no per-layer operation: its GRN entries are stored at their
    ``scan_slots`` already, and the scan body cuts ``b`` to ``size``)."""
    if isinstance(blocks, BlockStack):
        return (*blocks.group(start, stop), size)
    chosen = blocks[start:stop]
    if slots is not None:
        width = 1 + max(max(s) for s in slots)
        chosen = [placed_block(b, s, width) for b, s in zip(chosen, slots)]
    elif size is not None:
        chosen = [padded_block(b, size) for b in chosen]
    return (*BlockStack.stack(chosen).group(0, len(chosen)), None)


def _block(block_arrays, static, size: int | None):
    """One iteration's block: its arrays with the group's static part, GRNs cut to ``size``."""
    block = eqx.combine(block_arrays, static)
    return block if size is None else padded_block(block, size)


def scan_blocks(step: Callable, carry, group, extras=None):
    """Fold ``carry = step(block, carry, extra)`` over the blocks of ``group`` (from
    :func:`block_group`) in order, as one ``lax.scan``; ``extras`` is a pytree with one
    leading-axis slice per block (or ``None``)."""
    arrays, static, size = group

    def body(carry, xs):
        block_arrays, extra = xs
        return step(_block(block_arrays, static, size), carry, extra), None

    carry, _ = jax.lax.scan(body, carry, (arrays, extras))
    return carry


def block_keys_array(key: PRNGKeyArray | None, n: int) -> Array | None:
    """The per-block dropout keys as one array (the unrolled trunk's ``split_or_none(key, n)``)."""
    return None if key is None else jax.random.split(key, n)


def vanilla_scan(blocks: Sequence[PreLNBlock] | BlockStack, x_LxD: Float[Array, "L D"], *,
                 causal: bool, key: PRNGKeyArray | None) -> Float[Array, "L D"]:
    """``h ← h + f_t(h)`` over every block."""
    def step(block, h_LxD, k):
        return h_LxD + block.branch(h_LxD, causal=causal, key=k)

    return scan_blocks(step, x_LxD, block_group(blocks, 0, len(blocks)),
                       block_keys_array(key, len(blocks)))


def k_dca_scan(trunk, x_LxD: Float[Array, "L D"], *, causal: bool,
               key: PRNGKeyArray | None) -> Float[Array, "L D"]:
    """The k-DCA trunk's output (needs ``k + 1 < n_layers``): one scan over every block with
    the fixed-size stack ``[x, middle, last k]`` as the carry, started as ``[x, 0, …, 0]``; the
    first ``k + 1`` blocks' GRN entries are placed where their outputs sit in it
    (:func:`~dca_theory.lm.layer_stack.scan_slots`)."""
    cfg, impl = trunk.cfg, scan_grn_impl(trunk.cfg)
    k, n = cfg.k, cfg.n_layers
    add = middle_add(impl, token=trunk.final.b)

    def step(block, entries, k_t):
        o_LxD, _, entries = block.apply(entries, causal=causal, key=k_t, grn_impl=impl)
        x, middle, *recent = entries
        recent = (*recent, o_LxD)  # push, then the oldest of the last k joins the middle
        return (x, add(middle, recent[0]), *recent[1:])

    start = (x_LxD, *(jnp.zeros_like(x_LxD) for _ in range(k + 1)))
    slots = [scan_slots(cfg, t) for t in range(n)]
    entries = scan_blocks(step, start, block_group(trunk.blocks, 0, n, slots=slots),
                          block_keys_array(key, n))
    stack = ResidualStack(inputs=entries[0], middle=entries[1], recent=tuple(entries[2:]), k=k,
                          _num_outputs=n)
    (h_LxD,), _ = combine_stack((trunk.final,), stack, impl)
    return h_LxD


def group_bounds(n: int, groups: int) -> list[tuple[int, int]]:
    """``[(start, stop), …]``: ``n`` blocks split into at most ``groups`` consecutive runs of
    nearly equal length."""
    groups = max(1, min(groups, n))
    cuts = [round(i * n / groups) for i in range(groups + 1)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def fill_buffer(trunk, buffer: Array, bounds: Sequence[tuple[int, int]], keys: Array | None,
                impl: str, *, causal: bool) -> Array:
    """Run blocks ``start, …, stop - 1`` of each ``(start, stop)`` in ``bounds`` (one scan per
    pair), block t reading the buffer's first ``stop`` slots and writing its output to slot
    ``t + 1`` (:func:`write_once_scan`: the backward pass keeps one buffer, not one per
    block)."""
    for start, stop in bounds:
        size = stop  # block stop - 1 reads x and stop - 1 outputs

        def step(block, buffer, extra, size=size):
            t, k_t = extra
            o_LxD, _, _ = block.apply(buffer[:size], causal=causal, key=k_t, grn_impl=impl)
            return jax.lax.dynamic_update_index_in_dim(buffer, o_LxD, t + 1, axis=0)

        extras = (jnp.arange(start, stop), None if keys is None else keys[start:stop])
        buffer = write_once_scan(step, buffer, block_group(trunk.blocks, start, stop, size),
                                 extras)
    return buffer


def write_once_scan(step: Callable, buffer: Array, group, extras) -> Array:
    """:func:`scan_blocks` for a ``step`` that writes slot ``t + 1`` of ``buffer`` (``t`` is
    ``extras[0]``) and reads only slots ``<= t``, where the slots above ``t`` still hold zeros:
    the value is the same, the backward pass differs. Slots are written once, so the buffer
    block t read is the final buffer with the slots above ``t`` set to zero; the backward pass
    rebuilds it so, recomputes block t's forward pass and applies its VJP, block by block in
    reverse. Memory: the final buffer and one block's activations at a time, instead of the
    buffer every block read (``lax.scan``'s autodiff saves each iteration's inputs, which grows
    like depth²); cost: one more forward pass per block."""
    arrays, static, size = group

    def apply(block_arrays, buf, extra):
        return step(_block(block_arrays, static, size), buf, extra)

    def forward(arrays, buf, extras):
        return jax.lax.scan(lambda b, xs: (apply(xs[0], b, xs[1]), None), buf,
                            (arrays, extras))[0]

    @jax.custom_vjp
    def run(arrays, buf, extras):
        return forward(arrays, buf, extras)

    def run_fwd(arrays, buf, extras):
        out = forward(arrays, buf, extras)
        return out, (arrays, out, extras)

    def run_bwd(res, g_out):
        arrays, out, extras = res
        slot = jnp.arange(out.shape[0]).reshape((-1,) + (1,) * (out.ndim - 1))

        def back(g_buf, xs):
            block_arrays, extra = xs
            read = jnp.where(slot <= extra[0], out, jnp.zeros_like(out))  # what block t read
            _, vjp = jax.vjp(lambda a, b: apply(a, b, extra), block_arrays, read)
            g_arrays, g_read = vjp(g_buf)
            return g_read, g_arrays

        g_in, g_arrays = jax.lax.scan(back, g_out, (arrays, extras), reverse=True)
        return g_arrays, g_in, jax.tree.map(lambda _: None, extras)

    run.defvjp(run_fwd, run_bwd)
    return run(arrays, buffer, extras)


def grn_scan(trunk, x_LxD: Float[Array, "L D"], *, causal: bool,
             key: PRNGKeyArray | None, groups: int | None = None) -> Float[Array, "L D"]:
    """The GRN kinds' trunk (one GRN per block over the whole stack, then a final GRN) through
    the ``(n_layers + 1)``-slot buffer, one scan per group of blocks as for full DCA: block t's
    GRN reads the buffer's first slots (its ``b`` zero-padded), its branch writes slot
    ``t + 1``."""
    groups = DCA_SCAN_GROUPS if groups is None else groups
    n = trunk.cfg.n_layers
    buffer = jnp.zeros((n + 1, *x_LxD.shape), x_LxD.dtype).at[0].set(x_LxD)
    keys = block_keys_array(key, n)
    grns = trunk.grns[0] if isinstance(trunk.grns[0], BlockStack) else trunk.grns[:-1]
    for start, stop in group_bounds(n, groups):
        size = stop

        def step(pair, buffer, extra, size=size):
            (block, grn), (t, k_t) = pair, extra
            in_LxD = padded_block(grn, size)(buffer[:size])
            f_LxD = block.branch(in_LxD, causal=causal, key=k_t)
            return jax.lax.dynamic_update_index_in_dim(buffer, f_LxD, t + 1, axis=0)

        blocks_ = block_group(trunk.blocks, start, stop)
        grns_ = block_group(grns, start, stop, size)
        group = ((blocks_[0], grns_[0]), (blocks_[1], grns_[1]), None)
        extras = (jnp.arange(start, stop), None if keys is None else keys[start:stop])
        buffer = write_once_scan(step, buffer, group, extras)
    return trunk.grns[-1](buffer)


def full_dca_scan(trunk, x_LxD: Float[Array, "L D"], *, causal: bool,
                  key: PRNGKeyArray | None, groups: int | None = None) -> Float[Array, "L D"]:
    """The full DCA trunk's output through the ``(n_layers + 1)``-slot buffer, one scan per
    group of blocks (``groups``: :data:`DCA_SCAN_GROUPS`)."""
    groups = DCA_SCAN_GROUPS if groups is None else groups
    impl, n = scan_grn_impl(trunk.cfg), trunk.cfg.n_layers
    buffer = jnp.zeros((n + 1, *x_LxD.shape), x_LxD.dtype).at[0].set(x_LxD)
    buffer = fill_buffer(trunk, buffer, group_bounds(n, groups), block_keys_array(key, n), impl,
                         causal=causal)
    if impl == "reference":
        return trunk.final(buffer)
    stack = ResidualStack(inputs=buffer[0], middle=None, recent=tuple(buffer[1:]),
                          k=trunk.cfg.k, _num_outputs=n)
    (h_LxD,), _ = combine_stack((trunk.final,), stack, impl)
    return h_LxD


def scan_grn_impl(cfg) -> str:
    """The GRN path of the scanned DCA trunk: :data:`SCAN_GRN_IMPL`, or ``cfg.grn_impl``."""
    return SCAN_GRN_IMPL or cfg.grn_impl


def dca_scan(trunk, x_LxD: Float[Array, "L D"], *, causal: bool,
             key: PRNGKeyArray | None) -> Float[Array, "L D"]:
    """The DCA trunk's output with its blocks scanned (k-DCA or full DCA, see above)."""
    cfg = trunk.cfg
    if cfg.k is None or cfg.k + 1 >= cfg.n_layers:
        return full_dca_scan(trunk, x_LxD, causal=causal, key=key)
    return k_dca_scan(trunk, x_LxD, causal=causal, key=key)
