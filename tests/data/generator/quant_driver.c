#include <string.h>
// test-vector generator: runs ggml's reference quantizers/dequantizers on inputs from a file
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stddef.h>
#include "ggml-common.h"
#include "ggml-quants.h"
void ggml_abort(const char *f, int l, const char *fmt, ...) { fprintf(stderr, "abort %s:%d\n", f, l); exit(1); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { abort(); }
const char *ggml_type_name(enum ggml_type t) { abort(); }
size_t ggml_type_size(enum ggml_type t) { abort(); }
typedef void (*qf)(const float *, void *, int64_t);
typedef void (*df)(const void *, float *, int64_t);
int main(int argc, char **argv) {
    // argv: in.f32 n type out.bin out.f32
    FILE *f = fopen(argv[1], "rb"); int64_t n = atoll(argv[2]);
    float *x = malloc(n * 4); fread(x, 4, n, f); fclose(f);
    const char *t = argv[3]; qf q; df d; size_t bs, ts;
#define T(name, blk, QK) if (!strcmp(t, #name)) { q = (qf)quantize_row_##name##_ref; d = (df)dequantize_row_##name; bs = sizeof(blk); ts = QK; }
    T(q4_0, block_q4_0, QK4_0) T(q4_1, block_q4_1, QK4_1) T(q5_0, block_q5_0, QK5_0)
    T(q5_1, block_q5_1, QK5_1) T(q8_0, block_q8_0, QK8_0) T(q4_K, block_q4_K, QK_K)
    T(q5_K, block_q5_K, QK_K) T(q6_K, block_q6_K, QK_K)
    size_t nb = n / ts; void *y = malloc(nb * bs); float *z = malloc(n * 4);
    q(x, y, n); d(y, z, n);
    f = fopen(argv[4], "wb"); fwrite(y, bs, nb, f); fclose(f);
    f = fopen(argv[5], "wb"); fwrite(z, 4, n, f); fclose(f);
    return 0;
}
