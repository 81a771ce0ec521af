r"""The scans of a trunk whose state holds a write-once buffer, and why the backward pass needs
them: without them ``lax.scan``'s autodiff saves the buffer once per block (depth² memory).

A mixer that keeps a growing stack keeps it in a preallocated *buffer*
(:class:`~dca_theory.lm.driver.State`): block t writes slots ``1 + slots_per_block · t, …`` and
reads only earlier ones, so the buffer block t read is the *final* buffer ``B`` with the later
slots zeroed. The backward pass needs that buffer for the mixer's own derivative (a GRN's
``b̄_i = Σ ȳ ⊙ h_i`` reads the entries); these scans rebuild it from ``B`` instead of saving it.

* :func:`shadow_scan` (the default): block t's mixer steps, :meth:`~Mixer.read` and
  :meth:`~Mixer.write`, run under custom VJPs that save only their small inputs (the block's
  mixer parameters, the non-buffer carry, the block's inputs and outputs); the block itself is
  differentiated by ``lax.scan`` as usual (its activations saved, nothing recomputed). To
  rebuild block t's buffer, the backward pass needs ``B``, which only exists at the end of the
  forward pass: it travels backwards as the *cotangent* of a shadow carry. The shadow is an
  all-zero array carried unchanged through every step; the trunk output is tied to it by
  :func:`_attach`, whose backward pass gives the shadow the cotangent ``B``; each step's
  backward pass reads ``B`` there and passes it on unchanged. Memory: ``B`` once, plus what a
  vanilla scan saves; extra work: each mixer step runs twice (the blocks once).
* :func:`write_once_scan`, for a mixer whose block reads the state itself (through a
  :class:`~dca_theory.lm.driver.BlockIO` hook, as Attention Residuals' MLP input does), so the
  block cannot be separated from the mixer: the whole step is recomputed in the backward pass
  from the rebuilt buffer (one more forward pass per block).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array


def _rebuilt(final: Array, t: Array, slots_per_block: int) -> Array:
    """The buffer block ``t`` read: ``final`` with the slots it and later blocks write zeroed."""
    slot = jnp.arange(final.shape[0]).reshape((-1,) + (1,) * (final.ndim - 1))
    return jnp.where(slot < 1 + slots_per_block * t, final, jnp.zeros_like(final))


def _shadowed(fn: Callable, slots_per_block: int, rebuild: bool) -> Callable:
    """``fn(args, buffer, t)`` as ``f(args, buffer, shadow, t) -> (fn(...), shadow)``: same
    value; its backward pass saves only ``args`` and ``t`` and recomputes ``fn`` on the buffer
    rebuilt from the shadow's cotangent (the final buffer), or on the final buffer itself if
    ``fn`` reads no slot written after block t (``rebuild=False``)."""

    @jax.custom_vjp
    def f(args, buffer, shadow, t):
        return fn(args, buffer, t), shadow

    def f_fwd(args, buffer, shadow, t):
        return (fn(args, buffer, t), shadow), (args, t)

    def f_bwd(res, cotangents):
        args, t = res
        g_out, final = cotangents
        buffer = _rebuilt(final, t, slots_per_block) if rebuild else final
        _, vjp = jax.vjp(lambda a, b: fn(a, b, t), args, buffer)
        g_args, g_buffer = vjp(g_out)
        return g_args, g_buffer, final, None

    f.defvjp(f_fwd, f_bwd)
    return f


@jax.custom_vjp
def _attach(h: Array, shadow: Array, buffer: Array) -> Array:
    """``h``; its backward pass gives ``shadow`` the cotangent ``buffer`` (and ``buffer``
    none of its own)."""
    return h


def _attach_fwd(h, shadow, buffer):
    return h, buffer


def _attach_bwd(buffer, g_h):
    return g_h, buffer, jnp.zeros_like(buffer)


_attach.defvjp(_attach_fwd, _attach_bwd)


def shadow_scan(read: Callable, block: Callable, write: Callable, output: Callable,
                arrays, state, extras, slots_per_block: int, rebuild: bool = True) -> Array:
    """The trunk output of ``lax.scan`` over blocks with the split step
    ``io, buffer = read(p, carry, buffer, t)``, ``out = block(blk, io, key)``,
    ``state = write(p, carry, io, out, buffer, t)`` (``arrays = (blocks, mixer layers)``
    stacked, ``extras = (t, keys)``), then ``output(state)``; see the module docstring. The
    write continues from the buffer the read returns (the same one, or passed through a kernel
    that accumulates its cotangent in place); ``rebuild=False`` for reads and writes that read
    no slot written after block t."""
    read_s = _shadowed(lambda a, buf, t: read(*a, buf, t), slots_per_block, rebuild)
    write_s = _shadowed(lambda a, buf, t: write(*a, buf, t), slots_per_block, rebuild)

    def body(carry, xs):
        state, shadow = carry
        (blk, p), (t, key) = xs
        (io, buffer), shadow = read_s((p, state.carry), state.buffer, shadow, t)
        out = block(blk, io, key)
        state, shadow = write_s((p, state.carry, io, out), buffer, shadow, t)
        return (state, shadow), None

    (state, shadow), _ = jax.lax.scan(body, (state, jnp.zeros_like(state.buffer)),
                                      (arrays, extras))
    return _attach(output(state), shadow, state.buffer)


def write_once_scan(step: Callable, arrays, state, extras, slots_per_block: int):
    """``lax.scan`` of ``state = step(arrays_t, state, extras_t)`` over the leading axis, for a
    ``step`` that writes buffer slots from ``1 + slots_per_block · t`` on (``t = extras[0]``)
    and reads only earlier ones (``state`` a :class:`~dca_theory.lm.driver.State`): same value,
    a backward pass that keeps one buffer and recomputes each step (see the module
    docstring)."""

    def forward(arrays, state, extras):
        def body(s, xs):
            return step(xs[0], s, xs[1]), s.carry

        return jax.lax.scan(body, state, (arrays, extras))

    @jax.custom_vjp
    def run(arrays, state, extras):
        return forward(arrays, state, extras)[0]

    def run_fwd(arrays, state, extras):
        out, carries = forward(arrays, state, extras)
        return out, (arrays, out.buffer, carries, extras)

    def run_bwd(res, g_out):
        arrays, buffer, carries, extras = res
        def back(g_state, xs):
            arrays_t, carry, extra = xs
            read = _rebuilt(buffer, extra[0], slots_per_block)
            _, vjp = jax.vjp(lambda a, s: step(a, s, extra), arrays_t,
                             state._replace(buffer=read, carry=carry))
            g_arrays, g_in = vjp(g_state)
            return g_in, g_arrays

        g_state, g_arrays = jax.lax.scan(back, g_out, (arrays, carries, extras), reverse=True)
        return g_arrays, g_state, jax.tree.map(lambda _: None, extras)

    run.defvjp(run_fwd, run_bwd)
    return run(arrays, state, extras)
