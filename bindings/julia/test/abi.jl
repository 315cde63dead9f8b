# The size rules of flatmem's ABI 1 (flatmem.h, "Conventions") through Flatmem.jl's mirrors, as a
# caller built against a NEWER flatmem.h would meet them: its structs are larger than this
# library's. A struct the library writes, passed with a size larger than the library's sizeof,
# gets the library's fields, then zeros up to that size (and an init sets struct_size to it); an
# options struct whose bytes past the library's sizeof are all zero is accepted, one with a
# non-zero byte there (a field this library does not know) is refused with
# FLATMEM_STATUS_UNSUPPORTED; a size of 0 is INVALID_ARGUMENT naming the size argument. The
# binding itself always passes sizeof of its own mirrors (check_ccalls.py checks that); the
# ccalls here pass other sizes on purpose.
#
# CHECKED, NOT RUN: no Julia runtime exists on the project's machines (see ../README.md);
# scripts/check-julia.sh checks this directory's ccalls only. Run it where Julia >= 1.6 exists:
#     FLATMEM_LIBRARY=/path/to/prefix/lib/libflatmem.so julia bindings/julia/test/abi.jl
using Test

include(joinpath(@__DIR__, "..", "Flatmem.jl"))
using .Flatmem
using .Flatmem: libflatmem, check, ContrastiveOptions, ContrastiveHandle,
                FLATMEM_STATUS_SUCCESS, FLATMEM_STATUS_INVALID_ARGUMENT, FLATMEM_STATUS_UNSUPPORTED

const EXTRA = 24   # bytes of fields a newer flatmem.h would have appended
const FILL = 0xa5  # what the caller's memory holds before the call: any byte left unwritten shows

# flatmem_cyclic_schedule_action into a buffer of `bytes` bytes: (status, the buffer).
function action_into(s::CyclicSchedule, rank, time_step, bytes)
    buffer = fill(FILL, max(bytes, sizeof(CyclicAction)))
    status = GC.@preserve buffer begin
        # flatmem-check: size: a newer header's larger CyclicAction, or 0
        ccall((:flatmem_cyclic_schedule_action, libflatmem), Cint,
              (Ref{CyclicSchedule}, Int32, Int64, Ptr{CyclicAction}, Csize_t),
              s, Int32(rank), Int64(time_step), Ptr{CyclicAction}(pointer(buffer)), Csize_t(bytes))
    end
    return status, buffer
end

# flatmem_contrastive_options_init into a buffer of `bytes` bytes.
function contrastive_options_into(bytes)
    buffer = fill(FILL, bytes)
    status = GC.@preserve buffer begin
        # flatmem-check: size: a newer header's larger ContrastiveOptions
        ccall((:flatmem_contrastive_options_init, libflatmem), Cint, (Ptr{ContrastiveOptions}, Csize_t),
              Ptr{ContrastiveOptions}(pointer(buffer)), Csize_t(bytes))
    end
    check(status)
    return buffer
end

# flatmem_contrastive_create from the options in `buffer` (destroyed at once): the status.
function create_from(buffer::Vector{UInt8})
    out = Ref{Ptr{ContrastiveHandle}}(C_NULL)
    status = GC.@preserve buffer begin
        ccall((:flatmem_contrastive_create, libflatmem), Cint, (Ref{Ptr{ContrastiveHandle}}, Ptr{ContrastiveOptions}),
              out, Ptr{ContrastiveOptions}(pointer(buffer)))
    end
    if status == FLATMEM_STATUS_SUCCESS
        @test out[] != C_NULL
        check(ccall((:flatmem_contrastive_destroy, libflatmem), Cint, (Ptr{ContrastiveHandle},), out[]))
    else
        @test out[] == C_NULL   # *out is set only on success
    end
    return status
end

last_error() = unsafe_string(ccall((:flatmem_last_error, libflatmem), Cstring, ()))

load(::Type{T}, buffer::Vector{UInt8}) where {T} = GC.@preserve buffer unsafe_load(Ptr{T}(pointer(buffer)))

@testset "Flatmem.jl: structs of another size (ABI 1)" begin
    @testset "an output struct larger than the library's: its fields, then zeros" begin
        s = cyclic_schedule(8, 4, 3; rule=:newest)
        # (rank, time step) => (kind, stage, step, activations held), as in README.md and the C tests
        for ((rank, t), (kind, stage, step, held)) in ((0, 0) => (:forward, 0, 0, 1), (5, 7) => (:forward, 2, 0, 3),
                                                       (7, 30) => (:backward, 0, 2, 1))
            status, buffer = action_into(s, rank, t, sizeof(CyclicAction) + EXTRA)
            @test status == FLATMEM_STATUS_SUCCESS
            a = load(CyclicAction, buffer)
            @test a === cyclic_action(s, rank, t)   # the binding's own call, sizeof(CyclicAction)
            @test (a.time_step, action_kind(a), a.stage, a.step, a.activations_held) == (t, kind, stage, step, held)
            @test (a.update_stage, a.update_step) == (-1, -1)
            @test all(==(0x00), buffer[(sizeof(CyclicAction) + 1):end])
        end
        status, buffer = action_into(s, 5, 7, 0)
        @test status == FLATMEM_STATUS_INVALID_ARGUMENT
        @test occursin("action_size: 0", last_error())
        @test all(==(FILL), buffer)   # a refused call writes nothing
    end

    @testset "larger options: init writes defaults then zeros; an unknown non-zero field is refused" begin
        n = sizeof(ContrastiveOptions)
        defaults = load(ContrastiveOptions, contrastive_options_into(n))
        @test defaults.struct_size == n
        buffer = contrastive_options_into(n + EXTRA)
        grown = load(ContrastiveOptions, buffer)
        @test grown.struct_size == n + EXTRA
        @test all(getfield(grown, f) == getfield(defaults, f) for f in fieldnames(ContrastiveOptions)[2:end])
        @test all(==(0x00), buffer[(n + 1):end])
        @test create_from(buffer) == FLATMEM_STATUS_SUCCESS   # the unknown bytes are 0: accepted

        buffer[n + 1] = 0x01   # a field of the newer header, set
        @test create_from(buffer) == FLATMEM_STATUS_UNSUPPORTED
        @test occursin("options: byte $n of the caller's $(n + EXTRA)-byte struct is set", last_error())
    end
end
