"""A plain PyTorch (autograd) reference of fastln.rnn's LNRNN, LNLSTM, LNGRU, LSTM, RNN and GRU.

The equations of docs/design.md ("Recurrent networks") written with torch ops (no
torch.nn.LSTM/GRU), multi-layer, one or two directions, with ``lengths`` masking by
torch.where.  The reverse direction gathers each sequence's own steps in reversed order
(index lengths[b] - 1 - t), runs forward over them and gathers the outputs back.  Used by
tests/test_rnn.py and tests/test_rnn_bidir.py:

    out = torch_rnn(torch, "lstm", params, x, state, lengths, num_layers=2, dy=dy, dstate=dstate)
    out.y, out.state, out.grads, out.dx, out.dstate      # NumPy float64 arrays

``grads`` etc. are the gradients of  sum(y*dy) + sum(h_n*dh_n) [+ sum(c_n*dc_n)],
i.e. what ``m.backward(dy, dstate)`` must return/fill.
"""
from types import SimpleNamespace

import numpy as np


def _tensor(torch, a, dtype, grad):
    t = torch.from_numpy(np.array(a, dtype=np.float64)).to(dtype)
    return t.requires_grad_(grad)


def _step_rnn(torch, p, x_t, h, c, eps, act):
    F = torch.nn.functional
    H = h.shape[-1]
    a = x_t @ p["weight_ih"].T + h @ p["weight_hh"].T
    return act(F.layer_norm(a, (H,), p["ln_weight"], p["ln_bias"], eps)), None


def _step_lstm(torch, p, x_t, h, c, eps, act):
    F = torch.nn.functional
    H = h.shape[-1]
    gates = (F.layer_norm(x_t @ p["weight_ih"].T, (4 * H,), p["ln_ih_weight"], p["ln_ih_bias"], eps)
             + F.layer_norm(h @ p["weight_hh"].T, (4 * H,), p["ln_hh_weight"], p["ln_hh_bias"], eps)
             + p["bias"])
    gi, gf, gg, go = gates.chunk(4, dim=-1)
    c_new = torch.sigmoid(gf) * c + torch.sigmoid(gi) * torch.tanh(gg)
    c_norm = F.layer_norm(c_new, (H,), p["ln_c_weight"], p["ln_c_bias"], eps)
    h_new = torch.sigmoid(go) * torch.tanh(c_norm)
    return h_new, c_new


def _step_gru(torch, p, x_t, h, c, eps, act):
    F = torch.nn.functional
    H = h.shape[-1]
    w_ih, w_hh = p["weight_ih"], p["weight_hh"]
    zr = (F.layer_norm(x_t @ w_ih[:2 * H].T, (2 * H,), p["ln_ih_weight"], p["ln_ih_bias"], eps)
          + F.layer_norm(h @ w_hh[:2 * H].T, (2 * H,), p["ln_hh_weight"], p["ln_hh_bias"], eps))
    z, r = torch.sigmoid(zr[:, :H]), torch.sigmoid(zr[:, H:])
    n_in = F.layer_norm(x_t @ w_ih[2 * H:].T, (H,), p["ln_in_weight"], p["ln_in_bias"], eps)
    n_h = F.layer_norm(h @ w_hh[2 * H:].T, (H,), p["ln_hn_weight"], p["ln_hn_bias"], eps)
    n = torch.tanh(n_in + r * n_h)
    return (1 - z) * h + z * n, None


def _step_lstm_plain(torch, p, x_t, h, c, eps, act):
    gi, gf, gg, go = (x_t @ p["weight_ih"].T + h @ p["weight_hh"].T + p["bias"]).chunk(4, dim=-1)
    c_new = torch.sigmoid(gf) * c + torch.sigmoid(gi) * torch.tanh(gg)
    return torch.sigmoid(go) * torch.tanh(c_new), c_new


def _step_rnn_plain(torch, p, x_t, h, c, eps, act):
    return act(x_t @ p["weight_ih"].T + h @ p["weight_hh"].T + p["bias"]), None


def _step_gru_plain(torch, p, x_t, h, c, eps, act, linear_before_reset=True):
    H = h.shape[-1]
    gx = x_t @ p["weight_ih"].T + p["bias"]                   # [r, z, n] blocks
    w_hh = p["weight_hh"]
    r = torch.sigmoid(gx[:, :H] + h @ w_hh[:H].T)
    z = torch.sigmoid(gx[:, H:2 * H] + h @ w_hh[H:2 * H].T)
    if linear_before_reset:
        n = torch.tanh(gx[:, 2 * H:] + r * (h @ w_hh[2 * H:].T + p["bias_hn"]))
    else:
        n = torch.tanh(gx[:, 2 * H:] + (r * h) @ w_hh[2 * H:].T + p["bias_hn"])
    return (1 - z) * n + z * h, None


def _step_gru_plain_lbr_false(torch, p, x_t, h, c, eps, act):
    return _step_gru_plain(torch, p, x_t, h, c, eps, act, linear_before_reset=False)


_STEPS = {"rnn": _step_rnn, "lstm": _step_lstm, "gru": _step_gru,
          "lstm_plain": _step_lstm_plain, "rnn_plain": _step_rnn_plain,
          "gru_plain": _step_gru_plain}


