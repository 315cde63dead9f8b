/* flatmem.i -- the SWIG interface of flatmem's C ABI (include/flatmem/flatmem.h).
 *
 * One interface for every SWIG target language; the Python package
 * (bindings/python) and the Java proof (scripts/check-java.sh) are generated
 * from this file. Language-specific parts sit under #ifdef SWIGPYTHON /
 * #ifdef SWIGJAVA; everything else is plain SWIG.
 *
 * What the target language sees (flatmem_ / FLATMEM_ prefixes stripped):
 *   version(), version_string(), last_error(), status_string(int)
 *   VERSION, VERSION_MAJOR/MINOR/PATCH      the header this wrapper was built from
 *   ABI_VERSION, MAX_STRUCT_SIZE            its ABI (libflatmem.so.ABI_VERSION) and size limit
 *   STATUS_*, NONFINITE_*, CONTRASTIVE_*     enum values
 *   CPU_ISA_*, cpu_isa_in_use(), cpu_isa_best(), cpu_isa_set(isa), cpu_isa_name(isa),
 *   cpu_isa_engine(isa)  the CPU instruction set (flatmem_cpu_isa_get / _set / _name / _engine;
 *                        Java: the CpuIsa enum), see "CPU instruction set" below
 *   REVERSIBLE_*, BLOCK_ATTENTION/MLP, BLOCK_MATH_FP32/TF32   reversible.h's enum values
 *   kDLCPU, kDLCUDA, kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex   DLPack codes
 *   ContrastiveOptions   flatmem_contrastive_options, initialised to the defaults (every
 *                        field but struct_size and comm settable, logit_cache_bytes included)
 *   Contrastive          flatmem_contrastive_t: constructor = *_create, destructor = *_destroy,
 *                        forward/backward and the two workspace queries as methods;
 *                        sigmoid_forward / sigmoid_value_and_grad / sigmoid_backward /
 *                        sigmoid_workspace_size for a CONTRASTIVE_SIGMOID handle
 *   Tensor               a DLTensor together with the shape and strides it points to
 *   CyclicSchedule       flatmem_cyclic_schedule: offset(), delay(), length(), action() (pure)
 *   CyclicAction         flatmem_cyclic_action, read-only; CYCLIC_* rules and action kinds
 *
 * Errors. Every status other than SUCCESS becomes an exception in the target
 * language whose message is "<status name>: <flatmem_last_error()>", e.g.
 * "FLATMEM_STATUS_INVALID_ARGUMENT: q: dtype float64 is not
 * accepted here; ...". The mechanism is one %exception block (below) around
 * every wrapped call: wrapped code records a failed status in a thread-local
 * slot with flatmem_swig_check(), and the block turns it into
 * SWIG_exception() (Java: IllegalArgumentException, OutOfMemoryError or
 * RuntimeException) or, for Python, into flatmem's own exception classes
 * (Error and its subclasses, which also derive from ValueError, MemoryError,
 * ... and carry .status).
 *
 * Struct sizes. Every struct the library fills (an init function's options,
 * an action, a schedule, a summary, an array of statistics) is passed with
 * sizeof it as this wrapper was compiled (arrays: the element's), as
 * flatmem.h's conventions ask; the target language never passes a size.
 *
 * Versions. Loading the module compares FLATMEM_VERSION (the header compiled
 * into this wrapper) with flatmem_version() (the library actually loaded) and
 * refuses a mismatch: Python raises ImportError, Java UnsatisfiedLinkError.
 *
 * Threads. Python releases the GIL around every wrapped call (threads="1");
 * the few calls that touch Python objects are marked %nothread. A handle is
 * still used by one thread at a time (the C thread rule): the Python package
 * holds a lock per handle.
 *
 * Reversible segments: Block (flatmem_block_t) and Reversible (a
 * flatmem_reversible_t plus what the binding keeps for it), with Python
 * functions as F/G through C trampolines; see "Reversible segments" below.
 *
 * Cyclic data parallelism (<flatmem/cyclic.h>): CyclicSchedule
 * (flatmem_cyclic_schedule) with the pure queries as methods, CyclicAction,
 * CYCLIC_* rules and action kinds; see "Cyclic schedule" below. The runtime
 * (Cyclic, CyclicTimeStepStats, CyclicSummary) is in comm.i.
 *
 * Communicators (<flatmem/comm.h>): comm.i -- UniqueId, Communicator,
 * CommRequest, CommLocalGroup, and Contrastive(options, comm) for the ring
 * loss. Timeouts and peer failures raise (Python) CommTimeoutError
 * (TimeoutError), PeerFailureError and CommPoisonedError (ConnectionError).
 *
 * Adding a handle kind: an empty struct
 * for SWIG, %extend it with a constructor calling *_create and a destructor
 * calling *_destroy, %ignore the raw functions, and let every method pass the
 * status of its C call to flatmem_swig_check(). Sizes and other results come
 * back as return values.
 */

#ifdef SWIGJAVA
%module Flatmem
#else
%module(package="flatmem", threads="1") capi
#endif

%{
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flatmem/flatmem.h>
%}

%include <exception.i>
%include <stdint.i>

/* ------------------------------------------------------------------------ */
/* Errors: a thread-local pending status + message, raised by %exception.    */
/* ------------------------------------------------------------------------ */

