# Flatmem.jl -- the Julia binding of flatmem's C ABI (include/flatmem/flatmem.h).
#
#     include("bindings/julia/Flatmem.jl"); using .Flatmem
#
# Plain `ccall`s on the C ABI, nothing compiled. The library is
# ENV["FLATMEM_LIBRARY"] (a path or a name) or "libflatmem", found by the
# dynamic loader. Communicators live in comm.jl and the cyclic runtime in
# cyclic.jl, both included below. Every ccall of the three files is checked
# against the C headers by bindings/julia/check_ccalls.py
# (scripts/check-julia.sh); they are not run on the project's machines, which
# have no Julia (see README.md).
#
# Layout. A Julia d x b matrix stores each column (sample) contiguously: it is,
# byte for byte, the row-major b x d matrix the C ABI calls q (b, d). So users
# pass features as d x b (one sample per column, the usual Julia convention)
# and get gradients back in that same shape; the DLTensor handed to C says
# shape (b, d), strides (stride(q, 2), 1). Views whose columns are contiguous
# (stride(q, 1) == 1) are passed without a copy; anything else is copied once.
module Flatmem

using Libdl

export Contrastive, FlatmemError, BF16, contrastive_loss, forward_workspace_size,
       backward_workspace_size, sigmoid_loss, sigmoid_forward, sigmoid_value_and_grad, sigmoid_backward,
       sigmoid_workspace_size, library_version, version_string, cpu_isa, set_cpu_isa!, cpu_engine,
       Block, Segment, set_parameters!, zero_gradients!, parameter_sizes, forward!, backward!,
       last_mode, rebuild_error, block_seed,
       CyclicSchedule, CyclicAction, cyclic_schedule, cyclic_offset, cyclic_delay, cyclic_length,
       cyclic_action, action_kind,
       Comm, CommUniqueId, Request, unique_id, comm_from_env, local_comms, abort!, health, isend, irecv!,
       ring_shift!, all_reduce!, all_reduce, barrier, init_device, group_start, group_end, synchronize,
       Cyclic, CyclicTimeStepStats, CyclicSummary, cyclic_next!, cyclic_reduce!, cyclic_reduce_stream!, cyclic_stats,
       cyclic_summary,
       CyclicRelayTimeStep, CyclicRelaySummary, cyclic_set_shard!, cyclic_shard_range, cyclic_parameters!,
       cyclic_set_shard_stream!, cyclic_parameters_stream!, cyclic_relay_stats, cyclic_relay_summary,
       CyclicStages, CyclicStagesSchedule, CyclicStagesAction, CyclicStagesOccupancy, CyclicStagesTimeStepStats,
       CyclicStagesSummary, cyclic_stages_schedule, cyclic_stages_offset, cyclic_stages_period, cyclic_stages_length,
       cyclic_stages_versions_kept, cyclic_stages_actions, cyclic_stages_occupancy, cyclic_stages_next!,
       cyclic_stages_send!, cyclic_stages_receive!, cyclic_stages_accumulate!, cyclic_stages_average!,
       cyclic_stages_send_stream!, cyclic_stages_receive_stream!, cyclic_stages_accumulate_stream!,
       cyclic_stages_average_stream!,
       cyclic_stages_stats, cyclic_stages_summary

"""The shared library every ccall uses: `ENV["FLATMEM_LIBRARY"]` or `"libflatmem"`."""
const libflatmem = get(ENV, "FLATMEM_LIBRARY", "libflatmem")

# The header's constants (FLATMEM_*, the kDL* values used here), opaque handle types and C struct
# mirrors, generated from include/flatmem/*.h by scripts/gen_julia.py (comm.jl and cyclic.jl,
# included below into this module, use them too).
include("generated.jl")

# ---------------------------------------------------------------------------
# Errors and versions
# ---------------------------------------------------------------------------

"""
    FlatmemError(status, name, message)

A flatmem call returned `status` (a `FLATMEM_STATUS_*` value, named by `name`);
`message` is the calling thread's `flatmem_last_error()` text: which argument,
its shape or value, and what was expected. Shapes in the message are the C
ones, (b, d) for a Julia d x b matrix.
"""
struct FlatmemError <: Exception
    status::Cint
    name::String
    message::String
end

function Base.showerror(io::IO, e::FlatmemError)
    print(io, "FlatmemError: ", e.name, " (", e.status, "): ", e.message)
end

"""`flatmem_status_string`: the static name of a status value."""
function status_string(status::Integer)
    return unsafe_string(ccall((:flatmem_status_string, libflatmem), Cstring, (Cint,), status))
end

# Reads flatmem_last_error() first: the text belongs to the thread's last
# flatmem call, and status_string is a flatmem call too. No task switch can
# happen between the failed ccall and this one (no yield point in between).
function FlatmemError(status::Integer)
    message = unsafe_string(ccall((:flatmem_last_error, libflatmem), Cstring, ()))
    return FlatmemError(Cint(status), status_string(status), message)
end

function check(status::Cint)
    status == FLATMEM_STATUS_SUCCESS || throw(FlatmemError(status))
    return nothing
end

gc_safe_enter() = ccall(:jl_gc_safe_enter, Int8, ())
gc_safe_leave(state::Int8) = ccall(:jl_gc_safe_leave, Cvoid, (Int8,), state)

"""
    @gc_safe ccall(...)

Makes the ccall with the calling thread marked GC-safe (`jl_gc_safe_enter` / `_leave`, as
CUDA.jl does around its blocking calls) and returns its result. For every flatmem call that
may wait -- a collective waiting for its peers, a request wait, `cyclic_next!`, a long
contrastive pass: otherwise a garbage collection another Julia thread starts meanwhile waits
for this one, and in an in-process group (`local_comms`, ranks as threads of this process)
that other thread may be the very peer this call waits for. The ccall's arguments are
evaluated inside the region, so they must neither allocate nor throw: compute conversions
first and pass locals, field loads (a handle's `ptr` via `unsafe_convert`), `tensor_ptr(t)`
and literals. Julia's GC does not move objects, so pointers into preserved arrays stay
valid while another thread collects.
"""
macro gc_safe(call)
    (call isa Expr && call.head === :call && call.args[1] === :ccall) ||
        throw(ArgumentError("@gc_safe takes one ccall(...) expression"))
    return quote
        local state = gc_safe_enter()
        local result = $(esc(call))
        gc_safe_leave(state)
        result
    end
end

# An Int32 argument of a C call, or an ArgumentError naming it.
function int32_arg(value::Integer, name::String)
    typemin(Int32) <= value <= typemax(Int32) || throw(ArgumentError("$name = $value does not fit a 32-bit C int"))
    return Int32(value)
end

"""The packed version (`major * 10000 + minor * 100 + patch`) of the loaded library."""
library_version() = Int(ccall((:flatmem_version, libflatmem), Cint, ()))

"""The loaded library's version as \"MAJOR.MINOR.PATCH\"."""
version_string() = unsafe_string(ccall((:flatmem_version_string, libflatmem), Cstring, ()))

function __init__()
    wanted = get(ENV, "FLATMEM_LIBRARY", "libflatmem")
    if wanted != libflatmem
        # Only when this file was precompiled as part of a package under another setting.
        @warn "FLATMEM_LIBRARY is \"$wanted\" but Flatmem was compiled with \"$libflatmem\"; using the latter"
    end
    if Libdl.dlopen_e(libflatmem) == C_NULL
        error("Flatmem: cannot load the flatmem library \"$libflatmem\"; set ENV[\"FLATMEM_LIBRARY\"] " *
              "to the path of libflatmem.$(Libdl.dlext) (or add its folder to LD_LIBRARY_PATH)")
    end
    loaded = library_version()
    if loaded != FLATMEM_VERSION
        error("Flatmem: this module was written for flatmem.h version $FLATMEM_VERSION " *
              "($FLATMEM_VERSION_MAJOR.$FLATMEM_VERSION_MINOR.$FLATMEM_VERSION_PATCH) but " *
              "\"$libflatmem\" is version $loaded ($(version_string()))")
    end
    return nothing
end

# The name (a Symbol) of a C enum value in `table` (a NamedTuple name => value);
# a value this file does not know is a FlatmemError naming `what`.
function enum_symbol(table::NamedTuple, value::Integer, what::String)
    for (name, v) in pairs(table)
        v == value && return name
    end
    throw(FlatmemError(FLATMEM_STATUS_INTERNAL, status_string(FLATMEM_STATUS_INTERNAL), "unknown $what $value"))
end

