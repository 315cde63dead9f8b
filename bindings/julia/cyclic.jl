# cyclic.jl -- cyclic data parallelism (flatmem/cyclic.h), included by Flatmem.jl.
#
# The schedule queries are pure C functions (no handle, thread-safe):
# cyclic_schedule, cyclic_offset, cyclic_delay, cyclic_length, cyclic_action.
# The runtime, `Cyclic`, runs a rank's schedule over a `Comm` (comm.jl):
# cyclic_next!, cyclic_reduce!, cyclic_reduce_stream!, cyclic_stats, cyclic_summary. Ranks, stages,
# steps and time steps are 0-based, as the C API counts them.

"""`flatmem_cyclic_schedule`: N ranks, L stages, training steps, rule; make one with `cyclic_schedule`."""
CyclicSchedule

"""
`flatmem_cyclic_action`: what one rank does in one time step (`cyclic_action`). `kind` is a
`FLATMEM_CYCLIC_*` action kind (`action_kind` gives it as a Symbol); `stage`, `step`, `phase`
and `update_stage`/`update_step` are 0-based, -1 when there is none.
"""
CyclicAction

"""
`flatmem_cyclic_relay_time_step`: the ZeRO relay in one time step (`cyclic_relay_stats`): parameter
bytes held (measured, and by the protocol) and relay bytes sent.
"""
CyclicRelayTimeStep

"""`flatmem_cyclic_relay_summary`: shard, replica and staging bytes, peaks and relay totals (`cyclic_relay_summary`)."""
CyclicRelaySummary

"""
`flatmem_cyclic_time_step_stats`: what happened in one time step of this rank (`cyclic_stats`).
`kind` is a `FLATMEM_CYCLIC_*` action kind; `stage`/`step` 0-based (-1: none); `activation_bytes`
of the activations held; `bytes_sent` measured (timing-dependent), `bytes_scheduled` the same bytes
in the time step the protocol assigns them to; `seconds` from this time step's `cyclic_next!` to
the next one's (0 for the current one), `wait_seconds` of it spent waiting in `cyclic_next!`.
"""
CyclicTimeStepStats

"""`flatmem_cyclic_summary`: totals since the `Cyclic` was created (`cyclic_summary`); seconds are wall-clock."""
CyclicSummary

const CYCLIC_PARAMETERS = (replicated = FLATMEM_CYCLIC_PARAMETERS_REPLICATED, relayed = FLATMEM_CYCLIC_PARAMETERS_RELAYED)
const CYCLIC_MEMORY = (host = FLATMEM_CYCLIC_MEMORY_HOST, cuda = FLATMEM_CYCLIC_MEMORY_CUDA)
const CYCLIC_RULES = (delay1 = FLATMEM_CYCLIC_DELAY1, newest = FLATMEM_CYCLIC_NEWEST, sync = FLATMEM_CYCLIC_SYNC)
const CYCLIC_KINDS = (idle = FLATMEM_CYCLIC_IDLE, forward = FLATMEM_CYCLIC_FORWARD,
                      backward = FLATMEM_CYCLIC_BACKWARD, done = FLATMEM_CYCLIC_DONE)

function cyclic_rule(rule::Symbol)
    haskey(CYCLIC_RULES, rule) || throw(ArgumentError("rule must be one of $(keys(CYCLIC_RULES)), not :$rule"))
    return CYCLIC_RULES[rule]
end

# An options array given as integers: `nothing`, or exactly `count` Int64s (copied by create).
function int64_entries(values::Union{Nothing,AbstractVector{<:Integer}}, count::Integer, name::String, meaning::String)
    values === nothing && return nothing
    length(values) == count || throw(ArgumentError("$name has $(length(values)) entries; expected $count ($meaning)"))
    return Vector{Int64}(values)
end

"""
    cyclic_schedule(world_size, stages, steps; rule=:delay1) -> CyclicSchedule

The schedule of `world_size` ranks training a model of `stages` stages for `steps` steps;
`rule` is `:delay1`, `:newest` or `:sync` (see cyclic.h). The library checks the ranges
(a `FlatmemError` naming the field, e.g. `schedule.world_size: 0; expected 1 .. 1048576`).
"""
function cyclic_schedule(world_size::Integer, stages::Integer, steps::Integer; rule::Symbol=:delay1)
    s = CyclicSchedule(Csize_t(sizeof(CyclicSchedule)), Int32(world_size), Int32(stages), Int64(steps), cyclic_rule(rule),
                       Int32(0))
    cyclic_length(s)   # checks the schedule
    return s
end

"""`cyclic_offset(s, rank) -> Int`: time steps rank `rank` (0-based) starts after rank 0."""
function cyclic_offset(s::CyclicSchedule, rank::Integer)
    offset = Ref{Int64}(0)
    check(ccall((:flatmem_cyclic_schedule_offset, libflatmem), Cint,
                (Ref{CyclicSchedule}, Int32, Ref{Int64}), s, Int32(rank), offset))
    return Int(offset[])
end

"""`cyclic_delay(s, rank, stage) -> Int`: 0 or 1; step t's average reaches `stage` before its forward in step t + 1 + delay."""
function cyclic_delay(s::CyclicSchedule, rank::Integer, stage::Integer)
    delay = Ref{Int32}(0)
    check(ccall((:flatmem_cyclic_schedule_delay, libflatmem), Cint,
                (Ref{CyclicSchedule}, Int32, Int32, Ref{Int32}), s, Int32(rank), Int32(stage), delay))
    return Int(delay[])
end

"""`cyclic_length(s) -> Int`: global time steps until every rank is done (its last update included)."""
function cyclic_length(s::CyclicSchedule)
    time_steps = Ref{Int64}(0)
    check(ccall((:flatmem_cyclic_schedule_length, libflatmem), Cint,
                (Ref{CyclicSchedule}, Ref{Int64}), s, time_steps))
    return Int(time_steps[])
end

"""
    cyclic_action(s, rank, time_step) -> CyclicAction

What rank `rank` does at global time step `time_step` (both 0-based; `FLATMEM_CYCLIC_DONE` at
and after `cyclic_length(s)`).
"""
function cyclic_action(s::CyclicSchedule, rank::Integer, time_step::Integer)
    action = Ref{CyclicAction}()
    check(ccall((:flatmem_cyclic_schedule_action, libflatmem), Cint,
                (Ref{CyclicSchedule}, Int32, Int64, Ref{CyclicAction}, Csize_t),
                s, Int32(rank), Int64(time_step), action, Csize_t(sizeof(CyclicAction))))
    return action[]
end

"""`action_kind(a::CyclicAction) -> Symbol`: `:idle`, `:forward`, `:backward` or `:done`."""
action_kind(a::CyclicAction) = enum_symbol(CYCLIC_KINDS, a.kind, "action kind")

# ---------------------------------------------------------------------------
# The runtime
# ---------------------------------------------------------------------------

