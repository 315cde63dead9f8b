# comm.jl -- communicators (flatmem/comm.h), included by Flatmem.jl.
#
# A `Comm` is one rank's flatmem_comm_t: world_size processes (or, with
# local_comms, threads of this process) joined over UCX. Ranks, peers and tags
# are 0-based, as the C API counts them. Buffers are dense host `Array`s; the
# bytes of a message are the array's bytes (a Julia (d, n) array is the C
# row-major (n, d) tensor: the shape is reversed, the bytes are the same).
#
# Lifetimes. A Comm is released by close(c) / abort!(c), or by its finalizer
# when it is garbage. A Contrastive or Cyclic handle over it keeps a reference
# (and counts itself in `users`): close and abort! refuse while one is open,
# and the finalizer of an unreachable Comm leaves the destroy to the last of
# its users. A Request keeps its buffer, and the Comm keeps its outstanding
# Requests, until the request is waited on or the Comm is released (which
# cancels it): C never writes into memory the GC has reclaimed.
#
# Failure. Every wait has a deadline (timeout_ms, 0 = the communicator's
# default); a timeout or a dead peer is a FlatmemError with status
# FLATMEM_STATUS_TIMEOUT / _PEER_FAILURE naming the operation, the peer and the
# step, and poisons the communicator (later calls: FLATMEM_STATUS_COMM_POISONED).
# Release a poisoned Comm with abort! (its peers then fail at once instead of at
# their own deadline). Arguments the binding refuses before calling C (an
# ArgumentError: a non-Array buffer, an element type C has no dtype for) fail on
# this rank only: in a collective, the other ranks then fail at their deadline.
#
# Threads. One task (thread) at a time per Comm, and per handle over it. A
# blocking call (create, wait, the collectives, the ring loss, cyclic_next!)
# marks its thread GC-safe while it waits (@gc_safe in Flatmem.jl), so the
# ranks of an in-process group may be Julia threads (Threads.@spawn, one per
# rank) that allocate while their peers wait.

"""
    CommUniqueId

`flatmem_comm_unique_id`: what rank 0 makes with `unique_id` and every rank passes to
`Comm(rank, world_size, id)`. Plain bytes (rank 0's listening address and a random session
number): `string(id)` writes it as 256 hex digits, `CommUniqueId(hex)` reads them back, so it can
travel on a command line, in a file or over a launcher's own broadcast.
"""
CommUniqueId

function CommUniqueId(hex::AbstractString)
    n = FLATMEM_COMM_UNIQUE_ID_BYTES
    bytes = try
        hex2bytes(hex)
    catch
        throw(ArgumentError("hex: not a string of hex digits (a CommUniqueId is $(2n) of them)"))
    end
    length(bytes) == n || throw(ArgumentError("hex: $(length(bytes)) bytes; a CommUniqueId has $n ($(2n) hex digits)"))
    return CommUniqueId(ntuple(i -> bytes[i], Val(FLATMEM_COMM_UNIQUE_ID_BYTES)))
end

Base.print(io::IO, id::CommUniqueId) = print(io, bytes2hex(collect(id.internal)))
Base.show(io::IO, id::CommUniqueId) = print(io, "Flatmem.CommUniqueId(\"", bytes2hex(collect(id.internal[1:8])), "…\")")

# flatmem_comm_options with the library's defaults and these two (0 = default).
function comm_options(timeout_ms::Integer, connect_timeout_ms::Integer)
    timeout_ms >= 0 || throw(ArgumentError("timeout_ms = $timeout_ms; expected >= 0 (0 = FLATMEM_COMM_TIMEOUT_MS, else 60000 ms)"))
    connect_timeout_ms >= 0 || throw(ArgumentError("connect_timeout_ms = $connect_timeout_ms; expected >= 0 (0 = 120000 ms)"))
    options = Ref{CommOptions}()
    check(ccall((:flatmem_comm_options_init, libflatmem), Cint, (Ref{CommOptions}, Csize_t),
                options, Csize_t(sizeof(CommOptions))))
    options[] = CommOptions(options[].struct_size, Int64(timeout_ms), Int64(connect_timeout_ms))
    return options
end

# A per-call deadline in milliseconds: > 0, or 0 for the handle's default.
function timeout_arg(timeout_ms::Integer)
    timeout_ms >= 0 || throw(ArgumentError("timeout_ms = $timeout_ms; expected > 0, or 0 for the communicator's default"))
    return Int64(timeout_ms)