# ---------------------------------------------------------------------------
# CPU instruction set
# ---------------------------------------------------------------------------
#
# The CPU kernels (the matrix products, the contrastive loss's exponentials and
# reductions, the built-in blocks' LayerNorm, softmax and GELU) are compiled
# once per instruction set and one runs for the whole process: the best this
# processor supports, capped by the environment variable FLATMEM_CPU_ISA (amx,
# avx512bf16, avx512, avx2, baseline, any case; empty or auto = the best) when
# the process first asks, unless set_cpu_isa! chose one since. The matrix
# products are flatmem's own kernels for that level, no BLAS's. avx512bf16 adds
# the contrastive tile products of bf16 inputs on vdpbf16ps, amx on AMX tiles
# (fp32 accumulation); below them bf16 inputs are widened to fp32.
# cpu_engine() names the kernels. Results are bitwise reproducible for one
# instruction set, not across them.

const CPU_ISAS = (baseline = FLATMEM_CPU_ISA_BASELINE, avx2 = FLATMEM_CPU_ISA_AVX2, avx512 = FLATMEM_CPU_ISA_AVX512,
                  avx512bf16 = FLATMEM_CPU_ISA_AVX512BF16, amx = FLATMEM_CPU_ISA_AMX)

"""
    cpu_isa() -> (in_use, best)

The instruction set the CPU kernels run with now and the best this processor supports
(`flatmem_cpu_isa_get`), as Symbols: `:baseline`, `:avx2`, `:avx512`, `:avx512bf16` or `:amx`,
least capable first. Throws a `FlatmemError` when `FLATMEM_CPU_ISA` is malformed
(`FLATMEM_STATUS_INVALID_ARGUMENT`) or asks for more than `best`
(`FLATMEM_STATUS_UNSUPPORTED`), unless `set_cpu_isa!` chose one since.
"""
function cpu_isa()
    in_use = Ref{Cint}(FLATMEM_CPU_ISA_DEFAULT)
    best = Ref{Cint}(FLATMEM_CPU_ISA_DEFAULT)
    check(ccall((:flatmem_cpu_isa_get, libflatmem), Cint, (Ref{Cint}, Ref{Cint}), in_use, best))
    return enum_symbol(CPU_ISAS, in_use[], "instruction set"), enum_symbol(CPU_ISAS, best[], "instruction set")
end

"""
    set_cpu_isa!(isa::Symbol)
    set_cpu_isa!(nothing)

Selects the instruction set of the CPU kernels for the whole process
(`flatmem_cpu_isa_set`): `:baseline`, `:avx2`, `:avx512`, `:avx512bf16` or `:amx`; `nothing` goes back to the
default (`FLATMEM_CPU_ISA`, else the best). One above the best of `cpu_isa()` throws a
`FlatmemError` (`FLATMEM_STATUS_UNSUPPORTED`) and changes nothing. Select before
computing when the bits matter: a call already running may finish with the previous one.
"""
function set_cpu_isa!(isa::Union{Nothing,Symbol})
    value = isa === nothing ? FLATMEM_CPU_ISA_DEFAULT : cpu_isa_value(isa)
    check(ccall((:flatmem_cpu_isa_set, libflatmem), Cint, (Cint,), value))
    return nothing
end

function cpu_isa_value(isa::Symbol)
    haskey(CPU_ISAS, isa) || throw(ArgumentError("isa must be one of $(keys(CPU_ISAS)) or nothing, not :$isa"))
    return CPU_ISAS[isa]
end

"""
    cpu_isa_name(isa) -> String

The library's name of an instruction set (`flatmem_cpu_isa_name`), given as a Symbol of
`cpu_isa()` or a `FLATMEM_CPU_ISA_*` value: "amx", "avx512bf16", "avx512", "avx2", "baseline",
"default"; "unknown" for other values.
"""
cpu_isa_name(isa::Symbol) = cpu_isa_name(cpu_isa_value(isa))
cpu_isa_name(isa::Integer) = unsafe_string(ccall((:flatmem_cpu_isa_name, libflatmem), Cstring, (Cint,), isa))

"""
    cpu_engine(isa = nothing) -> String

The kernels behind the CPU products at `isa` (a Symbol of `cpu_isa()`, a
`FLATMEM_CPU_ISA_*` value, or `nothing`: the one in use), in words
(`flatmem_cpu_isa_engine`): library, version and the kernel per input dtype. For logs
and benchmark rows; not a stable format.
"""
cpu_engine(isa::Nothing = nothing) = cpu_engine(FLATMEM_CPU_ISA_DEFAULT)
cpu_engine(isa::Symbol) = cpu_engine(cpu_isa_value(isa))
cpu_engine(isa::Integer) = unsafe_string(ccall((:flatmem_cpu_isa_engine, libflatmem), Cstring, (Cint,), isa))

# ---------------------------------------------------------------------------
# Element types
# ---------------------------------------------------------------------------

"""
    BF16

bfloat16 as 16 raw bits (the upper half of a `Float32`): a storage type, no
arithmetic. `BF16(x)` rounds to nearest even, `Float32(b)` widens exactly,
`reinterpret(BF16, u::UInt16)` takes raw bits. Arrays of `BF16` (or of
`Core.BFloat16` on Julia versions that have it) are passed as DLPack kDLBfloat.
"""
primitive type BF16 16 end

function BF16(x::Float32)
    u = reinterpret(UInt32, x)
    if isnan(x)
        return reinterpret(BF16, UInt16(u >> 16) | 0x0040)   # keep sign and payload top, quiet
    end
    u += 0x00007fff + ((u >> 16) & 0x00000001)               # round to nearest, ties to even
    return reinterpret(BF16, UInt16(u >> 16))
end
BF16(x::Real) = BF16(Float32(x))
Base.Float32(x::BF16) = reinterpret(Float32, UInt32(reinterpret(UInt16, x)) << 16)
Base.convert(::Type{BF16}, x::Real) = BF16(x)
Base.convert(::Type{Float32}, x::BF16) = Float32(x)
Base.show(io::IO, x::BF16) = print(io, "BF16(", Float32(x), ")")

# The DLPack dtype of each element type flatmem accepts.
dl_dtype(::Type{T}) where {T} = throw(ArgumentError(
    "flatmem accepts Float32, Float16 and bfloat16 (Flatmem.BF16) features, not $T; convert first, e.g. Float32.(q)"))
dl_dtype(::Type{Float32}) = DLDataType(kDLFloat, 32, 1)
dl_dtype(::Type{Float16}) = DLDataType(kDLFloat, 16, 1)
dl_dtype(::Type{BF16}) = DLDataType(kDLBfloat, 16, 1)
dl_dtype(::Type{Int64}) = DLDataType(kDLInt, 64, 1)
@static if isdefined(Core, :BFloat16)
    dl_dtype(::Type{Core.BFloat16}) = DLDataType(kDLBfloat, 16, 1)
end

# ---------------------------------------------------------------------------
# DLTensors over Julia arrays
# ---------------------------------------------------------------------------

# A DLTensor plus the Julia objects its pointers point into. Hold it (and pass
# it through GC.@preserve) for as long as C may read the pointers; C only reads
# them during a call.
struct Tensor
    dl::Base.RefValue{DLTensor}
    shape::Vector{Int64}
    strides::Vector{Int64}
    owner::Any
end

tensor_ptr(t::Tensor) = Base.unsafe_convert(Ptr{DLTensor}, t.dl)
tensor_ptr(::Nothing) = Ptr{DLTensor}(C_NULL)

const CPU = DLDevice(kDLCPU, 0)

# A Julia d x n matrix whose columns are contiguous, seen by C as (n, d)
# row-major with row stride stride(A, 2). A stays reachable through the Tensor.
function matrix_tensor(A::AbstractMatrix{T}) where {T}
    shape = Int64[size(A, 2), size(A, 1)]
    strides = Int64[stride(A, 2), 1]
    dl = DLTensor(Ptr{Cvoid}(pointer(A)), CPU, Cint(2), dl_dtype(T), pointer(shape), pointer(strides), UInt64(0))
    return Tensor(Ref(dl), shape, strides, A)
end

# A contiguous vector of length n, shape (n,), compact (strides NULL).
function vector_tensor(v::Vector{T}) where {T}
    shape = Int64[length(v)]
    dl = DLTensor(Ptr{Cvoid}(pointer(v)), CPU, Cint(1), dl_dtype(T), pointer(shape), Ptr{Int64}(C_NULL), UInt64(0))
    return Tensor(Ref(dl), shape, Int64[], v)
end

# One element as a 0-d tensor (shape NULL), over v[1].
function scalar_tensor(v::Vector{Float32})
    length(v) == 1 || throw(ArgumentError("a scalar tensor needs a 1-element vector"))
    dl = DLTensor(Ptr{Cvoid}(pointer(v)), CPU, Cint(0), dl_dtype(Float32), Ptr{Int64}(C_NULL), Ptr{Int64}(C_NULL), UInt64(0))
    return Tensor(Ref(dl), Int64[], Int64[], v)
end

# A dense Julia array as a compact C tensor of the reversed size (a Julia
# (w, t, b) array is the row-major (b, t, w) tensor: the same bytes).
function dense_tensor(A::Array, dtype::DLDataType)
    shape = Int64[reverse(size(A))...]
    dl = DLTensor(Ptr{Cvoid}(pointer(A)), CPU, Cint(ndims(A)), dtype, pointer(shape), Ptr{Int64}(C_NULL), UInt64(0))
    return Tensor(Ref(dl), shape, Int64[], A)