"""
    Cyclic(comm::Comm, stages, steps; rule=:delay1, activation_bytes=nothing, timeout_ms=0,
           propagate_nonfinite=false, history=0, parameters=:replicated, parameter_count=nothing,
           memory=:host)

This rank's cyclic data-parallel runtime over `comm` (`flatmem_cyclic_create`; collective: every
rank passes the same `stages`, `steps` and `rule`, checked, a `FlatmemError` on every rank naming
the first that differs). `activation_bytes` (`stages` non-negative integers, copied) are the bytes
of activations stage j keeps for its backward, for the statistics only (`nothing` = 1 per stage).
`timeout_ms` bounds every wait (0 = the communicator's default). Gradients are scanned for
NaN/Inf (a `FlatmemError` with `FLATMEM_STATUS_NON_FINITE` that poisons the communicator) unless
`propagate_nonfinite`. `history`: time steps of statistics kept (0 = 65536). `parameters = :relayed`
(the ZeRO relay, `:delay1` only) with `parameter_count` (the elements of each stage): rank k keeps
shard k of every stage (`cyclic_set_shard!`) and gets the full stage before each forward and backward
from the relay (`cyclic_parameters!`); see "ZeRO relay" in cyclic.h. `memory = :cuda` takes device
gradients instead of Arrays (kDLCUDA buffers on the communicator's device, averaged over NCCL,
handed over with `cyclic_reduce_stream!`; relayed shards and full stages too, through
`cyclic_set_shard_stream!` / `cyclic_parameters_stream!`): every rank calls
`init_device(comm, device)` first (else a `FlatmemError` naming `options.memory` on every rank);
`FLATMEM_STATUS_UNSUPPORTED` with `parameters = :relayed` over N > 2L ranks or from a flatmem
built without NCCL. Every rank passes the same.

Drive it from one task, one time step per `cyclic_next!`:

    h = Cyclic(comm, L, steps; rule=:newest)
    while true
        a = cyclic_next!(h)                       # may wait (start token, averaged gradients)
        action_kind(a) === :done && break
        if a.update_stage >= 0                    # the buffer handed over for (update_stage,
            optimizer_step!(a.update_stage, grad[a.update_stage + 1][a.update_step % 2 + 1])  # update_step) holds the average
        end
        action_kind(a) === :forward && model_forward!(a.stage, batch(a.step))
        if action_kind(a) === :backward
            g = grad[a.stage + 1][a.step % 2 + 1]  # two buffers per stage, alternating on the step's parity
            model_backward!(a.stage, g)
            cyclic_reduce!(h, a.stage, g)         # hands g over until its update comes back
        end
    end
    close(h)

The average of each step is Σ_r g_r / N (summed in rank order, then scaled: the same bits on
every rank). A gradient array handed to `cyclic_reduce!` belongs to the runtime until the
`cyclic_next!` that returns its update: the `Cyclic` keeps a reference to it (so the GC cannot
take it) and it must not be read or written meanwhile. The `Cyclic` also keeps `comm` open (its
`close` is refused, its finalizer waits) until `close(h)`. One `Cyclic` per communicator at a time.
"""
mutable struct Cyclic
    ptr::Ptr{CyclicHandle}
    comm::Comm
    last::CyclicAction                              # the action of the current time step
    in_flight::Dict{Tuple{Int,Int},Tensor}         # (stage, step) -> gradient handed over, until its update
    shards::Dict{Int,Tensor}                         # relayed: stage -> registered shard (read inside next)

    function Cyclic(comm::Comm, stages::Integer, steps::Integer; rule::Symbol=:delay1,
                    activation_bytes::Union{Nothing,AbstractVector{<:Integer}}=nothing, timeout_ms::Integer=0,
                    propagate_nonfinite::Bool=false, history::Integer=0, parameters::Symbol=:replicated,
                    parameter_count::Union{Nothing,AbstractVector{<:Integer}}=nothing, memory::Symbol=:host)
        ensure_open(comm)
        rule_value = cyclic_rule(rule)
        nstages = int32_arg(stages, "stages")
        timeout_ms >= 0 || throw(ArgumentError("timeout_ms = $timeout_ms; expected >= 0 (0 = the communicator's default)"))
        history >= 0 || throw(ArgumentError("history = $history; expected >= 0 (0 = 65536 time steps)"))
        haskey(CYCLIC_PARAMETERS, parameters) ||
            throw(ArgumentError("parameters must be one of $(keys(CYCLIC_PARAMETERS)), not :$parameters"))
        haskey(CYCLIC_MEMORY, memory) || throw(ArgumentError("memory must be one of $(keys(CYCLIC_MEMORY)), not :$memory"))
        bytes = int64_entries(activation_bytes, stages, "activation_bytes", "one per stage")
        counts = int64_entries(parameter_count, stages, "parameter_count", "the elements of each stage")
        null = Ptr{Int64}(C_NULL)
        options = Ref{CyclicOptions}()
        check(ccall((:flatmem_cyclic_options_init, libflatmem), Cint, (Ref{CyclicOptions}, Csize_t),
                    options, Csize_t(sizeof(CyclicOptions))))
        out = Ref{Ptr{CyclicHandle}}(C_NULL)
        status = GC.@preserve comm bytes counts begin
            options[] = CyclicOptions(options[].struct_size, nstages, Int32(0), Int64(steps), rule_value, Int32(0),
                                      bytes === nothing ? null : pointer(bytes), Int64(timeout_ms),
                                      propagate_nonfinite ? FLATMEM_NONFINITE_PROPAGATE : FLATMEM_NONFINITE_ERROR,
                                      Int32(0), Int64(history), CYCLIC_PARAMETERS[parameters], Int32(0),
                                      counts === nothing ? null : pointer(counts), CYCLIC_MEMORY[memory], Int32(0))
            @gc_safe ccall((:flatmem_cyclic_create, libflatmem), Cint,
                           (Ref{Ptr{CyclicHandle}}, Ptr{CommHandle}, Ref{CyclicOptions}), out, comm, options)
        end
        check(status)
        comm.users += 1
        none = CyclicAction(-1, FLATMEM_CYCLIC_IDLE, -1, -1, -1, 0, -1, 0, -1)
        h = new(out[], comm, none, Dict{Tuple{Int,Int},Tensor}(), Dict{Int,Tensor}())
        finalizer(destroy_quietly, h)
        return h
    end
end

Base.unsafe_convert(::Type{Ptr{CyclicHandle}}, h::Cyclic) = h.ptr
Base.isopen(h::Cyclic) = h.ptr != C_NULL

function Base.show(io::IO, h::Cyclic)
    print(io, "Flatmem.Cyclic(rank ", h.comm.rank, " of ", h.comm.world_size, isopen(h) ? ")" : ", closed)")
end

function ensure_open(h::Cyclic)
    isopen(h) || throw(ArgumentError("this Flatmem.Cyclic is closed"))
    return h
end

# flatmem_cyclic_destroy once (its threads stop: the gradients in flight are the
# caller's again), then lets go of the communicator; returns the status.
function destroy(h::Cyclic)
    handle = h.ptr
    h.ptr = Ptr{CyclicHandle}(C_NULL)
    handle == C_NULL && return FLATMEM_STATUS_SUCCESS
    status = @gc_safe ccall((:flatmem_cyclic_destroy, libflatmem), Cint, (Ptr{CyclicHandle},), handle)
    empty!(h.in_flight)
    empty!(h.shards)
    release_user(h.comm)
    return status
end

destroy_quietly(h::Cyclic) = (destroy(h); nothing)

