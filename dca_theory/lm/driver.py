r"""One trunk driver for every residual scheme: one pre-LN block, one ``lax.scan`` over blocks.

A residual scheme is a :class:`Mixer`: how a block's inputs are formed from the residual state
(:meth:`Mixer.read`), how the state takes the block's output (:meth:`Mixer.write`) and how the
trunk output is read from the final state (:meth:`Mixer.output`). The driver
(:func:`run_trunk`) runs any mixer over the blocks with one scan body, for training,
evaluation, analysis (``collect``: the per-layer states come out of the same scan) and cached
decoding (:func:`decode_trunk`: the same body on one token, each block reading and writing its
rows of a key/value cache). So a scheme is written once and every feature holds for it.

**Parameter layout.** The blocks are one :class:`~dca_theory.lm.blocks.PreLNBlock` whose array
leaves carry a leading ``layer`` axis, and a mixer keeps its per-block parameters the same way
(``Mixer.layers``); the scan slices both, so the compiled program does not grow with depth.
Per-block parameters whose shape grows with the block (a GRN over the stack so far) are stored
at the widest block's shape, zero-padded (each scheme's module says why the padding stays
exactly zero in training).

**The block** (:func:`run_block`), the Flax lm1b pre-LN block for every kind, generalised by
what the mixer hands it (:class:`BlockIO`): separate query, key and value inputs (DCA's
``q̃, k̃, ṽ``; MUDDFormer's streams), their LayerNorms (``LN_1`` unless the mixer has its own
for keys and values), the residual input of the MLP (``r``: ``m = MLP(LN_2(r + a))``; ``r`` is
the query input unless given), or a function forming the MLP input from the attention output
(Attention Residuals), and a map of the values (value residual learning). It returns the
attention output ``a`` (after dropout) and the MLP output ``m``; the vanilla branch is
``a + m``.

**Memory of the scan's backward pass.** ``lax.scan``'s autodiff saves each iteration's carry.
A mixer that keeps a growing stack of outputs keeps it in a preallocated *buffer* (``State.
buffer``, one slot per entry, zeros until written), and saving the buffer per block would grow
like depth². Such a scan runs :func:`write_once_scan`: block t writes slots
``1 + slots_per_block · t, …`` and reads only earlier ones, so the buffer block t read is the
final buffer with the later slots zeroed; the backward pass rebuilds it, recomputes the block
and applies its VJP, block by block in reverse (one buffer and one block's activations at a
time; one more forward pass per block). The rest of the state (``State.carry``) is saved per
block as ``lax.scan`` would.

Shape letters: :mod:`dca_theory.lm.model`; ``T`` layers, ``M`` cache rows (``max_len``).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from dca_theory.lm.blocks import LayerNorm, PreLNBlock, dropout, split_or_none
from dca_theory.lm.config import ModelConfig
from dca_theory.lm.fast.buffer_scans import shadow_scan, write_once_scan

#: groups of consecutive blocks whose buffer reads are cut to what their last block can read
#: (one ``lax.switch`` branch each in the scan body): a mixer that :attr:`~Mixer.narrows`
#: then reads on average ``(1 + 1/G) / 2`` of the buffer instead of all of it (the
#: blocks and the rest of the body are compiled once)
READ_GROUPS = 4


class State(NamedTuple):
    """A trunk's residual state between blocks: a write-once ``buffer`` of stack entries
    (``S×L×D``, or ``None``) and any other ``carry`` (a pytree; ``()`` for none)."""

    buffer: Array | None
    carry: Any


class BlockIO(eqx.Module):
    """What a mixer hands a block (see the module docstring); ``None`` fields take the query
    input (``k``, ``v``, ``r``) or the block's own ``LN_1`` (``kv_norms``). ``aux`` carries
    anything the mixer's :meth:`~Mixer.read` computed for its :meth:`~Mixer.write` (e.g.
    Hyper-Connections' stream weights); the block ignores it."""

    q: Array
    k: Array | None = None
    v: Array | None = None
    r: Array | None = None
    kv_norms: tuple[LayerNorm, LayerNorm] | None = None
    mix_values: Callable[[Array], Array] | None = None
    mlp_input: Callable[[Array], Array] | None = None
    aux: Any = None


