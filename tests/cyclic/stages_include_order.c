/* <flatmem/cyclic.h> included first, then <flatmem/cyclic_stages.h>: the stage
 * API must be complete (flatmem.h's own include of cyclic_stages.h ran while
 * cyclic.h was half read and left the body out). Compiled, not linked. */
#include <flatmem/cyclic.h>
#include <flatmem/cyclic_stages.h>

int stages_of(void) {
  flatmem_cyclic_stages_options o = FLATMEM_CYCLIC_STAGES_OPTIONS_INIT;
  flatmem_cyclic_stages_schedule s = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
  return (int)o.stages + (int)s.stages;
}