"""
    close(h::Cyclic)

Release the runtime (`flatmem_cyclic_destroy`). Local and quick once the schedule ran to `:done`
(or nothing is in flight); otherwise the reductions in flight cannot finish without this rank, so
the communicator is poisoned (the peers fail naming this rank). Idempotent.
"""
Base.close(h::Cyclic) = check(destroy(h))

"""
    cyclic_next!(h::Cyclic) -> CyclicAction

Advance to the next time step and return what to do in it (`flatmem_cyclic_next`). Waits, at
most the handle's timeout each, for the start token of rank - 1 (at the first forward) and for
the averaged gradient of the action's update: on return the array handed over for
`(update_stage, update_step)` holds the average, and is the caller's again. After the last time
step `action_kind(a) === :done` (again on every later call). A previous `:backward` whose
gradient was not handed over is a `FlatmemError` (`INVALID_ARGUMENT`) without advancing.
"""
function cyclic_next!(h::Cyclic)
    ensure_open(h)
    action = Ref{CyclicAction}()
    status = @gc_safe ccall((:flatmem_cyclic_next, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicAction}, Csize_t),
                            h, action, Csize_t(sizeof(CyclicAction)))
    check(status)
    a = action[]
    h.last = a
    if a.update_stage >= 0
        delete!(h.in_flight, (Int(a.update_stage), Int(a.update_step)))   # the runtime is done with it
    end
    return a
end

"""
    cyclic_reduce!(h::Cyclic, stage, gradient) -> gradient

Hand over the gradient of `stage` (0-based) computed in the current time step, which must be
that stage's `:backward` (once) (`flatmem_cyclic_reduce`). `gradient`: a dense `Array{Float32}`
or `Array{Float64}`, at least one element, the same element type and length on every rank.
Returns at once; the reduction runs in the background. Until the `cyclic_next!` that returns
its update the array belongs to the runtime (kept alive by `h`; do not read or write it); it
then holds the average over the ranks. Under the default NaN/Inf scan a non-finite gradient is
a `FlatmemError` (`FLATMEM_STATUS_NON_FINITE`, naming stage, step and element; the array is
untouched) and poisons the communicator.
"""
function cyclic_reduce!(h::Cyclic, stage::Integer, gradient::AbstractArray)
    hand_over!(h, stage, gradient_tensor(ensure_open(h), gradient), nothing)
    return gradient
end

"""
    cyclic_reduce_stream!(h::Cyclic, stage, data::Ptr{Float32 or Float64}, len, cuda_device, stream::Ptr{Cvoid})
    cyclic_reduce_stream!(h::Cyclic, stage, gradient::Array, stream::Ptr{Cvoid}) -> gradient

`cyclic_reduce!` for a gradient computed on the CUDA `stream` (a `cudaStream_t`; `C_NULL` = the
legacy default stream), `flatmem_cyclic_reduce_stream`: the runtime records an event on the
stream and its chain reads the gradient after the work enqueued there so far (no host wait
here). With `memory = :cuda` the gradient is `len` elements at the device pointer `data` on CUDA
device `cuda_device` (the communicator's; this binding has no device arrays of its own, so the
caller vouches for the memory): it belongs to the runtime until the `cyclic_next!` that returns
its update, which then holds the average in device memory. Under the default NaN/Inf scan a
non-finite device gradient is found by the chain: the `FlatmemError` (`NON_FINITE`) comes from
the next `cyclic_next!`. The stream is ignored for an `Array` (host memory); a gradient of the
other kind than the runtime's `memory` is a `FlatmemError` (`INVALID_ARGUMENT`) naming
`options.memory`.
"""
function cyclic_reduce_stream!(h::Cyclic, stage::Integer, data::Ptr{T}, len::Integer, cuda_device::Integer,
                               stream::Ptr{Cvoid}) where {T<:Union{Float32,Float64}}
    hand_over!(ensure_open(h), stage, device_vector_tensor(data, len, cuda_device, dl_dtype(T)), stream)
    return nothing
end

# `len` elements at the device pointer `data` on CUDA device `cuda_device`, as a compact kDLCUDA
# vector of `dtype`. This binding has no device arrays of its own: the caller vouches for the
# memory, which nothing here reads.
function device_vector_tensor(data::Ptr, len::Integer, cuda_device::Integer, dtype::DLDataType)
    len >= 0 || throw(ArgumentError("len = $len; expected >= 0 elements"))
    shape = Int64[len]
    device = DLDevice(kDLCUDA, int32_arg(cuda_device, "cuda_device"))
    dl = DLTensor(Ptr{Cvoid}(data), device, Cint(1), dtype, pointer(shape), Ptr{Int64}(C_NULL), UInt64(0))
    return Tensor(Ref(dl), shape, Int64[], nothing)
end

function cyclic_reduce_stream!(h::Cyclic, stage::Integer, gradient::AbstractArray, stream::Ptr{Cvoid})
    hand_over!(h, stage, gradient_tensor(ensure_open(h), gradient), stream)
    return gradient
end

# A host gradient as its Tensor, or an ArgumentError.
function gradient_tensor(::Cyclic, gradient::AbstractArray)
    gradient isa Union{Array{Float32},Array{Float64}} || throw(ArgumentError(
        "gradient must be a dense Array{Float32} or Array{Float64} (the runtime reads and overwrites it in place); got $(typeof(gradient))"))
    return array_tensor(gradient)
end

# flatmem_cyclic_reduce (stream nothing) or _reduce_stream; an accepted gradient stays in
# h.in_flight (its memory and its DLTensor's shape) until its update comes back.
function hand_over!(h::Cyclic, stage::Integer, t::Tensor, stream::Union{Nothing,Ptr{Cvoid}})
    s = int32_arg(stage, "stage")
    status = GC.@preserve t stream begin
        if stream === nothing
            ccall((:flatmem_cyclic_reduce, libflatmem), Cint, (Ptr{CyclicHandle}, Int32, Ptr{DLTensor}), h, s, tensor_ptr(t))
        else
            ccall((:flatmem_cyclic_reduce_stream, libflatmem), Cint, (Ptr{CyclicHandle}, Int32, Ptr{DLTensor}, Ptr{Cvoid}),
                  h, s, tensor_ptr(t), stream)
        end
    end
    check(status)
    h.in_flight[(Int(stage), Int(h.last.step))] = t   # accepted: stage's backward of the current step
    return nothing
end

"""`cyclic_schedule(h::Cyclic) -> CyclicSchedule`: the runtime's schedule (world size, stages, steps, rule)."""
function cyclic_schedule(h::Cyclic)
    schedule = Ref{CyclicSchedule}()
    check(ccall((:flatmem_cyclic_get_schedule, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicSchedule}, Csize_t),
                ensure_open(h), schedule, Csize_t(sizeof(CyclicSchedule))))
    return schedule[]
end

"""`cyclic_summary(h::Cyclic) -> CyclicSummary`: totals since create (`flatmem_cyclic_summary_get`)."""
function cyclic_summary(h::Cyclic)
    summary = Ref{CyclicSummary}()
    check(ccall((:flatmem_cyclic_summary_get, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicSummary}, Csize_t),
                ensure_open(h), summary, Csize_t(sizeof(CyclicSummary))))
    return summary[]