def branch_inputs(io: BlockIO) -> BlockIO | None:
    """What a block's pre-LN branch reads of ``io`` (its ``q``, ``k``, ``v``, ``r`` and
    ``kv_norms``), for the per-layer records the branch analyses read
    (:mod:`dca_theory.lab.jacobian_rank`); ``None`` when ``io`` hands the block a hook
    (``mix_values``, ``mlp_input``), through which the branch reads the state as well."""
    if io.mix_values is not None or io.mlp_input is not None:
        return None
    return BlockIO(q=io.q, k=io.k, v=io.v, r=io.r, kv_norms=io.kv_norms)


class BlockOut(NamedTuple):
    """A block's outputs: attention ``a`` (after dropout), MLP ``m``, the projected values
    before any mixing (``H``-headed), and the updated key/value cache (``None`` without)."""

    a: Array
    m: Array
    values: Array
    cache: tuple[Array, Array] | None


def run_block(blk: PreLNBlock, io: BlockIO, *, causal: bool, key: PRNGKeyArray | None,
              cache: tuple[Array, Array] | None = None, offset: Array | None = None
              ) -> BlockOut:
    """The pre-LN block on ``io``: ``a = Attn(LN_1 q, LN_k k, LN_v v)``,
    ``m = MLP(LN_2(r + a))`` (or ``MLP(LN_2(io.mlp_input(a)))``)."""
    k_att, k_drop, k_mlp = split_or_none(key, 3)
    qn_LxD = blk.ln1(io.q)
    ln_k, ln_v = io.kv_norms or (blk.ln1, blk.ln1)
    kn_LxD = qn_LxD if io.k is None and io.kv_norms is None else ln_k(
        io.q if io.k is None else io.k)
    vn_LxD = qn_LxD if io.v is None and io.kv_norms is None else ln_v(
        io.q if io.v is None else io.v)
    a_LxD, values, cache = blk.attn.forward(qn_LxD, kn_LxD, vn_LxD, causal=causal, key=k_att,
                                            mix_values=io.mix_values, cache=cache,
                                            offset=offset)
    a_LxD = dropout(a_LxD, blk.rate, k_drop).astype(io.q.dtype)
    if io.mlp_input is not None:
        x_LxD = io.mlp_input(a_LxD)
    else:
        x_LxD = (io.q if io.r is None else io.r) + a_LxD
    m_LxD = blk.mlp(blk.ln2(x_LxD), key=k_mlp).astype(io.q.dtype)
    return BlockOut(a_LxD, m_LxD, values, cache)