%{
#define FLATMEM_SWIG_MESSAGE_BYTES 2048

/* The calling thread's pending failure: set by flatmem_swig_check() or
 * flatmem_swig_fail() inside a wrapped call, consumed by %exception after it.
 * Thread-local because Python runs wrapped calls without the GIL. */
typedef struct flatmem_swig_pending {
  int status; /* a flatmem_status; 0 = nothing pending */
  char message[FLATMEM_SWIG_MESSAGE_BYTES];
} flatmem_swig_pending;
static _Thread_local flatmem_swig_pending flatmem_swig_error;

/* Records a failed C call: its status and flatmem_last_error(), copied now
 * (the library's pointer is only valid until the thread's next flatmem call).
 * Returns 1 when status is SUCCESS. */
static int flatmem_swig_check(flatmem_status status) {
  if (status == FLATMEM_STATUS_SUCCESS) return 1;
  if (flatmem_swig_error.status == 0) {
    flatmem_swig_error.status = (int)status;
    snprintf(flatmem_swig_error.message, sizeof flatmem_swig_error.message, "%s: %s",
             flatmem_status_string(status), flatmem_last_error());
  }
  return 0;
}

/* Records a failure found by the binding itself (bad helper argument). */
static void flatmem_swig_fail(flatmem_status status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void flatmem_swig_fail(flatmem_status status, const char *format, ...) {
  va_list args;
  int used;
  if (flatmem_swig_error.status != 0) return;
  flatmem_swig_error.status = (int)status;
  used = snprintf(flatmem_swig_error.message, sizeof flatmem_swig_error.message, "%s: ",
                  flatmem_status_string(status));
  va_start(args, format);
  vsnprintf(flatmem_swig_error.message + used, sizeof flatmem_swig_error.message - (size_t)used,
            format, args);
  va_end(args);
}

/* "" when the header this wrapper was compiled with matches the library that
 * was loaded, else the message explaining the mismatch. */
static const char *flatmem_swig_version_mismatch(void) {
  static char message[512];
  const int library = flatmem_version();
  if (library == FLATMEM_VERSION) return "";
  snprintf(message, sizeof message,
           "flatmem: this binding was built with flatmem.h %d.%d.%d (FLATMEM_VERSION %d) but the "
           "loaded libflatmem is %s (flatmem_version() = %d); rebuild the binding against the "
           "installed library, or load the library it was built for",
           FLATMEM_VERSION_MAJOR, FLATMEM_VERSION_MINOR, FLATMEM_VERSION_PATCH, FLATMEM_VERSION,
           flatmem_version_string(), library);
  return message;
}
%}

#ifdef SWIGPYTHON
/* Python: flatmem's exception classes, made when the module is imported.
 * Error(RuntimeError) is the base; each status has a subclass that also
 * derives from the closest built-in exception. Instances carry .status (int),
 * .status_name and .detail (flatmem_last_error() of the failed call). */
%{
typedef struct flatmem_swig_exception_kind {
  int status;
  const char *name;
  PyObject **builtin;
} flatmem_swig_exception_kind;

static PyObject *flatmem_swig_error_base = NULL;
static PyObject *flatmem_swig_error_classes[FLATMEM_STATUS_COMM_POISONED + 1];

static int flatmem_swig_make_exceptions(PyObject *module) {
  const flatmem_swig_exception_kind kinds[] = {
      {FLATMEM_STATUS_INVALID_ARGUMENT, "InvalidArgumentError", &PyExc_ValueError},
      {FLATMEM_STATUS_UNSUPPORTED, "UnsupportedError", &PyExc_NotImplementedError},
      {FLATMEM_STATUS_OUT_OF_MEMORY, "OutOfMemoryError", &PyExc_MemoryError},
      {FLATMEM_STATUS_WORKSPACE_TOO_SMALL, "WorkspaceTooSmallError", &PyExc_ValueError},
      {FLATMEM_STATUS_NON_FINITE, "NonFiniteError", &PyExc_FloatingPointError},
      {FLATMEM_STATUS_INTERNAL, "InternalError", NULL},
      {FLATMEM_STATUS_TIMEOUT, "CommTimeoutError", &PyExc_TimeoutError},
      {FLATMEM_STATUS_PEER_FAILURE, "PeerFailureError", &PyExc_ConnectionError},
      {FLATMEM_STATUS_COMM_POISONED, "CommPoisonedError", &PyExc_ConnectionError},
  };
  char qualified[128];
  size_t i;
  flatmem_swig_error_base = PyErr_NewExceptionWithDoc(
      "flatmem.Error",
      "A flatmem call failed. str(e) is '<status name>: <message>'; e.status is the "
      "flatmem_status value, e.status_name its name, e.detail flatmem_last_error().",
      PyExc_RuntimeError, NULL);
  if (!flatmem_swig_error_base) return -1;
  Py_INCREF(flatmem_swig_error_base);
  if (PyModule_AddObject(module, "Error", flatmem_swig_error_base) < 0) return -1;
  for (i = 0; i < sizeof kinds / sizeof kinds[0]; ++i) {
    PyObject *bases = kinds[i].builtin
                          ? PyTuple_Pack(2, flatmem_swig_error_base, *kinds[i].builtin)
                          : PyTuple_Pack(1, flatmem_swig_error_base);
    PyObject *cls;
    if (!bases) return -1;
    snprintf(qualified, sizeof qualified, "flatmem.%s", kinds[i].name);
    cls = PyErr_NewException(qualified, bases, NULL);
    Py_DECREF(bases);
    if (!cls) return -1;
    flatmem_swig_error_classes[kinds[i].status] = cls;
    Py_INCREF(cls);
    if (PyModule_AddObject(module, kinds[i].name, cls) < 0) return -1;
  }
  return 0;
}

/* A Python exception raised by a reversible segment's Python callback (see
 * "Reversible segments" below): moved here by the segment method, after its C
 * call failed, on the calling thread (ownership moves, no refcounting, so the
 * GIL is not needed for that), and raised by flatmem_swig_raise_python().
 * `same` is 1 when the library's message is the one made from this exception
 * (it was the failure that ended the call), 0 when another failure came first
 * (OVERLAPPED: both chains can fail). */
typedef struct flatmem_swig_python_exception {
  PyObject *type, *value, *traceback;
  int same;
} flatmem_swig_python_exception;
static _Thread_local flatmem_swig_python_exception flatmem_swig_callback_exception;

/* Re-raises the callback's own exception, with a note carrying flatmem's
 * message (which block, F or G, which phase). Returns 0 when it cannot (no
 * exception pending, another failure ended the call, or Python < 3.11 without
 * add_note): the caller then raises flatmem's error, chained to it. */
static int flatmem_swig_reraise_callback_exception(const char *detail) {
  flatmem_swig_python_exception *e = &flatmem_swig_callback_exception;
  PyObject *note, *done;
  if (!e->type || !e->same) return 0;
  PyErr_NormalizeException(&e->type, &e->value, &e->traceback);
  if (!e->value || !PyObject_HasAttrString(e->value, "add_note")) return 0;
  note = PyUnicode_FromFormat("flatmem: %s", detail);
  done = note ? PyObject_CallMethod(e->value, "add_note", "O", note) : NULL;
  Py_XDECREF(note);
  if (!done) {
    PyErr_Clear();
    return 0;
  }
  Py_DECREF(done);
  if (e->traceback) PyException_SetTraceback(e->value, e->traceback);
  PyErr_Restore(e->type, e->value, e->traceback);
  e->type = e->value = e->traceback = NULL;
  return 1;
}

/* Raises the pending failure as flatmem.<Kind>Error and clears it. */
static void flatmem_swig_raise_python(void) {
  const int status = flatmem_swig_error.status;
  PyObject *cls = (status > 0 && status <= FLATMEM_STATUS_COMM_POISONED &&
                   flatmem_swig_error_classes[status])
                      ? flatmem_swig_error_classes[status]
                      : flatmem_swig_error_base;
  const char *message = flatmem_swig_error.message;
  const char *colon = strstr(message, ": ");
  const char *status_name = flatmem_status_string((flatmem_status)status);
  PyObject *exc;
  PyObject *values[3] = {NULL, NULL, NULL};
  const char *const names[3] = {"status", "status_name", "detail"};
  int i, ok;
  flatmem_swig_error.status = 0;
  if (flatmem_swig_reraise_callback_exception(colon ? colon + 2 : message)) return;
  exc = PyObject_CallFunction(cls, "s", message);
  ok = exc != NULL;
  if (ok) {
    values[0] = PyLong_FromLong(status);
    values[1] = PyUnicode_FromString(status_name);
    values[2] = PyUnicode_FromString(colon ? colon + 2 : message);
  }
  for (i = 0; i < 3; ++i) ok = ok && values[i] && PyObject_SetAttrString(exc, names[i], values[i]) == 0;
  for (i = 0; i < 3; ++i) Py_XDECREF(values[i]);
  if (ok && flatmem_swig_callback_exception.type) {
    /* A callback's exception that is not re-raised as it is: flatmem's error
     * is raised from it (__cause__), so its traceback is not lost. */
    flatmem_swig_python_exception *e = &flatmem_swig_callback_exception;
    PyErr_NormalizeException(&e->type, &e->value, &e->traceback);
    if (e->value) {
      if (e->traceback) PyException_SetTraceback(e->value, e->traceback);
      PyException_SetCause(exc, e->value); /* steals the reference */
      e->value = NULL;
    }
  }
  Py_CLEAR(flatmem_swig_callback_exception.type);
  Py_CLEAR(flatmem_swig_callback_exception.value);
  Py_CLEAR(flatmem_swig_callback_exception.traceback);
  if (ok) PyErr_SetObject(cls, exc); /* else the error of the failed step stands */
  Py_XDECREF(exc);
}
%}

%exception {
  flatmem_swig_error.status = 0;
  $action
  if (flatmem_swig_error.status != 0) {
    flatmem_swig_raise_python();
    SWIG_fail;
  }
}

%init %{
  if (flatmem_swig_make_exceptions(m) < 0) return NULL;
  if (flatmem_swig_version_mismatch()[0] != '\0') {
    PyErr_SetString(PyExc_ImportError, flatmem_swig_version_mismatch());
    return NULL;
  }
%}

%pythoncode %{
Error = _capi.Error
InvalidArgumentError = _capi.InvalidArgumentError
UnsupportedError = _capi.UnsupportedError
OutOfMemoryError = _capi.OutOfMemoryError
WorkspaceTooSmallError = _capi.WorkspaceTooSmallError
NonFiniteError = _capi.NonFiniteError
InternalError = _capi.InternalError
CommTimeoutError = _capi.CommTimeoutError
PeerFailureError = _capi.PeerFailureError
CommPoisonedError = _capi.CommPoisonedError
%}

#else /* every other language: exception.i */

%{
/* The SWIG error class for a status (exception.i maps it per language). */
static int flatmem_swig_error_code(int status) {
  switch (status) {
    case FLATMEM_STATUS_INVALID_ARGUMENT:
    case FLATMEM_STATUS_WORKSPACE_TOO_SMALL:
    case FLATMEM_STATUS_NON_FINITE: return SWIG_ValueError;
    case FLATMEM_STATUS_OUT_OF_MEMORY: return SWIG_MemoryError;
    /* UNSUPPORTED, INTERNAL and the communicator statuses (TIMEOUT,
     * PEER_FAILURE, COMM_POISONED): the message names the status. */
    default: return SWIG_RuntimeError;
  }
}
%}

%exception {
  flatmem_swig_error.status = 0;
  $action
  if (flatmem_swig_error.status != 0) {
    const int flatmem_swig_status_ = flatmem_swig_error.status;
    flatmem_swig_error.status = 0;
    SWIG_exception(flatmem_swig_error_code(flatmem_swig_status_), flatmem_swig_error.message);
  }
}

#endif

#ifdef SWIGJAVA
/* Java: the JNI library is loaded by the JNI class; the version check runs
 * right after and refuses a mismatched library the way a missing one is. */
%pragma(java) jniclasscode=%{
  static {
    System.loadLibrary(System.getProperty("flatmem.jni.library", "flatmemjni"));
    String mismatch = version_mismatch();
    if (!mismatch.isEmpty()) throw new UnsatisfiedLinkError(mismatch);
  }
%}
/* Java errors: this %exception replaces the exception.i one above for Java.
 * A failed status is thrown as flatmem.FlatmemArgumentException (an
 * IllegalArgumentException: INVALID_ARGUMENT, WORKSPACE_TOO_SMALL,
 * NON_FINITE), java.lang.OutOfMemoryError (OUT_OF_MEMORY) or
 * flatmem.FlatmemException (a RuntimeException: UNSUPPORTED, INTERNAL and
 * the communicator's TIMEOUT, PEER_FAILURE, COMM_POISONED). Both flatmem
 * classes carry status() (a Status) and the message
 * "<status name>: <flatmem_last_error()>". They are hand-written classes of
 * the binding (bindings/java/flatmem/), compiled with the generated ones; the
 * package is the one scripts/check-java.sh passes to swig (-package flatmem). */
%{
/* A java.nio.ByteBuffer crossing the JNI (see Tensor.bytes below). */
typedef jobject flatmem_swig_byte_buffer;

static void flatmem_swig_throw_java(JNIEnv *jenv, int status, const char *message) {
  const int code = flatmem_swig_error_code(status);
  jclass cls;
  jmethodID init;
  jstring text;
  jobject error = NULL;
  if (code == SWIG_MemoryError) {
    SWIG_JavaThrowException(jenv, SWIG_JavaOutOfMemoryError, message);
    return;
  }
  cls = (*jenv)->FindClass(jenv, code == SWIG_ValueError ? "flatmem/FlatmemArgumentException"
                                                          : "flatmem/FlatmemException");
  init = cls ? (*jenv)->GetMethodID(jenv, cls, "<init>", "(ILjava/lang/String;)V") : NULL;
  text = init ? (*jenv)->NewStringUTF(jenv, message) : NULL;
  if (text) error = (*jenv)->NewObject(jenv, cls, init, (jint)status, text);
  if (error) {
    (*jenv)->Throw(jenv, (jthrowable)error);
    return;
  }
  /* the classes are missing (a build without bindings/java/flatmem): plain Java ones */
  (*jenv)->ExceptionClear(jenv);
  SWIG_JavaThrowException(jenv, code == SWIG_ValueError ? SWIG_JavaIllegalArgumentException
                                                        : SWIG_JavaRuntimeException, message);
}
%}
%exception {
  flatmem_swig_error.status = 0;
  $action
  if (flatmem_swig_error.status != 0) {
    const int flatmem_swig_status_ = flatmem_swig_error.status;
    flatmem_swig_error.status = 0;
    flatmem_swig_throw_java(jenv, flatmem_swig_status_, flatmem_swig_error.message);
    return $null;
  }
}
/* A java.nio.ByteBuffer as an argument or result (Tensor.wrap / bytes, below);
 * a JNIEnv * argument named jni_env is the wrapper's own. */
%typemap(in, numinputs=0) JNIEnv *jni_env "$1 = jenv;"
%typemap(jni) flatmem_swig_byte_buffer "jobject"
%typemap(jtype) flatmem_swig_byte_buffer "java.nio.ByteBuffer"
%typemap(jstype) flatmem_swig_byte_buffer "java.nio.ByteBuffer"
%typemap(in) flatmem_swig_byte_buffer "$1 = $input;"
%typemap(out) flatmem_swig_byte_buffer "$result = $1;"
%typemap(javain) flatmem_swig_byte_buffer "$javainput"
%typemap(javaout) flatmem_swig_byte_buffer { return $jnicall; }
%javamethodmodifiers flatmem_swig_tensor::byte_view "private";
/* Proper Java enums; options, handles and tensors are AutoCloseable (close() =
 * delete()); the overloads SWIG makes from default arguments in C++ are
 * written out here (this interface is wrapped as C). */
%include <enums.swg>
%typemap(javainterfaces) struct flatmem_contrastive_options "AutoCloseable"
%typemap(javacode) struct flatmem_contrastive_options %{
  @Override public void close() { delete(); }
%}
%javamethodmodifiers flatmem_contrastive_s::flatmem_contrastive_s "
  /**
   * flatmem_contrastive_create. options: null = the defaults. comm: null (this
   * process alone), or a Communicator whose ranks share one global batch -- the
   * ring loss (\"Ring across ranks\" in flatmem.h): rank r passes its rows q_r
   * (b_r x d) and its columns k_r (c_r x d), INFONCE labels (b_r,) int64 are
   * GLOBAL column indices, SYMMETRIC needs b_r = c_r. loss and dlogit_scale are
   * those of the whole batch (the same bits on every rank); row_lse / col_lse
   * are global log-sum-exps of this rank's rows / columns; dq and dk are this
   * rank's slices of the exact gradients of the GLOBAL mean loss -- nothing is
   * summed over ranks (a wrapper that averages gradients over N ranks passes
   * dloss = N). forward / backward are collective (every rank, same order,
   * same options and logit scale); transport failures throw FlatmemException.
   * CONTRASTIVE_SIGMOID: the sigmoid_* calls, collective alike -- labels GLOBAL
   * (none: global row g's positive is global column g), loss, dlogit_scale and
   * dlogit_bias those of the whole batch (the mean over the B global rows, the
   * same bits on every rank), the same logit bias and the same outputs
   * requested on every rank, workspace null.
   * The handle holds comm: comm.close() is refused until this handle is closed.
   * One thread at a time per handle and communicator.
   */
  public";
%typemap(javainterfaces) struct flatmem_contrastive_s "AutoCloseable"
%typemap(javacode) struct flatmem_contrastive_s %{
  @Override public void close() { delete(); }

  /** A handle with the default options. */
  public Contrastive() { this(null, (Communicator) null); }

  /** A handle of this process alone (no communicator). */
  public Contrastive(ContrastiveOptions options) { this(options, (Communicator) null); }

  /** The ring loss over comm's ranks with the default options (see
   *  Contrastive(ContrastiveOptions, Communicator)). */
  public Contrastive(Communicator comm) { this(null, comm); }

  /** forward() with the handle's own workspace, on the CPU. */
  public void forward(Tensor q, Tensor k, Tensor labels, Tensor logit_scale, Tensor loss,
                      Tensor row_lse, Tensor col_lse) {
    forward(q, k, labels, logit_scale, loss, row_lse, col_lse, null, 0);
  }

  /** backward() with the handle's own workspace, on the CPU. */
  public void backward(Tensor q, Tensor k, Tensor labels, Tensor logit_scale, Tensor row_lse,
                       Tensor col_lse, Tensor dloss, Tensor dq, Tensor dk, Tensor dlogit_scale) {
    backward(q, k, labels, logit_scale, row_lse, col_lse, dloss, dq, dk, dlogit_scale, null, 0);
  }

  /** sigmoid_forward() with the handle's own workspace, on the CPU: the
   *  SigLIP loss L = -(1/b) sum_ij log sigmoid(z_ij (s &lt;q_i, k_j&gt; + t))
   *  (z = +1 at (i, labels[i] or i), -1 elsewhere: the mean over the b rows
   *  of the sum over the c columns) of a handle made with loss
   *  CONTRASTIVE_SIGMOID. q (b, d), k (c, d) float32 / bfloat16 / float16;
   *  labels (b,) int64 in [0, c) or null (y_i = i, needs c &gt;= b);
   *  logit_scale s (finite, &gt; 0), logit_bias t (finite) and loss one
   *  float32 element each. */
  public void sigmoid_forward(Tensor q, Tensor k, Tensor labels, Tensor logit_scale, Tensor logit_bias,
                              Tensor loss) {
    sigmoid_forward(q, k, labels, logit_scale, logit_bias, loss, null, 0);
  }

  /** sigmoid_value_and_grad() with the handle's own workspace, on the CPU:
   *  the loss and any of dq (b, d), dk (c, d) (float32 or the input dtype),
   *  dlogit_scale = dL/ds, dlogit_bias = dL/dt (one float32 element each);
   *  null = not computed. */
  public void sigmoid_value_and_grad(Tensor q, Tensor k, Tensor labels, Tensor logit_scale,
                                     Tensor logit_bias, Tensor loss, Tensor dq, Tensor dk,
                                     Tensor dlogit_scale, Tensor dlogit_bias) {
    sigmoid_value_and_grad(q, k, labels, logit_scale, logit_bias, loss, dq, dk, dlogit_scale, dlogit_bias,
                           null, 0);
  }

  /** sigmoid_backward() with the handle's own workspace, on the CPU: the
   *  gradients of dloss * L (dloss one float32 element, null = 1),
   *  recomputing the logits. */
  public void sigmoid_backward(Tensor q, Tensor k, Tensor labels, Tensor logit_scale, Tensor logit_bias,
                               Tensor dloss, Tensor dq, Tensor dk, Tensor dlogit_scale, Tensor dlogit_bias) {
    sigmoid_backward(q, k, labels, logit_scale, logit_bias, dloss, dq, dk, dlogit_scale, dlogit_bias, null, 0);
  }
%}
%typemap(javainterfaces) struct flatmem_swig_tensor "AutoCloseable"
%typemap(javacode) struct flatmem_swig_tensor %{
  @Override public void close() { delete(); }

  /** A tensor of this shape and dtype with zeroed memory of its own. */
  public static Tensor allocated(int dtype_code, int dtype_bits, long... shape) {
    Tensor t = new Tensor(0, shape.length, dtype_code, dtype_bits);
    for (int i = 0; i < shape.length; ++i) t.set_shape(i, shape[i]);
    t.allocate();
    return t;
  }

  /** The direct buffer a wrap()ped tensor points into (kept reachable). */
  private java.nio.ByteBuffer wrapped;

  /** A compact CPU tensor over the bytes of a DIRECT ByteBuffer, from its
   *  position on (no copy): dtype (dtype_code, dtype_bits), shape in elements
   *  (none: 0-d). The buffer must hold the tensor's nbytes() from its position;
   *  values are in the platform's byte order (use
   *  buffer.order(ByteOrder.nativeOrder())). The tensor keeps the buffer
   *  reachable; the buffer's later position changes do not move it. */
  public static Tensor wrap(java.nio.ByteBuffer buffer, int dtype_code, int dtype_bits, long... shape) {
    if (buffer == null || !buffer.isDirect())
      throw new IllegalArgumentException("Tensor.wrap: buffer: " + (buffer == null ? "null" : "not a direct ByteBuffer")
                                         + "; expected ByteBuffer.allocateDirect(...) or a mapped file");
    Tensor t = new Tensor(Flatmem.direct_buffer_address(buffer) + buffer.position(), shape.length,
                          dtype_code, dtype_bits);
    for (int i = 0; i < shape.length; ++i) t.set_shape(i, shape[i]);
    if (t.nbytes() > buffer.remaining()) {
      long need = t.nbytes();
      t.delete();
      throw new IllegalArgumentException("Tensor.wrap: buffer: " + buffer.remaining() + " bytes from position "
                                         + buffer.position() + "; the tensor needs " + need);
    }
    t.wrapped = buffer;
    return t;
  }

  /** A float32 tensor of this shape (none: 1-d of values.length) holding a copy of values. */
  public static Tensor of(float[] values, long... shape) {
    Tensor t = allocated(Flatmem.kDLFloat, 32, shapeOf("Tensor.of", values == null ? -1 : values.length, shape));
    t.bytes().asFloatBuffer().put(values);
    return t;
  }

  /** A float64 tensor of this shape (none: 1-d of values.length) holding a copy of values. */
  public static Tensor of(double[] values, long... shape) {
    Tensor t = allocated(Flatmem.kDLFloat, 64, shapeOf("Tensor.of", values == null ? -1 : values.length, shape));
    t.bytes().asDoubleBuffer().put(values);
    return t;
  }

  /** An int64 tensor (labels) of this shape (none: 1-d of values.length) holding a copy of values. */
  public static Tensor of(long[] values, long... shape) {
    Tensor t = allocated(Flatmem.kDLInt, 64, shapeOf("Tensor.of", values == null ? -1 : values.length, shape));
    t.bytes().asLongBuffer().put(values);
    return t;
  }

  private static long[] shapeOf(String what, long count, long[] shape) {
    if (count < 0) throw new IllegalArgumentException(what + ": values: null");
    if (shape.length == 0) return new long[] {count};
    long n = 1;
    for (long e : shape) n *= e;
    if (n != count)
      throw new IllegalArgumentException(what + ": values: " + count + " elements; shape "
                                         + java.util.Arrays.toString(shape) + " holds " + n);
    return shape;
  }

  /** The tensor's compact bytes as a direct ByteBuffer in the platform's
   *  byte order (no copy): valid while the tensor is open (do not keep it
   *  past close()). A CPU tensor with data and compact strides only. */
  public java.nio.ByteBuffer bytes() {
    return byte_view().order(java.nio.ByteOrder.nativeOrder());
  }

  /** A copy of a float32 tensor's elements (row-major). */
  public float[] toFloatArray() {
    requireDtype("toFloatArray", Flatmem.kDLFloat, 32);
    float[] out = new float[(int) numel()];
    bytes().asFloatBuffer().get(out);
    return out;
  }

  /** A copy of a float64 tensor's elements (row-major). */
  public double[] toDoubleArray() {
    requireDtype("toDoubleArray", Flatmem.kDLFloat, 64);
    double[] out = new double[(int) numel()];
    bytes().asDoubleBuffer().get(out);
    return out;
  }

  /** Overwrites a float32 tensor's elements with values (numel() of them). */
  public void copyFrom(float[] values) {
    requireDtype("copyFrom(float[])", Flatmem.kDLFloat, 32);
    shapeOf("Tensor.copyFrom", values == null ? -1 : values.length, new long[] {numel()});
    bytes().asFloatBuffer().put(values);
  }

  /** Overwrites a float64 tensor's elements with values (numel() of them). */
  public void copyFrom(double[] values) {
    requireDtype("copyFrom(double[])", Flatmem.kDLFloat, 64);
    shapeOf("Tensor.copyFrom", values == null ? -1 : values.length, new long[] {numel()});
    bytes().asDoubleBuffer().put(values);
  }

  private void requireDtype(String what, int code, int bits) {
    if (dtype_code() != code || dtype_bits() != bits || dtype_lanes() != 1)
      throw new IllegalArgumentException("Tensor." + what + ": dtype (code " + dtype_code() + ", bits "
                                         + dtype_bits() + ", lanes " + dtype_lanes() + "); expected (code "
                                         + code + ", bits " + bits + ", lanes 1)");
  }
%}
/* Reversible segments, Java side: Block and Reversible are AutoCloseable; the
 * raw set_parameters / set_block become private *_raw methods behind Java
 * ones that keep the Tensors a Block points at, and the Blocks a segment
 * calls, reachable from their user (the C side keeps only pointers, and the
 * proxies' finalizers free the memory otherwise); seed and offset are Java
 * longs (the uint64 bits). */
%apply int64_t { uint64_t seed, uint64_t offset };
%rename(set_parameters_raw) flatmem_block_s::set_parameters;
%javamethodmodifiers flatmem_block_s::set_parameters "private";
%rename(set_block_raw) flatmem_swig_reversible::set_block;
%javamethodmodifiers flatmem_swig_reversible::set_block "private";
%typemap(javainterfaces) struct flatmem_block_s "AutoCloseable"
%typemap(javacode) struct flatmem_block_s %{
  private Tensor[] kept = new Tensor[0];

  @Override public void close() { delete(); }

  /** A block of this kind with the library's defaults for what is 0. */
  public Block(BlockKind kind, int width, int heads, int hidden) {
    this(kind, width, heads, hidden, BlockMath.BLOCK_MATH_FP32);
  }

  /** ... and this precision of the products (the CPU runs FP32 for either). */
  public Block(BlockKind kind, int width, int heads, int hidden, BlockMath math) {
    this(kind.swigValue(), width, heads, hidden, 0.0f, math.swigValue());
  }

  /** flatmem_block_set_parameters: six parameter Tensors and six gradient
   *  Tensors (gradients null: a forward-only block). The block keeps them
   *  (reachable) until the next call or until it is closed. */
  public void set_parameters(Tensor[] parameters, Tensor[] gradients) {
    if (parameters == null || parameters.length != 6 || (gradients != null && gradients.length != 6))
      throw new IllegalArgumentException("set_parameters: 6 parameter Tensors and 6 (or no) gradient Tensors");
    Tensor[] g = gradients != null ? gradients : new Tensor[6];
    set_parameters_raw(parameters[0], parameters[1], parameters[2], parameters[3], parameters[4],
                       parameters[5], g[0], g[1], g[2], g[3], g[4], g[5]);
    Tensor[] both = new Tensor[12];
    System.arraycopy(parameters, 0, both, 0, 6);
    System.arraycopy(g, 0, both, 6, 6);
    kept = both;
  }
%}
/* CyclicSchedule: AutoCloseable, and built from the CyclicRule enum. */
%typemap(javainterfaces) struct flatmem_cyclic_schedule "AutoCloseable"
%typemap(javacode) struct flatmem_cyclic_schedule %{
  @Override public void close() { delete(); }

  public CyclicSchedule(int world_size, int stages, long steps, CyclicRule rule) {
    this(world_size, stages, steps, rule.swigValue());
  }

  /** A schedule under the default rule, CYCLIC_DELAY1. */
  public CyclicSchedule(int world_size, int stages, long steps) {
    this(world_size, stages, steps, CyclicRule.CYCLIC_DELAY1);
  }
%}
%typemap(javainterfaces) struct flatmem_swig_reversible "AutoCloseable"
%typemap(javacode) struct flatmem_swig_reversible %{
  private final java.util.ArrayList<Block> blocks = new java.util.ArrayList<Block>();

  @Override public void close() { delete(); }

  public Reversible(int num_blocks, ReversibleMode mode, int num_threads) {
    this(num_blocks, mode.swigValue(), num_threads);
  }

  /** F (part REVERSIBLE_F) or G of block k is this built-in block, which the
   *  segment keeps reachable (close the segment before the block). */
  public void set_block(int block, ReversiblePart part, Block function) {
    set_block_raw(block, part.swigValue(), function);
    blocks.add(function);
  }

  /** The mode the last successful backward ran. */
  public ReversibleMode lastMode() { return ReversibleMode.swigToEnum(last_mode()); }

  /** forward() with the handle's own workspace, on the CPU. */
  public void forward(Tensor x1, Tensor x2, long seed, long offset, Tensor y1, Tensor y2) {
    forward(x1, x2, seed, offset, y1, y2, null, 0);
  }

  /** backward() with the handle's own workspace, on the CPU; x1, x2 (the
   *  rebuilt input) may be null. */
  public void backward(Tensor y1, Tensor y2, Tensor dy1, Tensor dy2, long seed, long offset,
                       Tensor dx1, Tensor dx2, Tensor x1, Tensor x2) {
    backward(y1, y2, dy1, dy2, seed, offset, dx1, dx2, x1, x2, null, 0);
  }
%}
#endif

/* The mismatch text ("" when fine), for the Java static initializer and tests. */
%rename(version_mismatch) flatmem_swig_version_mismatch;
const char *flatmem_swig_version_mismatch(void);

/* ------------------------------------------------------------------------ */
/* The public header                                                         */
/* ------------------------------------------------------------------------ */

/* Names without the flatmem_ / FLATMEM_ prefix (version(), STATUS_SUCCESS). */
%rename("%(regex:/^(flatmem|FLATMEM)_(.*)$/\\2/)s") "";

/* Exposed as methods of Contrastive / ContrastiveOptions below. */
%ignore flatmem_contrastive_options_init;
%ignore flatmem_contrastive_create;
%ignore flatmem_contrastive_destroy;
%ignore flatmem_contrastive_forward_workspace_size;
%ignore flatmem_contrastive_backward_workspace_size;
%ignore flatmem_contrastive_forward;
%ignore flatmem_contrastive_backward;
%ignore flatmem_contrastive_sigmoid_workspace_size;
%ignore flatmem_contrastive_sigmoid_forward;
%ignore flatmem_contrastive_sigmoid_value_and_grad;
%ignore flatmem_contrastive_sigmoid_backward;
/* Takes the status enum; status_string(int) below serves every language. */
%ignore flatmem_status_string;
/* The enums' 0x7fffffff sentinels only fix the enum width. */
%ignore FLATMEM_STATUS_MAX;
%ignore FLATMEM_NONFINITE_MAX;
%ignore FLATMEM_CONTRASTIVE_LOSS_MAX;
%ignore FLATMEM_CPU_ISA_MAX;
/* Out-pointers and a status: wrapped below as cpu_isa_in_use(), cpu_isa_best()
 * and cpu_isa_set(isa). */
%ignore flatmem_cpu_isa_get;
%ignore flatmem_cpu_isa_set;
/* The options' comm is not a field here: Contrastive(options, comm) takes a
 * Communicator (comm.i) and keeps a reference to it. */
%ignore flatmem_contrastive_options::comm;

%rename(Status) flatmem_status;
%rename(NonfinitePolicy) flatmem_nonfinite_policy;
%rename(ContrastiveLoss) flatmem_contrastive_loss;
%rename(CpuIsa) flatmem_cpu_isa;
%rename(ContrastiveOptions) flatmem_contrastive_options;
%rename(Contrastive) flatmem_contrastive_s;

/* struct_size is set by the constructor; the library reads it. */
%immutable flatmem_contrastive_options::struct_size;

%include <flatmem/flatmem.h>

/* reversible.h: the enums, FLATMEM_BLOCK_NUM_PARAMETERS and block_seed();
 * the handles are wrapped below (Reversible, Block), the callback structs are
 * not (the language's own functions are bridged, see "Reversible segments"). */
%ignore flatmem_reversible_options_init;
%ignore flatmem_reversible_create;
%ignore flatmem_reversible_destroy;
%ignore flatmem_reversible_forward_workspace_size;
%ignore flatmem_reversible_backward_workspace_size;
%ignore flatmem_reversible_forward;
%ignore flatmem_reversible_backward;
%ignore flatmem_reversible_last_mode;
%ignore flatmem_reversible_rebuild_error;
%ignore flatmem_reversible_callback_error;
%ignore flatmem_block_options_init;
%ignore flatmem_block_create;
%ignore flatmem_block_destroy;
%ignore flatmem_block_set_parameters;
%ignore flatmem_block_function;
%ignore flatmem_reversible_context;
%ignore flatmem_reversible_function;
%ignore flatmem_reversible_block;
%ignore flatmem_reversible_options;
%ignore flatmem_block_options;
%ignore flatmem_reversible_forward_fn;
%ignore flatmem_reversible_vjp_fn;
%ignore flatmem_reversible_residual_size_fn;
%ignore FLATMEM_REVERSIBLE_MODE_MAX;
%ignore FLATMEM_REVERSIBLE_PART_MAX;
%ignore FLATMEM_REVERSIBLE_PHASE_MAX;
%ignore FLATMEM_BLOCK_KIND_MAX;
%ignore FLATMEM_BLOCK_MATH_MAX;
%rename(ReversibleMode) flatmem_reversible_mode;
%rename(ReversiblePart) flatmem_reversible_part;
%rename(ReversiblePhase) flatmem_reversible_phase;
%rename(BlockKind) flatmem_block_kind;
%rename(BlockMath) flatmem_block_math;
%rename(Block) flatmem_block_s;
%include <flatmem/reversible.h>

/* cyclic.h: the schedule. CyclicSchedule's constructor fills
 * FLATMEM_CYCLIC_SCHEDULE_INIT and has the library check it; offset, delay,
 * length and action are the pure flatmem_cyclic_schedule_* queries (below).
 * CyclicAction is what action() returns (read-only; -1 = none). The runtime
 * (flatmem_cyclic_t: create / next / reduce / stats) is wrapped as Cyclic in
 * comm.i: its raw functions are ignored here. */
%ignore flatmem_cyclic_schedule_offset;
%ignore flatmem_cyclic_schedule_delay;
%ignore flatmem_cyclic_schedule_length;
%ignore flatmem_cyclic_schedule_action;
%ignore flatmem_cyclic_options_init;
%ignore flatmem_cyclic_create;
%ignore flatmem_cyclic_destroy;
%ignore flatmem_cyclic_get_schedule;
%ignore flatmem_cyclic_next;
%ignore flatmem_cyclic_reduce;
%ignore flatmem_cyclic_reduce_stream;
%ignore flatmem_cyclic_stats;
%ignore flatmem_cyclic_summary_get;
%ignore flatmem_cyclic_options;
%ignore flatmem_cyclic_s;
%ignore FLATMEM_CYCLIC_SCHEDULE_INIT;
%ignore FLATMEM_CYCLIC_OPTIONS_INIT;
%ignore FLATMEM_CYCLIC_RULE_MAX;
%ignore FLATMEM_CYCLIC_ACTION_KIND_MAX;
%rename(CyclicRule) flatmem_cyclic_rule;
%rename(CyclicActionKind) flatmem_cyclic_action_kind;
%rename(CyclicMemory) flatmem_cyclic_memory;
%rename(CyclicSchedule) flatmem_cyclic_schedule;
%rename(CyclicAction) flatmem_cyclic_action;
/* The runtime's results (the runtime itself, Cyclic, is in comm.i): read-only. */
%rename(CyclicTimeStepStats) flatmem_cyclic_time_step_stats;
%rename(CyclicSummary) flatmem_cyclic_summary;
%immutable flatmem_cyclic_time_step_stats::time_step;
%immutable flatmem_cyclic_time_step_stats::kind;
%immutable flatmem_cyclic_time_step_stats::stage;
%immutable flatmem_cyclic_time_step_stats::step;
%immutable flatmem_cyclic_time_step_stats::activations_held;
%immutable flatmem_cyclic_time_step_stats::activation_bytes;
%immutable flatmem_cyclic_time_step_stats::bytes_sent;
%immutable flatmem_cyclic_time_step_stats::seconds;
%immutable flatmem_cyclic_time_step_stats::wait_seconds;
%immutable flatmem_cyclic_time_step_stats::bytes_scheduled;
%immutable flatmem_cyclic_summary::time_steps;
%immutable flatmem_cyclic_summary::bytes_sent;
%immutable flatmem_cyclic_summary::messages_sent;
%immutable flatmem_cyclic_summary::max_bytes_sent_per_time_step;
%immutable flatmem_cyclic_summary::peak_activation_bytes;
%immutable flatmem_cyclic_summary::wait_seconds;
%immutable flatmem_cyclic_summary::seconds;
%immutable flatmem_cyclic_schedule::struct_size;
%immutable flatmem_cyclic_action::time_step;
%immutable flatmem_cyclic_action::kind;
%immutable flatmem_cyclic_action::stage;
%immutable flatmem_cyclic_action::step;
%immutable flatmem_cyclic_action::update_stage;
%immutable flatmem_cyclic_action::update_step;
%immutable flatmem_cyclic_action::activations_held;
%immutable flatmem_cyclic_action::phase;
/* The ZeRO relay's calls reach Python and Java through Cyclic's methods
   (comm.i); their raw forms would only be noise. */
%ignore flatmem_cyclic_set_shard;
%ignore flatmem_cyclic_set_shard_stream;
%ignore flatmem_cyclic_shard_range;
%ignore flatmem_cyclic_parameters;
%ignore flatmem_cyclic_parameters_stream;
%ignore flatmem_cyclic_relay_stats;
%ignore flatmem_cyclic_relay_summary_get;
%ignore FLATMEM_CYCLIC_PARAMETER_MODE_MAX;
%ignore FLATMEM_CYCLIC_MEMORY_MAX;
%rename(CyclicRelayTimeStep) flatmem_cyclic_relay_time_step;
%rename(CyclicRelaySummary) flatmem_cyclic_relay_summary;
%include <flatmem/cyclic.h>

%rename(status_string) flatmem_status_string_of;
%inline %{
/* flatmem_status_string for a plain int (a status number from any language). */
const char *flatmem_status_string_of(int status) {
  return flatmem_status_string((flatmem_status)status);
}
%}

/* ------------------------------------------------------------------------ */
/* CPU instruction set (flatmem_cpu_isa_get / _set)                          */
/* ------------------------------------------------------------------------ */
/* cpu_isa_in_use(): the instruction set the CPU kernels run with now;
 * cpu_isa_best(): the best this processor supports among those compiled in.
 * Both fail as flatmem_cpu_isa_get does (a malformed FLATMEM_CPU_ISA:
 * INVALID_ARGUMENT; one asking for more than the processor has: UNSUPPORTED).
 * cpu_isa_set(isa): flatmem_cpu_isa_set, for the whole process (CPU_ISA_DEFAULT:
 * back to FLATMEM_CPU_ISA or the best); UNSUPPORTED, and nothing changes, for
 * an instruction set this processor lacks. cpu_isa_name(isa) is the
 * library's own ("amx", "avx512bf16", "avx512", "avx2", "baseline", "default").
 * CPU_ISA_AVX512BF16 (4) = AVX512 plus AVX512_BF16: the element-wise kernels
 * of AVX512, and the contrastive tile products of bf16 inputs on vdpbf16ps
 * (fp32 accumulation); CPU_ISA_AMX (5): those products on AMX tiles; below
 * AVX512BF16 bf16 inputs are widened to fp32. cpu_isa_engine(isa) names the
 * kernels at isa (CPU_ISA_DEFAULT: the one in use), wrapped as declared. */
%rename(cpu_isa_in_use) flatmem_swig_cpu_isa_in_use;
%rename(cpu_isa_best) flatmem_swig_cpu_isa_best;
%rename(cpu_isa_set) flatmem_swig_cpu_isa_set;
%inline %{
flatmem_cpu_isa flatmem_swig_cpu_isa_in_use(void) {
  flatmem_cpu_isa isa = FLATMEM_CPU_ISA_DEFAULT;
  flatmem_swig_check(flatmem_cpu_isa_get(&isa, NULL));
  return isa;
}
flatmem_cpu_isa flatmem_swig_cpu_isa_best(void) {
  flatmem_cpu_isa isa = FLATMEM_CPU_ISA_DEFAULT;
  flatmem_swig_check(flatmem_cpu_isa_get(NULL, &isa));
  return isa;
}
void flatmem_swig_cpu_isa_set(flatmem_cpu_isa isa) { flatmem_swig_check(flatmem_cpu_isa_set(isa)); }
%}

/* DLPack codes (dlpack.h is not wrapped: Tensor below builds DLTensors). */
%constant int kDLCPU = kDLCPU;
%constant int kDLCUDA = kDLCUDA;
%constant int kDLCUDAHost = kDLCUDAHost;
%constant int kDLInt = kDLInt;
%constant int kDLUInt = kDLUInt;
%constant int kDLFloat = kDLFloat;
%constant int kDLBfloat = kDLBfloat;
%constant int kDLComplex = kDLComplex;

/* ------------------------------------------------------------------------ */
/* Tensor: a DLTensor plus the shape/strides arrays it points to.            */
/* ------------------------------------------------------------------------ */
/*
 * Layout: a C struct holding a DLTensor `dl` and two int64 arrays of
 * FLATMEM_SWIG_MAX_NDIM extents; dl.shape always points at `shape`, dl.strides
 * is NULL (compact row-major) until set_stride() is called, then points at
 * `strides` (in elements, as DLPack says). The data is the caller's (an
 * address given as an integer, kept alive by the caller) unless allocate() is
 * called, which gives the tensor zeroed memory of its own, freed with it.
 * Nothing here checks what flatmem checks (dtype, extents, strides): the
 * library's own messages report those.
 */

%{
#define FLATMEM_SWIG_MAX_NDIM 8

typedef struct flatmem_swig_tensor {
  DLTensor dl;
  int64_t shape[FLATMEM_SWIG_MAX_NDIM];
  int64_t strides[FLATMEM_SWIG_MAX_NDIM];
  void *owned;
} flatmem_swig_tensor;

static const DLTensor *flatmem_swig_dl(const flatmem_swig_tensor *t) { return t ? &t->dl : NULL; }
static DLTensor *flatmem_swig_dl_out(flatmem_swig_tensor *t) { return t ? &t->dl : NULL; }

static int flatmem_swig_dim_ok(const flatmem_swig_tensor *t, int32_t dim) {
  if (dim >= 0 && dim < t->dl.ndim) return 1;
  flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor: dimension %d is out of range for ndim %d",
                    (int)dim, (int)t->dl.ndim);
  return 0;
}

static int64_t flatmem_swig_numel(const flatmem_swig_tensor *t) {
  int64_t n = 1;
  int i;
  for (i = 0; i < t->dl.ndim; ++i) n *= t->shape[i];
  return n;
}

static int64_t flatmem_swig_element_bytes(const flatmem_swig_tensor *t) {
  return ((int64_t)t->dl.dtype.bits * t->dl.dtype.lanes + 7) / 8;
}

/* Byte address of element `index` (row-major order over the shape, honouring strides). */
static char *flatmem_swig_element(const flatmem_swig_tensor *t, int64_t index) {
  int64_t offset = 0;
  int i;
  if (!t->dl.data) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor: no data (call allocate() or pass an address)");
    return NULL;
  }
  if (index < 0 || index >= flatmem_swig_numel(t)) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor: element %lld is out of range for %lld elements",
                      (long long)index, (long long)flatmem_swig_numel(t));
    return NULL;
  }
  for (i = t->dl.ndim - 1; i >= 0; --i) {
    const int64_t position = index % t->shape[i];
    int64_t stride = 1, j;
    index /= t->shape[i];
    if (t->dl.strides) stride = t->strides[i];
    else for (j = i + 1; j < t->dl.ndim; ++j) stride *= t->shape[j];
    offset += position * stride;
  }
  return (char *)t->dl.data + t->dl.byte_offset + offset * flatmem_swig_element_bytes(t);
}

