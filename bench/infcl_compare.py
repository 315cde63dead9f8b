#!/usr/bin/env python3
"""flatmem's CUDA symmetric loss against Inf-CL's Triton loss, forward + backward, bf16.

Inf-CL (PyPI: inf-cl) computes one direction per call; its authors call it twice for the
symmetric CLIP loss (image->text and text->image), which is what is timed here. flatmem is
called through its C ABI with ctypes (no binding needed): DLTensors pointing at the torch
tensors' device memory, the current torch stream, a torch-allocated workspace.

Run on a GPU machine (not run in CI):
    pip install torch triton inf-cl         # or: pip install <inf_cl wheel>
    python3 bench/infcl_compare.py --lib build/src/libflatmem.so [--d 512 768] [--b 16384 65536]
Prints, per (d, b): time of each, the ratio Inf-CL / flatmem, peak memory beyond the inputs
(torch.cuda.max_memory_allocated deltas) and the agreement of loss and gradients.
"""
import argparse
import ctypes
import math
import sys

import torch

try:
    # cal_flash_loss is what Inf-CL's cal_inf_loss runs in a single process; cal_inf_loss itself
    # wraps a scale that needs a gradient in GradientGather, whose backward all-reduces over
    # torch.distributed and so fails without a process group.
    from inf_cl import cal_flash_loss
except ImportError:  # pragma: no cover
    sys.exit("inf_cl is not installed: pip install inf-cl")


# --- flatmem through ctypes ----------------------------------------------------------------
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class Options(ctypes.Structure):  # flatmem_contrastive_options
    _fields_ = [("struct_size", ctypes.c_size_t), ("loss", ctypes.c_int), ("num_threads", ctypes.c_int32),
                ("tile_rows", ctypes.c_int32), ("tile_cols", ctypes.c_int32), ("nonfinite", ctypes.c_int),
                ("fp32_precision", ctypes.c_int64), ("comm", ctypes.c_void_p),
                ("logit_cache_bytes", ctypes.c_size_t)]


kDLCUDA, kDLFloat, kDLBfloat = 2, 2, 4
FLATMEM_NONFINITE_PROPAGATE = 1


def dl(t, keep):
    """A DLTensor for a contiguous torch CUDA tensor (shape kept alive in `keep`)."""
    shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
    keep.append(shape)
    code = kDLBfloat if t.dtype == torch.bfloat16 else kDLFloat
    bits = 16 if t.dtype in (torch.bfloat16, torch.float16) else 32
    return DLTensor(t.data_ptr(), DLDevice(kDLCUDA, t.device.index or 0), t.dim(), DLDataType(code, bits, 1),
                    shape if t.dim() else None, None, 0)


class Flatmem:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.flatmem_last_error.restype = ctypes.c_char_p
        opts = Options()
        self.check(self.lib.flatmem_contrastive_options_init(ctypes.byref(opts), ctypes.c_size_t(ctypes.sizeof(opts))))
        opts.nonfinite = FLATMEM_NONFINITE_PROPAGATE
        self.handle = ctypes.c_void_p()
        self.check(self.lib.flatmem_contrastive_create(ctypes.byref(self.handle), ctypes.byref(opts)))

    def check(self, status):
        if status != 0:
            raise RuntimeError(f"flatmem status {status}: {self.lib.flatmem_last_error().decode()}")

    def loss_and_grads(self, q, k, scale):
        keep, b, d = [], q.shape[0], q.shape[1]
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        loss = torch.empty((), device=q.device)
        row, col = torch.empty(b, device=q.device), torch.empty(b, device=q.device)
        dq, dk, ds = torch.empty_like(q), torch.empty_like(k), torch.empty((), device=q.device)
        Q, K, S = dl(q, keep), dl(k, keep), dl(scale, keep)
        L, R, C, DQ, DK, DS = (dl(t, keep) for t in (loss, row, col, dq, dk, ds))
        fb, bb = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(self.lib.flatmem_contrastive_forward_workspace_size(self.handle, ctypes.byref(Q), ctypes.byref(K),
                                                                       ctypes.byref(fb)))
        self.check(self.lib.flatmem_contrastive_backward_workspace_size(
            self.handle, ctypes.byref(Q), ctypes.byref(K), ctypes.byref(DQ), ctypes.byref(DK), ctypes.byref(bb)))
        ws = torch.empty(max(fb.value, bb.value), dtype=torch.uint8, device=q.device)
        self.check(self.lib.flatmem_contrastive_forward(
            self.handle, ctypes.byref(Q), ctypes.byref(K), None, ctypes.byref(S), ctypes.byref(L), ctypes.byref(R),
            ctypes.byref(C), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(fb.value), stream))
        self.check(self.lib.flatmem_contrastive_backward(
            self.handle, ctypes.byref(Q), ctypes.byref(K), None, ctypes.byref(S), ctypes.byref(R), ctypes.byref(C),
            None, ctypes.byref(DQ), ctypes.byref(DK), ctypes.byref(DS), ctypes.c_void_p(ws.data_ptr()),
            ctypes.c_size_t(bb.value), stream))
        return loss, dq, dk, ds