end

# Features as C can take them: columns contiguous, column stride >= column
# length (the row stride rule of the ABI). Otherwise one compact copy.
function as_rows(A::AbstractMatrix{T}) where {T}
    dl_dtype(T)   # refuse unsupported element types before copying anything
    if A isa StridedMatrix && stride(A, 1) == 1 && (size(A, 2) == 1 || stride(A, 2) >= size(A, 1))
        return A
    end
    return Matrix{T}(A)
end

# Julia's 1-based labels in 1:c as the ABI's 0-based int64 labels. c = nothing (the
# ring): global column indices, whose upper bound C only the library knows.
function zero_based_labels(labels::AbstractVector{<:Integer}, b::Integer, c::Union{Nothing,Integer})
    length(labels) == b || throw(ArgumentError("labels has $(length(labels)) entries; expected one per sample of q ($b)"))
    out = Vector{Int64}(undef, b)
    for (i, y) in enumerate(labels)
        if c === nothing
            1 <= y <= typemax(Int64) || throw(ArgumentError("labels[$i] = $y; labels are 1-based GLOBAL column indices (>= 1)"))
        else
            1 <= y <= c || throw(ArgumentError("labels[$i] = $y is outside 1:$c (labels are 1-based column indices of k)"))
        end
        out[i] = Int64(y) - 1
    end
    return out
end

include("comm.jl")

# The labels argument of a loss call as the ABI takes them (0-based Int64, or
# nothing): columns of this k, or GLOBAL columns on a ring handle.
labels_arg(c, labels::Nothing, q::AbstractMatrix, k::AbstractMatrix) = nothing
labels_arg(c, labels::AbstractVector{<:Integer}, q::AbstractMatrix, k::AbstractMatrix) =
    zero_based_labels(labels, size(q, 2), c.comm === nothing ? size(k, 2) : nothing)

# ---------------------------------------------------------------------------
# The contrastive loss handle
# ---------------------------------------------------------------------------

"""
    Contrastive(; symmetric=true, loss=(symmetric ? :symmetric : :infonce), num_threads=0, tile_rows=0,
                tile_cols=0, propagate_nonfinite=false, logit_cache_bytes=0, comm=nothing)

A `flatmem_contrastive_t` handle: the symmetric CLIP loss (`symmetric=true`)
or the one-way InfoNCE loss (`symmetric=false`, optional labels), both for
`contrastive_loss`; or, with `loss=:sigmoid`, the pairwise sigmoid (SigLIP)
loss for `sigmoid_loss` and the other `sigmoid_*` functions (`loss`, when
given, wins over `symmetric`). It owns
`num_threads - 1` worker threads (0 = all processors) and a workspace buffer;
`close(c)` releases them now, otherwise a finalizer does when `c` is garbage.
Use one handle from one task at a time. Zero means the library default for
the tile extents; `propagate_nonfinite=true` selects FLATMEM_NONFINITE_PROPAGATE
(no NaN/Inf scan of the inputs).

`logit_cache_bytes` trades memory for compute: the forward keeps the raw logit
tiles that fit in that many bytes (the handle's own memory, `min(bytes, 4 b c)`
from its first forward until it is closed) and the next backward reads them
instead of recomputing them (6 instead of 8 `b c d` FLOPs for forward + backward
of the symmetric loss at `4 b c` bytes). The results are bitwise those without
it; a backward whose `q` or `k` differ from the last forward's recomputes. 0
(the default) keeps none.

`comm` (a `Comm`) makes it the ring loss across ranks ("Ring across ranks" in flatmem.h):
each rank passes its own shard, `q` d x b_r and `k` d x c_r, and every call is collective
(all ranks call forward, then backward, in the same order, with the same loss kind, d, element
type, logit scale and `dloss`). The loss is that of the concatenated global batch
(B = Σ b_r rows, C = Σ c_r columns, shards concatenated in rank order), the same bits on
every rank; `labels` are then GLOBAL 1-based column indices in 1:C (a positive may live on
any rank; the default pairs global row g with global column g); the symmetric loss needs
b_r == c_r on each rank. The backward's `dq` (this rank's rows), `dk` (this rank's columns)
and `dlogit_scale` (the same on every rank) are the exact gradients of the GLOBAL mean loss:
nothing is summed over ranks. A data-parallel optimizer that AVERAGES parameter gradients
over N ranks must pass `dloss = N` (or sum instead of averaging). With a communicator the
handle keeps no workspace and no logit cache (`logit_cache_bytes` must be 0). The handle
keeps a reference to `comm`: the communicator stays open (`close(comm)` is refused, its
finalizer waits) until this handle is closed. A transport failure (a dead or wedged peer)
is a `FlatmemError` with `FLATMEM_STATUS_TIMEOUT` / `_PEER_FAILURE` naming the ring step;
the communicator is then poisoned (close this handle, then `abort!(comm)`).
"""
# The loss kinds of `Contrastive(; loss)`, by name.
const CONTRASTIVE_LOSSES = (symmetric = FLATMEM_CONTRASTIVE_SYMMETRIC, infonce = FLATMEM_CONTRASTIVE_INFONCE,
                            sigmoid = FLATMEM_CONTRASTIVE_SIGMOID)

mutable struct Contrastive
    ptr::Ptr{ContrastiveHandle}
    symmetric::Bool
    loss::Symbol                # :symmetric, :infonce or :sigmoid
    comm::Union{Nothing,Comm}   # the ring's communicator, kept open while this handle is

    function Contrastive(; symmetric::Bool=true, loss::Symbol=(symmetric ? :symmetric : :infonce),
                         num_threads::Integer=0, tile_rows::Integer=0, tile_cols::Integer=0,
                         propagate_nonfinite::Bool=false, logit_cache_bytes::Integer=0,
                         comm::Union{Nothing,Comm}=nothing)
        haskey(CONTRASTIVE_LOSSES, loss) ||
            throw(ArgumentError("loss must be one of $(join(map(repr, keys(CONTRASTIVE_LOSSES)), ", ")), not $(repr(loss))"))
        comm === nothing || ensure_open(comm)
        options = Ref{ContrastiveOptions}()
        check(ccall((:flatmem_contrastive_options_init, libflatmem), Cint,
                    (Ref{ContrastiveOptions}, Csize_t), options, Csize_t(sizeof(ContrastiveOptions))))
        defaults = options[]
        options[] = ContrastiveOptions(defaults.struct_size,
                                       CONTRASTIVE_LOSSES[loss],
                                       Int32(num_threads), Int32(tile_rows), Int32(tile_cols),
                                       propagate_nonfinite ? FLATMEM_NONFINITE_PROPAGATE : FLATMEM_NONFINITE_ERROR,
                                       Int32(0), defaults.fp32_precision, comm === nothing ? Ptr{CommHandle}(C_NULL) : comm.ptr,
                                       Csize_t(logit_cache_bytes))
        out = Ref{Ptr{ContrastiveHandle}}(C_NULL)
        check(ccall((:flatmem_contrastive_create, libflatmem), Cint,
                    (Ref{Ptr{ContrastiveHandle}}, Ref{ContrastiveOptions}), out, options))
        comm === nothing || (comm.users += 1)
        c = new(out[], loss === :symmetric, loss, comm)
        finalizer(destroy_quietly, c)
        return c
    end
end

# Passing a Contrastive to a ccall passes its handle, and keeps the Contrastive
# (so its finalizer) alive for the duration of the call.
Base.unsafe_convert(::Type{Ptr{ContrastiveHandle}}, c::Contrastive) = c.ptr

Base.isopen(c::Contrastive) = c.ptr != C_NULL

function Base.show(io::IO, c::Contrastive)
    print(io, "Flatmem.Contrastive(", c.loss,
          c.comm === nothing ? "" : ", ring rank $(c.comm.rank) of $(c.comm.world_size)", isopen(c) ? ")" : ", closed)")
end

# flatmem_contrastive_destroy on the handle, once, then lets go of its communicator;
# returns the status.
function destroy(c::Contrastive)
    handle = c.ptr
    c.ptr = Ptr{ContrastiveHandle}(C_NULL)
    handle == C_NULL && return FLATMEM_STATUS_SUCCESS
    status = ccall((:flatmem_contrastive_destroy, libflatmem), Cint, (Ptr{ContrastiveHandle},), handle)
    release_user(c.comm)
    return status
end

destroy_quietly(c::Contrastive) = (destroy(c); nothing)

"""`close(c)`: destroy the handle now (joins its threads, frees its buffers; its communicator may then be closed). Idempotent."""
Base.close(c::Contrastive) = check(destroy(c))

function ensure_open(c::Contrastive)
    isopen(c) || throw(ArgumentError("this Flatmem.Contrastive is closed"))
    return c
end