class Mixer(eqx.Module):
    """One residual scheme's combination rule (see the module docstring).

    ``layers`` holds the per-block parameters (a pytree whose array leaves have a leading
    ``layer`` axis; ``None`` if the scheme has none); the driver slices it and hands block t's
    slice to :meth:`read` and :meth:`write` as ``p``. Those two must not read ``self``'s arrays
    (the driver calls them on a copy without arrays: a scan body that closed over the whole
    stack would defeat the layout). :meth:`output` may read the rest (a final combiner).
    """

    layers: eqx.AbstractVar[Any]
    #: buffer slots each block writes (Attention Residuals: 2, attention and MLP apart)
    slots_per_block: ClassVar[int] = 1
    #: whether the block reads the state through a BlockIO hook (``mlp_input``,
    #: ``mix_values``), so that a buffer's scan must recompute the whole step
    #: (:mod:`dca_theory.lm.fast.buffer_scans`)
    block_reads_state: ClassVar[bool] = False
    #: whether :meth:`narrow` is implemented: block t then reads only the buffer's first
    #: slots (see :data:`READ_GROUPS`)
    narrows: ClassVar[bool] = False
    #: whether :meth:`read_through` and :meth:`write` read no buffer slot that block t has not
    #: written yet (from ``1 + slots_per_block · t`` on), e.g. through
    #: :func:`~dca_theory.lm.fast.buffer_grn.buffer_grns_through`: the backward pass then
    #: recomputes them on the final buffer as it is, not on a rebuilt copy with those slots
    #: zeroed (:mod:`dca_theory.lm.fast.buffer_scans`)
    reads_written_only: ClassVar[bool] = False

    #: whether :meth:`read` hands the block a hook (``mix_values``, ``mlp_input``): its branch
    #: then reads more than its q/k/v/r inputs, so the branch analyses
    #: (:mod:`dca_theory.lab.jacobian_rank`) refuse the kind
    hooks_block: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def overhead(cls, cfg: ModelConfig) -> int:
        """The parameters this scheme adds to the vanilla model of ``cfg``'s size, in closed
        form from ``cfg`` alone (no arrays: ``dca-theory lm info`` counts the paper preset
        without building it). It equals ``param_count()`` of the mixer ``init(cfg)`` builds,
        its stored zero padding excluded (tested for every kind); the blocks are vanilla's."""

    @abc.abstractmethod
    def start(self, x_LxD: Float[Array, "L D"], n_layers: int) -> State:
        """The state before the first block."""

    def start_for_training(self, x_LxD: Float[Array, "L D"], n_layers: int) -> State:
        """:meth:`start` for a pass with a dropout key (training), whose gradient is taken:
        the same values in a state that is cheaper to differentiate, where the two differ
        (k-DCA: the scan's backward pass saves the carry once per block, so it keeps its
        entries in a write-once buffer rather than carrying its whole stack). Default:
        :meth:`start`."""
        return self.start(x_LxD, n_layers)

    @abc.abstractmethod
    def read(self, p: Any, state: State, t: Array) -> BlockIO:
        """Block ``t``'s inputs (``p``: its slice of ``layers``)."""

    def read_through(self, p: Any, state: State, t: Array) -> tuple[BlockIO, State]:
        """:meth:`read`, and the state :meth:`write` continues from: the same, unless the read
        passes the buffer through a kernel whose backward pass accumulates into the buffer's
        cotangent in place (:func:`~dca_theory.lm.fast.buffer_grn.buffer_grns_through`), whose
        passed-through buffer it then is. Default: ``state``."""
        return self.read(p, state, t), state

    @abc.abstractmethod
    def write(self, p: Any, state: State, t: Array, io: BlockIO, out: BlockOut) -> State:
        """The state after block ``t``."""

    @abc.abstractmethod
    def output(self, state: State) -> Float[Array, "L D"]:
        """The trunk output (before the final LayerNorm)."""

    def record(self, p: Any, before: State, after: State, io: BlockIO, out: BlockOut
               ) -> dict[str, Array]:
        """Block t's analysis states (:mod:`dca_theory.lm.trunk` names them): what attention
        reads as its query input, the block's new stack entry, the plain sum of everything so
        far, (stack kinds) the buffer it read and what the block's branch read
        (:func:`branch_inputs`). Default: a stream ``h ← h + a + m``."""
        return {"in": io.q, "out": out.a + out.m, "stream": after.carry,
                "io": branch_inputs(io)}

    def for_vanilla(self, blocks: PreLNBlock) -> Mixer:
        """This mixer (at its init) set so that the trunk with ``blocks`` computes exactly the
        vanilla model with those blocks (retrofit, :mod:`dca_theory.lm.retrofit`). Default:
        itself, for a mixer whose init is the plain residual sum already."""
        return self

    def named_combiners(self) -> dict[str, tuple[Any, int]]:
        """Every stack combiner at its own size (analysis: :mod:`dca_theory.lab.analysis`),
        with the number of block outputs its stack holds; none by default."""
        return {}

    def narrow(self, p: Any, width: int) -> Any:
        """Block parameters ``p`` for reading a buffer of its first ``width`` slots (only
        called if :attr:`narrows`; every slot beyond ``width`` is one block t has not written
        yet)."""
        raise NotImplementedError

    def stack_slots(self, t: int) -> tuple[int, ...] | None:
        """Which buffer slots block ``t``'s stack entries sit in, oldest first (``None``:
        the scheme records no stack)."""
        return None