static int flatmem_swig_scalar_dtype_ok(const flatmem_swig_tensor *t) {
  const DLDataType d = t->dl.dtype;
  if (d.lanes == 1 && ((d.code == kDLFloat && (d.bits == 32 || d.bits == 64)) ||
                       (d.code == kDLInt && (d.bits == 32 || d.bits == 64))))
    return 1;
  flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                    "Tensor.get/set: dtype (code %d, bits %d, lanes %d) not supported; "
                    "expected float32, float64, int32 or int64",
                    (int)d.code, (int)d.bits, (int)d.lanes);
  return 0;
}
%}

%rename(Tensor) flatmem_swig_tensor;
struct flatmem_swig_tensor {};
%extend flatmem_swig_tensor {
  /* A tensor of `ndim` dimensions (extents 1 until set_shape) of dtype
   * (dtype_code, dtype_bits, lanes 1) on kDLCPU device 0, at byte address
   * `data` (0 = none yet; see allocate()). */
  flatmem_swig_tensor(int64_t data, int32_t ndim, int32_t dtype_code, int32_t dtype_bits) {
    flatmem_swig_tensor *t;
    int i;
    if (ndim < 0 || ndim > FLATMEM_SWIG_MAX_NDIM) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor: ndim %d is out of range [0, %d]",
                        (int)ndim, FLATMEM_SWIG_MAX_NDIM);
      return NULL;
    }
    if (dtype_code < 0 || dtype_code > 255 || dtype_bits < 0 || dtype_bits > 255) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor: dtype code %d / bits %d do not fit DLPack's uint8 fields",
                        (int)dtype_code, (int)dtype_bits);
      return NULL;
    }
    t = (flatmem_swig_tensor *)calloc(1, sizeof *t);
    if (!t) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "Tensor: out of memory");
      return NULL;
    }
    for (i = 0; i < FLATMEM_SWIG_MAX_NDIM; ++i) t->shape[i] = 1;
    t->dl.data = (void *)(intptr_t)data;
    t->dl.device.device_type = kDLCPU;
    t->dl.device.device_id = 0;
    t->dl.ndim = ndim;
    t->dl.dtype.code = (uint8_t)dtype_code;
    t->dl.dtype.bits = (uint8_t)dtype_bits;
    t->dl.dtype.lanes = 1;
    t->dl.shape = t->shape;
    t->dl.strides = NULL;
    t->dl.byte_offset = 0;
    return t;
  }
  ~flatmem_swig_tensor() {
    free($self->owned);
    free($self);
  }

  void set_shape(int32_t dim, int64_t extent) {
    if (flatmem_swig_dim_ok($self, dim)) $self->shape[dim] = extent;
  }
  /* Strides in elements. The first call switches from compact row-major
   * (strides NULL) to explicit strides, starting from the compact ones of
   * the current shape: set the shape first. */
  void set_stride(int32_t dim, int64_t stride) {
    int i;
    if (!flatmem_swig_dim_ok($self, dim)) return;
    if (!$self->dl.strides) {
      int64_t s = 1;
      for (i = $self->dl.ndim - 1; i >= 0; --i) {
        $self->strides[i] = s;
        s *= $self->shape[i];
      }
      $self->dl.strides = $self->strides;
    }
    $self->strides[dim] = stride;
  }
  void set_byte_offset(uint64_t byte_offset) { $self->dl.byte_offset = byte_offset; }
  void set_lanes(int32_t lanes) { $self->dl.dtype.lanes = (uint16_t)lanes; }
  void set_device(int32_t device_type, int32_t device_id) {
    $self->dl.device.device_type = (DLDeviceType)device_type;
    $self->dl.device.device_id = device_id;
  }
  /* Gives the tensor zeroed compact memory of its own for its current shape
   * and dtype (freed with the tensor); strides return to compact. */
  void allocate() {
    const int64_t bytes = flatmem_swig_numel($self) * flatmem_swig_element_bytes($self);
    int i;
    for (i = 0; i < $self->dl.ndim; ++i)
      if ($self->shape[i] < 0) {
        flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor.allocate: negative extent in dimension %d", i);
        return;
      }
    if ($self->owned || $self->dl.data) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor.allocate: the tensor already has data");
      return;
    }
    $self->owned = calloc((size_t)(bytes > 0 ? bytes : 1), 1);
    if (!$self->owned) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "Tensor.allocate: could not allocate %lld bytes",
                        (long long)bytes);
      return;
    }
    $self->dl.data = $self->owned;
    $self->dl.strides = NULL;
    $self->dl.byte_offset = 0;
  }

  /* Element `index` (row-major order over the shape) of a float32/float64/
   * int32/int64 tensor, as a double; and its setter. */
  double get(int64_t index) {
    const char *p;
    if (!flatmem_swig_scalar_dtype_ok($self) || !(p = flatmem_swig_element($self, index))) return 0.0;
    if ($self->dl.dtype.code == kDLFloat)
      return $self->dl.dtype.bits == 32 ? (double)*(const float *)p : *(const double *)p;
    return $self->dl.dtype.bits == 32 ? (double)*(const int32_t *)p : (double)*(const int64_t *)p;
  }
  void set(int64_t index, double value) {
    char *p;
    if (!flatmem_swig_scalar_dtype_ok($self) || !(p = flatmem_swig_element($self, index))) return;
    if ($self->dl.dtype.code == kDLFloat) {
      if ($self->dl.dtype.bits == 32) *(float *)p = (float)value;
      else *(double *)p = value;
    } else if ($self->dl.dtype.bits == 32) {
      *(int32_t *)p = (int32_t)value;
    } else {
      *(int64_t *)p = (int64_t)value;
    }
  }

  int64_t data() const { return (int64_t)(intptr_t)$self->dl.data; }
  int32_t ndim() const { return $self->dl.ndim; }
  int32_t dtype_code() const { return $self->dl.dtype.code; }
  int32_t dtype_bits() const { return $self->dl.dtype.bits; }
  int32_t dtype_lanes() const { return $self->dl.dtype.lanes; }
  int32_t device_type() const { return (int32_t)$self->dl.device.device_type; }
  int32_t device_id() const { return $self->dl.device.device_id; }
  uint64_t byte_offset() const { return $self->dl.byte_offset; }
  int64_t shape(int32_t dim) const { return flatmem_swig_dim_ok($self, dim) ? $self->shape[dim] : 0; }
  /* The stride of `dim` in elements (the compact one when strides are NULL). */
  int64_t stride(int32_t dim) const {
    int64_t s = 1;
    int i;
    if (!flatmem_swig_dim_ok($self, dim)) return 0;
    if ($self->dl.strides) return $self->strides[dim];
    for (i = dim + 1; i < $self->dl.ndim; ++i) s *= $self->shape[i];
    return s;
  }
  bool has_strides() const { return $self->dl.strides != NULL; }
  int64_t numel() const { return flatmem_swig_numel($self); }
  /* Bytes of the compact extent: numel() * element size. */
  int64_t nbytes() const { return flatmem_swig_numel($self) * flatmem_swig_element_bytes($self); }
}