function check_features(q::AbstractMatrix, k::AbstractMatrix)
    eltype(q) === eltype(k) || throw(ArgumentError("q and k must have one element type; got $(eltype(q)) and $(eltype(k))"))
    size(q, 1) == size(k, 1) || throw(ArgumentError(
        "q is $(size(q, 1)) x $(size(q, 2)) and k is $(size(k, 1)) x $(size(k, 2)): both must be d x (samples) with the same d"))
    return nothing
end

"""
    forward_workspace_size(c, q, k) -> Int

Bytes of workspace `flatmem_contrastive_forward` needs for d x b features `q`
and d x c features `k` (informational: the calls here let the handle keep
its own buffer).
"""
function forward_workspace_size(c::Contrastive, q::AbstractMatrix, k::AbstractMatrix)
    ensure_open(c)
    check_features(q, k)
    q_t = matrix_tensor(as_rows(q))
    k_t = matrix_tensor(as_rows(k))
    bytes = Ref{Csize_t}(0)
    status = GC.@preserve q_t k_t begin
        ccall((:flatmem_contrastive_forward_workspace_size, libflatmem), Cint,
              (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ref{Csize_t}),
              c, tensor_ptr(q_t), tensor_ptr(k_t), bytes)
    end
    check(status)
    return Int(bytes[])
end

"""
    backward_workspace_size(c, q, k; dq=true, dk=true) -> Int

Bytes of workspace `flatmem_contrastive_backward` needs, with gradients in
the features' element type (as `contrastive_loss` returns them).
"""
function backward_workspace_size(c::Contrastive, q::AbstractMatrix, k::AbstractMatrix; dq::Bool=true, dk::Bool=true)
    ensure_open(c)
    return gradient_workspace_size(:backward, c, q, k, dq, dk)
end

# The workspace query of the backward (:backward) or of the sigmoid calls
# (:sigmoid) for q, k and, when requested, gradients in the features' type.
function gradient_workspace_size(which::Symbol, c::Contrastive, q::AbstractMatrix, k::AbstractMatrix, dq::Bool, dk::Bool)
    check_features(q, k)
    q_t = matrix_tensor(as_rows(q))
    k_t = matrix_tensor(as_rows(k))
    dq_t = dq ? q_t : nothing   # dq has q's shape and dtype; the query reads nothing else
    dk_t = dk ? k_t : nothing
    bytes = Ref{Csize_t}(0)
    status = GC.@preserve q_t k_t dq_t dk_t begin
        if which === :sigmoid
            ccall((:flatmem_contrastive_sigmoid_workspace_size, libflatmem), Cint,
                  (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ref{Csize_t}),
                  c, tensor_ptr(q_t), tensor_ptr(k_t), tensor_ptr(dq_t), tensor_ptr(dk_t), bytes)
        else
            ccall((:flatmem_contrastive_backward_workspace_size, libflatmem), Cint,
                  (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ref{Csize_t}),
                  c, tensor_ptr(q_t), tensor_ptr(k_t), tensor_ptr(dq_t), tensor_ptr(dk_t), bytes)
        end
    end
    check(status)
    return Int(bytes[])
end

# The forward pass over prepared arrays: (loss, row_lse, col_lse or nothing).
function forward_pass(c::Contrastive, q::AbstractMatrix, k::AbstractMatrix,
                      labels::Union{Nothing,Vector{Int64}}, scale::Vector{Float32})
    loss = Float32[0]
    row_lse = Vector{Float32}(undef, size(q, 2))
    col_lse = c.symmetric ? Vector{Float32}(undef, size(k, 2)) : nothing
    q_t = matrix_tensor(q)
    k_t = matrix_tensor(k)
    labels_t = labels === nothing ? nothing : vector_tensor(labels)
    scale_t = scalar_tensor(scale)
    loss_t = scalar_tensor(loss)
    row_t = vector_tensor(row_lse)
    col_t = col_lse === nothing ? nothing : vector_tensor(col_lse)
    status = GC.@preserve q_t k_t labels_t scale_t loss_t row_t col_t begin
        @gc_safe ccall((:flatmem_contrastive_forward, libflatmem), Cint,
                       (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                        Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{Cvoid}, Csize_t, Ptr{Cvoid}),
                       c, tensor_ptr(q_t), tensor_ptr(k_t), tensor_ptr(labels_t), tensor_ptr(scale_t),
                       tensor_ptr(loss_t), tensor_ptr(row_t), tensor_ptr(col_t), C_NULL, Csize_t(0), C_NULL)
    end
    check(status)
    return loss[1], row_lse, col_lse
end

# The backward pass: (dq, dk, dlogit_scale), dq and dk in the features' type
# and Julia shape (d x b, d x c).
function backward_pass(c::Contrastive, q::AbstractMatrix{T}, k::AbstractMatrix{T},
                       labels::Union{Nothing,Vector{Int64}}, scale::Vector{Float32},
                       row_lse::Vector{Float32}, col_lse::Union{Nothing,Vector{Float32}},
                       dloss::Float32) where {T}
    ensure_open(c)
    dq = Matrix{T}(undef, size(q, 1), size(q, 2))
    dk = Matrix{T}(undef, size(k, 1), size(k, 2))
    dscale = Float32[0]
    g = Float32[dloss]
    q_t = matrix_tensor(q)
    k_t = matrix_tensor(k)
    labels_t = labels === nothing ? nothing : vector_tensor(labels)
    scale_t = scalar_tensor(scale)
    row_t = vector_tensor(row_lse)
    col_t = col_lse === nothing ? nothing : vector_tensor(col_lse)
    g_t = scalar_tensor(g)
    dq_t = matrix_tensor(dq)
    dk_t = matrix_tensor(dk)
    dscale_t = scalar_tensor(dscale)
    status = GC.@preserve q_t k_t labels_t scale_t row_t col_t g_t dq_t dk_t dscale_t begin
        @gc_safe ccall((:flatmem_contrastive_backward, libflatmem), Cint,
                       (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                        Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                        Ptr{Cvoid}, Csize_t, Ptr{Cvoid}),
                       c, tensor_ptr(q_t), tensor_ptr(k_t), tensor_ptr(labels_t), tensor_ptr(scale_t),
                       tensor_ptr(row_t), tensor_ptr(col_t), tensor_ptr(g_t), tensor_ptr(dq_t),
                       tensor_ptr(dk_t), tensor_ptr(dscale_t), C_NULL, Csize_t(0), C_NULL)
    end
    check(status)
    return dq, dk, dscale[1]
end

"""
    contrastive_loss(q, k, logit_scale; labels=nothing, symmetric=true, logit_cache_bytes=0) -> (loss, backward)
    contrastive_loss(c::Contrastive, q, k, logit_scale; labels=nothing) -> (loss, backward)

The mean contrastive loss of features `q` (d x b: one sample per column) and
`k` (d x c) with logits `logit_scale * q[:, i]' * k[:, j]`, never storing the
b x c logit matrix. `symmetric=true` is CLIP's loss (c == b, sample i paired
with column i, no labels); `symmetric=false` is InfoNCE over the rows, with
`labels[i]` in `1:c` the positive column of sample i (1-based; default i,
which needs c >= b).

Element types: `Float32`, `Float16` or bfloat16 (`Flatmem.BF16`, or
`Core.BFloat16` where Julia has it), the same for `q` and `k`; the loss and
`logit_scale` are `Float32`.

Returns the loss (`Float32`) and `backward(dloss = 1f0) -> (dq, dk, dlogit_scale)`:
gradients of `dloss * loss` with `dq` (d x b) and `dk` (d x c) new arrays of
the features' element type and `dlogit_scale` a `Float32` (the gradient with
respect to the scale itself, not its logarithm). `backward` reads `q` and `k`
when it is called: do not mutate them in between. The first form creates a
handle for this loss (freed with the `backward` closure; `logit_cache_bytes` as
for `Contrastive`); the second reuses `c` (its loss kind and logit cache apply)
and must not be used by two tasks at once. When `c` was made with a `Comm`
(the ring loss), `q` and `k` are this rank's shards, the call and `backward`
are collective, `labels` are GLOBAL 1-based columns, and the loss and the
gradients are those of the global batch's mean loss (see `Contrastive`).
"""
function contrastive_loss(c::Contrastive, q::AbstractMatrix, k::AbstractMatrix, logit_scale::Real;
                          labels::Union{Nothing,AbstractVector{<:Integer}}=nothing)
    ensure_open(c)
    c.loss === :sigmoid && throw(ArgumentError("this Flatmem.Contrastive computes the sigmoid loss: call sigmoid_loss"))
    check_features(q, k)
    if c.symmetric
        labels === nothing || throw(ArgumentError("labels are for the InfoNCE loss (symmetric=false) only"))
        size(q, 2) == size(k, 2) || throw(ArgumentError(
            "the symmetric loss pairs sample i of q with sample i of k: q has $(size(q, 2)) samples, k has $(size(k, 2))"))
    end
    qm = as_rows(q)
    km = as_rows(k)
    labels0 = labels_arg(c, labels, qm, km)
    scale = Float32[logit_scale]
    loss, row_lse, col_lse = forward_pass(c, qm, km, labels0, scale)
    backward(dloss::Real = 1.0f0) = backward_pass(c, qm, km, labels0, scale, row_lse, col_lse, Float32(dloss))
    return loss, backward