# --- Inf-CL, called twice as its authors do for the symmetric loss --------------------------
def infcl_loss_and_grads(q, k, scale):
    q = q.detach().requires_grad_(True)
    k = k.detach().requires_grad_(True)
    s = scale.detach().requires_grad_(True)
    labels = torch.arange(q.shape[0], device=q.device)
    loss = 0.5 * (cal_flash_loss(q, k, labels, scale=s).mean() + cal_flash_loss(k, q, labels, scale=s).mean())
    loss.backward()
    return loss.detach(), q.grad, k.grad, s.grad


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        out = fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return sorted(times)[len(times) // 2], out


def peak_beyond(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/src/libflatmem.so")
    ap.add_argument("--d", type=int, nargs="+", default=[768, 512])
    ap.add_argument("--b", type=int, nargs="+", default=[16384, 65536, 262144])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    fm = Flatmem(args.lib)
    print(f"device: {torch.cuda.get_device_name()}; symmetric loss fwd+bwd, bf16, s = 14.3")
    print(f"{'d':>5} {'b':>7} | {'flatmem s':>10} {'TFLOP/s':>8} {'MiB':>8} | {'Inf-CL x2 s':>11} {'MiB':>8} | "
          f"{'InfCL/fm':>8} | {'|dloss|':>9} {'max|ddq|/max|dq|':>17}")
    for d in args.d:
        for b in args.b:
            torch.manual_seed(0)
            q = torch.nn.functional.normalize(torch.randn(b, d, device="cuda"), dim=-1).to(torch.bfloat16)
            k = torch.nn.functional.normalize(torch.randn(b, d, device="cuda"), dim=-1).to(torch.bfloat16)
            scale = torch.tensor(14.3, device="cuda")
            t_fm, out_fm = timed(lambda: fm.loss_and_grads(q, k, scale), args.reps)
            m_fm = peak_beyond(lambda: fm.loss_and_grads(q, k, scale))
            try:
                t_ic, out_ic = timed(lambda: infcl_loss_and_grads(q, k, scale), args.reps)
                m_ic = peak_beyond(lambda: infcl_loss_and_grads(q, k, scale))
            except Exception as e:  # e.g. out of memory, or Inf-CL's head_dim rule
                print(f"{d:>5} {b:>7} | Inf-CL failed: {e}")
                continue
            tflops = 8 * b * b * d / t_fm / 1e12
            dloss = abs(out_fm[0].item() - out_ic[0].item())
            ddq = (out_fm[1].float() - out_ic[1].float()).abs().max().item() / out_ic[1].float().abs().max().item()
            print(f"{d:>5} {b:>7} | {t_fm:>10.4f} {tflops:>8.1f} {m_fm:>8.1f} | {t_ic:>11.4f} {m_ic:>8.1f} | "
                  f"{t_ic / t_fm:>8.2f} | {dloss:>9.2e} {ddq:>17.2e}")


if __name__ == "__main__":
    main()