end

"""
    Comm(rank, world_size, id::CommUniqueId; timeout_ms=0, connect_timeout_ms=0)

This rank's communicator (`flatmem_comm_create`), collective over `world_size` ranks: every rank
calls it with its own `rank` (0-based) and the `id` rank 0 made with `unique_id` (rank 0 in the
process that made it). Returns when every rank has joined, or throws after `connect_timeout_ms`
(0 = 120 s) naming the ranks that never arrived. `timeout_ms` is the default deadline of every
later wait (0 = `FLATMEM_COMM_TIMEOUT_MS`, else 60 s). Fields: `rank`, `world_size` (read-only).
See also `comm_from_env` and `local_comms`; `close(c)` or `abort!(c)` releases it.
"""
mutable struct Comm
    ptr::Ptr{CommHandle}
    rank::Int
    world_size::Int
    users::Int                # open Contrastive / Cyclic handles over this communicator
    finalized::Bool           # unreachable: destroyed when users reaches 0
    pending::Set{Any}         # outstanding Requests (and so their buffers), until waited on

    # Wraps a created handle of this rank and size (they never change).
    function Comm(ptr::Ptr{CommHandle}, rank::Integer, world_size::Integer)
        c = new(ptr, Int(rank), Int(world_size), 0, false, Set{Any}())
        finalizer(finalize_comm, c)
        return c
    end
end

# Wraps a created handle whose rank and size the caller does not know (from the environment).
function wrap_queried(ptr::Ptr{CommHandle})
    rank = Ref{Int32}(0)
    nranks = Ref{Int32}(0)
    status = ccall((:flatmem_comm_rank, libflatmem), Cint, (Ptr{CommHandle}, Ref{Int32}), ptr, rank)
    if status == FLATMEM_STATUS_SUCCESS
        status = ccall((:flatmem_comm_world_size, libflatmem), Cint, (Ptr{CommHandle}, Ref{Int32}), ptr, nranks)
    end
    if status != FLATMEM_STATUS_SUCCESS
        err = FlatmemError(status)
        @gc_safe ccall((:flatmem_comm_destroy, libflatmem), Cint, (Ptr{CommHandle},), ptr)
        throw(err)
    end
    return Comm(ptr, rank[], nranks[])
end

function Comm(rank::Integer, world_size::Integer, id::CommUniqueId; timeout_ms::Integer=0, connect_timeout_ms::Integer=0)
    r = int32_arg(rank, "rank")
    n = int32_arg(world_size, "world_size")
    options = comm_options(timeout_ms, connect_timeout_ms)
    out = Ref{Ptr{CommHandle}}(C_NULL)
    idref = Ref(id)
    status = @gc_safe ccall((:flatmem_comm_create, libflatmem), Cint,
                            (Ref{Ptr{CommHandle}}, Int32, Int32, Ref{CommUniqueId}, Ref{CommOptions}), out, r, n, idref, options)
    check(status)
    return Comm(out[], r, n)
end

"""
    comm_from_env(; timeout_ms=0, connect_timeout_ms=0) -> Comm

This rank's communicator from the environment (`flatmem_comm_create_from_env`), for launchers:
`FLATMEM_COORDINATOR=host:port` (required; rank 0 listens there), `FLATMEM_RANK` /
`FLATMEM_WORLD_SIZE` or the launcher's own (`OMPI_COMM_WORLD_RANK/_SIZE` of mpirun, `PMI_*`,
`SLURM_PROCID/NTASKS`, `RANK/WORLD_SIZE`), optionally `FLATMEM_SESSION` and
`FLATMEM_COMM_TIMEOUT_MS`. A missing or malformed variable is a `FlatmemError` naming it.
Collective, as `Comm(rank, world_size, id)`.
"""
function comm_from_env(; timeout_ms::Integer=0, connect_timeout_ms::Integer=0)
    options = comm_options(timeout_ms, connect_timeout_ms)
    out = Ref{Ptr{CommHandle}}(C_NULL)
    status = @gc_safe ccall((:flatmem_comm_create_from_env, libflatmem), Cint, (Ref{Ptr{CommHandle}}, Ref{CommOptions}), out, options)
    check(status)
    return wrap_queried(out[])
end

