#!/usr/bin/env python3
"""Writes the seed corpora tests/fuzz/corpus/<target>/<case> (one file per case).

Each target's input starts with its Plan (one byte per decision, 0 = the ordinary,
valid choice; see the Plan struct at the top of the target), then mutations and values.
A seed names the plan bytes that differ from 0; the rest of the file is padding values.
Usage: python3 tests/fuzz/make_seeds.py   (rewrites the corpus folders)
"""
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
VALUES = bytes((i * 37) % 200 for i in range(400))  # element values, k / 32

# Plan field names in struct order, per target, and the seed cases: {field: byte}.
PLANS = {
    "fuzz_contrastive": ("loss dtype b c_extra d threads tile_rows tile_cols nonfinite precision "
                         "cache struct_size labels scale workspace_forward workspace_backward nan "
                         "backward_outputs gradient_dtype dloss fresh_lse null_handle").split(),
    "fuzz_reversible": ("kind_f kind_g width heads hidden eps math block_size mutate_parameters "
                        "gradients callbacks num_blocks mode threads segment_size batch tokens "
                        "state_ndim workspace_forward workspace_backward nan rebuilt "
                        "fresh_outputs").split(),
    "fuzz_cyclic": ("world stages steps rule schedule_size rank stage time_step create_size "
                    "activation_bytes timeout nonfinite history null_comm run_length "
                    "gradient_dtype skip_reduce stats_first stats_count nan").split(),
    "fuzz_comm_id": "source address flips rank_world connect_timeout timeout struct_size".split(),
    "fuzz_comm_env": [f"choice{i}" for i in range(13)] + ["connect_timeout"],
}
SEEDS = {
    "fuzz_contrastive": {
        "symmetric_fp32": {"b": 7, "d": 9},
        "infonce_labels_bf16": {"loss": 1, "dtype": 1, "labels": 1, "b": 5, "c_extra": 3},
        "fp16_tiles_2x5_cache": {"dtype": 2, "tile_rows": 2, "tile_cols": 2, "cache": 1, "b": 11},
        "nan_input": {"nan": 1},
        "propagate_nan": {"nan": 1, "nonfinite": 1},
        "workspace_exact_and_short": {"workspace_forward": 2, "workspace_backward": 3},
        "older_struct_size": {"struct_size": 6},
        "null_handle": {"null_handle": 2},
        "scale_zero": {"scale": 3},
    },
    "fuzz_reversible": {
        "attention_mlp_2_blocks": {},
        "overlapped_3_threads": {"mode": 3, "threads": 3, "num_blocks": 2},
        "standard_rebuilt": {"mode": 1, "rebuilt": 1},
        "heads_2_tokens_5": {"heads": 2, "tokens": 4, "batch": 2},
        "callbacks_failing_g": {"callbacks": 0x13},
        "null_forward_callback": {"callbacks": 0x23},
        "workspace_short": {"workspace_forward": 3, "workspace_backward": 3},
        "forward_only_block": {"gradients": 3},
    },
    "fuzz_cyclic": {
        "schedule_4x3x2": {"world": 3, "stages": 2, "steps": 1},
        "schedule_newest": {"world": 1, "stages": 3, "steps": 3, "rule": 1},
        "schedule_sync": {"world": 4, "rule": 2, "rank": 3},
        "runtime_delay1": {"null_comm": 0x80, "stages": 1, "run_length": 20},
        "runtime_newest_f64": {"null_comm": 0x80, "rule": 1, "gradient_dtype": 1, "run_length": 23},
        "runtime_skip_reduce": {"null_comm": 0x80, "skip_reduce": 7, "run_length": 9},
        "runtime_nan": {"null_comm": 0x80, "nan": 1, "run_length": 9},
    },
    "fuzz_comm_id": {
        "made_id_world_1": {},
        "made_id_rank_1_of_2": {"rank_world": 1},
        "flipped_id": {"flips": 2},
        "stamped_random_id": {"source": 0x81},
        "ipv6_listener": {"address": 3},
    },
    "fuzz_comm_env": {
        "flatmem_variables": {},
        "open_mpi_variables": {"choice1": 1, "choice2": 1, "choice3": 2, "choice4": 2},
        "torchrun_variables": {"choice1": 1, "choice2": 1, "choice9": 2, "choice10": 2},
        "no_coordinator": {"choice0": 1},
        "bad_timeout_variable": {"choice12": 3},
    },
}

for target, cases in SEEDS.items():
    folder = HERE / "corpus" / target
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    fields = PLANS[target]
    for name, choices in cases.items():
        plan = bytearray(len(fields))
        for field, value in choices.items():
            plan[fields.index(field)] = value
        (folder / name).write_bytes(bytes(plan) + b"\0" + VALUES)
