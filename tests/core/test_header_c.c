/* A C99 caller of flatmem: includes the public header, links the library and
 * calls it, as a C program would (no C++ anywhere in this translation unit).
 * Built with -std=c99 -pedantic -Werror; exits 0 on success. */
#include <flatmem/flatmem.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

int main(void) {
  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  flatmem_contrastive_t *handle = NULL;
  /* Two unit rows, d = 2: q = k = identity, s = 3. Then every row and
   * column LSE is log(e^3 + 1) and L = log(1 + e^-3). */
  float q[4] = {1.0f, 0.0f, 0.0f, 1.0f};
  float k[4] = {1.0f, 0.0f, 0.0f, 1.0f};
  float scale = 3.0f, loss = -1.0f, row_lse[2] = {0}, col_lse[2] = {0}, ds = 0.0f;
  int64_t shape[2] = {2, 2};
  int64_t vector_shape[1] = {2};
  DLTensor tq, tk, ts, tloss, trow, tcol, tds;
  size_t bytes = 0;

  EXPECT(flatmem_version() == FLATMEM_VERSION);
  {
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", FLATMEM_VERSION_MAJOR, FLATMEM_VERSION_MINOR,
             FLATMEM_VERSION_PATCH);
    EXPECT(strcmp(flatmem_version_string(), expected) == 0);
  }
  EXPECT(strcmp(flatmem_status_string(FLATMEM_STATUS_SUCCESS), "FLATMEM_STATUS_SUCCESS") == 0);

  memset(&tq, 0, sizeof tq);
  tq.data = q;
  tq.device.device_type = kDLCPU;
  tq.ndim = 2;
  tq.dtype.code = kDLFloat;
  tq.dtype.bits = 32;
  tq.dtype.lanes = 1;
  tq.shape = shape;
  tk = tq;
  tk.data = k;
  ts = tq;
  ts.data = &scale;
  ts.ndim = 0;
  ts.shape = NULL;
  tloss = ts;
  tloss.data = &loss;
  tds = ts;
  tds.data = &ds;
  trow = tq;
  trow.ndim = 1;
  trow.shape = vector_shape;
  trow.data = row_lse;
  tcol = trow;
  tcol.data = col_lse;

  options.num_threads = 1;
  EXPECT(flatmem_contrastive_create(&handle, &options) == FLATMEM_STATUS_SUCCESS);
  EXPECT(handle != NULL);
  EXPECT(flatmem_contrastive_forward_workspace_size(handle, &tq, &tk, &bytes) == FLATMEM_STATUS_SUCCESS);
  EXPECT(bytes > 0);
  EXPECT(flatmem_contrastive_forward(handle, &tq, &tk, NULL, &ts, &tloss, &trow, &tcol, NULL, 0, NULL) ==
         FLATMEM_STATUS_SUCCESS);
  EXPECT(strcmp(flatmem_last_error(), "") == 0);
  EXPECT(fabs(loss - log1p(exp(-3.0))) < 1e-6);
  EXPECT(fabs(row_lse[1] - log(exp(3.0) + 1.0)) < 1e-5);
  EXPECT(flatmem_contrastive_backward(handle, &tq, &tk, NULL, &ts, &trow, &tcol, NULL, NULL, NULL, &tds,
                                      NULL, 0, NULL) == FLATMEM_STATUS_SUCCESS);
  EXPECT(fabs(ds - (-1.0 / (1.0 + exp(3.0)))) < 1e-6);

  /* An error is a status plus a message, never a crash. */
  EXPECT(flatmem_contrastive_forward(handle, NULL, &tk, NULL, &ts, &tloss, &trow, &tcol, NULL, 0, NULL) ==
         FLATMEM_STATUS_INVALID_ARGUMENT);
  EXPECT(strstr(flatmem_last_error(), "q") != NULL);

  EXPECT(flatmem_contrastive_destroy(handle) == FLATMEM_STATUS_SUCCESS);
  EXPECT(flatmem_contrastive_destroy(NULL) == FLATMEM_STATUS_SUCCESS);
  if (failures == 0) printf("C99 caller: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