end

# How many time steps a stats query asks for: `count`, or every one begun from `first` on.
function stats_count(first::Integer, count::Union{Nothing,Integer}, begun::Integer)
    first >= 0 || throw(ArgumentError("first = $first; expected >= 0"))
    n = count === nothing ? max(begun - first, 0) : Int64(count)
    n >= 0 || throw(ArgumentError("count = $count; expected >= 0"))
    return n
end

"""
    cyclic_stats(h::Cyclic; first=0, count=nothing) -> Vector{CyclicTimeStepStats}

Statistics of time steps `first .. first + count - 1` (0-based global time steps) that are still
kept (the most recent `history` begun so far) (`flatmem_cyclic_stats`); `count = nothing` asks
for all begun so far. Check `time_step` of the first element: older ones may be gone.
"""
function cyclic_stats(h::Cyclic; first::Integer=0, count::Union{Nothing,Integer}=nothing)
    n = stats_count(first, count, cyclic_summary(ensure_open(h)).time_steps)
    stats = Vector{CyclicTimeStepStats}(undef, n)
    written = Ref{Int64}(0)
    status = GC.@preserve stats begin
        ccall((:flatmem_cyclic_stats, libflatmem), Cint,
              (Ptr{CyclicHandle}, Int64, Int64, Ptr{CyclicTimeStepStats}, Csize_t, Ref{Int64}),
              h, Int64(first), Int64(n), pointer(stats), Csize_t(sizeof(CyclicTimeStepStats)), written)
    end
    check(status)
    return resize!(stats, written[])
end

# ---------------------------------------------------------------------------
# The ZeRO relay of the runtime (parameters = :relayed)
# ---------------------------------------------------------------------------

# A dense Float32 / Float64 Array as its Tensor (relayed shards and full stages; the stage
# runtime's accumulate and average), or an ArgumentError.
function float_tensor(A::AbstractArray, name::String)
    A isa Union{Array{Float32},Array{Float64}} ||
        throw(ArgumentError("$name must be a dense Array{Float32} or Array{Float64}; got $(typeof(A))"))
    return array_tensor(A)
end

"""
    cyclic_set_shard!(h::Cyclic, stage, shard::Array{Float32 or Float64}) -> shard

Register this rank's shard of `stage` (`flatmem_cyclic_set_shard`): exactly the elements of
`cyclic_shard_range(h, stage)` (possibly none), version 0 at the first `cyclic_next!`. The runtime
reads it inside `cyclic_next!` (it sends copies), so `h` keeps it alive; update it in place at the
stage's update actions with the average's shard range.
"""
function cyclic_set_shard!(h::Cyclic, stage::Integer, shard::AbstractArray)
    register_shard!(ensure_open(h), stage, float_tensor(shard, "shard"), nothing)
    return shard
end

"""
    cyclic_set_shard_stream!(h::Cyclic, stage, data::Ptr{Float32 or Float64}, len, cuda_device, stream::Ptr{Cvoid})
    cyclic_set_shard_stream!(h::Cyclic, stage, shard::Array, stream::Ptr{Cvoid}) -> shard

`cyclic_set_shard!` with the CUDA `stream` (a `cudaStream_t`; `C_NULL` = the legacy default
stream) the shard is updated on, `flatmem_cyclic_set_shard_stream`: the runtime's copies of the
shard (for rank 0's gathers) are enqueued on it inside `cyclic_next!`, between the caller's
updates. With `memory = :cuda` the shard is `len` elements at the device pointer `data` on CUDA
device `cuda_device` (the communicator's; the caller vouches for the memory, which must stay
allocated, and be written only by work ordered on `stream`, until the shard is registered again
or the runtime is closed). The stream is ignored for an `Array` (host memory); a shard of the
other kind than the runtime's `memory` is a `FlatmemError` (`INVALID_ARGUMENT`) naming
`options.memory`, and nothing is registered.
"""
function cyclic_set_shard_stream!(h::Cyclic, stage::Integer, data::Ptr{T}, len::Integer, cuda_device::Integer,
                                  stream::Ptr{Cvoid}) where {T<:Union{Float32,Float64}}
    register_shard!(ensure_open(h), stage, device_vector_tensor(data, len, cuda_device, dl_dtype(T)), stream)
    return nothing
end

function cyclic_set_shard_stream!(h::Cyclic, stage::Integer, shard::AbstractArray, stream::Ptr{Cvoid})
    register_shard!(ensure_open(h), stage, float_tensor(shard, "shard"), stream)
    return shard
end

# flatmem_cyclic_set_shard (stream nothing) or _set_shard_stream; a registered shard stays in
# h.shards (a host Array's memory, and the Tensor's shape) until it is registered again.
function register_shard!(h::Cyclic, stage::Integer, t::Tensor, stream::Union{Nothing,Ptr{Cvoid}})
    s = int32_arg(stage, "stage")
    status = GC.@preserve t stream begin
        if stream === nothing
            ccall((:flatmem_cyclic_set_shard, libflatmem), Cint, (Ptr{CyclicHandle}, Int32, Ptr{DLTensor}), h, s, tensor_ptr(t))
        else
            ccall((:flatmem_cyclic_set_shard_stream, libflatmem), Cint, (Ptr{CyclicHandle}, Int32, Ptr{DLTensor}, Ptr{Cvoid}),
                  h, s, tensor_ptr(t), stream)
        end
    end
    check(status)
    h.shards[Int(stage)] = t
    return nothing
end

"""
    cyclic_shard_range(h::Cyclic, stage, rank=h.comm.rank) -> UnitRange

The 1-based Julia range of `stage`'s elements that `rank` (0-based) owns (`flatmem_cyclic_shard_range`:
c = ceil(n_j / N), the 0-based [min(rank c, n_j), min((rank + 1) c, n_j)), possibly empty).
"""
function cyclic_shard_range(h::Cyclic, stage::Integer, rank::Integer=h.comm.rank)
    begin_ = Ref{Int64}(0)
    end_ = Ref{Int64}(0)
    check(ccall((:flatmem_cyclic_shard_range, libflatmem), Cint, (Ptr{CyclicHandle}, Int32, Int32, Ref{Int64}, Ref{Int64}),
                ensure_open(h), int32_arg(stage, "stage"), int32_arg(rank, "rank"), begin_, end_))
    return (Int(begin_[]) + 1):Int(end_[])
end

"""
    cyclic_parameters!(h::Cyclic, full::Array{Float32 or Float64}) -> full

During a `:forward` or `:backward`, once: wait (at most the timeout) for the relay of the action's
stage and copy its full parameters (version max(0, step - 1), n_j elements) into `full`
(`flatmem_cyclic_parameters`); written only on success.
"""
function cyclic_parameters!(h::Cyclic, full::AbstractArray)
    relay_parameters(ensure_open(h), float_tensor(full, "full"), nothing)
    return full
end