def _bare(module: eqx.Module) -> eqx.Module:
    """``module`` without its arrays (its static part and methods only)."""
    return eqx.filter(module, eqx.is_array, inverse=True)


def _layer_count(blocks: PreLNBlock) -> int:
    return blocks.ln1.scale.shape[0]


def run_trunk(blocks: PreLNBlock, mixer: Mixer, x_LxD: Float[Array, "L D"], *, causal: bool,
              key: PRNGKeyArray | None, collect: bool = False
              ) -> tuple[Float[Array, "L D"], dict[str, Array] | None]:
    """The trunk output and, with ``collect``, the per-layer records stacked over layers
    (:meth:`Mixer.record`'s keys, each ``T×…``). Dropout keys: ``split(key, T)``, one per
    block, each split into attention, attention-output and MLP keys."""
    n = _layer_count(blocks)
    arrays, static = eqx.partition((blocks, mixer.layers), eqx.is_array)
    shell = _bare(mixer)
    extras = (jnp.arange(n), None if key is None else jax.random.split(key, n))

    def step(arrays_t, state, extra):
        blk, p = eqx.combine(arrays_t, static)
        t, k_t = extra
        io, through = shell.read_through(p, state, t)
        out = run_block(blk, io, causal=causal, key=k_t)
        after = shell.write(p, through, t, io, out)
        return after, (shell.record(p, state, after, io, out) if collect else None)

    # a dropout key marks training (every train step passes one, every evaluation none)
    state = mixer.start(x_LxD, n) if key is None else mixer.start_for_training(x_LxD, n)
    if state.buffer is None or collect:
        state, records = jax.lax.scan(lambda s, xs: step(xs[0], s, xs[1]), state,
                                      (arrays, extras))
        return mixer.output(state), records
    if mixer.block_reads_state:
        state = write_once_scan(lambda a, s, e: step(a, s, e)[0], arrays, state, extras,
                                mixer.slots_per_block)
        return mixer.output(state), None
    blk_static, p_static = static

    def checked(io):
        if io.mix_values is not None or io.mlp_input is not None:
            raise TypeError(f"{type(mixer).__name__} hands its block a hook (mix_values or "
                            "mlp_input) while keeping a buffer: set block_reads_state = True")
        return io

    def read_width(width, p, carry, buffer, t):
        p, buffer = shell.narrow(eqx.combine(p, p_static), width), buffer[:width]
        return checked(shell.read(p, State(buffer, carry), t))

    def read(p, carry, buffer, t):
        """Block t's inputs and the buffer the write continues from."""
        if not mixer.narrows:
            io, through = shell.read_through(eqx.combine(p, p_static), State(buffer, carry), t)
            return checked(io), through.buffer
        stops, widths = read_groups(n, mixer.slots_per_block)
        branches = [functools.partial(read_width, w) for w in widths]
        # t's dtype for the stops: with one group they are empty (a float array otherwise)
        group = jnp.searchsorted(jnp.asarray(stops[:-1], t.dtype), t, side="right")
        return jax.lax.switch(group, branches, p, carry, buffer, t), buffer

    def block(blk, io, k_t):
        return run_block(eqx.combine(blk, blk_static), io, causal=causal, key=k_t)

    def write(p, carry, io, out, buffer, t):
        return shell.write(eqx.combine(p, p_static), State(buffer, carry), t, io, out)

    return shadow_scan(read, block, write, mixer.output, arrays, state, extras,
                       mixer.slots_per_block, rebuild=not mixer.reads_written_only), None