end

function contrastive_loss(q::AbstractMatrix, k::AbstractMatrix, logit_scale::Real;
                          labels::Union{Nothing,AbstractVector{<:Integer}}=nothing, symmetric::Bool=true,
                          logit_cache_bytes::Integer=0)
    c = Contrastive(; symmetric=symmetric, logit_cache_bytes=logit_cache_bytes)
    return contrastive_loss(c, q, k, logit_scale; labels=labels)
end

# ---------------------------------------------------------------------------
# The sigmoid (SigLIP) loss: a Contrastive made with loss = :sigmoid
# ---------------------------------------------------------------------------
#
# L = -(1/b) Σ_i Σ_j log σ(z_ij x_ij), x_ij = s q[:, i]' k[:, j] + t, z_ij = +1
# for sample i's positive column y_i and -1 for every other column: the sum
# over all c columns of a sample, the MEAN over the b samples (flatmem.h,
# "Sigmoid (SigLIP) loss"). Gradients are those of this L with respect to q,
# k, and to s and t themselves (a framework learning log s multiplies
# dlogit_scale by s).

function ensure_sigmoid(c::Contrastive)
    ensure_open(c)
    c.loss === :sigmoid ||
        throw(ArgumentError("this Flatmem.Contrastive computes the $(c.loss) loss; the sigmoid functions need Contrastive(; loss = :sigmoid)"))
    return c
end

"""
    sigmoid_workspace_size(c, q, k; dq=true, dk=true) -> Int

Bytes of workspace the sigmoid calls of `c` (made with `loss = :sigmoid`)
need for d x b features `q` and d x c features `k`, with gradients `dq`
/ `dk` in the features' element type when requested (both `false`: the
forward). Informational: the calls here let the handle keep its own buffer.
"""
function sigmoid_workspace_size(c::Contrastive, q::AbstractMatrix, k::AbstractMatrix; dq::Bool=true, dk::Bool=true)
    ensure_sigmoid(c)
    return gradient_workspace_size(:sigmoid, c, q, k, dq, dk)
end

# The inputs of a sigmoid call as C takes them: features with contiguous
# columns, 0-based labels (or nothing), s and t as 1-element Float32 vectors.
struct SigmoidInputs{T}
    q::AbstractMatrix{T}
    k::AbstractMatrix{T}
    labels::Union{Nothing,Vector{Int64}}
    scale::Vector{Float32}
    bias::Vector{Float32}
end

function SigmoidInputs(c::Contrastive, q::AbstractMatrix, k::AbstractMatrix, logit_scale::Real, logit_bias::Real,
                       labels::Union{Nothing,AbstractVector{<:Integer}})
    ensure_sigmoid(c)
    check_features(q, k)
    qm = as_rows(q)
    km = as_rows(k)
    return SigmoidInputs(qm, km, labels_arg(c, labels, qm, km), Float32[logit_scale], Float32[logit_bias])
end

# One call of flatmem_contrastive_sigmoid_<path> (:forward, :value_and_grad,
# :backward) into the given outputs: `loss` a 1-element Float32 vector or
# nothing (:backward), `grads` nothing (:forward) or (dq, dk) matrices of one
# element type (Float32 or the features') and 1-element ds, dt vectors.
function sigmoid_call(path::Symbol, c::Contrastive, x::SigmoidInputs, loss::Union{Nothing,Vector{Float32}},
                      grads::Union{Nothing,Tuple}, dloss::Float32)
    ensure_sigmoid(c)
    q_t = matrix_tensor(x.q)
    k_t = matrix_tensor(x.k)
    labels_t = x.labels === nothing ? nothing : vector_tensor(x.labels)
    scale_t = scalar_tensor(x.scale)
    bias_t = scalar_tensor(x.bias)
    g_t = scalar_tensor(Float32[dloss])
    loss_t = loss === nothing ? nothing : scalar_tensor(loss)
    dq_t, dk_t, ds_t, dt_t = grads === nothing ? (nothing, nothing, nothing, nothing) :
        (matrix_tensor(grads[1]), matrix_tensor(grads[2]), scalar_tensor(grads[3]), scalar_tensor(grads[4]))
    status = GC.@preserve q_t k_t labels_t scale_t bias_t g_t loss_t dq_t dk_t ds_t dt_t begin
        if path === :forward
            @gc_safe ccall((:flatmem_contrastive_sigmoid_forward, libflatmem), Cint,
                           (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                            Ptr{DLTensor}, Ptr{DLTensor}, Ptr{Cvoid}, Csize_t, Ptr{Cvoid}),
                           c, tensor_ptr(q_t), tensor_ptr(k_t), tensor_ptr(labels_t), tensor_ptr(scale_t),
                           tensor_ptr(bias_t), tensor_ptr(loss_t), C_NULL, Csize_t(0), C_NULL)
        elseif path === :value_and_grad
            @gc_safe ccall((:flatmem_contrastive_sigmoid_value_and_grad, libflatmem), Cint,
                           (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                            Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                            Ptr{Cvoid}, Csize_t, Ptr{Cvoid}),
                           c, tensor_ptr(q_t), tensor_ptr(k_t), tensor_ptr(labels_t), tensor_ptr(scale_t),
                           tensor_ptr(bias_t), tensor_ptr(loss_t), tensor_ptr(dq_t), tensor_ptr(dk_t),
                           tensor_ptr(ds_t), tensor_ptr(dt_t), C_NULL, Csize_t(0), C_NULL)
        else
            @gc_safe ccall((:flatmem_contrastive_sigmoid_backward, libflatmem), Cint,
                           (Ptr{ContrastiveHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                            Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor},
                            Ptr{Cvoid}, Csize_t, Ptr{Cvoid}),
                           c, tensor_ptr(q_t), tensor_ptr(k_t), tensor_ptr(labels_t), tensor_ptr(scale_t),
                           tensor_ptr(bias_t), tensor_ptr(g_t), tensor_ptr(dq_t), tensor_ptr(dk_t),
                           tensor_ptr(ds_t), tensor_ptr(dt_t), C_NULL, Csize_t(0), C_NULL)
        end
    end
    check(status)
    return nothing
end

# New gradient outputs of element type G for these inputs: (dq d x b, dk d x c, ds, dt).
new_sigmoid_grads(x::SigmoidInputs, ::Type{G}) where {G} =
    (Matrix{G}(undef, size(x.q)...), Matrix{G}(undef, size(x.k)...), Float32[0], Float32[0])

"""
    sigmoid_forward(c, q, k, logit_scale, logit_bias; labels=nothing) -> Float32

The sigmoid (SigLIP) loss alone (`2 b c d` FLOPs) on a `Contrastive(; loss = :sigmoid)`:
`q` d x b and `k` d x c (one sample per column) of one element type (`Float32`, `Float16`
or bfloat16), `logit_scale` s (finite, > 0) and `logit_bias` t (finite),
`labels[i]` in `1:c` the positive column of sample i (1-based; default i, which needs
c >= b). Returns `L = -(1/b) Σ_i Σ_j log σ(z_ij (s q[:, i]' k[:, j] + t))`.
"""
function sigmoid_forward(c::Contrastive, q::AbstractMatrix, k::AbstractMatrix, logit_scale::Real, logit_bias::Real;
                         labels::Union{Nothing,AbstractVector{<:Integer}}=nothing)
    x = SigmoidInputs(c, q, k, logit_scale, logit_bias, labels)
    loss = Float32[0]
    sigmoid_call(:forward, c, x, loss, nothing, 1.0f0)
    return loss[1]
end

"""
    sigmoid_value_and_grad(c, q, k, logit_scale, logit_bias; labels=nothing)
        -> (loss, dq, dk, dlogit_scale, dlogit_bias)

The loss and all its gradients from one tile walk (`6 b c d` FLOPs); arguments as for
`sigmoid_forward`. `dq` (d x b) and `dk` (d x c) are new arrays of the features'
element type (16-bit ones accumulated in fp32, rounded once); `dlogit_scale` = dL/ds
and `dlogit_bias` = dL/dt are `Float32`s (with respect to s and t themselves).
"""
function sigmoid_value_and_grad(c::Contrastive, q::AbstractMatrix{T}, k::AbstractMatrix{T}, logit_scale::Real,
                                logit_bias::Real; labels::Union{Nothing,AbstractVector{<:Integer}}=nothing) where {T}
    x = SigmoidInputs(c, q, k, logit_scale, logit_bias, labels)
    loss = Float32[0]
    dq, dk, ds, dt = grads = new_sigmoid_grads(x, T)
    sigmoid_call(:value_and_grad, c, x, loss, grads, 1.0f0)
    return loss[1], dq, dk, ds[1], dt[1]