"""
    cyclic_parameters_stream!(h::Cyclic, data::Ptr{Float32 or Float64}, len, cuda_device, stream::Ptr{Cvoid})
    cyclic_parameters_stream!(h::Cyclic, full::Array, stream::Ptr{Cvoid}) -> full

`cyclic_parameters!` for `memory = :cuda` (`flatmem_cyclic_parameters_stream`): waits on the host
(at most the timeout) for the relay, then enqueues the copy of the full stage into `len` elements
at the device pointer `data` on CUDA device `cuda_device` on the CUDA `stream` (`C_NULL` = the
legacy default stream); the memory must stay allocated until the copy ran there. The stream is
ignored for an `Array`; a `full` of the other kind than the runtime's `memory` is a
`FlatmemError` (`INVALID_ARGUMENT`) naming `options.memory`, and nothing is written.
"""
function cyclic_parameters_stream!(h::Cyclic, data::Ptr{T}, len::Integer, cuda_device::Integer,
                                   stream::Ptr{Cvoid}) where {T<:Union{Float32,Float64}}
    relay_parameters(ensure_open(h), device_vector_tensor(data, len, cuda_device, dl_dtype(T)), stream)
    return nothing
end

function cyclic_parameters_stream!(h::Cyclic, full::AbstractArray, stream::Ptr{Cvoid})
    relay_parameters(ensure_open(h), float_tensor(full, "full"), stream)
    return full
end

# flatmem_cyclic_parameters (stream nothing) or _parameters_stream: both wait for the relay.
function relay_parameters(h::Cyclic, t::Tensor, stream::Union{Nothing,Ptr{Cvoid}})
    status = GC.@preserve t stream begin
        if stream === nothing
            @gc_safe ccall((:flatmem_cyclic_parameters, libflatmem), Cint, (Ptr{CyclicHandle}, Ptr{DLTensor}), h, tensor_ptr(t))
        else
            @gc_safe ccall((:flatmem_cyclic_parameters_stream, libflatmem), Cint,
                           (Ptr{CyclicHandle}, Ptr{DLTensor}, Ptr{Cvoid}), h, tensor_ptr(t), stream)
        end
    end
    return check(status)
end

"""`cyclic_relay_summary(h::Cyclic) -> CyclicRelaySummary` (`flatmem_cyclic_relay_summary_get`)."""
function cyclic_relay_summary(h::Cyclic)
    summary = Ref{CyclicRelaySummary}()
    check(ccall((:flatmem_cyclic_relay_summary_get, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicRelaySummary}, Csize_t),
                ensure_open(h), summary, Csize_t(sizeof(CyclicRelaySummary))))
    return summary[]
end

"""
    cyclic_relay_stats(h::Cyclic; first=0, count=nothing) -> Vector{CyclicRelayTimeStep}

The relay's per-time-step statistics still kept (`flatmem_cyclic_relay_stats`); `count = nothing`:
all begun so far.
"""
function cyclic_relay_stats(h::Cyclic; first::Integer=0, count::Union{Nothing,Integer}=nothing)
    n = stats_count(first, count, cyclic_summary(ensure_open(h)).time_steps)
    stats = Vector{CyclicRelayTimeStep}(undef, n)
    written = Ref{Int64}(0)
    status = GC.@preserve stats begin
        ccall((:flatmem_cyclic_relay_stats, libflatmem), Cint,
              (Ptr{CyclicHandle}, Int64, Int64, Ptr{CyclicRelayTimeStep}, Csize_t, Ref{Int64}),
              h, Int64(first), Int64(n), pointer(stats), Csize_t(sizeof(CyclicRelayTimeStep)), written)
    end
    check(status)
    return resize!(stats, written[])
end

# ---------------------------------------------------------------------------
# Stage-parallel cyclic training (flatmem/cyclic_stages.h)
# ---------------------------------------------------------------------------
#
# L ranks, one per model stage, serve N staggered micro-batches: micro-batch m follows the
# data-parallel schedule of rank m of N, so rank j runs stage j for all of them back to back.
# Pure schedule queries (cyclic_stages_schedule, _offset, _period, _length, _versions_kept,
# _actions, _occupancy) and the runtime `CyclicStages` over a `Comm` (cyclic_stages_next!,
# _send!, _receive!, _accumulate!, _average!, _stats, _summary). 0-based, as in C.

"""`flatmem_cyclic_stages_schedule`: L stages, N micro-batches per step, S steps, rule; make one with `cyclic_stages_schedule`."""
CyclicStagesSchedule

"""
`flatmem_cyclic_stages_action`: one action of one stage rank. `kind` is a `FLATMEM_CYCLIC_*`
action kind (`action_kind`); `micro_batch`, `step`, `version`, `update_step` 0-based, -1 for
none; `receives` / `sends` / `accumulates` 0 or 1: which of `cyclic_stages_receive!` (before
computing), `cyclic_stages_send!` (after) and `cyclic_stages_accumulate!` the action needs.
With `update_step >= 0`, form version `update_step + 1` from version `update_step` and
`cyclic_stages_average!` before the action.
"""
CyclicStagesAction

"""`flatmem_cyclic_stages_occupancy`: a stage rank's steady-state busy fraction, peak actions per time step, peak and mean micro-batches held."""
CyclicStagesOccupancy

"""`flatmem_cyclic_stages_time_step_stats`: actions, activations held (and their bytes), boundary bytes posted, seconds and wait seconds of one time step."""
CyclicStagesTimeStepStats

"""`flatmem_cyclic_stages_summary`: totals since create, busy fractions (the run so far, and the schedule's steady state)."""
CyclicStagesSummary

"""`action_kind(a::CyclicStagesAction) -> Symbol`: `:idle`, `:forward`, `:backward` or `:done`."""
action_kind(a::CyclicStagesAction) = enum_symbol(CYCLIC_KINDS, a.kind, "action kind")

"""
    cyclic_stages_schedule(stages, micro_batches, steps; rule=:delay1) -> CyclicStagesSchedule

L = `stages` stage ranks serving N = `micro_batches` micro-batches per step for `steps` steps:
offset(m) = floor(m 2L / N); period P = 2L (`:delay1`, `:newest`), 2L + offset(N-1) (`:sync`);
the forward of stage j for (m, s) at offset(m) + P s + j, its backward at offset(m) + P s + 2L-1-j.
The library checks the ranges (a `FlatmemError` naming the field).
"""
function cyclic_stages_schedule(stages::Integer, micro_batches::Integer, steps::Integer; rule::Symbol=:delay1)
    s = CyclicStagesSchedule(Csize_t(sizeof(CyclicStagesSchedule)), int32_arg(stages, "stages"),
                             int32_arg(micro_batches, "micro_batches"), Int64(steps), cyclic_rule(rule),
                             Int32(0))
    cyclic_stages_length(s)   # checks the schedule
    return s
end

"""`cyclic_stages_offset(s, micro_batch) -> Int`: floor(m 2L / N) time steps."""
function cyclic_stages_offset(s::CyclicStagesSchedule, micro_batch::Integer)
    offset = Ref{Int64}(0)
    check(ccall((:flatmem_cyclic_stages_schedule_offset, libflatmem), Cint,
                (Ref{CyclicStagesSchedule}, Int32, Ref{Int64}), s, int32_arg(micro_batch, "micro_batch"), offset))
    return Int(offset[])
end

"""`cyclic_stages_period(s) -> Int`: P, time steps per training step."""
function cyclic_stages_period(s::CyclicStagesSchedule)
    period = Ref{Int64}(0)
    check(ccall((:flatmem_cyclic_stages_schedule_period, libflatmem), Cint,
                (Ref{CyclicStagesSchedule}, Ref{Int64}), s, period))
    return Int(period[])