"""
    local_comms(world_size; timeout_ms=0) -> Vector{Comm}

`world_size` communicators (1 .. 4096) of one group inside this process
(`flatmem_comm_create_local`): element `r + 1` is rank `r`. Messages are copied in memory, no UCX.
Drive each from its own thread (`Threads.@spawn`, Julia started with at least `world_size`
threads): a collective returns only when every rank's thread has called it. Same deadlines,
poisoning (one poisoned rank poisons the group) and abort as across processes.
"""
function local_comms(world_size::Integer; timeout_ms::Integer=0)
    1 <= world_size <= 4096 || throw(ArgumentError("world_size = $world_size; expected 1 .. 4096"))
    options = comm_options(timeout_ms, 0)
    handles = fill(Ptr{CommHandle}(C_NULL), Int(world_size))
    status = GC.@preserve handles begin
        ccall((:flatmem_comm_create_local, libflatmem), Cint, (Ptr{Ptr{CommHandle}}, Int32, Ref{CommOptions}),
              pointer(handles), Int32(world_size), options)
    end
    check(status)
    return Comm[Comm(handles[r + 1], r, world_size) for r in 0:(world_size - 1)]
end

"""
    unique_id(address="") -> CommUniqueId

Rank 0: open a UCX listener and describe it (`flatmem_comm_unique_id_create`). `address` is
`"host:port"`, `"host"`, `"[ipv6]:port"` or `":port"` (port 0 or none = a free port); `""` =
the environment's `FLATMEM_COMM_ADDRESS`, else all interfaces, the id naming this machine's first
non-loopback IPv4 address. The listener lives until rank 0's `Comm(0, n, id)` adopts it.
"""
function unique_id(address::AbstractString="")
    '\0' in address && throw(ArgumentError("address contains a NUL character"))
    id = Ref{CommUniqueId}()
    check(ccall((:flatmem_comm_unique_id_create, libflatmem), Cint, (Cstring, Ref{CommUniqueId}), String(address), id))
    return id[]
end

Base.unsafe_convert(::Type{Ptr{CommHandle}}, c::Comm) = c.ptr
Base.isopen(c::Comm) = c.ptr != C_NULL

function Base.show(io::IO, c::Comm)
    print(io, "Flatmem.Comm(rank ", c.rank, " of ", c.world_size, isopen(c) ? ")" : ", closed)")
end

function ensure_open(c::Comm)
    isopen(c) || throw(ArgumentError("this Flatmem.Comm is closed"))
    return c
end

# flatmem_comm_destroy (or _abort) once; the outstanding requests are cancelled by it,
# so their buffers are C's no more. Returns the status.
function destroy(c::Comm; abort::Bool=false)
    handle = c.ptr
    c.ptr = Ptr{CommHandle}(C_NULL)
    handle == C_NULL && return FLATMEM_STATUS_SUCCESS
    status = abort ? @gc_safe(ccall((:flatmem_comm_abort, libflatmem), Cint, (Ptr{CommHandle},), handle)) :
                     @gc_safe(ccall((:flatmem_comm_destroy, libflatmem), Cint, (Ptr{CommHandle},), handle))
    for r in c.pending
        r.ptr = Ptr{CommRequestHandle}(C_NULL)
    end
    empty!(c.pending)
    return status
end

# A handle over the communicator may still use it: then the last user destroys it.
function finalize_comm(c::Comm)
    c.finalized = true
    c.users == 0 && destroy(c)
    return nothing
end

# A Contrastive / Cyclic handle over `c` is gone.
function release_user(c::Comm)
    c.users -= 1
    c.users == 0 && c.finalized && destroy(c)
    return nothing
end
release_user(::Nothing) = nothing

function ensure_unused(c::Comm, what::String)
    c.users == 0 || throw(ArgumentError(
        "cannot $what this Flatmem.Comm: $(c.users) Contrastive/Cyclic handle(s) over it are open; close them first"))
    return c
end

"""
    close(c::Comm)

Release the communicator (`flatmem_comm_destroy`): not collective but orderly (what this rank sent
is flushed, the peers are told it left); outstanding requests are cancelled. Refused while a
`Contrastive` or `Cyclic` over it is open. Idempotent.
"""
Base.close(c::Comm) = (ensure_unused(c, "close"); check(destroy(c)))

"""
    abort!(c::Comm)

Give up (`flatmem_comm_abort`): the peers fail at once with `FLATMEM_STATUS_PEER_FAILURE` naming
this rank; then the handle is released. Use it after an error (a poisoned communicator) or to stop
the other ranks' waits. Refused while a `Contrastive` or `Cyclic` over it is open. Idempotent.
"""
abort!(c::Comm) = (ensure_unused(c, "abort"); check(destroy(c; abort=true)))

