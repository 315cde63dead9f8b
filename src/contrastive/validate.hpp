// Argument checks of the contrastive C API. Each throws flatmem::Error with a
// message naming the argument; none writes anything the caller owns.
#pragma once

#include <flatmem/flatmem.h>

#include "contrastive/problem.hpp"

namespace flatmem::contrastive {

Options resolve_options(const flatmem_contrastive_options *options);

// Refuses (INVALID_ARGUMENT) a sigmoid handle in a softmax entry point and a
// softmax handle in a sigmoid one; `function` names the entry point.
void check_loss_kind(const Options &options, bool sigmoid_call, const char *function);

// q, k: matrices of one accepted dtype with equal d; c = b for the symmetric
// loss. `use` = metadata_only for size queries.
void check_features(const Options &options, const DLTensor *q, const DLTensor *k, DataUse use,
                    MatrixView &q_view, MatrixView &k_view);

// A gradient matrix (dq or dk): NULL allowed (not requested), else shaped like
// `like`, fp32 or like's dtype, on like's device.
MatrixView check_gradient(const DLTensor *t, const char *name, const MatrixView &like,
                          const char *like_name, DataUse use);

// single_process also checks the label values against c (or c >= b without
// labels) and, under FLATMEM_NONFINITE_ERROR, that q and k are finite. The
// ring checks those against the global batch, together with every rank
// (src/contrastive/ring/agreement.hpp).
enum class Scope { single_process, ring };
Inputs check_inputs(const Options &options, const DLTensor *q, const DLTensor *k,
                    const DLTensor *labels, const DLTensor *logit_scale,
                    Scope scope = Scope::single_process);

// Throws FLATMEM_STATUS_NON_FINITE naming the first NaN / Inf of q or k.
void check_features_finite(const Inputs &in);

ForwardOutputs check_forward_outputs(const Inputs &in, DLTensor *loss, DLTensor *row_lse,
                                     DLTensor *col_lse);

// Under FLATMEM_NONFINITE_ERROR the saved LSE and dloss must be finite.
BackwardArgs check_backward_args(const Options &options, const Inputs &in, const DLTensor *row_lse,
                                 const DLTensor *col_lse, const DLTensor *dloss, DLTensor *dq,
                                 DLTensor *dk, DLTensor *dlogit_scale);

}  // namespace flatmem::contrastive
