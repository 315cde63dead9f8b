/* The stand-in library of tests/abi/gate/standin.h. The bodies do nothing (only the ABI matters) and
 * the signatures are spelled as in the header, so that one edit changes both. */
#include "standin.h"

struct standin_thing_s {
  int x;
};
struct standin_comm_s {
  double y;
};

standin_status standin_create(standin_thing_t **out, const standin_options *options) { return STANDIN_OK; }
standin_status standin_destroy(standin_thing_t *thing) { return STANDIN_OK; }
standin_status standin_attach(standin_thing_t *thing, standin_comm_t *comm) { return STANDIN_OK; }
standin_status standin_run(standin_thing_t *thing, const standin_callback *callback) { return STANDIN_OK; }