def torch_rnn(torch, cell, params, x, state=None, lengths=None, num_layers=1, eps=1e-5,
              nonlinearity="tanh", batch_first=False, dy=None, dstate=None, dtype=None,
              bidirectional=False, linear_before_reset=True, reverse=False):
    """Forward (and, with ``dy`` given, backward) of ``cell`` in "rnn", "lstm", "gru",
    "rnn_plain", "lstm_plain", "gru_plain" (the plain cells ignore eps;
    ``linear_before_reset`` is gru_plain's form of n).  With ``bidirectional`` the
    states are (2 * num_layers, B, H), direction d of layer k at 2k + d, y has 2H
    features, and the reverse direction's parameters are named ``..._reverse``.  With
    ``reverse`` (unidirectional only) the one direction runs backwards in time.

    ``params``, ``x``, ``state`` (None, an array, or (h, c) for "lstm") and ``dy``/``dstate``
    are NumPy arrays.  Computes in ``dtype`` (default torch.float64).  Returns a namespace
    with NumPy float64 ``y``, ``state`` (same form as the model's) and, if ``dy`` is
    given, ``grads`` (dict like params), ``dx`` and ``dstate`` (same form as the state).

    Runs on one torch thread: its ops are a few small rows each, where a thread pool
    only adds a fork and join per op, and a join waits for a descheduled worker
    whenever other processes hold the cores. The caller's thread count is restored
    afterwards (torch may share fastln's OpenMP runtime, whose limit it sets).
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _torch_rnn(torch, cell, params, x, state, lengths, num_layers, eps,
                          nonlinearity, batch_first, dy, dstate, dtype, bidirectional,
                          linear_before_reset, reverse)
    finally:
        torch.set_num_threads(saved)


def _reversal_index(torch, lengths_t, T):
    """(T, B) index: lengths[b] - 1 - t for t < lengths[b], t after (a permutation of each
    column that is its own inverse)."""
    t = torch.arange(T)[:, None]
    return torch.where(t < lengths_t[None, :], lengths_t[None, :] - 1 - t, t)


def _reverse_time(torch, a, index):
    """a (T, B, F) with each sequence's own steps reversed (the steps after its end kept)."""
    return torch.gather(a, 0, index[:, :, None].expand(-1, -1, a.shape[2]))


def _torch_rnn(torch, cell, params, x, state, lengths, num_layers, eps, nonlinearity,
               batch_first, dy, dstate, dtype, bidirectional=False, linear_before_reset=True,
               reverse=False):
    dtype = torch.float64 if dtype is None else dtype
    lstm = cell.startswith("lstm")
    step = _STEPS[cell]
    if cell == "gru_plain" and not linear_before_reset:
        step = _step_gru_plain_lbr_false
    directions = [("", False), ("_reverse", True)] if bidirectional else [("", reverse)]
    D = len(directions)
    act = {"tanh": torch.tanh, "relu": torch.relu}[nonlinearity]
    want_grad = dy is not None

    P = {name: _tensor(torch, a, dtype, want_grad) for name, a in params.items()}
    xt = _tensor(torch, x, dtype, want_grad)
    xs = xt.transpose(0, 1) if batch_first else xt                  # (T, B, I)
    T, B = xs.shape[0], xs.shape[1]
    H = params["weight_hh_l0"].shape[1]
    if state is None:
        state = (np.zeros((D * num_layers, B, H)),) * (2 if lstm else 1)
    elif not lstm:
        state = (state,)
    S0 = [_tensor(torch, s, dtype, want_grad) for s in state]
    lengths_t = torch.full((B,), T) if lengths is None else \
        torch.as_tensor(np.asarray(lengths)).long()
    alive = (torch.arange(T)[:, None] < lengths_t[None, :])[:, :, None]
    rev = _reversal_index(torch, lengths_t, T)

    inp = xs
    h_n, c_n = [], []
    for k in range(num_layers):
        dir_outs = []
        for d, (dir_suffix, backwards) in enumerate(directions):
            suffix = "_l%d%s" % (k, dir_suffix)
            p = {name[:-len(suffix)]: t for name, t in P.items() if name.endswith(suffix)}
            h = S0[0][D * k + d]
            c = S0[1][D * k + d] if lstm else None
            seq = _reverse_time(torch, inp, rev) if backwards else inp
            outs = []
            for t in range(T):
                h_new, c_new = step(torch, p, seq[t], h, c, eps, act)
                h = torch.where(alive[t], h_new, h)
                if lstm:
                    c = torch.where(alive[t], c_new, c)
                outs.append(torch.where(alive[t], h, torch.zeros_like(h)))
            out = torch.stack(outs)
            dir_outs.append(_reverse_time(torch, out, rev) if backwards else out)
            h_n.append(h)
            c_n.append(c)
        inp = torch.cat(dir_outs, dim=-1)
    y = inp.transpose(0, 1) if batch_first else inp
    finals = [torch.stack(h_n)] + ([torch.stack(c_n)] if lstm else [])

    def np64(t):
        return t.detach().to(torch.float64).numpy().copy()

    out = SimpleNamespace(y=np64(y),
                          state=tuple(np64(s) for s in finals) if lstm else np64(finals[0]))
    if not want_grad:
        return out
    loss = (y * _tensor(torch, dy, dtype, False)).sum()
    if dstate is not None:
        dstate = tuple(dstate) if lstm else (dstate,)
        for s, ds in zip(finals, dstate):
            if ds is not None:
                loss = loss + (s * _tensor(torch, ds, dtype, False)).sum()
    leaves = list(P.values()) + [xt] + S0
    gs = torch.autograd.grad(loss, leaves, allow_unused=True)
    gs = [np.zeros(tuple(leaf.shape)) if g is None else np64(g) for leaf, g in zip(leaves, gs)]
    out.grads = dict(zip(P.keys(), gs[:len(P)]))
    out.dx = gs[len(P)]
    out.dstate = tuple(gs[len(P) + 1:]) if lstm else gs[len(P) + 1]
    return out
