/*
 * One time step of a stack of recurrent layers for a batch of streams
 * (fastln_rnn_step_*): the layers' forwards at T = 1, one after another, in
 * one call. The streams' states are rows of state tables; the step gathers
 * the rows it names, runs the layers and scatters the new states back only
 * when every layer succeeded, so that a failed step leaves the tables as
 * they were. The engine's rows do not depend on the other rows of the batch,
 * so a stream's results are those of the stream alone.
 */
#include <stdlib.h>
#include <string.h>
#include "api/internal.h"
#include "rnn/rnn.h"

/* Whether s is a valid step: every layer is valid for a forward at T = 1,
 * with the same cell, H and projection; layer 0 reads I0 = layers[0].input,
 * layer k > 0 layer k-1's output (P features with a projection, else H);
 * every row is inside the table. */
static int step_args_ok(const fastln_rnn_step_args *s)
{
    if (!s || !s->layers || s->num_layers < 1 || s->batch < 1 || !s->x || !s->y || !s->h)
        return 0;
    if (s->rows ? s->table_rows < 1 || s->h_in || s->c_in : s->table_rows != s->batch)
        return 0;
    const int64_t H = s->layers[0].hidden, P = s->layers[0].proj;
    const int cell0 = s->layers[0].cell;
    for (int64_t k = 0; k < s->num_layers; k++) {
        const fastln_rnn_args *a = &s->layers[k];
        fastln_rnn_layout L;
        if (a->cell != cell0 || a->hidden != H || a->proj != P || a->input < 1 ||
            (k > 0 && a->input != (P ? P : H)) || fastln_rnn_layout_for(&L, a->cell, 1, 1, H))
            return 0;
        if (L.cell == FASTLN_CELL_LSTM && !s->c) return 0;
    }
    if (s->rows)
        for (int64_t b = 0; b < s->batch; b++)
            if (s->rows[b] < 0 || s->rows[b] >= s->table_rows) return 0;
    return 1;
}

/* dst rows (n, H) = src rows idx[0..n) (gather), or the other way (back). */
static void move_rows(char *dst, char *src, const int64_t *idx, int64_t n, size_t row, int back)
{
    for (int64_t b = 0; b < n; b++) {
        if (back) memcpy(src + (size_t)idx[b] * row, dst + (size_t)b * row, row);
        else memcpy(dst + (size_t)b * row, src + (size_t)idx[b] * row, row);
    }
}

static int step(const fastln_rnn_step_args *s, int f32)
{
    if (!step_args_ok(s)) return FASTLN_EINVAL;
    const int64_t B = s->batch, nl = s->num_layers, H = s->layers[0].hidden, S = s->table_rows;
    const int64_t W = s->layers[0].proj ? s->layers[0].proj : H;   /* h's and y's width */
    const size_t es = f32 ? sizeof(float) : sizeof(double);
    const size_t row = (size_t)W * es, crow = (size_t)H * es;   /* of h, of c */
    const size_t layer_table = (size_t)S * row, layer_batch = (size_t)B * row;
    const size_t c_table = (size_t)S * crow, c_batch = (size_t)B * crow;
    fastln_rnn_layout L;
    fastln_rnn_layout_for(&L, s->layers[0].cell, 1, 1, H);   /* checked: a valid cell */
    int cell = L.cell == FASTLN_CELL_LSTM;
    /* the gathered states (rows only: nl * B rows of h, and of c) and two
     * outputs of the layers below the top, in turn */
    size_t nstate = s->rows ? (size_t)nl * (layer_batch + (cell ? c_batch : 0)) : 0;
    size_t nmid = nl > 1 ? 2 * layer_batch : 0;
    char *raw = nstate + nmid ? (char *)malloc(nstate + nmid + 64) : NULL;
    if (nstate + nmid && !raw) return FASTLN_ENOMEM;
    char *buf = raw ? (char *)fastln_align64(raw) : NULL;
    char *hs = buf, *cs = NULL, *mid = NULL;
    if (buf) {
        if (cell && s->rows) cs = buf + (size_t)nl * layer_batch;
        mid = buf + nstate;
    }
    char *h = (char *)s->h, *c = (char *)s->c;
    for (int64_t k = 0; k < nl; k++) {
        if (s->rows) {
            move_rows(hs + k * layer_batch, h + k * layer_table, s->rows, B, row, 0);
            if (cell) move_rows(cs + k * c_batch, c + k * c_table, s->rows, B, crow, 0);
        } else {
            if (s->h_in && s->h_in != s->h)
                memcpy(h + k * layer_table, (const char *)s->h_in + k * layer_batch, layer_batch);
            if (cell && s->c_in && s->c_in != s->c)
                memcpy(c + k * c_table, (const char *)s->c_in + k * c_batch, c_batch);
        }
    }
    int rc = FASTLN_OK;
    const void *x = s->x;
    for (int64_t k = 0; k < nl && rc == FASTLN_OK; k++) {
        fastln_rnn_args a = s->layers[k];
        a.steps = 1;
        a.batch = B;
        a.x = x;
        a.y = k == nl - 1 ? s->y : mid + (size_t)(k % 2) * layer_batch;
        a.h = s->rows ? hs + k * layer_batch : h + k * layer_table;
        a.c = !cell ? NULL : s->rows ? cs + k * c_batch : c + k * c_table;
        a.lengths = NULL;
        a.cache = NULL;
        a.interrupt = NULL;
        a.reverse = 0;
        a.ldy = 0;
        rc = f32 ? fastln_rnn_forward_f32(&a) : fastln_rnn_forward_f64(&a);
        x = a.y;
    }
    if (rc == FASTLN_OK && s->rows) {
        for (int64_t k = 0; k < nl; k++) {
            move_rows(hs + k * layer_batch, h + k * layer_table, s->rows, B, row, 1);
            if (cell) move_rows(cs + k * c_batch, c + k * c_table, s->rows, B, crow, 1);
        }
    }
    free(raw);
    return rc;
}

int fastln_rnn_step_f32(const fastln_rnn_step_args *s) { return step(s, 1); }
int fastln_rnn_step_f64(const fastln_rnn_step_args *s) { return step(s, 0); }
