/* A stand-in for flatmem.h, small enough to mutate: tests/abi/gate/check-gate.sh applies each kind of
 * ABI change to a scratch copy of this header and standin.c and asserts that scripts/check-abi.sh
 * rejects the incompatible ones and accepts the rest. Its shapes are flatmem's: opaque handles, an
 * options struct that begins with struct_size, a reserved field, a frozen callback struct, an enum. */
#ifndef STANDIN_H
#define STANDIN_H
#include <stddef.h>
#include <stdint.h>

typedef struct standin_thing_s standin_thing_t;
typedef struct standin_comm_s standin_comm_t;

typedef enum standin_status {
  STANDIN_OK = 0,
  STANDIN_BAD = 1,
  STANDIN_STATUS_MAX = 0x7fffffff
} standin_status;

typedef struct standin_options {
  size_t struct_size;
  int64_t count;
  int64_t limit;
  double scale;
  const int64_t *sizes;
  int32_t mode;
  int32_t reserved0;
} standin_options;

typedef struct standin_callback {
  void (*call)(void *user);
  void *user;
} standin_callback;

standin_status standin_create(standin_thing_t **out, const standin_options *options);
standin_status standin_destroy(standin_thing_t *thing);
standin_status standin_attach(standin_thing_t *thing, standin_comm_t *comm);
standin_status standin_run(standin_thing_t *thing, const standin_callback *callback);
#endif