#ifdef SWIGJAVA
/* Java: direct ByteBuffers. direct_buffer_address(buffer) is the address of a
 * direct buffer's memory (Tensor.wrap uses it); Tensor.byte_view() is a
 * direct ByteBuffer over a tensor's compact bytes (Tensor.bytes() sets the
 * byte order). Typemaps: see flatmem_swig_byte_buffer above. */
%rename(direct_buffer_address) flatmem_swig_direct_buffer_address;
%inline %{
int64_t flatmem_swig_direct_buffer_address(JNIEnv *jni_env, flatmem_swig_byte_buffer buffer) {
  void *address = buffer ? (*jni_env)->GetDirectBufferAddress(jni_env, buffer) : NULL;
  if (!address)
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                      "direct_buffer_address: buffer: null or not a direct ByteBuffer");
  return (int64_t)(intptr_t)address;
}
%}
%extend flatmem_swig_tensor {
  flatmem_swig_byte_buffer byte_view(JNIEnv *jni_env) {
    jobject view;
    int i;
    int64_t expected = 1;
    if ($self->dl.device.device_type != kDLCPU || !$self->dl.data) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Tensor.bytes: a CPU tensor with data is needed");
      return NULL;
    }
    for (i = $self->dl.ndim - 1; $self->dl.strides && i >= 0; --i) {
      if ($self->shape[i] != 1 && $self->strides[i] != expected) {
        flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                          "Tensor.bytes: dimension %d has stride %lld; only compact tensors have a byte view",
                          i, (long long)$self->strides[i]);
        return NULL;
      }
      expected *= $self->shape[i];
    }
    view = (*jni_env)->NewDirectByteBuffer(jni_env, (char *)$self->dl.data + $self->dl.byte_offset,
                                           (jlong)(flatmem_swig_numel($self) * flatmem_swig_element_bytes($self)));
    if (!view) flatmem_swig_fail(FLATMEM_STATUS_INTERNAL, "Tensor.bytes: the JVM has no direct buffer access");
    return view;
  }
}
#endif
#ifdef SWIGPYTHON
/* Python: a Tensor describing the DLTensor inside an unconsumed "dltensor"
 * capsule (obj.__dlpack__()). The capsule is not consumed: the caller keeps
 * it alive as long as the Tensor is used; its destructor calls the producer's
 * deleter. Runs with the GIL (it calls the C API of Python). */
