# cyclic.jl -- cyclic data parallelism (flatmem/cyclic.h), included by Flatmem.jl.
#
# The schedule queries are pure C functions (no handle, thread-safe):
# cyclic_schedule, cyclic_offset, cyclic_delay, cyclic_length, cyclic_action.
# The runtime, `Cyclic`, runs a rank's schedule over a `Comm` (comm.jl):
# cyclic_next!, cyclic_reduce!, cyclic_stats, cyclic_summary. Ranks, stages,
# steps and time steps are 0-based, as the C API counts them.

# flatmem_cyclic_rule
const FLATMEM_CYCLIC_DELAY1 = Cint(0)
const FLATMEM_CYCLIC_NEWEST = Cint(1)
const FLATMEM_CYCLIC_SYNC = Cint(2)

# flatmem_cyclic_action_kind
const FLATMEM_CYCLIC_IDLE = Cint(0)
const FLATMEM_CYCLIC_FORWARD = Cint(1)
const FLATMEM_CYCLIC_BACKWARD = Cint(2)
const FLATMEM_CYCLIC_DONE = Cint(3)

"""`flatmem_cyclic_schedule`: N ranks, L stages, training steps, rule; make one with `cyclic_schedule`."""
struct CyclicSchedule
    struct_size::Csize_t
    world_size::Int32
    stages::Int32
    steps::Int64
    rule::Cint
end

"""
`flatmem_cyclic_action`: what one rank does in one time step (`cyclic_action`). `kind` is a
`FLATMEM_CYCLIC_*` action kind (`action_kind` gives it as a Symbol); `stage`, `step`, `phase`
and `update_stage`/`update_step` are 0-based, -1 when there is none.
"""
struct CyclicAction
    time_step::Int64
    kind::Cint
    stage::Int32
    step::Int64
    update_stage::Int32
    update_step::Int64
    activations_held::Int32
    phase::Int32
end

"""Opaque C handle type `flatmem_cyclic_t` (the cyclic runtime, wrapped by `Cyclic`); only ever behind a `Ptr`."""
mutable struct CyclicHandle end

"""`flatmem_cyclic_options`; fill it with `flatmem_cyclic_options_init` (the `Cyclic` constructor does)."""
struct CyclicOptions
    struct_size::Csize_t
    stages::Int32
    steps::Int64
    rule::Cint
    activation_bytes::Ptr{Int64}
    timeout_ms::Int64
    nonfinite::Cint
    history::Int64
end

"""
`flatmem_cyclic_time_step_stats`: what happened in one time step of this rank (`cyclic_stats`).
`kind` is a `FLATMEM_CYCLIC_*` action kind; `stage`/`step` 0-based (-1: none); `activation_bytes`
of the activations held; `bytes_sent` measured (timing-dependent), `bytes_scheduled` the same bytes
in the time step the protocol assigns them to; `seconds` from this time step's `cyclic_next!` to
the next one's (0 for the current one), `wait_seconds` of it spent waiting in `cyclic_next!`.
"""
struct CyclicTimeStepStats
    time_step::Int64
    kind::Cint
    stage::Int32
    step::Int64
    activations_held::Int32
    activation_bytes::Int64
    bytes_sent::Int64
    seconds::Float64
    wait_seconds::Float64
    bytes_scheduled::Int64
end

"""`flatmem_cyclic_summary`: totals since the `Cyclic` was created (`cyclic_summary`); seconds are wall-clock."""
struct CyclicSummary
    time_steps::Int64
    bytes_sent::Int64
    messages_sent::Int64
    max_bytes_sent_per_time_step::Int64
    peak_activation_bytes::Int64
    wait_seconds::Float64
    seconds::Float64
end

const CYCLIC_RULES = (delay1 = FLATMEM_CYCLIC_DELAY1, newest = FLATMEM_CYCLIC_NEWEST, sync = FLATMEM_CYCLIC_SYNC)
const CYCLIC_KINDS = (idle = FLATMEM_CYCLIC_IDLE, forward = FLATMEM_CYCLIC_FORWARD,
                      backward = FLATMEM_CYCLIC_BACKWARD, done = FLATMEM_CYCLIC_DONE)

function cyclic_rule(rule::Symbol)
    haskey(CYCLIC_RULES, rule) || throw(ArgumentError("rule must be one of $(keys(CYCLIC_RULES)), not :$rule"))
    return CYCLIC_RULES[rule]
end

"""
    cyclic_schedule(world_size, stages, steps; rule=:delay1) -> CyclicSchedule

The schedule of `world_size` ranks training a model of `stages` stages for `steps` steps;
`rule` is `:delay1`, `:newest` or `:sync` (see cyclic.h). The library checks the ranges
(a `FlatmemError` naming the field, e.g. `schedule.world_size: 0; expected 1 .. 1048576`).
"""
function cyclic_schedule(world_size::Integer, stages::Integer, steps::Integer; rule::Symbol=:delay1)
    s = CyclicSchedule(Csize_t(sizeof(CyclicSchedule)), Int32(world_size), Int32(stages), Int64(steps), cyclic_rule(rule))
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
                (Ref{CyclicSchedule}, Int32, Int64, Ref{CyclicAction}), s, Int32(rank), Int64(time_step), action))
    return action[]
end

"""`action_kind(a::CyclicAction) -> Symbol`: `:idle`, `:forward`, `:backward` or `:done`."""
action_kind(a::CyclicAction) = enum_symbol(CYCLIC_KINDS, a.kind, "action kind")

# ---------------------------------------------------------------------------
# The runtime
# ---------------------------------------------------------------------------