"""`rank(c::Comm) -> Int`: this rank, 0-based (`flatmem_comm_rank`; also the field `c.rank`)."""
function rank(c::Comm)
    r = Ref{Int32}(0)
    check(ccall((:flatmem_comm_rank, libflatmem), Cint, (Ptr{CommHandle}, Ref{Int32}), ensure_open(c), r))
    return Int(r[])
end

"""`world_size(c::Comm) -> Int`: the number of ranks (`flatmem_comm_world_size`; also `c.world_size`)."""
function world_size(c::Comm)
    n = Ref{Int32}(0)
    check(ccall((:flatmem_comm_world_size, libflatmem), Cint, (Ptr{CommHandle}, Ref{Int32}), ensure_open(c), n))
    return Int(n[])
end

"""
    health(c::Comm) -> Union{Nothing, FlatmemError}

`nothing` while the communicator is healthy; otherwise the error that poisoned it (its status,
`FLATMEM_STATUS_TIMEOUT`, `_PEER_FAILURE`, ..., and the first error's message), returned, not
thrown (`flatmem_comm_health`).
"""
function health(c::Comm)
    status = ccall((:flatmem_comm_health, libflatmem), Cint, (Ptr{CommHandle},), ensure_open(c))
    return status == FLATMEM_STATUS_SUCCESS ? nothing : FlatmemError(status)
end

# The DLPack dtype of a message's elements (nothing: no dtype for T here).
message_dtype(::Type) = nothing
message_dtype(::Type{T}) where {T<:Union{Float16,Float32,Float64}} = DLDataType(kDLFloat, 8sizeof(T), 1)
message_dtype(::Type{T}) where {T<:Union{Int8,Int16,Int32,Int64}} = DLDataType(kDLInt, 8sizeof(T), 1)
message_dtype(::Type{T}) where {T<:Union{UInt8,UInt16,UInt32,UInt64,Bool}} = DLDataType(kDLUInt, 8sizeof(T), 1)
message_dtype(::Type{BF16}) = DLDataType(kDLBfloat, 16, 1)
@static if isdefined(Core, :BFloat16)
    message_dtype(::Type{Core.BFloat16}) = DLDataType(kDLBfloat, 16, 1)
end

# A message buffer: a dense Array (C reads or writes its memory), as a compact tensor.
function message_tensor(A::AbstractArray, name::String)
    A isa Array || throw(ArgumentError("$name must be a dense Array (C reads or writes its memory in place); got $(typeof(A))"))
    dtype = message_dtype(eltype(A))
    dtype === nothing && throw(ArgumentError(
        "$name: element type $(eltype(A)) has no DLPack dtype here; use a Float64/32/16, BF16, (U)Int8/16/32/64 or Bool array"))
    return dense_tensor(A, dtype)
end

function tag_arg(tag::Integer)
    0 <= tag <= typemax(UInt32) || throw(ArgumentError("tag = $tag; expected 0 .. $(typemax(UInt32)) (a 32-bit unsigned value)"))
    return UInt32(tag)
end

"""
    Request

An outstanding `isend` / `irecv!` (`flatmem_comm_request_t`). Complete it with `wait(r)`
(exactly once); `isready(r)` asks without waiting. It keeps its buffer alive until then.
"""
mutable struct Request
    ptr::Ptr{CommRequestHandle}
    comm::Comm
    buffer::Tensor   # what C reads (send) or writes (receive) until the request completes
    receive::Bool
end

Base.show(io::IO, r::Request) = print(io, "Flatmem.Request(", r.receive ? "irecv" : "isend",
                                      r.ptr == C_NULL ? ", completed)" : ")")

function post(c::Comm, buffer::AbstractArray, peer::Integer, tag::Integer, receive::Bool)
    ensure_open(c)
    t = message_tensor(buffer, "buffer")
    p = int32_arg(peer, "peer")
    g = tag_arg(tag)
    out = Ref{Ptr{CommRequestHandle}}(C_NULL)
    status = GC.@preserve t begin
        if receive
            ccall((:flatmem_comm_irecv, libflatmem), Cint,
                  (Ptr{CommHandle}, Ptr{DLTensor}, Int32, UInt32, Ref{Ptr{CommRequestHandle}}, Ptr{Cvoid}),
                  c, tensor_ptr(t), p, g, out, C_NULL)
        else
            ccall((:flatmem_comm_isend, libflatmem), Cint,
                  (Ptr{CommHandle}, Ptr{DLTensor}, Int32, UInt32, Ref{Ptr{CommRequestHandle}}, Ptr{Cvoid}),
                  c, tensor_ptr(t), p, g, out, C_NULL)
        end
    end
    check(status)
    r = Request(out[], c, t, receive)
    push!(c.pending, r)
    return r