end

"""`cyclic_stages_length(s) -> Int`: time steps of the whole run (B(0, N-1, S-1) + 2)."""
function cyclic_stages_length(s::CyclicStagesSchedule)
    time_steps = Ref{Int64}(0)
    check(ccall((:flatmem_cyclic_stages_schedule_length, libflatmem), Cint,
                (Ref{CyclicStagesSchedule}, Ref{Int64}), s, time_steps))
    return Int(time_steps[])
end

"""`cyclic_stages_versions_kept(s, stage) -> Int`: K, the parameter versions `stage` keeps (version v in slot v % K)."""
function cyclic_stages_versions_kept(s::CyclicStagesSchedule, stage::Integer)
    kept = Ref{Int32}(0)
    check(ccall((:flatmem_cyclic_stages_schedule_versions_kept, libflatmem), Cint,
                (Ref{CyclicStagesSchedule}, Int32, Ref{Int32}), s, int32_arg(stage, "stage"), kept))
    return Int(kept[])
end

"""
    cyclic_stages_actions(s, stage, time_step) -> Vector{CyclicStagesAction}

The actions of `stage` at global `time_step`, in the order the runtime returns them (backwards
first, then forwards, each by ascending micro-batch); empty when there are none.
"""
function cyclic_stages_actions(s::CyclicStagesSchedule, stage::Integer, time_step::Integer)
    j, t = int32_arg(stage, "stage"), Int64(time_step)
    count = Ref{Int32}(0)
    check(ccall((:flatmem_cyclic_stages_schedule_actions, libflatmem), Cint,
                (Ref{CyclicStagesSchedule}, Int32, Int64, Ptr{CyclicStagesAction}, Csize_t, Int32, Ref{Int32}),
                s, j, t, Ptr{CyclicStagesAction}(C_NULL), Csize_t(sizeof(CyclicStagesAction)), Int32(0), count))
    actions = Vector{CyclicStagesAction}(undef, count[])
    status = GC.@preserve actions begin
        ccall((:flatmem_cyclic_stages_schedule_actions, libflatmem), Cint,
              (Ref{CyclicStagesSchedule}, Int32, Int64, Ptr{CyclicStagesAction}, Csize_t, Int32, Ref{Int32}),
              s, j, t, pointer(actions), Csize_t(sizeof(CyclicStagesAction)), Int32(length(actions)), count)
    end
    check(status)
    return resize!(actions, count[])
end

"""`cyclic_stages_occupancy(s, stage) -> CyclicStagesOccupancy`: the stage's steady-state occupancy."""
function cyclic_stages_occupancy(s::CyclicStagesSchedule, stage::Integer)
    occupancy = Ref{CyclicStagesOccupancy}()
    check(ccall((:flatmem_cyclic_stages_schedule_occupancy, libflatmem), Cint,
                (Ref{CyclicStagesSchedule}, Int32, Ref{CyclicStagesOccupancy}, Csize_t),
                s, int32_arg(stage, "stage"), occupancy, Csize_t(sizeof(CyclicStagesOccupancy))))
    return occupancy[]
end

"""
    CyclicStages(comm::Comm, micro_batches, steps; boundary_bytes, rule=:delay1,
                 activation_bytes=nothing, timeout_ms=0, history=0, memory=:host)

This stage rank's stage-parallel runtime over `comm` (`flatmem_cyclic_stages_create`; collective,
rank j runs stage j of L = the communicator's size; every rank passes the same values, checked).
`boundary_bytes`: L - 1 integers, the largest bytes crossing the boundary between stages j and
j + 1 (an activation or its gradient; `nothing` only when L = 1). `activation_bytes`: L integers
per micro-batch, accounting only. `timeout_ms` bounds every wait (0 = the communicator's).
`memory = :cuda` moves device tensors instead of Arrays (kDLCUDA buffers on the communicator's
device, over NCCL, through the `*_stream!` calls): every rank calls `init_device(comm, device)`
first (else a `FlatmemError` naming `options.memory` on every rank); `FLATMEM_STATUS_UNSUPPORTED`
from a flatmem built without NCCL. Every rank passes the same.

    h = CyclicStages(comm, N, S; boundary_bytes=[rows * width * 4])
    K = cyclic_stages_versions_kept(cyclic_schedule(h), comm.rank)
    while true
        a = cyclic_stages_next!(h)                     # may wait (the last sends)
        action_kind(a) === :done && break
        if a.update_step >= 0                          # version v + 1 from version v
            v = a.update_step
            slot[(v + 1) % K + 1] = slot[v % K + 1] .- lr .* cyclic_stages_average!(h, average)
        end
        if action_kind(a) === :forward
            a.receives == 1 && cyclic_stages_receive!(h, x)
            y = forward(slot[a.version % K + 1], x)
            a.sends == 1 && cyclic_stages_send!(h, y)
        elseif action_kind(a) === :backward
            a.receives == 1 && cyclic_stages_receive!(h, dy)
            g, dx = backward(slot[a.version % K + 1], dy)
            cyclic_stages_accumulate!(h, g)
            a.sends == 1 && cyclic_stages_send!(h, dx)
        end
    end
    close(h)

Arrays are copied (send, accumulate) or written (receive, average) during the call: the handle
keeps none (device buffers: the copies are enqueued on the call's CUDA stream, ordered like the
caller's own work there). Calls out of order are a `FlatmemError` (`INVALID_ARGUMENT`) that changes nothing; a
dead or wedged neighbour a `FlatmemError` (TIMEOUT / PEER_FAILURE) naming stage, micro-batch,
step and peer. The `CyclicStages` keeps `comm` open until `close(h)`.
"""
mutable struct CyclicStages
    ptr::Ptr{CyclicStagesHandle}
    comm::Comm

    function CyclicStages(comm::Comm, micro_batches::Integer, steps::Integer;
                          boundary_bytes::Union{Nothing,AbstractVector{<:Integer}}=nothing, rule::Symbol=:delay1,
                          activation_bytes::Union{Nothing,AbstractVector{<:Integer}}=nothing, timeout_ms::Integer=0,
                          history::Integer=0, memory::Symbol=:host)
        ensure_open(comm)
        rule_value = cyclic_rule(rule)
        haskey(CYCLIC_MEMORY, memory) || throw(ArgumentError("memory must be one of $(keys(CYCLIC_MEMORY)), not :$memory"))
        stages = comm.world_size
        timeout_ms >= 0 || throw(ArgumentError("timeout_ms = $timeout_ms; expected >= 0 (0 = the communicator's default)"))
        history >= 0 || throw(ArgumentError("history = $history; expected >= 0 (0 = 65536 time steps)"))
        bounds = int64_entries(boundary_bytes, stages - 1, "boundary_bytes", "one per boundary, stages - 1")
        bytes = int64_entries(activation_bytes, stages, "activation_bytes", "one per stage")
        null = Ptr{Int64}(C_NULL)
        options = Ref{CyclicStagesOptions}()
        check(ccall((:flatmem_cyclic_stages_options_init, libflatmem), Cint, (Ref{CyclicStagesOptions}, Csize_t),
                    options, Csize_t(sizeof(CyclicStagesOptions))))
        out = Ref{Ptr{CyclicStagesHandle}}(C_NULL)
        status = GC.@preserve comm bounds bytes begin
            options[] = CyclicStagesOptions(options[].struct_size, Int32(stages), int32_arg(micro_batches, "micro_batches"),
                                            Int64(steps), rule_value, Int32(0),
                                            bounds === nothing || isempty(bounds) ? null : pointer(bounds),
                                            bytes === nothing ? null : pointer(bytes), Int64(timeout_ms), Int64(history),
                                            CYCLIC_MEMORY[memory], Int32(0))
            @gc_safe ccall((:flatmem_cyclic_stages_create, libflatmem), Cint,
                           (Ref{Ptr{CyclicStagesHandle}}, Ptr{CommHandle}, Ref{CyclicStagesOptions}), out, comm, options)
        end
        check(status)
        comm.users += 1
        h = new(out[], comm)
        finalizer(destroy_quietly, h)
        return h
    end