%nothread flatmem_swig_tensor_from_dlpack;
%rename(tensor_from_dlpack) flatmem_swig_tensor_from_dlpack;
%newobject flatmem_swig_tensor_from_dlpack;
%inline %{
flatmem_swig_tensor *flatmem_swig_tensor_from_dlpack(PyObject *capsule) {
  const DLManagedTensor *managed;
  const DLTensor *src;
  flatmem_swig_tensor *t;
  int i;
  if (!PyCapsule_IsValid(capsule, "dltensor")) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                      "tensor_from_dlpack: expected an unconsumed PyCapsule named \"dltensor\" "
                      "(what __dlpack__() returns)");
    return NULL;
  }
  managed = (const DLManagedTensor *)PyCapsule_GetPointer(capsule, "dltensor");
  src = &managed->dl_tensor;
  if (src->ndim < 0 || src->ndim > FLATMEM_SWIG_MAX_NDIM) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "tensor_from_dlpack: ndim %d is out of range [0, %d]",
                      (int)src->ndim, FLATMEM_SWIG_MAX_NDIM);
    return NULL;
  }
  t = (flatmem_swig_tensor *)calloc(1, sizeof *t);
  if (!t) {
    flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "tensor_from_dlpack: out of memory");
    return NULL;
  }
  t->dl = *src;
  for (i = 0; i < FLATMEM_SWIG_MAX_NDIM; ++i) t->shape[i] = i < src->ndim ? src->shape[i] : 1;
  t->dl.shape = t->shape;
  if (src->strides) {
    for (i = 0; i < src->ndim; ++i) t->strides[i] = src->strides[i];
    t->dl.strides = t->strides;
  }
  return t;
}
%}
#endif

