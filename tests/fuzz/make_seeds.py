#!/usr/bin/env python3
"""Writes the seed corpora tests/fuzz/corpus/<target>/<case> (one file per case).

Each target's input starts with its Plan (one byte per decision, 0 = the ordinary,
valid choice; see the Plan struct at the top of the target), then mutations and values.
A seed names the plan bytes that differ from 0; the rest of the file is padding values.
Usage: python3 tests/fuzz/make_seeds.py   (rewrites the named seeds of the corpus folders)

The folders also hold regression inputs (named after what they found) and inputs
grown by long fuzzing runs and merged minimised (`-merge=1`, named by libFuzzer
after their SHA-1): only the files named like a seed below are rewritten.
"""
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
VALUES = bytes((i * 37) % 200 for i in range(400))  # element values, k / 32

# Plan field names in struct order, per target, and the seed cases: {field: byte}.
PLANS = {
    "fuzz_contrastive": ("loss dtype b c_extra d threads tile_rows tile_cols nonfinite precision "
                         "cache struct_size labels scale workspace_forward workspace_backward nan "
                         "backward_outputs gradient_dtype dloss fresh_lse null_handle").split(),
    "fuzz_sigmoid": ("loss dtype b c d threads tile_rows tile_cols nonfinite precision cache "
                     "struct_size labels scale bias nan workspace outputs gradient_dtype dloss "
                     "null_handle").split(),
    "fuzz_reversible": ("kind_f kind_g width heads hidden eps math block_size mutate_parameters "
                        "gradients callbacks num_blocks mode threads segment_size batch tokens "
                        "state_ndim workspace_forward workspace_backward nan rebuilt "
                        "fresh_outputs").split(),
    "fuzz_cyclic": ("world stages steps rule schedule_size rank stage time_step create_size "
                    "activation_bytes timeout nonfinite history null_comm run_length "
                    "gradient_dtype skip_reduce stats_first stats_count nan parameters parameter_count "
                    "shard relay_misuse").split(),
    "fuzz_cyclic_stages": ("stages micro_batches steps rule schedule_size micro_batch stage "
                           "time_step capacity create_size boundary_bytes activation_bytes timeout "
                           "history null_comm run_length gradient_dtype misuse stats_first "
                           "stats_count nan").split(),
    "fuzz_comm_id": "source address flips rank_world connect_timeout timeout struct_size".split(),
    "fuzz_comm_env": [f"choice{i}" for i in range(13)] + ["connect_timeout"],
    "fuzz_abi": "function size tail fill count".split(),
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
    "fuzz_sigmoid": {
        "siglip_fp32_b7_c7": {"b": 6, "d": 8},
        "labels_c_prime_bf16": {"labels": 1, "dtype": 1, "b": 4, "c": 12, "d": 12, "bias": 1},
        "fp16_tiles_2x5_f16_gradients": {"dtype": 2, "tile_rows": 2, "tile_cols": 2, "b": 10,
                                         "gradient_dtype": 1, "scale": 1},
        "scale_100_bias_minus_10_dloss": {"scale": 2, "bias": 1, "dloss": 3, "b": 3, "d": 2},
        "c_less_than_b_no_labels": {"c": 0x80, "b": 9},
        "nan_input": {"nan": 1},
        "propagate_nan": {"nan": 1, "nonfinite": 1},
        "nan_bias": {"bias": 5},
        "nan_dloss": {"dloss": 5},
        "workspace_exact": {"workspace": 2, "b": 5},
        "workspace_short": {"workspace": 3, "b": 5},
        "only_dlogit_bias": {"outputs": 15, "b": 2},
        "softmax_handle_refused": {"loss": 1},
        "logit_cache_refused": {"cache": 1},
        "older_struct_size": {"struct_size": 6},
        "null_handle": {"null_handle": 2},
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
        "relay_delay1_L1": {"null_comm": 0x80, "parameters": 1, "run_length": 23},
        "relay_delay1_L3_f64": {"null_comm": 0x80, "parameters": 1, "stages": 2, "steps": 2,
                                "gradient_dtype": 1, "run_length": 23},
        "relay_sync_refused": {"null_comm": 0x80, "parameters": 1, "rule": 2},
        "relay_newest_refused": {"null_comm": 0x80, "parameters": 1, "rule": 1},
        "relay_no_parameter_count": {"null_comm": 0x80, "parameters": 1, "parameter_count": 3},
        "relay_hostile_parameter_count": {"null_comm": 0x80, "parameters": 1, "parameter_count": 2},
        "relay_hostile_stage_and_rank": {"null_comm": 0x80, "parameters": 1, "relay_misuse": 1},
        "relay_unregistered_stage": {"null_comm": 0x80, "parameters": 1, "stages": 1,
                                     "relay_misuse": 3, "run_length": 5},
        "relay_skipped_parameters": {"null_comm": 0x80, "parameters": 1, "relay_misuse": 5,
                                     "run_length": 9},
        "relay_mutated_shard": {"null_comm": 0x80, "parameters": 1, "shard": 3, "run_length": 9},
        "relay_mutated_full": {"null_comm": 0x80, "parameters": 1, "shard": 2, "run_length": 9},
        "relay_stats_struct_size": {"null_comm": 0x80, "parameters": 1, "relay_misuse": 0x3e,
                                    "run_length": 9},
        "replicated_refuses_relay_calls": {"null_comm": 0x80, "parameter_count": 1, "run_length": 5},
    },
    "fuzz_cyclic_stages": {
        "schedule_L1_N1": {},
        "schedule_L4_N4_delay1": {"stages": 3, "micro_batches": 3, "steps": 2, "stage": 2, "time_step": 4},
        "schedule_L3_N7_newest": {"stages": 2, "micro_batches": 4, "steps": 3, "rule": 1, "stage": 1},
        "schedule_L2_N3_sync": {"stages": 1, "micro_batches": 2, "steps": 2, "rule": 2, "time_step": 2},
        "schedule_L5_N8_capacity_1": {"stages": 4, "micro_batches": 5, "steps": 1, "capacity": 2,
                                      "time_step": 5},
        "schedule_limits": {"stages": 7, "micro_batches": 8, "steps": 6},
        "schedule_past_limits": {"stages": 8, "micro_batches": 9, "steps": 7},
        "schedule_struct_size_0": {"schedule_size": 4},
        "runtime_N3_delay1": {"null_comm": 0x80, "micro_batches": 2, "steps": 2, "run_length": 23},
        "runtime_N5_newest_f64": {"null_comm": 0x80, "micro_batches": 3, "rule": 1, "steps": 1,
                                  "gradient_dtype": 1, "run_length": 23},
        "runtime_sync_history_1": {"null_comm": 0x80, "micro_batches": 1, "rule": 2, "history": 2,
                                   "run_length": 15},
        "runtime_skip_accumulate": {"null_comm": 0x80, "micro_batches": 1, "misuse": 7, "run_length": 9},
        "runtime_send_on_one_stage": {"null_comm": 0x80, "misuse": 3, "run_length": 5},
        "runtime_two_stages_one_rank": {"null_comm": 0x80, "stages": 1, "boundary_bytes": 1},
        "runtime_hostile_boundary": {"null_comm": 0x80, "boundary_bytes": 2, "activation_bytes": 2},
        "runtime_older_struct": {"null_comm": 0x80, "create_size": 6, "run_length": 7},
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
    # One seed per function of the target (its switch), at the library's size, a newer
    # caller's and a zero size; reads with set bytes past the library's sizeof.
    "fuzz_abi": {
        **{f"function{f}_exact": {"function": f, "count": 3} for f in range(14)},
        **{f"function{f}_newer": {"function": f, "size": 1, "fill": 0xA5, "count": 2} for f in range(14)},
        **{f"function{f}_zero_size": {"function": f, "size": 3} for f in range(14)},
        **{f"read{f}_unknown_field": {"function": f, "size": 1, "tail": 1} for f in (6, 7, 8)},
    },
}

for target, cases in SEEDS.items():
    folder = HERE / "corpus" / target
    folder.mkdir(parents=True, exist_ok=True)
    fields = PLANS[target]
    for name, choices in cases.items():
        plan = bytearray(len(fields))
        for field, value in choices.items():
            plan[fields.index(field)] = value
        (folder / name).write_bytes(bytes(plan) + b"\0" + VALUES)