end

"""
    sigmoid_backward(c, q, k, logit_scale, logit_bias, dloss=1f0; labels=nothing)
        -> (dq, dk, dlogit_scale, dlogit_bias)

`dloss` times the gradients of `sigmoid_value_and_grad`, recomputing the logits
(`6 b c d` FLOPs): for callers that do not keep gradients between their forward and
backward. Arguments and results as for `sigmoid_value_and_grad`.
"""
function sigmoid_backward(c::Contrastive, q::AbstractMatrix{T}, k::AbstractMatrix{T}, logit_scale::Real,
                          logit_bias::Real, dloss::Real=1.0f0;
                          labels::Union{Nothing,AbstractVector{<:Integer}}=nothing) where {T}
    x = SigmoidInputs(c, q, k, logit_scale, logit_bias, labels)
    dq, dk, ds, dt = grads = new_sigmoid_grads(x, T)
    sigmoid_call(:backward, c, x, nothing, grads, Float32(dloss))
    return dq, dk, ds[1], dt[1]
end

"""
    sigmoid_loss(q, k, logit_scale, logit_bias; labels=nothing, num_threads=0) -> (loss, backward)
    sigmoid_loss(c::Contrastive, q, k, logit_scale, logit_bias; labels=nothing) -> (loss, backward)

The pairwise sigmoid (SigLIP) loss of features `q` (d x b: one sample per column) and
`k` (d x c), logit scale s and bias t, never storing the b x c logit matrix:

    L = -(1/b) Σ_i Σ_j log σ(z_ij (s q[:, i]' k[:, j] + t))

with z_ij = +1 for sample i's positive column (`labels[i]` in `1:c`, 1-based; default i,
which needs c >= b) and -1 for every other column: the sum over all c columns, the
MEAN over the b samples. Element types as for `contrastive_loss` (`Float32`,
`Float16`, bfloat16; `q` and `k` alike); s (finite, > 0) and t (finite) are taken as
`Float32`.

Returns the loss (`Float32`) and `backward(dloss = 1f0) -> (dq, dk, dlogit_scale,
dlogit_bias)`: the gradients of `dloss * loss`, `dq` (d x b) and `dk` (d x c) new arrays
of the features' element type, `dlogit_scale` = dL/ds and `dlogit_bias` = dL/dt
(`Float32`, with respect to s and t themselves: times s for a learned log s). The
forward computes the loss and its gradients in ONE tile walk
(`flatmem_contrastive_sigmoid_value_and_grad`, `6 b c d` FLOPs, fp32 gradients kept in
the closure: `4 (b + c) d` bytes) and `backward` only scales them by `dloss` (rounded
once to the features' type): no recompute. The first form creates a handle
(`Contrastive(; loss = :sigmoid, num_threads)`, freed with the closure); the second
reuses `c`, which must be made with `loss = :sigmoid`. When `c` has a `Comm` (the ring),
`q` and `k` are this rank's shards, the call is collective, `labels` are GLOBAL 1-based
columns, `L` is the mean over the B global samples and `dq`, `dk` are this rank's
columns of the global gradient (`dlogit_scale`, `dlogit_bias` the same on every rank;
nothing summed over ranks, see `Contrastive`).
"""
function sigmoid_loss(c::Contrastive, q::AbstractMatrix{T}, k::AbstractMatrix{T}, logit_scale::Real,
                      logit_bias::Real; labels::Union{Nothing,AbstractVector{<:Integer}}=nothing) where {T}
    x = SigmoidInputs(c, q, k, logit_scale, logit_bias, labels)
    loss = Float32[0]
    dq, dk, ds, dt = grads = new_sigmoid_grads(x, Float32)
    sigmoid_call(:value_and_grad, c, x, loss, grads, 1.0f0)
    function backward(dloss::Real = 1.0f0)
        g = Float32(dloss)
        return T.(g .* dq), T.(g .* dk), g * ds[1], g * dt[1]
    end
    return loss[1], backward
end

function sigmoid_loss(q::AbstractMatrix, k::AbstractMatrix, logit_scale::Real, logit_bias::Real;
                      labels::Union{Nothing,AbstractVector{<:Integer}}=nothing, num_threads::Integer=0)
    c = Contrastive(; loss=:sigmoid, num_threads=num_threads)
    try
        return sigmoid_loss(c, q, k, logit_scale, logit_bias; labels=labels)
    finally
        close(c)
    end
end

# ---------------------------------------------------------------------------
# Reversible segments of built-in blocks (flatmem/reversible.h)
# ---------------------------------------------------------------------------
#
# Layout. As for features, a Julia array is handed to C with its size
# reversed: a state of Julia size (width, tokens, batch) is the row-major
# (batch, tokens, width) state of the C API, and a parameter the header gives
# as (rows, cols) is a Julia (cols, rows) matrix, i.e. the (out, in) matrix W
# that maps a column x to W * x. States and parameters must be dense `Array`s
# (no copy is made: the C block keeps pointers to the parameters).
#
# Only built-in blocks are exposed as F and G, not Julia functions:
# flatmem-check: not wrapped: flatmem_reversible_callback_error: it is for F/G callbacks written in the binding's language, and Julia functions are not exposed as F/G: OVERLAPPED (and AUTO) backwards call the rebuild's forward callbacks on a thread the library owns, which Julia cannot enter through a @cfunction before 1.9 (foreign-thread adoption), and no Julia runtime exists here to test the @cfunction path; the built-in blocks' callbacks are C

state_dtype(::Type{T}) where {T} = throw(ArgumentError("reversible states are Float32 or Float64 arrays, not $T"))
state_dtype(::Type{Float32}) = DLDataType(kDLFloat, 32, 1)
state_dtype(::Type{Float64}) = DLDataType(kDLFloat, 64, 1)

# A dense Float32/Float64 Julia array as a compact C tensor of the reversed size.
array_tensor(A::Array{T}) where {T} = dense_tensor(A, state_dtype(T))

# flatmem_block_math of a Block's `math` keyword: a Symbol by name, an Integer as it is
# (flatmem_block_create refuses values outside the enum, naming options.math).
block_math(math::Integer) = Cint(math)
function block_math(math::Symbol)
    math === :fp32 && return FLATMEM_BLOCK_MATH_FP32
    math === :tf32 && return FLATMEM_BLOCK_MATH_TF32
    throw(ArgumentError("math must be :fp32 or :tf32, not :$math"))
end

"""
    block_seed(seed, block, part) -> UInt64

The seed that block `block` (0-based, as the C API counts), part `:F` or `:G`
receives for a call `seed` (`flatmem_reversible_block_seed`).
"""
function block_seed(seed::Integer, block::Integer, part::Symbol)
    p = part === :F ? FLATMEM_REVERSIBLE_F : part === :G ? FLATMEM_REVERSIBLE_G :
        throw(ArgumentError("part must be :F or :G, not :$part"))
    return ccall((:flatmem_reversible_block_seed, libflatmem), UInt64, (UInt64, Int32, Int32),
                 UInt64(seed), Int32(block), Int32(p))
end

"""
    Block(kind, width; heads=0, hidden=0, layer_norm_eps=0, math=:fp32)

A built-in block (`flatmem_block_t`): `kind` is `:attention` (F(x) = MHSA(LN(x)),
`heads` heads, 0 = 1) or `:mlp` (G(x) = GELU(LN(x) W1 + b1) W2 + b2, `hidden`
units, 0 = 4 width); zeros are the library's defaults. `math` is the precision
of the products (`flatmem_block_math`): `:fp32` or `:tf32` (CUDA tensor cores;
the CPU, where these Julia arrays live, runs FP32 for either), or a raw
integer, which the library checks. Give it its parameters
with `set_parameters!` before a segment uses it. `close(b)` frees it (refused
while an open `Segment` uses it); otherwise a finalizer does, after every
segment using it is gone.
"""
mutable struct Block
    ptr::Ptr{BlockHandle}
    kind::Symbol
    width::Int
    heads::Int
    hidden::Int
    parameters::Vector{Array{Float32}}   # what the C block points at: kept alive here
    gradients::Vector{Array{Float32}}
    users::Int                           # open segments calling this block
    finalized::Bool                      # unreachable: destroyed when users reaches 0

    function Block(kind::Symbol, width::Integer; heads::Integer=0, hidden::Integer=0, layer_norm_eps::Real=0,
                   math::Union{Symbol,Integer}=:fp32)
        kind in (:attention, :mlp) || throw(ArgumentError("kind must be :attention or :mlp, not :$kind"))
        math_value = block_math(math)
        options = Ref{BlockOptions}()
        check(ccall((:flatmem_block_options_init, libflatmem), Cint, (Ref{BlockOptions}, Csize_t),
                    options, Csize_t(sizeof(BlockOptions))))
        defaults = options[]
        options[] = BlockOptions(defaults.struct_size, kind === :attention ? FLATMEM_BLOCK_ATTENTION : FLATMEM_BLOCK_MLP,
                                 Int32(width), Int32(heads), Int32(hidden), Float32(layer_norm_eps), math_value)
        out = Ref{Ptr{BlockHandle}}(C_NULL)
        check(ccall((:flatmem_block_create, libflatmem), Cint, (Ref{Ptr{BlockHandle}}, Ref{BlockOptions}), out, options))
        b = new(out[], kind, Int(width), Int(heads), Int(hidden), Array{Float32}[], Array{Float32}[], 0, false)
        finalizer(finalize_block, b)
        return b
    end