/* ------------------------------------------------------------------------ */
/* ContrastiveOptions                                                        */
/* ------------------------------------------------------------------------ */

%extend flatmem_contrastive_options {
  /* The defaults (flatmem_contrastive_options_init): symmetric loss, all
   * processors, 512 x 512 tiles, non-finite inputs refused, no logit cache
   * (logit_cache_bytes 0: the bytes of raw logit tiles a handle keeps from a
   * forward for the next backward on the same q, k; CPU only, see flatmem.h). */
  flatmem_contrastive_options() {
    flatmem_contrastive_options *o = (flatmem_contrastive_options *)calloc(1, sizeof *o);
    if (!o) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "ContrastiveOptions: out of memory");
      return NULL;
    }
    if (!flatmem_swig_check(flatmem_contrastive_options_init(o, sizeof *o))) {
      free(o);
      return NULL;
    }
    return o;
  }
  ~flatmem_contrastive_options() { free($self); }
}

/* ------------------------------------------------------------------------ */
/* Cyclic schedule (flatmem_cyclic_schedule and its pure queries)            */
/* ------------------------------------------------------------------------ */
/* CyclicSchedule(world_size, stages, steps, rule = CYCLIC_DELAY1): the
 * library checks it at once (INVALID_ARGUMENT naming the field). Ranks,
 * stages and time steps are 0-based, as in C. */

/* SWIG names an %extend method's C function <struct>_<method>: offset()
 * would be flatmem_cyclic_schedule_offset, the library's own function. The
 * methods are written as get_* and renamed. */
%rename(offset) flatmem_cyclic_schedule::get_offset;
%rename(delay) flatmem_cyclic_schedule::get_delay;
%rename(length) flatmem_cyclic_schedule::get_length;
%rename(action) flatmem_cyclic_schedule::get_action;
%extend flatmem_cyclic_schedule {
  flatmem_cyclic_schedule(int32_t world_size, int32_t stages, int64_t steps,
                          int32_t rule = FLATMEM_CYCLIC_DELAY1) {
    const flatmem_cyclic_schedule init = FLATMEM_CYCLIC_SCHEDULE_INIT;
    int64_t length = 0;
    flatmem_cyclic_schedule *s = (flatmem_cyclic_schedule *)malloc(sizeof *s);
    if (!s) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "CyclicSchedule: out of memory");
      return NULL;
    }
    *s = init;
    s->world_size = world_size;
    s->stages = stages;
    s->steps = steps;
    s->rule = (flatmem_cyclic_rule)rule;
    if (!flatmem_swig_check(flatmem_cyclic_schedule_length(s, &length))) {
      free(s);
      return NULL;
    }
    return s;
  }
  ~flatmem_cyclic_schedule() { free($self); }

  /* flatmem_cyclic_schedule_offset: time steps `rank` starts after rank 0. */
  int64_t get_offset(int32_t rank) const {
    int64_t offset = 0;
    flatmem_swig_check(flatmem_cyclic_schedule_offset($self, rank, &offset));
    return offset;
  }
  /* flatmem_cyclic_schedule_delay: 0 or 1. */
  int32_t get_delay(int32_t rank, int32_t stage) const {
    int32_t delay = 0;
    flatmem_swig_check(flatmem_cyclic_schedule_delay($self, rank, stage, &delay));
    return delay;
  }
  /* flatmem_cyclic_schedule_length: global time steps of the whole run. */
  int64_t get_length() const {
    int64_t time_steps = 0;
    flatmem_swig_check(flatmem_cyclic_schedule_length($self, &time_steps));
    return time_steps;
  }
  /* flatmem_cyclic_schedule_action: what `rank` does at `time_step`. */
  flatmem_cyclic_action get_action(int32_t rank, int64_t time_step) const {
    flatmem_cyclic_action action;
    memset(&action, 0, sizeof action);
    flatmem_swig_check(flatmem_cyclic_schedule_action($self, rank, time_step, &action, sizeof action));
    return action;
  }
}

/* ------------------------------------------------------------------------ */
/* Contrastive: the flatmem_contrastive_t handle                             */
/* ------------------------------------------------------------------------ */
/* Tensors are Tensor objects or None/null for the C API's NULL; the workspace
 * is a Tensor whose compact bytes (nbytes()) are handed over, or None (the
 * handle allocates); stream is a cudaStream_t as an integer (0 on the CPU). */

%{
static void *flatmem_swig_workspace(const flatmem_swig_tensor *w, size_t *bytes) {
  *bytes = w ? (size_t)(flatmem_swig_numel(w) * flatmem_swig_element_bytes(w)) : 0;
  return w ? (char *)w->dl.data + w->dl.byte_offset : NULL;
}
%}

%include "comm.i"

struct flatmem_contrastive_s {};
%extend flatmem_contrastive_s {
  /* flatmem_contrastive_create(options); None/null = defaults. comm: a
   * Communicator whose ranks share one global batch (the ring loss,
   * options.comm; see "Ring across ranks" in flatmem.h), or None/null. The
   * handle then holds a reference to it: Communicator.close() is refused
   * until the handle is destroyed. */
  flatmem_contrastive_s(const flatmem_contrastive_options *options = NULL,
                        flatmem_swig_comm *comm = NULL) {
    flatmem_contrastive_t *handle = NULL;
    flatmem_contrastive_options o;
    if (!comm) {
      flatmem_swig_check(flatmem_contrastive_create(&handle, options));
      return handle;
    }
    if (!flatmem_swig_comm_open(comm, "Contrastive: comm")) return NULL;
    if (options) o = *options;
    else if (!flatmem_swig_check(flatmem_contrastive_options_init(&o, sizeof o))) return NULL;
    o.comm = comm->handle;
    if (!flatmem_swig_check(flatmem_contrastive_create(&handle, &o))) return NULL;
    if (!flatmem_swig_comm_user_add(handle, comm)) {
      flatmem_contrastive_destroy(handle);
      return NULL;
    }
    return handle;
  }
  /* flatmem_contrastive_destroy: joins the handle's threads; then releases
   * its communicator, if any. */
  ~flatmem_contrastive_s() {
    flatmem_contrastive_destroy($self);
    flatmem_swig_comm_user_remove($self);
  }

  size_t forward_workspace_size(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k) const {
    size_t bytes = 0;
    flatmem_swig_check(flatmem_contrastive_forward_workspace_size($self, flatmem_swig_dl(q), flatmem_swig_dl(k), &bytes));
    return bytes;
  }
  size_t backward_workspace_size(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k,
                                 const flatmem_swig_tensor *dq, const flatmem_swig_tensor *dk) const {
    size_t bytes = 0;
    flatmem_swig_check(flatmem_contrastive_backward_workspace_size(
        $self, flatmem_swig_dl(q), flatmem_swig_dl(k), flatmem_swig_dl(dq), flatmem_swig_dl(dk), &bytes));
    return bytes;
  }

  /* flatmem_contrastive_forward: writes loss, row_lse and (symmetric) col_lse. */
  void forward(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k,
               const flatmem_swig_tensor *labels, const flatmem_swig_tensor *logit_scale,
               flatmem_swig_tensor *loss, flatmem_swig_tensor *row_lse, flatmem_swig_tensor *col_lse,
               const flatmem_swig_tensor *workspace = NULL, int64_t stream = 0) {
    size_t workspace_bytes;
    void *ws = flatmem_swig_workspace(workspace, &workspace_bytes);
    flatmem_swig_check(flatmem_contrastive_forward(
        $self, flatmem_swig_dl(q), flatmem_swig_dl(k), flatmem_swig_dl(labels), flatmem_swig_dl(logit_scale),
        flatmem_swig_dl_out(loss), flatmem_swig_dl_out(row_lse), flatmem_swig_dl_out(col_lse), ws,
        workspace_bytes, (void *)(intptr_t)stream));
  }

  /* flatmem_contrastive_backward: writes the requested gradients (None = skip). */
  void backward(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k,
                const flatmem_swig_tensor *labels, const flatmem_swig_tensor *logit_scale,
                const flatmem_swig_tensor *row_lse, const flatmem_swig_tensor *col_lse,
                const flatmem_swig_tensor *dloss, flatmem_swig_tensor *dq, flatmem_swig_tensor *dk,
                flatmem_swig_tensor *dlogit_scale, const flatmem_swig_tensor *workspace = NULL,
                int64_t stream = 0) {
    size_t workspace_bytes;
    void *ws = flatmem_swig_workspace(workspace, &workspace_bytes);
    flatmem_swig_check(flatmem_contrastive_backward(
        $self, flatmem_swig_dl(q), flatmem_swig_dl(k), flatmem_swig_dl(labels), flatmem_swig_dl(logit_scale),
        flatmem_swig_dl(row_lse), flatmem_swig_dl(col_lse), flatmem_swig_dl(dloss), flatmem_swig_dl_out(dq),
        flatmem_swig_dl_out(dk), flatmem_swig_dl_out(dlogit_scale), ws, workspace_bytes,
        (void *)(intptr_t)stream));
  }

  /* The sigmoid (SigLIP) loss of a handle made with loss = CONTRASTIVE_SIGMOID
   * ("Sigmoid (SigLIP) loss" in flatmem.h): x_ij = s <q_i, k_j> + t,
   * L = -(1/b) sum_ij log sigmoid(z_ij x_ij), z = +1 at (i, y_i), -1 elsewhere
   * (the mean over the b rows of the sum over the c columns). logit_scale s
   * and logit_bias t are one fp32 element each; dlogit_scale = dL/ds and
   * dlogit_bias = dL/dt of the given s and t. No saved state between calls.
   * A handle of another loss is refused (INVALID_ARGUMENT). With a
   * communicator (the ring, "Ring across ranks" under the sigmoid loss in
   * flatmem.h) the calls are collective over the global batch, labels are
   * global column indices and the workspace must be None/null (its query
   * returns 0). */

  /* flatmem_contrastive_sigmoid_workspace_size: bytes for the call with these
   * dq / dk (None/null for the forward, or for a gradient not requested). */
  size_t sigmoid_workspace_size(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k,
                                const flatmem_swig_tensor *dq, const flatmem_swig_tensor *dk) const {
    size_t bytes = 0;
    flatmem_swig_check(flatmem_contrastive_sigmoid_workspace_size(
        $self, flatmem_swig_dl(q), flatmem_swig_dl(k), flatmem_swig_dl(dq), flatmem_swig_dl(dk), &bytes));
    return bytes;
  }

  /* flatmem_contrastive_sigmoid_forward: writes loss (2 b c d FLOPs). */
  void sigmoid_forward(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k,
                       const flatmem_swig_tensor *labels, const flatmem_swig_tensor *logit_scale,
                       const flatmem_swig_tensor *logit_bias, flatmem_swig_tensor *loss,
                       const flatmem_swig_tensor *workspace = NULL, int64_t stream = 0) {
    size_t workspace_bytes;
    void *ws = flatmem_swig_workspace(workspace, &workspace_bytes);
    flatmem_swig_check(flatmem_contrastive_sigmoid_forward(
        $self, flatmem_swig_dl(q), flatmem_swig_dl(k), flatmem_swig_dl(labels), flatmem_swig_dl(logit_scale),
        flatmem_swig_dl(logit_bias), flatmem_swig_dl_out(loss), ws, workspace_bytes, (void *)(intptr_t)stream));
  }

  /* flatmem_contrastive_sigmoid_value_and_grad: the loss and the requested
   * gradients (None/null = skip; at least one output) in one walk (6 b c d FLOPs). */
  void sigmoid_value_and_grad(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k,
                              const flatmem_swig_tensor *labels, const flatmem_swig_tensor *logit_scale,
                              const flatmem_swig_tensor *logit_bias, flatmem_swig_tensor *loss,
                              flatmem_swig_tensor *dq, flatmem_swig_tensor *dk,
                              flatmem_swig_tensor *dlogit_scale, flatmem_swig_tensor *dlogit_bias,
                              const flatmem_swig_tensor *workspace = NULL, int64_t stream = 0) {
    size_t workspace_bytes;
    void *ws = flatmem_swig_workspace(workspace, &workspace_bytes);
    flatmem_swig_check(flatmem_contrastive_sigmoid_value_and_grad(
        $self, flatmem_swig_dl(q), flatmem_swig_dl(k), flatmem_swig_dl(labels), flatmem_swig_dl(logit_scale),
        flatmem_swig_dl(logit_bias), flatmem_swig_dl_out(loss), flatmem_swig_dl_out(dq), flatmem_swig_dl_out(dk),
        flatmem_swig_dl_out(dlogit_scale), flatmem_swig_dl_out(dlogit_bias), ws, workspace_bytes,
        (void *)(intptr_t)stream));
  }

  /* flatmem_contrastive_sigmoid_backward: the gradients of dloss * L (dloss
   * None/null: 1), recomputing the logits (6 b c d FLOPs). */
  void sigmoid_backward(const flatmem_swig_tensor *q, const flatmem_swig_tensor *k,
                        const flatmem_swig_tensor *labels, const flatmem_swig_tensor *logit_scale,
                        const flatmem_swig_tensor *logit_bias, const flatmem_swig_tensor *dloss,
                        flatmem_swig_tensor *dq, flatmem_swig_tensor *dk, flatmem_swig_tensor *dlogit_scale,
                        flatmem_swig_tensor *dlogit_bias, const flatmem_swig_tensor *workspace = NULL,
                        int64_t stream = 0) {
    size_t workspace_bytes;
    void *ws = flatmem_swig_workspace(workspace, &workspace_bytes);
    flatmem_swig_check(flatmem_contrastive_sigmoid_backward(
        $self, flatmem_swig_dl(q), flatmem_swig_dl(k), flatmem_swig_dl(labels), flatmem_swig_dl(logit_scale),
        flatmem_swig_dl(logit_bias), flatmem_swig_dl(dloss), flatmem_swig_dl_out(dq), flatmem_swig_dl_out(dk),
        flatmem_swig_dl_out(dlogit_scale), flatmem_swig_dl_out(dlogit_bias), ws, workspace_bytes,
        (void *)(intptr_t)stream));
  }
}

