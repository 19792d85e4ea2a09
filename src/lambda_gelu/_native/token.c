/* A whole token of a decoder in one call (lambda_gelu.inference.token_step): every layer's attention (decode.c) and
 * sparse gated FFN (gated.c) and the final norm in one parallel region, the team's threads meeting at barriers between
 * the steps instead of a parallel region, a Python call and a few torch calls for each — at batch 1 on a small model,
 * as much time as reading the weights. Its reference is the same decoder's layer-by-layer path. Greedy decoding
 * takes the token's embedding and the output layer's screen into the same call (lg_decode_next). */
#include "token.h"

/* A layer: its attention, its rotary tables (positions × rotary_dim), its sliding window (0: none), its FFN. */
struct lg_layer {
    struct lg_attention attention;
    const float *cos, *sin;
    int64_t window;
    struct lg_ffn ffn;
};

/* The sizes of the structs the Python side mirrors, for it to check its own against. */
void lg_token_sizes(int64_t *sizes) {
    sizes[0] = sizeof(struct lg_attention), sizes[1] = sizeof(struct lg_ffn), sizes[2] = sizeof(struct lg_layer);
    sizes[3] = offsetof(struct lg_layer, ffn), sizes[4] = offsetof(struct lg_ffn, ff);
    sizes[5] = sizeof(struct lg_head);
}

/* The `rows` tokens at positions pos..pos + rows − 1 through the n layers, in place on their hidden states h (rows,
 * d), writing their keys and values into each layer's caches (k_caches[i], v_caches[i]: (kv_heads, length, head_dim);
 * a layer that shares an earlier layer's is given that layer's), then out = rms_norm(h's last row)·final_w
 * (final_eps, final_plus_one). Layer by layer: each row's attention in turn (a row's reads its own keys and values and
 * those before it), then each row's FFN: what the rows one call each would compute, the same functions in the same
 * order for each row, while a layer's weights, read again for each row, come from the cache. (Through the torch path
 * with C's FFN and int8 products, a 15-token prompt spent 13 of 57 ms in some hundred small torch operations a layer,
 * and its batched int8 products ran at a quarter of the vector unit's multiply-add rate, the decoding step's at two
 * fifths.) Each layer's FFN writes its output's width d; a layer with a window
 * reads its caches from the window's first position. Returns 0, or −1 if buffers could not be allocated (h, the
 * caches and out unchanged). */
int lg_decode_tokens(float *h, int64_t rows, const struct lg_layer *layers, int64_t n, float *const *k_caches,
                     float *const *v_caches, int64_t length, int64_t pos, int64_t d, const float *final_w,
                     double final_eps, int final_plus_one, float *out, int max_threads) {
    int nt = max_threads > 1 ? max_threads : 1;
    struct lg_attention widest = {0};  /* the scratch is sized for the largest layer */
    widest.kv_heads = 1;
    int64_t ff = 1;
    for (int64_t i = 0; i < n; i++) {
        const struct lg_attention *a = &layers[i].attention;
        widest.heads = a->heads > widest.heads ? a->heads : widest.heads;
        widest.head_dim = a->head_dim > widest.head_dim ? a->head_dim : widest.head_dim;
        widest.kv_heads = a->kv_heads > widest.kv_heads ? a->kv_heads : widest.kv_heads;
        ff = layers[i].ffn.ff > ff ? layers[i].ffn.ff : ff;
    }
    struct lg_attention_scratch as;
    struct lg_ffn_scratch fs;
    if (rows < 1 || lg_attention_scratch(&widest, d, pos + rows - 1, nt, &as) != 0)
        return -1;
    if (lg_ffn_scratch(d, ff, d, nt, &fs) != 0) {
        lg_attention_scratch_free(&as);
        return -1;
    }
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        for (int64_t i = 0; i < n; i++) {
            const struct lg_layer *layer = &layers[i];
            int64_t window = layer->window, rotary = layer->attention.rotary_dim, head_dim = layer->attention.head_dim;
            for (int64_t r = 0; r < rows; r++) {
                int64_t at = pos + r, first = window > 0 && at + 1 > window ? at + 1 - window : 0;  /* window's first */
                lg_attention_team(&layer->attention, h + r * d, layer->cos + at * rotary, layer->sin + at * rotary,
                                  k_caches[i] + first * head_dim, v_caches[i] + first * head_dim, at - first, length,
                                  d, &as);
            }
            for (int64_t r = 0; r < rows; r++)
                lg_ffn_team(&layer->ffn, h + r * d, 1, d, &fs);
        }
        #pragma omp single
        lg_rms_norm_f32(h + (rows - 1) * d, final_w, out, d, final_eps, final_plus_one);
    }
    lg_attention_scratch_free(&as);
    lg_ffn_scratch_free(&fs);
    return 0;
}

/* A greedy decoder's step whole, for the Python loop to do nothing between tokens but call it (between two calls that
 * stream the weights through the caches, every torch operation ran ten times slower than alone, and a token's few
 * dozen of them cost 0.4 ms): h = embed's row `id` times embed_scale (embed NULL: h as given), the token through the
 * layers (lg_decode_tokens, the final hidden state into out), then the next token by the output layer's screen
 * (lg_screened_argmax_f32, *n_read the rows it read in float32). Returns that token, −1 if buffers could not be
 * allocated, or −2 if the screen cannot decide it (out holds the final hidden state, for the caller to compute every
 * logit). */
int64_t lg_decode_next(int64_t id, const float *embed, double embed_scale, float *h, const struct lg_layer *layers,
                       int64_t n, float *const *k_caches, float *const *v_caches, int64_t length, int64_t pos,
                       int64_t d, const float *final_w, double final_eps, int final_plus_one, float *out,
                       int max_threads, const struct lg_head *head, int64_t *n_read) {
    if (embed)
        for (int64_t j = 0; j < d; j++)
            h[j] = embed[id * d + j] * (float)embed_scale;  /* as torch multiplies float32 by a Python float */
    if (lg_decode_tokens(h, 1, layers, n, k_caches, v_caches, length, pos, d, final_w, final_eps, final_plus_one, out,
                         max_threads) != 0)
        return -1;
    return lg_screened_argmax_f32(out, head->w, head->b, head->q, head->s, head->r, head->nq, head->rows, d,
                                  max_threads, head->grain, n_read);
}
