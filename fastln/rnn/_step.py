"""One time step of a recurrent model, for streaming inference: ``step()``,
its compiled form (_engine.Step), and the step of a StreamTable's streams."""
from __future__ import annotations

from typing import Any, Generic, List, Optional, Tuple, cast

import numpy as np
import numpy.typing as npt

from . import _engine
from ._inputs import State, StateArg, as_array
from ._params import Parameters

_Array = npt.NDArray[Any]


class Stepping(Parameters, Generic[State]):
    """A model's steps (a base of :class:`fastln.rnn.RecurrentModel`, which
    sets the attributes declared here)."""

    eps: float
    reverse: bool
    _step: Any   # the compiled step: see _compile_step

    def _pack_state(self, parts: List[_Array]) -> State:
        """The state's arrays in the state's form: h, or (h, c)."""
        return cast(State, tuple(parts) if self._has_cell else parts[0])

    def step(self, x_t: npt.ArrayLike, state: StateArg = None, *,
             out: Optional[_Array] = None, state_out: Any = None) -> Tuple[_Array, State]:
        """One time step, for streaming inference.

        Computes what ``forward(x_t[None], state, cache=False)`` computes for
        a time-major model, with less overhead per call.

        Parameters
        ----------
        x_t : array_like, shape (B, input_size)
            The inputs of one step (whatever ``batch_first`` is), of the
            model's float type (as x in :meth:`forward`: a bfloat16 model
            takes bfloat16 or float32).
        state : ndarray or tuple of ndarray, optional
            The state before the step, as in :meth:`forward`; None for zeros.
        out : ndarray, optional
            Where to write h: C-contiguous, (B, hidden_size), of the model's
            dtype (bfloat16 for a bfloat16 model).
        state_out : ndarray or tuple of ndarray, optional
            Where to write the new state, in the form of `state`: C-contiguous
            arrays of the state's dtype, writable. They may be the arrays
            of `state` itself, which the step then updates in place; a loop
            that passes the same arrays every time allocates nothing.

        Returns
        -------
        h : ndarray, shape (B, hidden_size)
            The top layer's output, in the model's dtype.
        state : ndarray or tuple of ndarray
            The state after the step, in the form of :meth:`forward`'s:
            `state_out`, or new arrays (float32 for a bfloat16 model); the
            given state is modified only when it is `state_out`.

        Raises
        ------
        TypeError, ValueError
            As :meth:`forward`, for x_t and state, and for out and state_out
            of the wrong type, shape, dtype or layout. ValueError also for
            a bidirectional or reverse model, whose reverse direction needs
            the whole sequence.

        Notes
        -----
        Keeps no cache, and leaves the cache of an earlier forward as it is.
        A stream of steps gives bitwise the outputs and state of one forward
        over the same inputs, and a row's results do not depend on the other
        rows of the batch, in every dtype and on every instruction-set path.
        B = 0 gives an empty h and returns the (empty) state.

        The step runs compiled: the model's parameters are checked once
        and kept while ``params`` holds the same arrays, and each call is
        one call into the C engine, for every layer. The weights are read
        where they are, so a change to them in place (``m.params[k] -=
        ...``) applies from the next step: a float32 or float64 model keeps
        its weight matrices in Fortran order, the layout of the product
        kernels. A
        weight matrix whose memory nothing can write (a bytes object's, as
        a bfloat16 model's are) is packed for the kernels once and kept;
        any other C-ordered one, as from ``m.params[k] = a``, read-only or
        not, is packed on every call. A step refused for its arguments
        (TypeError, ValueError) writes neither `out` nor `state_out`.

        Examples
        --------
        >>> import numpy as np
        >>> from fastln.rnn import LNLSTM
        >>> m = LNLSTM(input_size=3, hidden_size=4, seed=0)
        >>> state = None
        >>> for x_t in np.ones((6, 2, 3), np.float32):
        ...     h, state = m.step(x_t, state)
        >>> y, final = m.forward(np.ones((6, 2, 3), np.float32), cache=False)
        >>> bool(np.array_equal(h, y[-1]))
        True
        """
        run = self._step
        if run is not None:
            done = run(self.params, x_t, state, out, state_out)   # the common case, in one call
            if done is not None:
                return done
        run, xs = self._step_input(x_t, "x_t")
        dt = self._dt
        shape = xs.shape
        if len(shape) != 2 or shape[1] != self.input_size:
            raise ValueError(f"x_t must have shape (B, {self.input_size}), got {shape}")
        B = shape[0]
        full = self._state_shapes(B, self.num_layers)
        W = self._out_size
        given = self._outputs(out, [(B, W)], "out")   # before state_out is written
        cell = self._has_cell
        parts = state if cell and type(state) is tuple else (state,)
        if len(parts) == 1 + cell and all(type(p) is np.ndarray and p.dtype is dt
                                          and p.shape == s and p.flags.c_contiguous
                                          and p.flags.aligned for p, s in zip(parts, full)):
            ins: List[Optional[_Array]] = list(parts)   # read by the engine, not changed
            outs = self._outputs(state_out, full, "state_out") or \
                [np.empty(s, dt) for s in full]
        else:   # checked and copied (zeros for None): the step starts from the copies
            ins = [None] * (1 + cell)
            outs = self._outputs(state_out, full, "state_out")
            start = self._states(state, B, "state")
            for o, st in zip(outs, start):
                o[...] = st
            outs = outs or start
        into = given[0] if given else None
        y = self._format.engine_y(into, (B, W))
        if B:
            run.run(B, xs, ins[0], ins[-1] if cell else None, y, outs[0],
                    outs[-1] if cell else None)
        return self._format.output(y, into), self._pack_state(outs)

    def _step_input(self, x: Any, name: str) -> Tuple[Any, _Array]:
        """The compiled step for the parameters params holds now, and x as
        the step reads it (of the state's dtype, C-contiguous, aligned)."""
        run = self._step
        if run is None or not run.valid(self.params):
            run = self._compile_step()
        if not (type(x) is np.ndarray and x.dtype is self._dt and x.flags.c_contiguous
                and x.flags.aligned):
            x = as_array(x, name, self._dt, self.dtype, strict=True, data=True)
        return run, x

    def _compile_step(self) -> Any:
        """The engine's compiled step (_engine.Step) for the parameters that
        params holds now, kept in self._step."""
        if self.bidirectional or self.reverse:
            raise ValueError(f"step() runs a stream forward in time; a "
                             f"{'bidirectional' if self.bidirectional else 'reverse'} model "
                             f"needs the whole sequence: call forward(x) instead")
        layers = [self._layer_params(k) for k in range(self.num_layers)]
        packs = [self._packed(k, 0, ps) for k, ps in enumerate(layers)]
        keys = [key for k in range(self.num_layers) for key in self._layer_keys(k)]
        self._step = _engine.Step(self._cell_name(), self.input_size, self.hidden_size,
                                  self.eps, layers, packs, self._format.wtype,
                                  self._format.rounds_to, keys,
                                  [self.params[key] for key in keys], self.proj_size)
        return self._step

    def _table_step(self, h_table: _Array, c_table: Optional[_Array], rows: _Array,
                    x: npt.ArrayLike, out: Optional[_Array]) -> _Array:
        """One step of the streams whose states are `rows` of the tables
        (num_layers, capacity, H), which it updates (StreamTable.step)."""
        run, xs = self._step_input(x, "x")
        B = len(rows)
        if xs.shape != (B, self.input_size):
            raise ValueError(f"x must have shape (len(ids), input_size) = "
                             f"{(B, self.input_size)}, got {xs.shape}")
        given = self._outputs(out, [(B, self._out_size)], "out")
        into = given[0] if given else None
        y = self._format.engine_y(into, (B, self._out_size))
        if B:
            run.table(xs, rows, h_table, c_table, y)
        return self._format.output(y, into)