def read_groups(n: int, slots_per_block: int) -> tuple[list[int], list[int]]:
    """``(stops, widths)``: the blocks split into :data:`READ_GROUPS` consecutive groups
    (group g ends before block ``stops[g]``) and the buffer slots its last block can read."""
    groups = max(1, min(READ_GROUPS, n))
    stops = sorted({round(i * n / groups) for i in range(1, groups + 1)})
    return stops, [1 + slots_per_block * (stop - 1) for stop in stops]


def decode_trunk(blocks: PreLNBlock, mixer: Mixer, x_LxD: Float[Array, "L D"],
                 cache: tuple[Array, Array], offset: Array
                 ) -> tuple[Float[Array, "L D"], tuple[Array, Array]]:
    """:func:`run_trunk` for ``L`` new tokens at positions ``offset, …`` (inference): each
    block reads and writes its rows of ``cache = (keys_TxMxHxK, values_TxMxHxK)``."""
    n = _layer_count(blocks)
    arrays, static = eqx.partition((blocks, mixer.layers), eqx.is_array)
    shell = _bare(mixer)

    def body(state, xs):
        arrays_t, t, layer = xs
        blk, p = eqx.combine(arrays_t, static)
        io, through = shell.read_through(p, state, t)
        out = run_block(blk, io, causal=True, key=None, cache=layer, offset=offset)
        return shell.write(p, through, t, io, out), out.cache

    state, cache = jax.lax.scan(body, mixer.start(x_LxD, n), (arrays, jnp.arange(n), cache))
    return mixer.output(state), cache


def stack_layers(modules) -> Any:
    """Modules of one structure as one, whose array leaves have a leading ``layer`` axis."""
    arrays = [eqx.filter(m, eqx.is_array) for m in modules]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *arrays)
    return eqx.combine(stacked, eqx.filter(modules[0], eqx.is_array, inverse=True))


def layer_of(stacked: Any, t: int) -> Any:
    """Layer ``t`` of a stacked module (:func:`stack_layers`' inverse, one layer)."""
    return jax.tree.map(lambda x: x[t] if eqx.is_array(x) else x, stacked)


def write_slot(buffer: Array, entry: Array, slot: Array) -> Array:
    """``buffer`` with ``entry`` in slot ``slot`` (leading axis), in place in a scan."""
    return jax.lax.dynamic_update_index_in_dim(buffer, entry.astype(buffer.dtype), slot, 0)


@jax.custom_vjp
def write_new_slot(buffer: Array, entry: Array, slot: Array) -> Array:
    """:func:`write_slot` into a slot that holds the zeros of :func:`new_buffer` (written once,
    by this call). Its backward pass reads the entry's cotangent from the slot and leaves the
    buffer's cotangent as it is, rather than zeroing the slot: that slot's old value is
    :func:`new_buffer`'s constant, which no gradient reaches, so the cotangent it would get is
    never read (no earlier block reads or writes the slot). So the backward pass neither
    copies nor rewrites the buffer's cotangent, which it would have to do while the block's
    backward pass still reads the entry's cotangent from it."""
    return write_slot(buffer, entry, slot)


def _write_new_slot_fwd(buffer, entry, slot):
    return write_slot(buffer, entry, slot), (slot, jnp.zeros((0,), entry.dtype))


def _write_new_slot_bwd(res, g_buffer):
    slot, like = res
    g_entry = jax.lax.dynamic_index_in_dim(g_buffer, slot, keepdims=False).astype(like.dtype)
    # the entry's cotangent as an array of its own, read before the buffer's cotangent moves
    # on: else XLA fuses the read into each of the block's backward kernels, and copies the
    # buffer's cotangent so that the next in-place update cannot overtake them
    g_entry, g_buffer = jax.lax.optimization_barrier((g_entry, g_buffer))
    return g_buffer, g_entry, None


write_new_slot.defvjp(_write_new_slot_fwd, _write_new_slot_bwd)


def new_buffer(x_LxD: Array, size: int) -> Array:
    """A ``size``-slot buffer holding ``x`` in slot 0 and zeros elsewhere."""
    return jnp.zeros((size, *x_LxD.shape), x_LxD.dtype).at[0].set(x_LxD)