"""
    Cyclic(comm::Comm, stages, steps; rule=:delay1, activation_bytes=nothing, timeout_ms=0,
           propagate_nonfinite=false, history=0)

This rank's cyclic data-parallel runtime over `comm` (`flatmem_cyclic_create`; collective: every
rank passes the same `stages`, `steps` and `rule`, checked, a `FlatmemError` on every rank naming
the first that differs). `activation_bytes` (`stages` non-negative integers, copied) are the bytes
of activations stage j keeps for its backward, for the statistics only (`nothing` = 1 per stage).
`timeout_ms` bounds every wait (0 = the communicator's default). Gradients are scanned for
NaN/Inf (a `FlatmemError` with `FLATMEM_STATUS_NON_FINITE` that poisons the communicator) unless
`propagate_nonfinite`. `history`: time steps of statistics kept (0 = 65536).

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

    function Cyclic(comm::Comm, stages::Integer, steps::Integer; rule::Symbol=:delay1,
                    activation_bytes::Union{Nothing,AbstractVector{<:Integer}}=nothing, timeout_ms::Integer=0,
                    propagate_nonfinite::Bool=false, history::Integer=0)
        ensure_open(comm)
        rule_value = cyclic_rule(rule)
        nstages = int32_arg(stages, "stages")
        timeout_ms >= 0 || throw(ArgumentError("timeout_ms = $timeout_ms; expected >= 0 (0 = the communicator's default)"))
        history >= 0 || throw(ArgumentError("history = $history; expected >= 0 (0 = 65536 time steps)"))
        bytes = activation_bytes === nothing ? nothing : Vector{Int64}(activation_bytes)
        if bytes !== nothing && length(bytes) != stages
            throw(ArgumentError("activation_bytes has $(length(bytes)) entries; expected one per stage ($stages)"))
        end
        options = Ref{CyclicOptions}()
        check(ccall((:flatmem_cyclic_options_init, libflatmem), Cint, (Ref{CyclicOptions},), options))
        out = Ref{Ptr{CyclicHandle}}(C_NULL)
        status = GC.@preserve comm bytes begin
            options[] = CyclicOptions(options[].struct_size, nstages, Int64(steps), rule_value,
                                      bytes === nothing ? Ptr{Int64}(C_NULL) : pointer(bytes), Int64(timeout_ms),
                                      propagate_nonfinite ? FLATMEM_NONFINITE_PROPAGATE : FLATMEM_NONFINITE_ERROR,
                                      Int64(history))
            @gc_safe ccall((:flatmem_cyclic_create, libflatmem), Cint,
                           (Ref{Ptr{CyclicHandle}}, Ptr{CommHandle}, Ref{CyclicOptions}), out, comm, options)
        end
        check(status)
        comm.users += 1
        none = CyclicAction(-1, FLATMEM_CYCLIC_IDLE, -1, -1, -1, -1, 0, -1)
        h = new(out[], comm, none, Dict{Tuple{Int,Int},Tensor}())
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
    status = @gc_safe ccall((:flatmem_cyclic_next, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicAction}), h, action)
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
    ensure_open(h)
    gradient isa Union{Array{Float32},Array{Float64}} || throw(ArgumentError(
        "gradient must be a dense Array{Float32} or Array{Float64} (the runtime reads and overwrites it in place); got $(typeof(gradient))"))
    s = int32_arg(stage, "stage")
    t = array_tensor(gradient)
    status = GC.@preserve t begin
        ccall((:flatmem_cyclic_reduce, libflatmem), Cint, (Ptr{CyclicHandle}, Int32, Ptr{DLTensor}), h, s, tensor_ptr(t))
    end
    check(status)
    h.in_flight[(Int(stage), Int(h.last.step))] = t   # accepted: stage's backward of the current step
    return gradient
end

"""`cyclic_schedule(h::Cyclic) -> CyclicSchedule`: the runtime's schedule (world size, stages, steps, rule)."""
function cyclic_schedule(h::Cyclic)
    schedule = Ref{CyclicSchedule}()
    check(ccall((:flatmem_cyclic_get_schedule, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicSchedule}),
                ensure_open(h), schedule))
    return schedule[]
end

"""`cyclic_summary(h::Cyclic) -> CyclicSummary`: totals since create (`flatmem_cyclic_summary_get`)."""
function cyclic_summary(h::Cyclic)
    summary = Ref{CyclicSummary}()
    check(ccall((:flatmem_cyclic_summary_get, libflatmem), Cint, (Ptr{CyclicHandle}, Ref{CyclicSummary}),
                ensure_open(h), summary))
    return summary[]
end

"""
    cyclic_stats(h::Cyclic; first=0, count=nothing) -> Vector{CyclicTimeStepStats}

Statistics of time steps `first .. first + count - 1` (0-based global time steps) that are still
kept (the most recent `history` begun so far) (`flatmem_cyclic_stats`); `count = nothing` asks
for all begun so far. Check `time_step` of the first element: older ones may be gone.
"""
function cyclic_stats(h::Cyclic; first::Integer=0, count::Union{Nothing,Integer}=nothing)
    ensure_open(h)
    first >= 0 || throw(ArgumentError("first = $first; expected >= 0"))
    n = count === nothing ? max(cyclic_summary(h).time_steps - first, 0) : Int64(count)
    n >= 0 || throw(ArgumentError("count = $count; expected >= 0"))
    stats = Vector{CyclicTimeStepStats}(undef, n)
    written = Ref{Int64}(0)
    status = GC.@preserve stats begin
        ccall((:flatmem_cyclic_stats, libflatmem), Cint,
              (Ptr{CyclicHandle}, Int64, Int64, Ptr{CyclicTimeStepStats}, Ref{Int64}),
              h, Int64(first), Int64(n), pointer(stats), written)
    end
    check(status)
    return resize!(stats, written[])
end