end

"""
    isend(c::Comm, buffer, peer; tag=0) -> Request

Start sending `buffer` (a dense `Array`; its bytes are the message) to rank `peer` (0-based; may
be this rank) with `tag` (`flatmem_comm_isend`). Returns at once; do not change `buffer` until
`wait` returns. Messages between a pair of ranks with one tag arrive in order.
"""
isend(c::Comm, buffer::AbstractArray, peer::Integer; tag::Integer=0) = post(c, buffer, peer, tag, false)

"""
    irecv!(c::Comm, buffer, peer; tag=0) -> Request

Start receiving into `buffer` (a dense `Array` of exactly the sent message's byte size) from rank
`peer` with `tag` (`flatmem_comm_irecv`). `wait(r)` returns `buffer` once it holds the message; a
message of another size fails that wait (`FLATMEM_STATUS_INVALID_ARGUMENT` naming both sizes; the
communicator stays usable, the buffer's contents are then unspecified).
"""
irecv!(c::Comm, buffer::AbstractArray, peer::Integer; tag::Integer=0) = post(c, buffer, peer, tag, true)

function ensure_pending(r::Request)
    r.ptr == C_NULL && throw(ArgumentError(
        "this Flatmem.Request is complete (waited on) or was cancelled (its communicator was released)"))
    return r
end

"""
    wait(r::Request; timeout_ms=0) -> buffer

Wait for the request, at most `timeout_ms` (0 = the communicator's default) (`flatmem_comm_wait`),
and return its buffer. The request is released whatever the outcome: wait once. A timeout or a
failed peer throws a `FlatmemError` and poisons the communicator.
"""
function Base.wait(r::Request; timeout_ms::Integer=0)
    ensure_pending(r)
    c = ensure_open(r.comm)
    timeout = timeout_arg(timeout_ms)
    handle = r.ptr
    r.ptr = Ptr{CommRequestHandle}(C_NULL)
    status = @gc_safe ccall((:flatmem_comm_wait, libflatmem), Cint, (Ptr{CommHandle}, Ptr{CommRequestHandle}, Int64),
                            c, handle, timeout)
    delete!(c.pending, r)   # C no longer touches the buffer
    check(status)
    return r.buffer.owner
end

"""
    isready(r::Request) -> Bool

Whether the request has completed (`flatmem_comm_test`), without waiting. It stays pending:
finish it with `wait(r)`, which then returns at once.
"""
function Base.isready(r::Request)
    ensure_pending(r)
    done = Ref{Int32}(0)
    check(ccall((:flatmem_comm_test, libflatmem), Cint, (Ptr{CommHandle}, Ptr{CommRequestHandle}, Ref{Int32}),
                ensure_open(r.comm), r.ptr, done))
    return done[] != 0
end

