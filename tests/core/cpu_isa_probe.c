/* cpu_isa_probe: what a fresh process makes of its FLATMEM_CPU_ISA, as one
 * line of key=value words for tests/core/test_cpu_isa.cpp:
 *   get=<status> in_use=<name> best=<name> contrastive_create=<status>
 *   block_create=<status>
 * then, on the next line, the last error text of the first call that failed
 * (or "-"). The variable is read once per process, so each setting needs a
 * process of its own. */
#include <flatmem/flatmem.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_DEFAULT, best = FLATMEM_CPU_ISA_DEFAULT;
  char first_error[1024] = "-";
  flatmem_status get, create, block;
  flatmem_contrastive_t *handle = NULL;
  flatmem_block_t *mlp = NULL;
  flatmem_block_options block_options = FLATMEM_BLOCK_OPTIONS_INIT;

  get = flatmem_cpu_isa_get(&in_use, &best);
  if (get != FLATMEM_STATUS_SUCCESS) snprintf(first_error, sizeof first_error, "%s", flatmem_last_error());
  create = flatmem_contrastive_create(&handle, NULL);
  if (create != FLATMEM_STATUS_SUCCESS && strcmp(first_error, "-") == 0)
    snprintf(first_error, sizeof first_error, "%s", flatmem_last_error());
  block_options.kind = FLATMEM_BLOCK_MLP;
  block_options.width = 4;
  block = flatmem_block_create(&mlp, &block_options);
  if (block != FLATMEM_STATUS_SUCCESS && strcmp(first_error, "-") == 0)
    snprintf(first_error, sizeof first_error, "%s", flatmem_last_error());

  printf("get=%s in_use=%s best=%s contrastive_create=%s block_create=%s\n%s\n", flatmem_status_string(get),
         flatmem_cpu_isa_name(in_use), flatmem_cpu_isa_name(best), flatmem_status_string(create),
         flatmem_status_string(block), first_error);
  flatmem_block_destroy(mlp);
  flatmem_contrastive_destroy(handle);
  return 0;
}
