"""The engine as torch operators: ``fastln::rnn_layer``, one layer of a
recurrent network forward in one direction or both, and
``fastln::rnn_layer_backward``, its backward, linked by
``torch.library.register_autograd``; ``register_fake`` gives their output
shapes, so that ``torch.compile`` and ``torch.export`` trace them without a
graph break.

Tensors cross into the engine as NumPy views of their memory (no copies):
the module hands in contiguous CPU tensors of one floating dtype. The
forward returns the layer's cache as a tensor, which autograd keeps for the
backward; the backward op has no derivative of its own (double backward
raises). The large buffers (the cache, y, the backward's scratch) come from
fastln's cache of large blocks (fastln._memory), as a model's NumPy outputs
do: fresh memory of their size would take a page fault per page on every
call."""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _lib, _rows
from ..rnn import functional


def _np(t: Optional[Tensor]) -> Any:
    return None if t is None else t.numpy()


def _split(params: Sequence[Any], directions: int) -> List[List[Any]]:
    """The flat list of parameters as one list per direction."""
    n = len(params) // directions
    return [list(params[d * n:(d + 1) * n]) for d in range(directions)]


def _empty(shape: Tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialized CPU tensor of like's dtype; one of 4 MiB or more
    from fastln's cache of large blocks, which takes its memory back when
    the tensor's storage is freed."""
    n = math.prod(shape)
    if n * like.element_size() < _lib._POOL_MIN_BYTES:
        return like.new_empty(shape)
    return torch.from_numpy(_rows.empty_rows(1, n, like.numpy()[:0].dtype)).view(shape)


def cache_numel(cell: str, T: Any, B: Any, H: int) -> Any:
    """functional.cache_size for T and B that may be symbolic (a cache holds
    T * B * a + B * b elements for a cell and H)."""
    one, two = functional.cache_size(cell, 1, 1, H), functional.cache_size(cell, 2, 1, H)
    return T * B * (two - one) + B * (2 * one - two)


def layer(x: Tensor, h0: Tensor, c0: Optional[Tensor], params: List[Tensor],
          lengths: Optional[Tensor], cell: str, eps: float, directions: int,
          keep_cache: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """One layer forward: (y (T, B, D*H), h_n (D, B, H), c_n (D, B, H), or
    empty without a cell state, cache (D, n), or (D, 0) without keep_cache):
    the operator's implementation, which a call outside tracing that
    autograd does not record runs directly."""
    T, B, _ = x.shape
    H = h0.shape[2]
    h = h0.clone()
    c = c0.clone() if c0 is not None else h0.new_empty(0)
    size = functional.cache_size(cell, T, B, H) if keep_cache else 0
    cache = _empty((directions, size), x)
    y = _empty((T, B, directions * H), x)
    caches = list(cache.numpy()) if keep_cache else None
    functional.layer_forward(cell, x.numpy(), _split([p.numpy() for p in params], directions),
                             h.numpy(), None if c0 is None else c.numpy(),
                             lengths=_np(lengths), eps=eps, caches=caches, out=y.numpy())
    return y, h, c, cache


rnn_layer = torch.library.custom_op("fastln::rnn_layer", layer, mutates_args=(),
                                    device_types="cpu")


@rnn_layer.register_fake
def _rnn_layer_fake(x: Tensor, h0: Tensor, c0: Optional[Tensor], params: List[Tensor],
                    lengths: Optional[Tensor], cell: str, eps: float, directions: int,
                    keep_cache: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    T, B, _ = x.shape
    H = int(params[1].shape[1])
    size = cache_numel(cell, T, B, H) if keep_cache else 0
    c = h0.new_empty(h0.shape) if c0 is not None else h0.new_empty(0)
    return (x.new_empty((T, B, directions * H)), h0.new_empty(h0.shape), c,
            x.new_empty((directions, size)))


@torch.library.custom_op("fastln::rnn_layer_backward", mutates_args=(), device_types="cpu")
def rnn_layer_backward(x: Tensor, params: List[Tensor], lengths: Optional[Tensor],
                       cache: Tensor, dy: Tensor, dh: Tensor, dc: Optional[Tensor], cell: str,
                       eps: float, directions: int) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    """One layer backward: (dx, dh0, dc0 (empty without a cell state), the
    parameters' gradients in params' order)."""
    dh0 = dh.clone()
    dc0 = dc.clone() if dc is not None else dh.new_empty(0)
    grads = [p.new_empty(p.shape) for p in params]
    dx = _empty(tuple(x.shape), x)
    T, B, _ = x.shape
    work = _empty((directions, functional.work_size(cell, T, B, dh.shape[2])), x)
    functional.layer_backward(cell, x.numpy(), _split([p.numpy() for p in params], directions),
                              list(cache.numpy()), dy.numpy(), dh0.numpy(),
                              None if dc is None else dc0.numpy(),
                              grads=_split([g.numpy() for g in grads], directions),
                              lengths=_np(lengths), eps=eps, out=dx.numpy(),
                              works=list(work.numpy()))
    return dx, dh0, dc0, grads


@rnn_layer_backward.register_fake
def _rnn_layer_backward_fake(x: Tensor, params: List[Tensor], lengths: Optional[Tensor],
                             cache: Tensor, dy: Tensor, dh: Tensor, dc: Optional[Tensor],
                             cell: str, eps: float, directions: int
                             ) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    dc0 = dh.new_empty(dh.shape) if dc is not None else dh.new_empty(0)
    return (x.new_empty(x.shape), dh.new_empty(dh.shape), dc0,
            [p.new_empty(p.shape) for p in params])


def _setup(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, ...]) -> None:
    x, _, c0, params, lengths, cell, eps, directions, keep_cache = inputs
    ctx.cell, ctx.eps, ctx.directions = cell, eps, directions
    ctx.has_cell, ctx.keep_cache = c0 is not None, keep_cache
    ctx.save_for_backward(x, lengths, output[3], *params)
    ctx.mark_non_differentiable(output[3])
    ctx.set_materialize_grads(False)   # no zeros for the cache and unused outputs


def _backward(ctx: Any, dy: Optional[Tensor], dh: Optional[Tensor], dc: Optional[Tensor],
              _dcache: Any) -> Tuple[Any, ...]:
    if not ctx.keep_cache:
        raise RuntimeError("fastln.torch: this forward kept no cache for a backward (it ran "
                           "with no input requiring grad, or under torch.no_grad)")
    x, lengths, cache, *params = ctx.saved_tensors
    T, B, _ = x.shape
    H = params[1].shape[1]
    D = ctx.directions
    dy = x.new_zeros((T, B, D * H)) if dy is None else dy.contiguous()
    dh = x.new_zeros((D, B, H)) if dh is None else dh.contiguous()
    if ctx.has_cell:
        dc = x.new_zeros((D, B, H)) if dc is None else dc.contiguous()
    else:
        dc = None
    dx, dh0, dc0, grads = rnn_layer_backward(x, params, lengths, cache, dy, dh, dc,
                                             ctx.cell, ctx.eps, D)
    return (dx, dh0, dc0 if ctx.has_cell else None, list(grads), None, None, None, None, None)


def _no_double_backward(ctx: Any, *grads: Any) -> Any:
    raise RuntimeError("fastln.torch's recurrent layers have no double backward: "
                       "a gradient of their gradient is not supported")


def _setup_backward(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
    pass


rnn_layer.register_autograd(_backward, setup_context=_setup)
rnn_layer_backward.register_autograd(_no_double_backward, setup_context=_setup_backward)