/* ------------------------------------------------------------------------ */
/* Block: a built-in block (flatmem_block_t)                                 */
/* ------------------------------------------------------------------------ */
/* Block(kind, width, heads, hidden, layer_norm_eps, math): flatmem_block_create
 * with those options (0 = the library's default; math a flatmem_block_math,
 * BLOCK_MATH_FP32 or BLOCK_MATH_TF32, which the library checks -- the CPU
 * runs FP32 for either). set_parameters takes the six
 * parameter Tensors and the six gradient Tensors (all None/null: a
 * forward-only block), in the order of reversible.h. The block keeps the
 * data pointers only: the caller keeps the memory (and the Tensors) alive
 * while the block is used, and destroys segments using a block before it. */

struct flatmem_block_s {};
%extend flatmem_block_s {
  flatmem_block_s(int32_t kind, int32_t width, int32_t heads = 0, int32_t hidden = 0,
                  float layer_norm_eps = 0.0f, int32_t math = 0) {
    flatmem_block_options options;
    flatmem_block_t *block = NULL;
    if (!flatmem_swig_check(flatmem_block_options_init(&options, sizeof options))) return NULL;
    options.kind = (flatmem_block_kind)kind;
    options.width = width;
    options.heads = heads;
    options.hidden = hidden;
    options.layer_norm_eps = layer_norm_eps;
    options.math = (flatmem_block_math)math;
    flatmem_swig_check(flatmem_block_create(&block, &options));
    return block;
  }
  ~flatmem_block_s() { flatmem_block_destroy($self); }

  void set_parameters(const flatmem_swig_tensor *p0, const flatmem_swig_tensor *p1,
                      const flatmem_swig_tensor *p2, const flatmem_swig_tensor *p3,
                      const flatmem_swig_tensor *p4, const flatmem_swig_tensor *p5,
                      const flatmem_swig_tensor *g0 = NULL, const flatmem_swig_tensor *g1 = NULL,
                      const flatmem_swig_tensor *g2 = NULL, const flatmem_swig_tensor *g3 = NULL,
                      const flatmem_swig_tensor *g4 = NULL, const flatmem_swig_tensor *g5 = NULL) {
    const flatmem_swig_tensor *p[FLATMEM_BLOCK_NUM_PARAMETERS] = {p0, p1, p2, p3, p4, p5};
    const flatmem_swig_tensor *g[FLATMEM_BLOCK_NUM_PARAMETERS] = {g0, g1, g2, g3, g4, g5};
    DLTensor parameters[FLATMEM_BLOCK_NUM_PARAMETERS], gradients[FLATMEM_BLOCK_NUM_PARAMETERS];
    int i, grads = 0;
    for (i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) grads += g[i] != NULL;
    if (grads != 0 && grads != FLATMEM_BLOCK_NUM_PARAMETERS) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                        "gradients: %d of %d given; pass all of them or none", grads,
                        FLATMEM_BLOCK_NUM_PARAMETERS);
      return;
    }
    for (i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) {
      if (!p[i]) {
        flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "parameters[%d]: NULL", i);
        return;
      }
      parameters[i] = p[i]->dl;
      if (grads) gradients[i] = g[i]->dl;
    }
    flatmem_swig_check(flatmem_block_set_parameters($self, parameters, grads ? gradients : NULL));
  }
}

/* ------------------------------------------------------------------------ */
/* Reversible segments (flatmem_reversible_t)                                */
/* ------------------------------------------------------------------------ */
/*
 * Reversible(num_blocks, mode, num_threads) prepares a segment; each F and G
 * is then given with set_block(k, part, Block) or, in Python,
 * set_python(k, part) (part: REVERSIBLE_F / REVERSIBLE_G), and create() makes
 * the flatmem_reversible_t. forward / backward / rebuild_error and the
 * workspace queries take Tensors as Contrastive's methods do (workspace None:
 * the handle allocates; stream 0 on the CPU).
 *
 * Python functions as F and G (bindings/python/flatmem/reversible.py builds
 * on this): set_dispatch(callable) gives the segment ONE Python callable that
 * every Python F/G goes through:
 *     dispatch(vjp, function, block, part, phase, num_threads, seed, offset,
 *              shape, bits, x, a, dx)
 * function = 2 * block + part; x, a and dx are memoryviews of flatmem's
 * buffers (no copy), valid during the call only: forward (vjp = 0): x read
 * only, a = y to write, dx None; VJP (vjp = 1): x and a = dy read only, dx
 * writable (dx += the input gradient). The trampolines take the GIL
 * (PyGILState_Ensure), since OVERLAPPED calls the rebuild's forwards from a
 * thread of the library; the segment's methods run without the GIL. An
 * exception in dispatch ends the segment call: the trampoline keeps it (the
 * first one of the call), hands "Type: text" to
 * flatmem_reversible_callback_error and returns INVALID_ARGUMENT; the method
 * then re-raises that exception itself with a note "flatmem: block k, F
 * forward (phase): ..." (Python >= 3.11; else flatmem's error, raised from it).
 * residual_size is NULL: residuals of Python functions live in Python.
 */

%{
typedef struct flatmem_swig_reversible flatmem_swig_reversible;

/* The user pointer of a language callback: its segment and F/G index. */
typedef struct flatmem_swig_slot {
  flatmem_swig_reversible *segment;
  int32_t function; /* 2 * block + part */
} flatmem_swig_slot;

struct flatmem_swig_reversible {
  flatmem_reversible_t *handle;     /* NULL until create() */
  int32_t num_blocks;
  flatmem_reversible_options options;
  flatmem_reversible_block *blocks; /* the F/G given so far; copied by create() */
  flatmem_swig_slot *slots;         /* 2 * num_blocks */
#ifdef SWIGPYTHON
  PyObject *dispatch;               /* owned; NULL without Python functions */
  /* The first exception of the running call (written under the GIL). */
  PyObject *exc_type, *exc_value, *exc_traceback;
  char exc_message[FLATMEM_SWIG_MESSAGE_BYTES];
#endif
};

static int flatmem_swig_reversible_ready(const flatmem_swig_reversible *s) {
  if (s->handle) return 1;
  flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Reversible: create() has not succeeded yet");
  return 0;
}

static int flatmem_swig_reversible_slot_ok(const flatmem_swig_reversible *s, int32_t block, int32_t part) {
  if (s->handle) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Reversible: the segment is created; its blocks are fixed");
    return 0;
  }
  if (block < 0 || block >= s->num_blocks || (part != FLATMEM_REVERSIBLE_F && part != FLATMEM_REVERSIBLE_G)) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                      "Reversible: block %d, part %d is out of range (%d blocks, part 0 = F or 1 = G)",
                      (int)block, (int)part, (int)s->num_blocks);
    return 0;
  }
  return 1;
}

static flatmem_reversible_function *flatmem_swig_reversible_function(flatmem_swig_reversible *s,
                                                                     int32_t block, int32_t part) {
  return part == FLATMEM_REVERSIBLE_F ? &s->blocks[block].f : &s->blocks[block].g;
}

/* Ends a segment call: records a failed status; Python: hands the
 * callback's exception (if any) to the thread's pending slot, which
 * %exception's flatmem_swig_raise_python() raises. Runs without the GIL. */
static void flatmem_swig_reversible_finish(flatmem_swig_reversible *s, flatmem_status status) {
  (void)s; /* only Python keeps something in it */
  flatmem_swig_check(status);
#ifdef SWIGPYTHON
  if (s->exc_type) {
    flatmem_swig_python_exception *e = &flatmem_swig_callback_exception;
    const char *text = flatmem_swig_error.message;
    const size_t have = strlen(text), want = strlen(s->exc_message);
    /* the library's message ends with the one the trampoline gave it */
    e->same = status != FLATMEM_STATUS_SUCCESS && have >= want &&
              strcmp(text + have - want, s->exc_message) == 0;
    e->type = s->exc_type;
    e->value = s->exc_value;
    e->traceback = s->exc_traceback;
    s->exc_type = s->exc_value = s->exc_traceback = NULL;
    if (status == FLATMEM_STATUS_SUCCESS) /* cannot happen: a raising callback fails the call */
      flatmem_swig_fail(FLATMEM_STATUS_INTERNAL, "Reversible: a callback raised but the call succeeded");
  }
#endif
}
%}

