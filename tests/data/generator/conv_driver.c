#include "ggml-impl.h"
#include <stdio.h>
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb"); long n = atol(argv[2]); float *x = malloc(n*4); fread(x, 4, n, f); fclose(f);
  uint16_t *h = malloc(n*2), *b = malloc(n*2);
  for (long i = 0; i < n; i++) { h[i] = ggml_compute_fp32_to_fp16(x[i]); b[i] = ggml_compute_fp32_to_bf16(x[i]).bits; }
  f = fopen("f16.bin", "wb"); fwrite(h, 2, n, f); fclose(f);
  f = fopen("bf16.bin", "wb"); fwrite(b, 2, n, f); fclose(f);
}
