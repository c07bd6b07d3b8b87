// The check scripts/wheelhouse runs on our CPU flash-attention kernel (llama.cpp-cpu-fa-decode.patch)
// before it builds a wheel, compiled with ggml under AddressSanitizer: a row's output has the
// same bits whatever pass it is in (alone; any row of a drafted pass of 4 or 9; first of two
// sequences) and whatever the thread count, for views of the cache under and past the 512 cells
// where upstream splits a lone row's keys, two head sizes and two GQA groupings; and the
// kernel's scratch stays in bounds (ASan stops the run otherwise). An upgrade of llama.cpp that
// breaks the patch's promise stops the wheel build here rather than ship.
//
//     cc fa-decode-check.c -Iggml/include <ggml's static libraries> -fsanitize=address
//     ./a.out   (exit 0: every case held; 1: the first that did not is printed)

#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shape {
    int64_t head_dim, heads, kv_heads, view, visible;
};

static uint64_t rng_state = 20261207;

static float noise(void) {  // xorshift: the same data on every machine
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 11) % 2000001) / 1000000.0f - 1.0f;
}

// flash_attn_ext as llama.cpp calls it (F32 q, F16 K/V and mask, F32 precision) on `rows` query
// rows of each of `streams` sequences; row r of stream s sees visible + r cells. q/k/v are pools
// laid out so that a row's data does not depend on rows/streams. Returns the output (malloc'd).
static float * attend(const struct shape * s, int rows, int streams, int threads, const float * q, const float * k,
                      const float * v, int max_rows) {
    struct ggml_init_params params = { 256u << 20, NULL, false };
    struct ggml_context *   ctx    = ggml_init(params);
    struct ggml_tensor *    tq     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, s->head_dim, rows, s->heads, streams);
    struct ggml_tensor *    tk = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, s->head_dim, s->view, s->kv_heads, streams);
    struct ggml_tensor *    tv = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, s->head_dim, s->view, s->kv_heads, streams);
    struct ggml_tensor *    tm = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, s->view, rows, 1, streams);
    float *                 qd = tq->data;
    for (int st = 0; st < streams; st++) {
        for (int64_t h = 0; h < s->heads; h++) {
            for (int r = 0; r < rows; r++) {
                const float * from = q + ((st * s->heads + h) * max_rows + r) * s->head_dim;
                memcpy(qd + ((st * s->heads + h) * rows + r) * s->head_dim, from, s->head_dim * sizeof(float));
            }
        }
    }
    const int64_t kv_n = s->head_dim * s->view * s->kv_heads * streams;
    ggml_fp32_to_fp16_row(k, tk->data, kv_n);
    ggml_fp32_to_fp16_row(v, tv->data, kv_n);
    ggml_fp16_t * m = tm->data;
    for (int st = 0; st < streams; st++) {
        for (int r = 0; r < rows; r++) {
            for (int64_t c = 0; c < s->view; c++) {
                m[(st * rows + r) * s->view + c] = ggml_fp32_to_fp16(c < s->visible + r ? 0.0f : -INFINITY);
            }
        }
    }
    struct ggml_tensor * out = ggml_flash_attn_ext(ctx, tq, tk, tv, tm, 1.0f / sqrtf((float) s->head_dim), 0.0f, 0.0f);
    ggml_prec_set_acc(out, GGML_PREC_F32);
    struct ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    if (ggml_graph_compute_with_ctx(ctx, graph, threads) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "fa-decode-check: the graph did not compute\n");
        exit(1);
    }
    float * result = malloc(ggml_nbytes(out));
    memcpy(result, out->data, ggml_nbytes(out));
    ggml_free(ctx);
    return result;
}

// output of (row, stream): [head_dim, heads, rows, streams], the heads of a row side by side
static const float * row_of(const float * out, const struct shape * s, int rows, int row, int stream) {
    return out + ((int64_t) stream * rows + row) * s->heads * s->head_dim;
}

static int same(const float * a, const float * b, const struct shape * s) {
    return memcmp(a, b, s->heads * s->head_dim * sizeof(float)) == 0;
}

int main(void) {
    ggml_cpu_init();
    const struct shape shapes[] = {
        { 64, 6, 2, 256, 200 },     // the embedded model's heads, a short cache
        { 64, 6, 2, 768, 600 },     // past the 512 cells
        { 128, 8, 8, 1024, 1000 },  // no GQA, a longer head
        { 128, 32, 8, 640, 513 },   // GQA by 4
    };
    const int max_rows = 9;
    int       cases    = 0;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        const struct shape * s = &shapes[i];
        const int64_t q_n  = s->head_dim * s->heads * max_rows * 2;
        const int64_t kv_n = s->head_dim * s->view * s->kv_heads * 2;
        float *       q    = malloc(q_n * sizeof(float));
        float *       k    = malloc(kv_n * sizeof(float));
        float *       v    = malloc(kv_n * sizeof(float));
        for (int64_t j = 0; j < q_n; j++) q[j] = noise();
        for (int64_t j = 0; j < kv_n; j++) k[j] = noise();
        for (int64_t j = 0; j < kv_n; j++) v[j] = noise();
        float * alone1 = attend(s, 1, 1, 1, q, k, v, max_rows);
        for (int threads = 1; threads <= 4; threads *= 2) {
            float * alone   = attend(s, 1, 1, threads, q, k, v, max_rows);
            float * batched = attend(s, 1, 2, threads, q, k, v, max_rows);
            const int drafts[] = { 4, max_rows };
            int ok = same(alone, alone1, s) && same(row_of(batched, s, 1, 0, 0), alone, s);
            for (int d = 0; ok && d < 2; d++) {
                float * drafted = attend(s, drafts[d], 1, threads, q, k, v, max_rows);
                ok              = same(row_of(drafted, s, drafts[d], 0, 0), alone, s);
                free(drafted);
            }
            cases++;
            if (!ok) {
                fprintf(stderr,
                        "fa-decode-check: a row's bits depend on its pass (head_dim %lld, %lld/%lld heads, view %lld, "
                        "%d threads)\n",
                        (long long) s->head_dim, (long long) s->heads, (long long) s->kv_heads, (long long) s->view,
                        threads);
                return 1;
            }
            free(alone);
            free(batched);
        }
        free(alone1);
        free(q);
        free(k);
        free(v);
    }
    printf("fa-decode-check: %d cases, every row the same bits in every pass\n", cases);
    return 0;
}