# The two-buffer collectives: recv written, send read; blocking, GC-safe.
function collective(fname::Symbol, c::Comm, recv::AbstractArray, send::AbstractArray, timeout_ms::Integer)
    ensure_open(c)
    recv_t = message_tensor(recv, "recv")
    send_t = recv === send ? recv_t : message_tensor(send, "send")
    timeout = timeout_arg(timeout_ms)
    status = GC.@preserve recv_t send_t begin
        if fname === :ring_shift
            @gc_safe ccall((:flatmem_comm_ring_shift, libflatmem), Cint,
                           (Ptr{CommHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Int64, Ptr{Cvoid}),
                           c, tensor_ptr(send_t), tensor_ptr(recv_t), timeout, C_NULL)
        else
            @gc_safe ccall((:flatmem_comm_all_reduce, libflatmem), Cint,
                           (Ptr{CommHandle}, Ptr{DLTensor}, Ptr{DLTensor}, Int64, Ptr{Cvoid}),
                           c, tensor_ptr(send_t), tensor_ptr(recv_t), timeout, C_NULL)
        end
    end
    check(status)
    return recv
end

"""
    ring_shift!(c::Comm, recv, send; timeout_ms=0) -> recv

Collective: every rank sends `send` to rank + 1 and receives into `recv` from rank - 1 (mod
world_size) (`flatmem_comm_ring_shift`). Dense `Array`s of one byte size that do not overlap; with
one rank, `recv` becomes a copy of `send`. Blocking, at most `timeout_ms`.
"""
ring_shift!(c::Comm, recv::AbstractArray, send::AbstractArray; timeout_ms::Integer=0) =
    collective(:ring_shift, c, recv, send, timeout_ms)

"""
    all_reduce!(c::Comm, recv, send=recv; timeout_ms=0) -> recv

Collective sum: `recv = Σ over ranks of send`, the same bits on every rank and on every repeat
(each element summed in a fixed order) (`flatmem_comm_all_reduce`). `Float32`, `Float64`, `Int32`
or `Int64` dense `Array`s of one shape; `recv === send` (the default) reduces in place; partial
overlap is refused. Blocking, at most `timeout_ms` per step.
"""
all_reduce!(c::Comm, recv::AbstractArray, send::AbstractArray=recv; timeout_ms::Integer=0) =
    collective(:all_reduce, c, recv, send, timeout_ms)

"""`all_reduce(c::Comm, send; timeout_ms=0)`: `all_reduce!` into a new array like `send`."""
all_reduce(c::Comm, send::AbstractArray; timeout_ms::Integer=0) = all_reduce!(c, similar(send), send; timeout_ms=timeout_ms)

"""`barrier(c::Comm; timeout_ms=0)`: every rank reaches it before any returns (`flatmem_comm_barrier`)."""
function barrier(c::Comm; timeout_ms::Integer=0)
    ensure_open(c)
    timeout = timeout_arg(timeout_ms)
    status = @gc_safe ccall((:flatmem_comm_barrier, libflatmem), Cint, (Ptr{CommHandle}, Int64), c, timeout)
    check(status)
    return nothing
end

# Device transport (NCCL), thin wrappers: the binding's buffers are host Arrays, so these
# serve code that hands flatmem kDLCUDA tensors of its own. `stream` is a cudaStream_t.

"""
    init_device(c::Comm, cuda_device; timeout_ms=0)

Collective: create the NCCL communicator of these ranks on CUDA device `cuda_device`
(`flatmem_comm_init_device`). `FLATMEM_STATUS_UNSUPPORTED` without NCCL or a usable driver (the
communicator stays healthy; the call may be retried).
"""
function init_device(c::Comm, cuda_device::Integer; timeout_ms::Integer=0)
    ensure_open(c)
    device = int32_arg(cuda_device, "cuda_device")
    timeout = timeout_arg(timeout_ms)
    status = @gc_safe ccall((:flatmem_comm_init_device, libflatmem), Cint, (Ptr{CommHandle}, Int32, Int64), c, device, timeout)
    check(status)
    return nothing
end

"""`group_start(c::Comm)`: open a group of device sends and receives (`flatmem_comm_group_start`, as ncclGroupStart)."""
group_start(c::Comm) = check(ccall((:flatmem_comm_group_start, libflatmem), Cint, (Ptr{CommHandle},), ensure_open(c)))

"""`group_end(c::Comm; timeout_ms=0)`: issue the group's device transfers (`flatmem_comm_group_end`); same thread as `group_start`."""
function group_end(c::Comm; timeout_ms::Integer=0)
    ensure_open(c)
    timeout = timeout_arg(timeout_ms)
    status = @gc_safe ccall((:flatmem_comm_group_end, libflatmem), Cint, (Ptr{CommHandle}, Int64), c, timeout)
    check(status)
    return nothing
end

"""
    synchronize(c::Comm, stream::Ptr{Cvoid}; timeout_ms=0)

Wait on the host until the CUDA `stream` has finished, at most `timeout_ms`, checking NCCL for
errors meanwhile (`flatmem_comm_synchronize`): the deadline of device transfers.
"""
function synchronize(c::Comm, stream::Ptr{Cvoid}; timeout_ms::Integer=0)
    ensure_open(c)
    timeout = timeout_arg(timeout_ms)
    status = @gc_safe ccall((:flatmem_comm_synchronize, libflatmem), Cint, (Ptr{CommHandle}, Ptr{Cvoid}, Int64), c, stream, timeout)
    check(status)
    return nothing
end