end

Base.unsafe_convert(::Type{Ptr{BlockHandle}}, b::Block) = b.ptr
Base.isopen(b::Block) = b.ptr != C_NULL

function Base.show(io::IO, b::Block)
    print(io, "Flatmem.Block(:", b.kind, ", ", b.width, isopen(b) ? ")" : ", closed)")
end

function destroy(b::Block)
    handle = b.ptr
    b.ptr = Ptr{BlockHandle}(C_NULL)
    handle == C_NULL && return FLATMEM_STATUS_SUCCESS
    return ccall((:flatmem_block_destroy, libflatmem), Cint, (Ptr{BlockHandle},), handle)
end

# A segment may still call the block: then the last segment to go destroys it.
function finalize_block(b::Block)
    b.finalized = true
    b.users == 0 && destroy(b)
    return nothing
end

function Base.close(b::Block)
    b.users == 0 || throw(ArgumentError("this Flatmem.Block is used by $(b.users) open segment(s): close them first"))
    return check(destroy(b))
end

function ensure_open(b::Block)
    isopen(b) || throw(ArgumentError("this Flatmem.Block is closed"))
    return b
end

"""
    parameter_sizes(b::Block) -> Vector{Tuple}

The Julia sizes of the six parameters, in the header's order (the C shapes
reversed): attention `ln_weight (w,)`, `ln_bias (w,)`, `qkv_weight (3w, w)`,
`qkv_bias (3w,)`, `proj_weight (w, w)`, `proj_bias (w,)`; MLP `ln_weight
(w,)`, `ln_bias (w,)`, `fc1_weight (h, w)`, `fc1_bias (h,)`, `fc2_weight (w,
h)`, `fc2_bias (w,)`.
"""
function parameter_sizes(b::Block)
    w = b.width
    if b.kind === :attention
        return [(w,), (w,), (3w, w), (3w,), (w, w), (w,)]
    end
    h = b.hidden == 0 ? 4w : b.hidden
    return [(w,), (w,), (h, w), (h,), (w, h), (w,)]
end

function parameter_array(b::Block, A, name::String, want::Tuple)
    A isa Array{Float32} || throw(ArgumentError(
        "$name must be a dense Array{Float32} (the block keeps a pointer to it, no copy is made); got $(typeof(A))"))
    size(A) == want || throw(ArgumentError("$name has size $(size(A)); expected $want"))
    return A
end

"""
    set_parameters!(b::Block, parameters, gradients=nothing)

Points the block at its six parameters and (for a backward) six gradient
accumulators, dense `Array{Float32}`s of `parameter_sizes(b)`
(`flatmem_block_set_parameters`). No copy: the block keeps the arrays (and so
keeps them alive) and the library reads them in every segment call; every
backward ADDS into the gradients (`zero_gradients!` first). May be called again
between segment calls.
"""
function set_parameters!(b::Block, parameters::AbstractVector, gradients::Union{Nothing,AbstractVector}=nothing)
    ensure_open(b)
    sizes = parameter_sizes(b)
    n = FLATMEM_BLOCK_NUM_PARAMETERS
    length(parameters) == n || throw(ArgumentError("parameters: $(length(parameters)) arrays; expected $n"))
    gradients === nothing || length(gradients) == n || throw(ArgumentError("gradients: $(length(gradients)) arrays; expected $n"))
    ps = Array{Float32}[parameter_array(b, parameters[i], "parameters[$i]", sizes[i]) for i in 1:n]
    gs = gradients === nothing ? Array{Float32}[] :
         Array{Float32}[parameter_array(b, gradients[i], "gradients[$i]", sizes[i]) for i in 1:n]
    p_holders = [array_tensor(p) for p in ps]
    g_holders = [array_tensor(g) for g in gs]
    p_dl = DLTensor[t.dl[] for t in p_holders]
    g_dl = DLTensor[t.dl[] for t in g_holders]
    status = GC.@preserve p_holders g_holders p_dl g_dl begin
        ccall((:flatmem_block_set_parameters, libflatmem), Cint, (Ptr{BlockHandle}, Ptr{DLTensor}, Ptr{DLTensor}),
              b, p_dl, isempty(g_dl) ? Ptr{DLTensor}(C_NULL) : pointer(g_dl))
    end
    check(status)
    b.parameters = ps
    b.gradients = gs
    return b
end

"""`zero_gradients!(b)`: fill the block's gradient accumulators with zeros."""
zero_gradients!(b::Block) = (foreach(g -> fill!(g, 0.0f0), b.gradients); b)

# The block's callbacks (flatmem_block_function), for a ReversibleBlock.
function block_function(b::Block)
    ensure_open(b)
    fn = Ref{ReversibleFunction}()
    check(ccall((:flatmem_block_function, libflatmem), Cint, (Ptr{BlockHandle}, Ref{ReversibleFunction}), b, fn))
    return fn[]
end

const MODES = (auto=FLATMEM_REVERSIBLE_AUTO, standard=FLATMEM_REVERSIBLE_STANDARD,
               vanilla=FLATMEM_REVERSIBLE_VANILLA, overlapped=FLATMEM_REVERSIBLE_OVERLAPPED)

"""
    Segment(layers; mode=:auto, num_threads=0)

A reversible segment (`flatmem_reversible_t`) of `length(layers)` blocks, each
layer a `(F::Block, G::Block)` tuple (typically `(Block(:attention, w), Block(:mlp, w))`);
block k maps `(X1, X2)` to `Y1 = X1 + F(X2)`, `Y2 = X2 + G(Y1)`. `mode` is
`:auto`, `:standard`, `:vanilla` or `:overlapped` (see reversible.h);
`num_threads` 0 = all processors. The segment keeps its blocks (and they their
parameters) alive; `close(s)` frees it now, otherwise a finalizer does. One
task at a time.
"""
mutable struct Segment
    ptr::Ptr{ReversibleHandle}
    blocks::Vector{Block}   # F of block 1, G of block 1, F of block 2, ...
    mode::Symbol

    function Segment(layers::AbstractVector; mode::Symbol=:auto, num_threads::Integer=0)
        haskey(MODES, mode) || throw(ArgumentError("mode must be one of $(keys(MODES)), not :$mode"))
        isempty(layers) && throw(ArgumentError("a segment needs at least one (F, G) layer"))
        blocks = Block[]
        for (i, layer) in enumerate(layers)
            layer isa Tuple{Block,Block} || throw(ArgumentError("layers[$i] must be an (F::Block, G::Block) tuple"))
            push!(blocks, ensure_open(layer[1]), ensure_open(layer[2]))
        end
        raw = ReversibleBlock[ReversibleBlock(block_function(blocks[2i - 1]), block_function(blocks[2i])) for i in 1:length(layers)]
        options = Ref{ReversibleOptions}()
        check(ccall((:flatmem_reversible_options_init, libflatmem), Cint, (Ref{ReversibleOptions}, Csize_t),
                    options, Csize_t(sizeof(ReversibleOptions))))
        defaults = options[]
        options[] = ReversibleOptions(defaults.struct_size, MODES[mode], Int32(num_threads))
        out = Ref{Ptr{ReversibleHandle}}(C_NULL)
        status = GC.@preserve raw begin
            ccall((:flatmem_reversible_create, libflatmem), Cint,
                  (Ref{Ptr{ReversibleHandle}}, Ptr{ReversibleBlock}, Int32, Ref{ReversibleOptions}),
                  out, raw, Int32(length(raw)), options)
        end
        check(status)
        foreach(b -> b.users += 1, blocks)
        s = new(out[], blocks, mode)
        finalizer(destroy_quietly, s)
        return s
    end
end

Base.unsafe_convert(::Type{Ptr{ReversibleHandle}}, s::Segment) = s.ptr
Base.isopen(s::Segment) = s.ptr != C_NULL
Base.length(s::Segment) = length(s.blocks) ÷ 2

function Base.show(io::IO, s::Segment)
    print(io, "Flatmem.Segment(", length(s), " blocks, :", s.mode, isopen(s) ? ")" : ", closed)")
end

# flatmem_reversible_destroy (joins its thread), then releases the blocks.
function destroy(s::Segment)
    handle = s.ptr
    s.ptr = Ptr{ReversibleHandle}(C_NULL)
    handle == C_NULL && return FLATMEM_STATUS_SUCCESS
    status = ccall((:flatmem_reversible_destroy, libflatmem), Cint, (Ptr{ReversibleHandle},), handle)
    for b in s.blocks
        b.users -= 1
        b.users == 0 && b.finalized && destroy(b)
    end
    return status