end

Base.unsafe_convert(::Type{Ptr{CyclicStagesHandle}}, h::CyclicStages) = h.ptr
Base.isopen(h::CyclicStages) = h.ptr != C_NULL

function Base.show(io::IO, h::CyclicStages)
    print(io, "Flatmem.CyclicStages(stage ", h.comm.rank, " of ", h.comm.world_size, isopen(h) ? ")" : ", closed)")
end

function ensure_open(h::CyclicStages)
    isopen(h) || throw(ArgumentError("this Flatmem.CyclicStages is closed"))
    return h
end

# flatmem_cyclic_stages_destroy once, then lets go of the communicator; returns the status.
function destroy(h::CyclicStages)
    handle = h.ptr
    h.ptr = Ptr{CyclicStagesHandle}(C_NULL)
    handle == C_NULL && return FLATMEM_STATUS_SUCCESS
    status = @gc_safe ccall((:flatmem_cyclic_stages_destroy, libflatmem), Cint, (Ptr{CyclicStagesHandle},), handle)
    release_user(h.comm)
    return status
end

destroy_quietly(h::CyclicStages) = (destroy(h); nothing)

"""
    close(h::CyclicStages)

Release the runtime (`flatmem_cyclic_stages_destroy`): quick after `:done` (or a failure); before
it the neighbours cannot finish, so the communicator is poisoned (they fail naming this stage).
Idempotent.
"""
Base.close(h::CyclicStages) = check(destroy(h))

"""
    cyclic_stages_next!(h::CyclicStages) -> CyclicStagesAction

The next action of this stage (`flatmem_cyclic_stages_next`; time steps without actions are
skipped). A `FlatmemError` (`INVALID_ARGUMENT`), without advancing, while the current action's
receive, send or accumulate is missing. Before `:done` it waits (at most the timeout) until this
rank's sends have left; `:done` again on every later call.
"""
function cyclic_stages_next!(h::CyclicStages)
    ensure_open(h)
    action = Ref{CyclicStagesAction}()
    status = @gc_safe ccall((:flatmem_cyclic_stages_next, libflatmem), Cint,
                            (Ptr{CyclicStagesHandle}, Ref{CyclicStagesAction}, Csize_t),
                            h, action, Csize_t(sizeof(CyclicStagesAction)))
    check(status)
    return action[]
end

"""
    cyclic_stages_send!(h::CyclicStages, tensor::Array) -> tensor

Send the current action's boundary tensor (its `sends`, once): a dense Array of a message element
type, at most the boundary's `boundary_bytes`. Copied; waits (at most the timeout) only while
every staging buffer is still in flight.
"""
function cyclic_stages_send!(h::CyclicStages, tensor::AbstractArray)
    stages_send(ensure_open(h), message_tensor(tensor, "tensor"), nothing)
    return tensor
end

"""
    cyclic_stages_receive!(h::CyclicStages, into::Array) -> into

Receive the current action's boundary tensor (its `receives`, once) into `into`, which must have
exactly the sent bytes (else a `FlatmemError` naming both sizes, which poisons the handle and
communicator). Waits at most the timeout; nothing is written on error.
"""
function cyclic_stages_receive!(h::CyclicStages, into::AbstractArray)
    stages_receive(ensure_open(h), message_tensor(into, "into"), nothing)
    return into
end

"""
    cyclic_stages_accumulate!(h::CyclicStages, gradient::Array{Float32 or Float64}) -> gradient

Add the current backward's stage gradient (once) into its step's accumulator (copied; the same
element type and length every time).
"""
function cyclic_stages_accumulate!(h::CyclicStages, gradient::AbstractArray)
    stages_accumulate(ensure_open(h), float_tensor(gradient, "gradient"), nothing)
    return gradient
end

"""
    cyclic_stages_average!(h::CyclicStages, out::Array{Float32 or Float64}) -> out

Copy the average of the current action's `update_step` (only while it is >= 0) into `out`:
((g_0 + g_1) + ... + g_{N-1}) * fl(1/N), the accumulate element type and length.
"""
function cyclic_stages_average!(h::CyclicStages, out::AbstractArray)
    stages_average(ensure_open(h), float_tensor(out, "out"), nothing)
    return out
end

"""
    cyclic_stages_send_stream!(h::CyclicStages, data::Ptr{T}, len, cuda_device, stream::Ptr{Cvoid})
    cyclic_stages_receive_stream!(h::CyclicStages, data::Ptr{T}, len, cuda_device, stream::Ptr{Cvoid})
    cyclic_stages_accumulate_stream!(h::CyclicStages, data::Ptr{Float32 or Float64}, len, cuda_device, stream::Ptr{Cvoid})
    cyclic_stages_average_stream!(h::CyclicStages, data::Ptr{Float32 or Float64}, len, cuda_device, stream::Ptr{Cvoid})
    cyclic_stages_send_stream!(h, tensor::Array, stream) -> tensor   (and so on: a host Array)

The four calls above for `memory = :cuda` (`flatmem_cyclic_stages_*_stream`): the tensor is `len`
elements of `T` (send / receive: a message element type) at the device pointer `data` on CUDA
device `cuda_device` (the communicator's; this binding has no device arrays of its own, so the
caller vouches for the memory), and the copies are enqueued on the CUDA `stream` (a
`cudaStream_t`; `C_NULL` = the legacy default stream): the memory must stay allocated until
they ran there. Send's tensor is the caller's again for work enqueued after the call on
`stream`; receive waits on the host (at most the timeout) for the arrival, then enqueues the
copy; order the average after the accumulates (the same stream, or your own synchronisation).
The stream is ignored for an `Array` (host memory); a tensor of the other kind than the
runtime's `memory` is a `FlatmemError` (`INVALID_ARGUMENT`) naming `options.memory`.
"""
function cyclic_stages_send_stream!(h::CyclicStages, data::Ptr{T}, len::Integer, cuda_device::Integer,
                                    stream::Ptr{Cvoid}) where {T}
    stages_send(ensure_open(h), device_vector_tensor(data, len, cuda_device, device_message_dtype(T, "tensor")), stream)
    return nothing
end

