/*
 * The cache layout of one layer of the LN-RNN engine (rnn.h), the same on
 * every path, and the sizes of the cache and of the backward's scratch
 * (fastln_rnn_cache_size, fastln_rnn_work_size).
 */
#include "rnn/rnn.h"

int fastln_rnn_layout_for(fastln_rnn_layout *L, int cell, int64_t T, int64_t B, int64_t H)
{
    int plain = (cell & FASTLN_CELL_PLAIN) != 0, rf = (cell & FASTLN_CELL_RESET_FIRST) != 0;
    int sum = (cell & FASTLN_CELL_LN_SUM) != 0, per_gate = (cell & FASTLN_CELL_LN_GATE) != 0;
    int carry_ln = (cell & FASTLN_CELL_CARRY_LN) != 0;
    cell &= ~(FASTLN_CELL_PLAIN | FASTLN_CELL_RESET_FIRST | FASTLN_CELL_LN_SUM |
              FASTLN_CELL_LN_GATE | FASTLN_CELL_CARRY_LN);
    if (cell < 0 || cell > FASTLN_CELL_GRU || (rf && !(plain && cell == FASTLN_CELL_GRU)) ||
        ((sum || per_gate || carry_ln) && (plain || cell != FASTLN_CELL_LSTM)) ||
        (sum && per_gate))
        return FASTLN_EINVAL;
    L->reset_first = rf;
    L->norm = sum ? FASTLN_NORM_SUM : per_gate ? FASTLN_NORM_GATE : FASTLN_NORM_PAIR;
    L->carry_ln = carry_ln;
    int lstm = cell == FASTLN_CELL_LSTM, gru = cell == FASTLN_CELL_GRU, ln = !plain;
    L->cell = cell;
    L->plain = plain;
    L->gates = lstm ? 4 : gru ? 3 : 1;
    L->gw = (lstm ? 5 : gru ? 4 : 1) * H;
    /* the gate LNs' (a pair, one, or one per gate), then c's */
    L->nrstd = plain ? 0 : lstm ? (sum ? 1 : per_gate ? 4 : 2) + 1 : gru ? 4 : 1;
    L->split = (ln && lstm && L->norm == FASTLN_NORM_PAIR) || gru;
    L->G = L->gates * H;
    int64_t tbg = T * B * L->G, tbh = T * B * H, seq = (T + 1) * B * H, off = 0;
    int xih = ln || lstm, xhh = ln && L->split, xc = lstm ? ln : gru && plain;
    L->xih = xih ? off : -1;           off += xih ? tbg : 0;
    L->xhh = xhh ? off : -1;           off += xhh ? tbg : 0;
    L->act = gru ? off : -1;           off += gru ? tbg : 0;   /* LSTM: recomputed */
    L->hseq = off;                     off += seq;
    L->cseq = lstm ? off : -1;         off += lstm ? seq : 0;
    L->xc = xc ? off : -1;             off += xc ? tbh : 0;
    L->rstd = off;                     off += T * B * L->nrstd;
    L->size = off;
    return FASTLN_OK;
}

int64_t fastln_rnn_cache_size(int cell, int64_t T, int64_t B, int64_t H)
{
    fastln_rnn_layout L;
    if (T < 0 || B < 0 || H < 0 || fastln_rnn_layout_for(&L, cell, T, B, H)) return -1;
    return L.size;
}

/* dA_ih and dA_hh (one array unless split), a step's LN-output gradients, a
 * step's rows of dA_ih in L1/L2 before they are streamed out, and a step's
 * recomputed LSTM gate activations */
int64_t fastln_rnn_work_size(int cell, int64_t T, int64_t B, int64_t H)
{
    fastln_rnn_layout L;
    if (T < 0 || B < 0 || H < 0 || fastln_rnn_layout_for(&L, cell, T, B, H)) return -1;
    return (L.split ? 2 : 1) * T * B * L.G + B * (L.gw + 2 * L.G);
}