end

destroy_quietly(s::Segment) = (destroy(s); nothing)

"""`close(s)`: destroy the segment now (its blocks stay usable). Idempotent."""
Base.close(s::Segment) = check(destroy(s))

function ensure_open(s::Segment)
    isopen(s) || throw(ArgumentError("this Flatmem.Segment is closed"))
    return s
end

# A state argument: a dense Float32/Float64 Array like `like` (same size and type).
function state_tensor(A::AbstractArray, name::String, like::Union{Nothing,AbstractArray}=nothing)
    A isa Array || throw(ArgumentError("$name must be a dense Array (no copy is made); got $(typeof(A))"))
    if like !== nothing && (size(A) != size(like) || eltype(A) !== eltype(like))
        throw(ArgumentError("$name is $(summary(A)); expected $(summary(like)) like x1 / y1"))
    end
    return array_tensor(A)
end

"""
    forward!(s::Segment, y1, y2, x1, x2; seed=0, offset=0) -> (y1, y2)

Segment forward into `y1`, `y2` (dense arrays of x1's size and element type,
Float32 for built-in blocks). `seed`/`offset` are handed to the blocks (pass the
same to the backward).
"""
function forward!(s::Segment, y1::AbstractArray, y2::AbstractArray, x1::AbstractArray, x2::AbstractArray;
                  seed::Integer=0, offset::Integer=0)
    ensure_open(s)
    x1_t = state_tensor(x1, "x1")
    x2_t = state_tensor(x2, "x2", x1)
    y1_t = state_tensor(y1, "y1", x1)
    y2_t = state_tensor(y2, "y2", x1)
    status = GC.@preserve x1_t x2_t y1_t y2_t begin
        ccall((:flatmem_reversible_forward, libflatmem), Cint,
              (Ptr{ReversibleHandle}, Ptr{DLTensor}, Ptr{DLTensor}, UInt64, UInt64, Ptr{DLTensor}, Ptr{DLTensor},
               Ptr{Cvoid}, Csize_t, Ptr{Cvoid}),
              s, tensor_ptr(x1_t), tensor_ptr(x2_t), UInt64(seed), UInt64(offset), tensor_ptr(y1_t),
              tensor_ptr(y2_t), C_NULL, 0, C_NULL)
    end
    check(status)
    return y1, y2
end

"""`forward(s, x1, x2; seed=0, offset=0) -> (y1, y2)`: `forward!` into new arrays."""
forward(s::Segment, x1::AbstractArray, x2::AbstractArray; kw...) = forward!(s, similar(x1), similar(x2), x1, x2; kw...)

"""
    backward!(s::Segment, dx1, dx2, y1, y2, dy1, dy2; seed=0, offset=0, x1=nothing, x2=nothing)

Segment backward from the forward's output `(y1, y2)` and the upstream
gradients `(dy1, dy2)`: writes `dx1`, `dx2`, and the rebuilt input into `x1`,
`x2` when given (both or neither). The blocks ADD their parameter gradients
into their gradient arrays. Returns `(dx1, dx2)`.
"""
function backward!(s::Segment, dx1::AbstractArray, dx2::AbstractArray, y1::AbstractArray, y2::AbstractArray,
                   dy1::AbstractArray, dy2::AbstractArray; seed::Integer=0, offset::Integer=0,
                   x1::Union{Nothing,AbstractArray}=nothing, x2::Union{Nothing,AbstractArray}=nothing)
    ensure_open(s)
    (x1 === nothing) == (x2 === nothing) || throw(ArgumentError("pass both rebuilt-input outputs x1 and x2, or neither"))
    y1_t = state_tensor(y1, "y1")
    y2_t = state_tensor(y2, "y2", y1)
    dy1_t = state_tensor(dy1, "dy1", y1)
    dy2_t = state_tensor(dy2, "dy2", y1)
    dx1_t = state_tensor(dx1, "dx1", y1)
    dx2_t = state_tensor(dx2, "dx2", y1)
    x1_t = x1 === nothing ? nothing : state_tensor(x1, "x1", y1)
    x2_t = x2 === nothing ? nothing : state_tensor(x2, "x2", y1)
    status = GC.@preserve y1_t y2_t dy1_t dy2_t dx1_t dx2_t x1_t x2_t begin
        ccall((:flatmem_reversible_backward, libflatmem), Cint,
              (Ptr{ReversibleHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, UInt64, UInt64,
               Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{DLTensor}, Ptr{Cvoid}, Csize_t, Ptr{Cvoid}),
              s, tensor_ptr(y1_t), tensor_ptr(y2_t), tensor_ptr(dy1_t), tensor_ptr(dy2_t), UInt64(seed),
              UInt64(offset), tensor_ptr(dx1_t), tensor_ptr(dx2_t), tensor_ptr(x1_t), tensor_ptr(x2_t),
              C_NULL, 0, C_NULL)
    end
    check(status)
    return dx1, dx2
end

"""
    backward(s, y1, y2, dy1, dy2; seed=0, offset=0, rebuild=false)

`backward!` into new arrays: `(dx1, dx2)`, or `(dx1, dx2, x1, x2)` with the
rebuilt input when `rebuild=true`.
"""
function backward(s::Segment, y1::AbstractArray, y2::AbstractArray, dy1::AbstractArray, dy2::AbstractArray;
                  seed::Integer=0, offset::Integer=0, rebuild::Bool=false)
    dx1, dx2 = similar(y1), similar(y2)
    if rebuild
        x1, x2 = similar(y1), similar(y2)
        backward!(s, dx1, dx2, y1, y2, dy1, dy2; seed=seed, offset=offset, x1=x1, x2=x2)
        return dx1, dx2, x1, x2
    end
    return backward!(s, dx1, dx2, y1, y2, dy1, dy2; seed=seed, offset=offset)
end

"""`last_mode(s) -> Symbol`: the mode the last successful backward ran (`:auto` before any)."""
function last_mode(s::Segment)
    ensure_open(s)
    mode = Ref{Cint}(FLATMEM_REVERSIBLE_AUTO)
    check(ccall((:flatmem_reversible_last_mode, libflatmem), Cint, (Ptr{ReversibleHandle}, Ref{Cint}), s, mode))
    return enum_symbol(MODES, mode[], "mode")
end

"""
    rebuild_error(s, x1, x2; seed=0, offset=0) -> Vector{Float64}

For each block, max |rebuilt - true| / max |true| over both streams of its
input after a forward from `(x1, x2)` and a rebuild (a diagnostic; allocates
O(blocks) states).
"""
function rebuild_error(s::Segment, x1::AbstractArray, x2::AbstractArray; seed::Integer=0, offset::Integer=0)
    ensure_open(s)
    errors = zeros(Float64, length(s))
    x1_t = state_tensor(x1, "x1")
    x2_t = state_tensor(x2, "x2", x1)
    errors_t = array_tensor(errors)
    status = GC.@preserve x1_t x2_t errors_t begin
        ccall((:flatmem_reversible_rebuild_error, libflatmem), Cint,
              (Ptr{ReversibleHandle}, Ptr{DLTensor}, Ptr{DLTensor}, UInt64, UInt64, Ptr{DLTensor}, Ptr{Cvoid}),
              s, tensor_ptr(x1_t), tensor_ptr(x2_t), UInt64(seed), UInt64(offset), tensor_ptr(errors_t), C_NULL)
    end
    check(status)
    return errors
end

"""`forward_workspace_size(s::Segment, x) -> Int`: workspace bytes of a forward on states like `x` (informational)."""
function forward_workspace_size(s::Segment, x::AbstractArray)
    ensure_open(s)
    x_t = state_tensor(x, "x")
    bytes = Ref{Csize_t}(0)
    status = GC.@preserve x_t begin
        ccall((:flatmem_reversible_forward_workspace_size, libflatmem), Cint,
              (Ptr{ReversibleHandle}, Ptr{DLTensor}, Ref{Csize_t}), s, tensor_ptr(x_t), bytes)
    end
    check(status)
    return Int(bytes[])
end

"""`backward_workspace_size(s::Segment, x) -> Int`: workspace bytes of a backward on states like `x` (the mode's)."""
function backward_workspace_size(s::Segment, x::AbstractArray)
    ensure_open(s)
    x_t = state_tensor(x, "x")
    bytes = Ref{Csize_t}(0)
    status = GC.@preserve x_t begin
        ccall((:flatmem_reversible_backward_workspace_size, libflatmem), Cint,
              (Ptr{ReversibleHandle}, Ptr{DLTensor}, Ref{Csize_t}), s, tensor_ptr(x_t), bytes)
    end
    check(status)
    return Int(bytes[])
end

include("cyclic.jl")

end # module Flatmem