function cyclic_stages_send_stream!(h::CyclicStages, tensor::AbstractArray, stream::Ptr{Cvoid})
    stages_send(ensure_open(h), message_tensor(tensor, "tensor"), stream)
    return tensor
end

function cyclic_stages_receive_stream!(h::CyclicStages, data::Ptr{T}, len::Integer, cuda_device::Integer,
                                       stream::Ptr{Cvoid}) where {T}
    stages_receive(ensure_open(h), device_vector_tensor(data, len, cuda_device, device_message_dtype(T, "into")), stream)
    return nothing
end

function cyclic_stages_receive_stream!(h::CyclicStages, into::AbstractArray, stream::Ptr{Cvoid})
    stages_receive(ensure_open(h), message_tensor(into, "into"), stream)
    return into
end

function cyclic_stages_accumulate_stream!(h::CyclicStages, data::Ptr{T}, len::Integer, cuda_device::Integer,
                                          stream::Ptr{Cvoid}) where {T<:Union{Float32,Float64}}
    stages_accumulate(ensure_open(h), device_vector_tensor(data, len, cuda_device, dl_dtype(T)), stream)
    return nothing
end

function cyclic_stages_accumulate_stream!(h::CyclicStages, gradient::AbstractArray, stream::Ptr{Cvoid})
    stages_accumulate(ensure_open(h), float_tensor(gradient, "gradient"), stream)
    return gradient
end

function cyclic_stages_average_stream!(h::CyclicStages, data::Ptr{T}, len::Integer, cuda_device::Integer,
                                       stream::Ptr{Cvoid}) where {T<:Union{Float32,Float64}}
    stages_average(ensure_open(h), device_vector_tensor(data, len, cuda_device, dl_dtype(T)), stream)
    return nothing
end

function cyclic_stages_average_stream!(h::CyclicStages, out::AbstractArray, stream::Ptr{Cvoid})
    stages_average(ensure_open(h), float_tensor(out, "out"), stream)
    return out
end

# The DLPack dtype of a device message's element type (as message_tensor's), or an ArgumentError.
function device_message_dtype(::Type{T}, name::String) where {T}
    dtype = message_dtype(T)
    dtype === nothing && throw(ArgumentError(
        "$name: element type $T has no DLPack dtype here; use Float64/32/16, BF16, (U)Int8/16/32/64 or Bool"))
    return dtype
end

# The four calls over a Tensor: the plain C function (stream nothing) or its *_stream twin.
function stages_send(h::CyclicStages, t::Tensor, stream::Union{Nothing,Ptr{Cvoid}})
    status = GC.@preserve t stream begin
        if stream === nothing
            @gc_safe ccall((:flatmem_cyclic_stages_send, libflatmem), Cint, (Ptr{CyclicStagesHandle}, Ptr{DLTensor}),
                           h, tensor_ptr(t))
        else
            @gc_safe ccall((:flatmem_cyclic_stages_send_stream, libflatmem), Cint,
                           (Ptr{CyclicStagesHandle}, Ptr{DLTensor}, Ptr{Cvoid}), h, tensor_ptr(t), stream)
        end
    end
    return check(status)
end

function stages_receive(h::CyclicStages, t::Tensor, stream::Union{Nothing,Ptr{Cvoid}})
    status = GC.@preserve t stream begin
        if stream === nothing
            @gc_safe ccall((:flatmem_cyclic_stages_receive, libflatmem), Cint, (Ptr{CyclicStagesHandle}, Ptr{DLTensor}),
                           h, tensor_ptr(t))
        else
            @gc_safe ccall((:flatmem_cyclic_stages_receive_stream, libflatmem), Cint,
                           (Ptr{CyclicStagesHandle}, Ptr{DLTensor}, Ptr{Cvoid}), h, tensor_ptr(t), stream)
        end
    end
    return check(status)
end

function stages_accumulate(h::CyclicStages, t::Tensor, stream::Union{Nothing,Ptr{Cvoid}})
    status = GC.@preserve t stream begin
        if stream === nothing
            ccall((:flatmem_cyclic_stages_accumulate, libflatmem), Cint, (Ptr{CyclicStagesHandle}, Ptr{DLTensor}),
                  h, tensor_ptr(t))
        else
            ccall((:flatmem_cyclic_stages_accumulate_stream, libflatmem), Cint,
                  (Ptr{CyclicStagesHandle}, Ptr{DLTensor}, Ptr{Cvoid}), h, tensor_ptr(t), stream)
        end
    end
    return check(status)
end

function stages_average(h::CyclicStages, t::Tensor, stream::Union{Nothing,Ptr{Cvoid}})
    status = GC.@preserve t stream begin
        if stream === nothing
            ccall((:flatmem_cyclic_stages_average, libflatmem), Cint, (Ptr{CyclicStagesHandle}, Ptr{DLTensor}),
                  h, tensor_ptr(t))
        else
            ccall((:flatmem_cyclic_stages_average_stream, libflatmem), Cint,
                  (Ptr{CyclicStagesHandle}, Ptr{DLTensor}, Ptr{Cvoid}), h, tensor_ptr(t), stream)
        end
    end
    return check(status)
end

"""`cyclic_schedule(h::CyclicStages) -> CyclicStagesSchedule`: the runtime's schedule."""
function cyclic_schedule(h::CyclicStages)
    schedule = Ref{CyclicStagesSchedule}()
    check(ccall((:flatmem_cyclic_stages_get_schedule, libflatmem), Cint,
                (Ptr{CyclicStagesHandle}, Ref{CyclicStagesSchedule}, Csize_t),
                ensure_open(h), schedule, Csize_t(sizeof(CyclicStagesSchedule))))
    return schedule[]
end

"""`cyclic_stages_summary(h::CyclicStages) -> CyclicStagesSummary`: totals since create."""
function cyclic_stages_summary(h::CyclicStages)
    summary = Ref{CyclicStagesSummary}()
    check(ccall((:flatmem_cyclic_stages_summary_get, libflatmem), Cint,
                (Ptr{CyclicStagesHandle}, Ref{CyclicStagesSummary}, Csize_t),
                ensure_open(h), summary, Csize_t(sizeof(CyclicStagesSummary))))
    return summary[]
end

"""
    cyclic_stages_stats(h::CyclicStages; first=0, count=nothing) -> Vector{CyclicStagesTimeStepStats}

Statistics of time steps `first .. first + count - 1` still kept (`flatmem_cyclic_stages_stats`);
`count = nothing`: all begun so far.
"""
function cyclic_stages_stats(h::CyclicStages; first::Integer=0, count::Union{Nothing,Integer}=nothing)
    n = stats_count(first, count, cyclic_stages_summary(ensure_open(h)).time_steps)
    stats = Vector{CyclicStagesTimeStepStats}(undef, n)
    written = Ref{Int64}(0)
    status = GC.@preserve stats begin
        ccall((:flatmem_cyclic_stages_stats, libflatmem), Cint,
              (Ptr{CyclicStagesHandle}, Int64, Int64, Ptr{CyclicStagesTimeStepStats}, Csize_t, Ref{Int64}),
              h, Int64(first), Int64(n), pointer(stats), Csize_t(sizeof(CyclicStagesTimeStepStats)), written)
    end
    check(status)
    return resize!(stats, written[])
end