#ifdef SWIGPYTHON
%{
static const void *flatmem_swig_dl_address(const DLTensor *t) {
  return (const char *)t->data + t->byte_offset;
}

static Py_ssize_t flatmem_swig_dl_bytes(const DLTensor *t) {
  int64_t n = 1;
  int i;
  for (i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return (Py_ssize_t)(n * ((t->dtype.bits * t->dtype.lanes + 7) / 8));
}

static int flatmem_swig_host_state(const DLTensor *t) {
  return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost;
}

static PyObject *flatmem_swig_memoryview(const DLTensor *t, int writable) {
  return PyMemoryView_FromMemory((char *)flatmem_swig_dl_address(t), flatmem_swig_dl_bytes(t),
                                 writable ? PyBUF_WRITE : PyBUF_READ);
}

static PyObject *flatmem_swig_shape_tuple(const DLTensor *t) {
  PyObject *shape = PyTuple_New(t->ndim);
  int i;
  for (i = 0; shape && i < t->ndim; ++i) {
    PyObject *extent = PyLong_FromLongLong((long long)t->shape[i]);
    if (!extent) {
      Py_CLEAR(shape);
      break;
    }
    PyTuple_SET_ITEM(shape, i, extent);
  }
  return shape;
}

/* Keeps the first exception of a call (the GIL is held) and returns the
 * status for the library, with "Type: text" as the callback's message. */
static flatmem_status flatmem_swig_python_failed(flatmem_swig_reversible *s) {
  PyObject *type, *value, *traceback, *text = NULL;
  const char *name, *utf8 = NULL;
  char message[FLATMEM_SWIG_MESSAGE_BYTES];
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  name = type ? ((PyTypeObject *)type)->tp_name : "exception";
  if (value) text = PyObject_Str(value);
  if (text) utf8 = PyUnicode_AsUTF8(text);
  if (!utf8) PyErr_Clear();
  {
    const char *dot = strrchr(name, '.');
    /* at most ~1 KiB, so that flatmem's message ("block k, ...: " + this) is not cut */
    snprintf(message, 1024, "%s: %s", dot ? dot + 1 : name, utf8 ? utf8 : "(no text)");
  }
  Py_XDECREF(text);
  if (!s->exc_type) {
    s->exc_type = type;
    s->exc_value = value;
    s->exc_traceback = traceback;
    memcpy(s->exc_message, message, sizeof message);
  } else {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
  }
  flatmem_reversible_callback_error(message);
  return FLATMEM_STATUS_INVALID_ARGUMENT;
}

/* The call into Python shared by the two trampolines. a: y (forward, written)
 * or dy (VJP, read); dx: NULL for a forward. */
static flatmem_status flatmem_swig_python_call(void *user, const flatmem_reversible_context *c,
                                               const DLTensor *x, const DLTensor *a, DLTensor *dx) {
  const flatmem_swig_slot *slot = (const flatmem_swig_slot *)user;
  flatmem_swig_reversible *s = slot->segment;
  const int vjp = dx != NULL;
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *shape, *xv, *av, *dxv, *result = NULL;
  /* memoryviews are host memory: device states (a CUDA segment with a Python F or G) must not
   * reach Python as such (reading one would fault); the call fails naming the device instead. */
  if (!flatmem_swig_host_state(x) || !flatmem_swig_host_state(a) || (dx && !flatmem_swig_host_state(dx))) {
    PyErr_Format(PyExc_TypeError,
                 "Python functions take host states (kDLCPU); this segment's states are on device type %d, "
                 "id %d: on a GPU use flatmem's built-in blocks (flatmem.Block) or C callbacks",
                 (int)x->device.device_type, (int)x->device.device_id);
    status = flatmem_swig_python_failed(s);
    PyGILState_Release(gil);
    return status;
  }
  shape = flatmem_swig_shape_tuple(x);
  xv = flatmem_swig_memoryview(x, 0);
  av = flatmem_swig_memoryview(a, !vjp);
  dxv = vjp ? flatmem_swig_memoryview(dx, 1) : (Py_INCREF(Py_None), Py_None);
  if (shape && xv && av && dxv)
    result = PyObject_CallFunction(s->dispatch, "iiiiiiKKOiOOO", vjp, (int)slot->function,
                                   (int)c->block, (int)c->part, (int)c->phase, (int)c->num_threads,
                                   (unsigned long long)c->seed, (unsigned long long)c->offset,
                                   shape, (int)x->dtype.bits, xv, av, dxv);
  if (!result) status = flatmem_swig_python_failed(s);
  Py_XDECREF(result);
  Py_XDECREF(shape);
  Py_XDECREF(xv);
  Py_XDECREF(av);
  Py_XDECREF(dxv);
  PyGILState_Release(gil);
  return status;
}

static flatmem_status flatmem_swig_python_forward(void *user, const flatmem_reversible_context *c,
                                                  const DLTensor *x, DLTensor *y, void *residuals) {
  (void)residuals; /* residual_size is NULL: always NULL */
  return flatmem_swig_python_call(user, c, x, y, NULL);
}

static flatmem_status flatmem_swig_python_vjp(void *user, const flatmem_reversible_context *c,
                                              const DLTensor *x, const void *residuals,
                                              const DLTensor *dy, DLTensor *dx) {
  (void)residuals;
  return flatmem_swig_python_call(user, c, x, dy, dx);
}
%}
#endif

%rename(Reversible) flatmem_swig_reversible;
struct flatmem_swig_reversible {};
%extend flatmem_swig_reversible {
  /* A segment of num_blocks blocks, mode (ReversibleMode, 0 = AUTO) and
   * num_threads (0 = all processors); give every F and G, then create(). */
  flatmem_swig_reversible(int32_t num_blocks, int32_t mode = 0, int32_t num_threads = 0) {
    flatmem_swig_reversible *s;
    int32_t i;
    if (num_blocks < 1 || num_blocks > 65536) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "num_blocks: %d; expected 1 to 65536",
                        (int)num_blocks);
      return NULL;
    }
    s = (flatmem_swig_reversible *)calloc(1, sizeof *s);
    if (s) s->blocks = (flatmem_reversible_block *)calloc((size_t)num_blocks, sizeof *s->blocks);
    if (s) s->slots = (flatmem_swig_slot *)calloc(2 * (size_t)num_blocks, sizeof *s->slots);
    if (!s || !s->blocks || !s->slots) {
      if (s) free(s->blocks);
      free(s);
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "Reversible: out of memory");
      return NULL;
    }
    if (!flatmem_swig_check(flatmem_reversible_options_init(&s->options, sizeof s->options))) {
      free(s->slots);
      free(s->blocks);
      free(s);
      return NULL;
    }
    s->options.mode = (flatmem_reversible_mode)mode;
    s->options.num_threads = num_threads;
    s->num_blocks = num_blocks;
    for (i = 0; i < 2 * num_blocks; ++i) {
      s->slots[i].segment = s;
      s->slots[i].function = i;
    }
    return s;
  }
  /* flatmem_reversible_destroy (joins the handle's threads), then drops
   * what the segment kept. */
  ~flatmem_swig_reversible() {
    flatmem_reversible_destroy($self->handle);
#ifdef SWIGPYTHON
    if ($self->dispatch || $self->exc_type) {
      PyGILState_STATE gil = PyGILState_Ensure();
      Py_CLEAR($self->dispatch);
      Py_CLEAR($self->exc_type);
      Py_CLEAR($self->exc_value);
      Py_CLEAR($self->exc_traceback);
      PyGILState_Release(gil);
    }
#endif
    free($self->slots);
    free($self->blocks);
    free($self);
  }

  /* F (part 0) or G (part 1) of block k is this built-in block. */
  void set_block(int32_t block, int32_t part, flatmem_block_t *function) {
    if (!flatmem_swig_reversible_slot_ok($self, block, part)) return;
    if (!function) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Reversible.set_block: block is NULL");
      return;
    }
    flatmem_swig_check(flatmem_block_function(function, flatmem_swig_reversible_function($self, block, part)));
  }

  /* flatmem_reversible_create with the blocks given. */
  void create() {
    flatmem_reversible_t *handle = NULL;
    if ($self->handle) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Reversible.create: already created");
      return;
    }
    if (flatmem_swig_check(flatmem_reversible_create(&handle, $self->blocks, $self->num_blocks, &$self->options)))
      $self->handle = handle;
  }

  int32_t num_blocks() const { return $self->num_blocks; }
  int32_t mode() const { return (int32_t)$self->options.mode; }
  int32_t num_threads() const { return $self->options.num_threads; }

  /* flatmem_reversible_last_mode: the mode the last successful backward ran. */
  int32_t last_mode() const {
    flatmem_reversible_mode mode = FLATMEM_REVERSIBLE_AUTO;
    if (flatmem_swig_reversible_ready($self)) flatmem_swig_check(flatmem_reversible_last_mode($self->handle, &mode));
    return (int32_t)mode;
  }

  size_t forward_workspace_size(const flatmem_swig_tensor *x) {
    size_t bytes = 0;
    if (flatmem_swig_reversible_ready($self))
      flatmem_swig_check(flatmem_reversible_forward_workspace_size($self->handle, flatmem_swig_dl(x), &bytes));
    return bytes;
  }
  size_t backward_workspace_size(const flatmem_swig_tensor *x) {
    size_t bytes = 0;
    if (flatmem_swig_reversible_ready($self))
      flatmem_swig_check(flatmem_reversible_backward_workspace_size($self->handle, flatmem_swig_dl(x), &bytes));
    return bytes;
  }

  /* flatmem_reversible_forward: writes y1, y2. */
  void forward(const flatmem_swig_tensor *x1, const flatmem_swig_tensor *x2, uint64_t seed,
               uint64_t offset, flatmem_swig_tensor *y1, flatmem_swig_tensor *y2,
               const flatmem_swig_tensor *workspace = NULL, int64_t stream = 0) {
    size_t workspace_bytes;
    void *ws = flatmem_swig_workspace(workspace, &workspace_bytes);
    if (!flatmem_swig_reversible_ready($self)) return;
    flatmem_swig_reversible_finish($self, flatmem_reversible_forward(
        $self->handle, flatmem_swig_dl(x1), flatmem_swig_dl(x2), seed, offset, flatmem_swig_dl_out(y1),
        flatmem_swig_dl_out(y2), ws, workspace_bytes, (void *)(intptr_t)stream));
  }

  /* flatmem_reversible_backward: writes dx1, dx2 and, when given, the rebuilt x1, x2. */
  void backward(const flatmem_swig_tensor *y1, const flatmem_swig_tensor *y2,
                const flatmem_swig_tensor *dy1, const flatmem_swig_tensor *dy2, uint64_t seed,
                uint64_t offset, flatmem_swig_tensor *dx1, flatmem_swig_tensor *dx2,
                flatmem_swig_tensor *x1 = NULL, flatmem_swig_tensor *x2 = NULL,
                const flatmem_swig_tensor *workspace = NULL, int64_t stream = 0) {
    size_t workspace_bytes;
    void *ws = flatmem_swig_workspace(workspace, &workspace_bytes);
    if (!flatmem_swig_reversible_ready($self)) return;
    flatmem_swig_reversible_finish($self, flatmem_reversible_backward(
        $self->handle, flatmem_swig_dl(y1), flatmem_swig_dl(y2), flatmem_swig_dl(dy1),
        flatmem_swig_dl(dy2), seed, offset, flatmem_swig_dl_out(dx1), flatmem_swig_dl_out(dx2),
        flatmem_swig_dl_out(x1), flatmem_swig_dl_out(x2), ws, workspace_bytes, (void *)(intptr_t)stream));
  }

  /* flatmem_reversible_rebuild_error: errors is a (num_blocks,) float64 Tensor. */
  void rebuild_error(const flatmem_swig_tensor *x1, const flatmem_swig_tensor *x2, uint64_t seed,
                     uint64_t offset, flatmem_swig_tensor *errors, int64_t stream = 0) {
    if (!flatmem_swig_reversible_ready($self)) return;
    flatmem_swig_reversible_finish($self, flatmem_reversible_rebuild_error(
        $self->handle, flatmem_swig_dl(x1), flatmem_swig_dl(x2), seed, offset,
        flatmem_swig_dl_out(errors), (void *)(intptr_t)stream));
  }
}

#ifdef SWIGPYTHON
/* Python functions as F and G. set_dispatch and set_python touch Python
 * objects or run before any call: they keep the GIL. */
%nothread flatmem_swig_reversible::set_dispatch;
%extend flatmem_swig_reversible {
  /* The one callable every Python F/G of this segment goes through (see above). */
  void set_dispatch(PyObject *dispatch) {
    if ($self->handle) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Reversible.set_dispatch: the segment is created");
      return;
    }
    if (!PyCallable_Check(dispatch)) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Reversible.set_dispatch: not callable");
      return;
    }
    {
      PyObject *old = $self->dispatch;
      Py_INCREF(dispatch);
      $self->dispatch = dispatch;
      Py_XDECREF(old);
    }
  }
  /* F (part 0) or G (part 1) of block k is a Python function: dispatch(..., function = 2k + part, ...). */
  void set_python(int32_t block, int32_t part) {
    flatmem_reversible_function *f;
    if (!flatmem_swig_reversible_slot_ok($self, block, part)) return;
    if (!$self->dispatch) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Reversible.set_python: call set_dispatch first");
      return;
    }
    f = flatmem_swig_reversible_function($self, block, part);
    f->forward = flatmem_swig_python_forward;
    f->vjp = flatmem_swig_python_vjp;
    f->residual_size = NULL;
    f->user = &$self->slots[2 * block + part];
  }
}
#endif
