/* isa_run ISA PROGRAM [ARGS...]: runs PROGRAM with FLATMEM_CPU_ISA=ISA
 * (avx512bf16 | avx512 | avx2 | baseline), or exits 77 -- CTest's skip code
 * for the per-ISA runs (label isa) -- when this processor lacks ISA, so that
 * one registration serves every x86-64 machine: an AVX512_BF16 CI machine
 * runs the numeric suites four times, an AVX-512 one without BF16 three
 * times, an AVX2-only one twice.
 * Exit status: PROGRAM's, 77 (skipped), or 2 (bad usage / exec failure). */
#define _POSIX_C_SOURCE 200809L
#include <flatmem/flatmem.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse(const char *name, flatmem_cpu_isa *isa) {
  const flatmem_cpu_isa all[] = {FLATMEM_CPU_ISA_BASELINE, FLATMEM_CPU_ISA_AVX2, FLATMEM_CPU_ISA_AVX512,
                                 FLATMEM_CPU_ISA_AVX512BF16};
  size_t i;
  for (i = 0; i < sizeof all / sizeof all[0]; ++i) {
    if (strcmp(name, flatmem_cpu_isa_name(all[i])) == 0) {
      *isa = all[i];
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  flatmem_cpu_isa wanted, best;
  if (argc < 3 || !parse(argv[1], &wanted)) {
    fprintf(stderr, "usage: isa_run avx512bf16|avx512|avx2|baseline PROGRAM [ARGS...]\n");
    return 2;
  }
  /* What the processor has, whatever the caller's environment asks for. */
  unsetenv("FLATMEM_CPU_ISA");
  if (flatmem_cpu_isa_get(NULL, &best) != FLATMEM_STATUS_SUCCESS) {
    fprintf(stderr, "isa_run: flatmem_cpu_isa_get: %s\n", flatmem_last_error());
    return 2;
  }
  if ((int)wanted > (int)best) {
    printf("skipped: this processor runs at most %s, not %s\n", flatmem_cpu_isa_name(best), argv[1]);
    return 77;
  }
  setenv("FLATMEM_CPU_ISA", argv[1], 1);
  execv(argv[2], argv + 2);
  perror("isa_run: execv");
  return 2;
}
